//! The designs directory: a manifest (`designs.json`) with one entry per built GEMM design.
//!
//! ```json
//! { "format": "xdna-vl-designs", "version": 1,
//!   "designs": [ { "name": "q4_m16_k2048_n6144", "kind": "q4", "m_tile": 16, "k": 2048,
//!                  "n": 6144, "xclbin": "q4_m16_k2048_n6144.xclbin",
//!                  "insts": "q4_m16_k2048_n6144.insts.bin", "kernel": "MLIR_AIE" } ] }
//! ```
//! Paths are relative to the directory (absolute ones are kept).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::geometry::{DesignKind, Geometry, GeometryError};

pub const MANIFEST_FILE: &str = "designs.json";
pub const MANIFEST_FORMAT: &str = "xdna-vl-designs";
pub const MANIFEST_VERSION: u32 = 1;

/// The manifest as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub designs: Vec<ManifestEntry>,
}

/// One design as stored in the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    pub name: String,
    pub kind: DesignKind,
    pub m_tile: usize,
    pub k: usize,
    pub n: usize,
    pub xclbin: PathBuf,
    pub insts: PathBuf,
    pub kernel: String,
}

/// A design ready to load: its geometry and the resolved paths of its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesignEntry {
    pub name: String,
    pub geometry: Geometry,
    pub xclbin: PathBuf,
    pub insts: PathBuf,
    pub kernel: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DesignsError {
    #[error("cannot read the designs manifest {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("designs manifest {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("designs manifest {path}, design {name}: {message}")]
    Entry {
        path: PathBuf,
        name: String,
        message: String,
    },
    #[error("designs manifest {path}, design {name}: {source}")]
    Geometry {
        path: PathBuf,
        name: String,
        source: GeometryError,
    },
    #[error(
        "no design for {wanted} in {path} (it has: {available}); build one with mlir-aie, see \
         `npu-designs plan`"
    )]
    Missing {
        path: PathBuf,
        wanted: Geometry,
        available: String,
    },
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
}

/// The loaded, validated manifest of a designs directory.
#[derive(Clone, Debug)]
pub struct Designs {
    manifest_path: PathBuf,
    entries: Vec<DesignEntry>,
}

impl Designs {
    /// Reads `dir/designs.json`, refusing (by file, design name and field) an unknown format or
    /// version, an impossible geometry, a duplicate name or geometry, an empty kernel name, or a
    /// design file that does not exist.
    pub fn load(dir: &Path) -> Result<Designs, DesignsError> {
        let path = dir.join(MANIFEST_FILE);
        let text = fs::read_to_string(&path).map_err(|e| DesignsError::Read {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| DesignsError::Parse {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Designs::from_manifest(dir, path, manifest)
    }

    fn from_manifest(
        dir: &Path,
        path: PathBuf,
        manifest: Manifest,
    ) -> Result<Designs, DesignsError> {
        if manifest.format != MANIFEST_FORMAT {
            return Err(DesignsError::Parse {
                path,
                message: format!(
                    "format is {:?}, expected {MANIFEST_FORMAT:?}",
                    manifest.format
                ),
            });
        }
        if manifest.version != MANIFEST_VERSION {
            return Err(DesignsError::Parse {
                path,
                message: format!(
                    "version is {}, expected {MANIFEST_VERSION}",
                    manifest.version
                ),
            });
        }
        let mut entries: Vec<DesignEntry> = Vec::with_capacity(manifest.designs.len());
        for stored in manifest.designs {
            let entry_error = |message: String| DesignsError::Entry {
                path: path.clone(),
                name: stored.name.clone(),
                message,
            };
            if stored.name.is_empty() {
                return Err(entry_error("the name is empty".into()));
            }
            let geometry = Geometry::new(stored.kind, stored.m_tile, stored.k, stored.n);
            geometry
                .validate()
                .map_err(|source| DesignsError::Geometry {
                    path: path.clone(),
                    name: stored.name.clone(),
                    source,
                })?;
            if stored.kernel.is_empty() {
                return Err(entry_error("the kernel name is empty".into()));
            }
            if let Some(other) = entries.iter().find(|e| e.name == stored.name) {
                return Err(entry_error(format!(
                    "the name is used twice ({})",
                    other.geometry
                )));
            }
            if let Some(other) = entries.iter().find(|e| e.geometry == geometry) {
                return Err(entry_error(format!(
                    "geometry {geometry} is also design {}",
                    other.name
                )));
            }
            let xclbin = dir.join(&stored.xclbin);
            let insts = dir.join(&stored.insts);
            for (what, file) in [("xclbin", &xclbin), ("instruction file", &insts)] {
                if !file.is_file() {
                    return Err(entry_error(format!(
                        "{what} {} does not exist",
                        file.display()
                    )));
                }
            }
            entries.push(DesignEntry {
                name: stored.name,
                geometry,
                xclbin,
                insts,
                kernel: stored.kernel,
            });
        }
        Ok(Designs {
            manifest_path: path,
            entries,
        })
    }

    pub fn manifest_path(&self) -> &Path {
        &self.manifest_path
    }

    pub fn entries(&self) -> &[DesignEntry] {
        &self.entries
    }

    /// The design of exactly this geometry, or a refusal naming it and what the manifest has.
    pub fn find(
        &self,
        kind: DesignKind,
        k: usize,
        n: usize,
        m_tile: usize,
    ) -> Result<&DesignEntry, DesignsError> {
        let wanted = Geometry::new(kind, m_tile, k, n);
        self.entries
            .iter()
            .find(|e| e.geometry == wanted)
            .ok_or_else(|| DesignsError::Missing {
                path: self.manifest_path.clone(),
                wanted,
                available: if self.entries.is_empty() {
                    "no designs".into()
                } else {
                    self.entries
                        .iter()
                        .map(|e| e.geometry.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            })
    }

    /// The M tiles available for (kind, K, N), ascending.
    pub fn m_tiles(&self, kind: DesignKind, k: usize, n: usize) -> Vec<usize> {
        let mut tiles: Vec<usize> = self
            .entries
            .iter()
            .filter(|e| e.geometry.kind == kind && e.geometry.k == k && e.geometry.n == n)
            .map(|e| e.geometry.m_tile)
            .collect();
        tiles.sort_unstable();
        tiles
    }
}

/// Writes `dir/designs.json` (creating `dir`), atomically.
pub fn write_manifest(dir: &Path, designs: Vec<ManifestEntry>) -> Result<PathBuf, DesignsError> {
    let path = dir.join(MANIFEST_FILE);
    let write_error = |e: std::io::Error| DesignsError::Write {
        path: path.clone(),
        message: e.to_string(),
    };
    fs::create_dir_all(dir).map_err(write_error)?;
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_string(),
        version: MANIFEST_VERSION,
        designs,
    };
    let text = serde_json::to_string_pretty(&manifest).expect("a manifest always serialises");
    // Written beside and renamed over: a reader (or an interrupted build) never sees half a file.
    let partial = dir.join(format!("{MANIFEST_FILE}.partial"));
    fs::write(&partial, text + "\n").map_err(write_error)?;
    fs::rename(&partial, &path).map_err(write_error)?;
    Ok(path)
}

/// The stub "xclbin" the software NPU reads: it records the geometry and kernel the stub was
/// made for, so loading it under another geometry is refused like a mismatched real design.
pub const EMU_XCLBIN_FORMAT: &str = "npu-emu-xclbin";

/// The kernel name written into software NPU stubs (real mlir-aie kernels start with it too).
pub const EMU_KERNEL_NAME: &str = "MLIR_AIE";

/// Writes a software-NPU designs directory: for each geometry a stub xclbin, a stub
/// instruction file, and the manifest entry. Returns the loaded manifest.
pub fn write_emu_designs(dir: &Path, geometries: &[Geometry]) -> Result<Designs, DesignsError> {
    fs::create_dir_all(dir).map_err(|e| DesignsError::Write {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut entries = Vec::with_capacity(geometries.len());
    for geometry in geometries {
        geometry
            .validate()
            .map_err(|source| DesignsError::Geometry {
                path: dir.join(MANIFEST_FILE),
                name: geometry.file_stem(),
                source,
            })?;
        let stem = geometry.file_stem();
        let xclbin = PathBuf::from(format!("{stem}.xclbin"));
        let insts = PathBuf::from(format!("{stem}.insts.bin"));
        let stub = serde_json::json!({
            "format": EMU_XCLBIN_FORMAT,
            "version": 1,
            "kind": geometry.kind,
            "m_tile": geometry.m_tile,
            "k": geometry.k,
            "n": geometry.n,
            "kernel": EMU_KERNEL_NAME,
        });
        let write = |file: &Path, bytes: &[u8]| {
            fs::write(dir.join(file), bytes).map_err(|e| DesignsError::Write {
                path: dir.join(file),
                message: e.to_string(),
            })
        };
        write(&xclbin, (stub.to_string() + "\n").as_bytes())?;
        // A few little-endian u32 words, like a real instruction stream (the emulator checks only
        // that it is whole words).
        let words: Vec<u8> = [
            0x0601_0300u32,
            geometry.m_tile as u32,
            geometry.k as u32,
            geometry.n as u32,
        ]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
        write(&insts, &words)?;
        entries.push(ManifestEntry {
            name: stem,
            kind: geometry.kind,
            m_tile: geometry.m_tile,
            k: geometry.k,
            n: geometry.n,
            xclbin,
            insts,
            kernel: EMU_KERNEL_NAME.to_string(),
        });
    }
    write_manifest(dir, entries)?;
    Designs::load(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometries() -> Vec<Geometry> {
        vec![
            Geometry::new(DesignKind::Q4, 16, 64, 32),
            Geometry::new(DesignKind::Q4, 128, 64, 32),
            Geometry::new(DesignKind::I8, 16, 48, 8),
        ]
    }

    #[test]
    fn emu_designs_round_trip_and_find() {
        let dir = tempfile::tempdir().unwrap();
        let designs = write_emu_designs(dir.path(), &geometries()).unwrap();
        assert_eq!(designs.entries().len(), 3);
        let entry = designs.find(DesignKind::Q4, 64, 32, 128).unwrap();
        assert_eq!(entry.name, "q4_m128_k64_n32");
        assert!(entry.xclbin.is_file());
        assert_eq!(designs.m_tiles(DesignKind::Q4, 64, 32), vec![16, 128]);
        let reloaded = Designs::load(dir.path()).unwrap();
        assert_eq!(reloaded.entries(), designs.entries());
    }

    #[test]
    fn a_missing_geometry_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let designs = write_emu_designs(dir.path(), &geometries()).unwrap();
        let err = designs
            .find(DesignKind::I8, 48, 16, 16)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no design for i8 M16 K48 N16"), "{err}");
        assert!(err.contains("i8 M16 K48 N8"), "lists what exists: {err}");
        // Control: the geometry that exists is found.
        designs.find(DesignKind::I8, 48, 8, 16).unwrap();
    }

    #[test]
    fn a_missing_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        write_emu_designs(dir.path(), &geometries()).unwrap();
        fs::remove_file(dir.path().join("i8_m16_k48_n8.insts.bin")).unwrap();
        let err = Designs::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("design i8_m16_k48_n8"), "{err}");
        assert!(err.contains("instruction file"), "{err}");
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn bad_entries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_emu_designs(dir.path(), &geometries()).unwrap();
        let path = dir.path().join(MANIFEST_FILE);
        let original = fs::read_to_string(&path).unwrap();
        let cases = [
            (original.replace("\"k\": 64", "\"k\": 40"), "multiple of 32"),
            (
                original.replace("\"n\": 8", "\"n\": 0"),
                "must all be positive",
            ),
            (
                original.replace("\"kind\": \"i8\"", "\"kind\": \"i4\""),
                "unknown variant",
            ),
            (
                original.replace("\"version\": 1", "\"version\": 7"),
                "version is 7",
            ),
            (
                original.replace("q4_m128_k64_n32\"", "q4_m16_k64_n32\""),
                "used twice",
            ),
            (
                original.replace("\"m_tile\": 128", "\"m_tile\": 16"),
                "also design",
            ),
            (
                original.replace("\"kernel\": \"MLIR_AIE\"", "\"kernel\": \"\""),
                "kernel name is empty",
            ),
        ];
        for (text, expected) in cases {
            assert_ne!(
                text, original,
                "the planted error must change the manifest ({expected})"
            );
            fs::write(&path, &text).unwrap();
            let err = Designs::load(dir.path()).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err}");
        }
        fs::write(&path, &original).unwrap();
        Designs::load(dir.path()).unwrap();
    }
}
