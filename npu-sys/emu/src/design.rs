//! Loading a design: the geometry it computes and the checks a real load would make (the files
//! exist, the instruction stream is whole u32 words, the xclbin has the kernel and was built for
//! this geometry).

use std::fmt;
use std::fs;
use std::path::Path;

use packs::quant::Q4_GROUP;

use crate::abi::{self, EmuError};

/// What the software NPU's stub xclbin says of itself (written by `npu-designs emu`).
pub const STUB_FORMAT: &str = "npu-emu-xclbin";
/// Stubs are small; anything larger is taken for a real xclbin and only checked to exist.
const STUB_MAX_BYTES: u64 = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    I8,
    Q4,
}

impl Kind {
    pub fn from_abi(value: u32) -> Option<Kind> {
        match value {
            abi::KIND_I8 => Some(Kind::I8),
            abi::KIND_Q4 => Some(Kind::Q4),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Kind::I8 => "i8",
            Kind::Q4 => "q4",
        }
    }
}

/// C [m x n] = A [m x k] x B [n x k]^T, as the header specifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub kind: Kind,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} M{} K{} N{}",
            self.kind.as_str(),
            self.m,
            self.k,
            self.n
        )
    }
}

pub fn group_name(group: u32) -> &'static str {
    match group {
        abi::GROUP_A => "A",
        abi::GROUP_B => "B",
        abi::GROUP_C => "C",
        _ => "?",
    }
}

impl Geometry {
    pub fn from_desc(kind: u32, m: u32, k: u32, n: u32) -> Result<Geometry, EmuError> {
        let kind = Kind::from_abi(kind).ok_or_else(|| {
            EmuError::invalid(format!("unknown design kind {kind} (1 = i8, 2 = q4)"))
        })?;
        let g = Geometry {
            kind,
            m: m as usize,
            k: k as usize,
            n: n as usize,
        };
        if g.m == 0 || g.k == 0 || g.n == 0 {
            return Err(EmuError::invalid(format!(
                "geometry {g}: M, K and N must be positive"
            )));
        }
        if kind == Kind::Q4 && !g.k.is_multiple_of(Q4_GROUP) {
            return Err(EmuError::invalid(format!(
                "geometry {g}: q4 needs K a multiple of {Q4_GROUP}"
            )));
        }
        for group in [abi::GROUP_A, abi::GROUP_B, abi::GROUP_C] {
            if g.buffer_len(group).is_none() {
                return Err(EmuError::invalid(format!(
                    "geometry {g}: buffer sizes overflow"
                )));
            }
        }
        Ok(g)
    }

    /// Bytes of the buffer of `group` (the header's layouts); None for an unknown group or on
    /// overflow.
    pub fn buffer_len(&self, group: u32) -> Option<usize> {
        let (m, k, n) = (self.m, self.k, self.n);
        match (group, self.kind) {
            (abi::GROUP_A, _) => m.checked_mul(k),
            (abi::GROUP_B, Kind::I8) => n.checked_mul(k),
            (abi::GROUP_B, Kind::Q4) => n
                .checked_mul(k / 2)?
                .checked_add(n.checked_mul(k / Q4_GROUP)?.checked_mul(2)?),
            (abi::GROUP_C, _) => m.checked_mul(n)?.checked_mul(4),
            _ => None,
        }
    }
}

/// Checks what loading the design on a device would check. `kernel` must be non-empty.
pub fn check_design_files(
    geometry: &Geometry,
    xclbin: &Path,
    insts: &Path,
    kernel: &str,
) -> Result<(), EmuError> {
    if kernel.is_empty() {
        return Err(EmuError::invalid("the kernel name is empty"));
    }
    let xclbin_meta = metadata(xclbin, "xclbin")?;
    let insts_meta = metadata(insts, "instruction file")?;
    if insts_meta.len() == 0 || insts_meta.len() % 4 != 0 {
        return Err(EmuError::invalid(format!(
            "instruction file {} has {} bytes, not a whole number of u32 words",
            insts.display(),
            insts_meta.len()
        )));
    }
    if xclbin_meta.len() <= STUB_MAX_BYTES {
        let bytes = fs::read(xclbin)
            .map_err(|e| EmuError::io(format!("cannot read xclbin {}: {e}", xclbin.display())))?;
        if let Some(stub) = parse_stub(&bytes) {
            check_stub(&stub, geometry, xclbin, kernel)?;
        }
    }
    Ok(())
}

fn metadata(path: &Path, what: &str) -> Result<fs::Metadata, EmuError> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(meta),
        Ok(_) => Err(EmuError::invalid(format!(
            "{what} {} is not a file",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(EmuError::not_found(format!(
            "{what} {} does not exist",
            path.display()
        ))),
        Err(e) => Err(EmuError::io(format!(
            "cannot read {what} {}: {e}",
            path.display()
        ))),
    }
}

fn parse_stub(bytes: &[u8]) -> Option<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    (value.get("format")?.as_str()? == STUB_FORMAT).then_some(value)
}

/// A stub records the geometry and kernel it was made for: loading it as anything else is the
/// software twin of loading a real design under the wrong geometry.
fn check_stub(
    stub: &serde_json::Value,
    geometry: &Geometry,
    xclbin: &Path,
    kernel: &str,
) -> Result<(), EmuError> {
    let field = |name: &str| stub.get(name).and_then(|v| v.as_u64());
    let kind = match stub.get("kind").and_then(|v| v.as_str()) {
        Some("i8") => Some(Kind::I8),
        Some("q4") => Some(Kind::Q4),
        _ => None,
    };
    let built = match (kind, field("m_tile"), field("k"), field("n")) {
        (Some(kind), Some(m), Some(k), Some(n)) => Geometry {
            kind,
            m: m as usize,
            k: k as usize,
            n: n as usize,
        },
        _ => {
            return Err(EmuError::invalid(format!(
                "xclbin {} is a software NPU stub without kind/m_tile/k/n",
                xclbin.display()
            )))
        }
    };
    if built != *geometry {
        return Err(EmuError::invalid(format!(
            "xclbin {} was built for {built}, the design is loaded as {geometry}",
            xclbin.display()
        )));
    }
    if let Some(stub_kernel) = stub.get("kernel").and_then(|v| v.as_str()) {
        if stub_kernel != kernel {
            return Err(EmuError::not_found(format!(
                "kernel {kernel:?} is not in xclbin {} (it has {stub_kernel:?})",
                xclbin.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_sizes_follow_the_header() {
        let q4 = Geometry::from_desc(abi::KIND_Q4, 16, 64, 8).unwrap();
        assert_eq!(q4.buffer_len(abi::GROUP_A), Some(16 * 64));
        assert_eq!(q4.buffer_len(abi::GROUP_B), Some(8 * 32 + 8 * 2 * 2));
        assert_eq!(q4.buffer_len(abi::GROUP_C), Some(16 * 8 * 4));
        let i8g = Geometry::from_desc(abi::KIND_I8, 4, 10, 3).unwrap();
        assert_eq!(i8g.buffer_len(abi::GROUP_B), Some(30));
        assert_eq!(i8g.buffer_len(7), None);
        assert!(Geometry::from_desc(abi::KIND_Q4, 16, 40, 8).is_err());
        assert!(Geometry::from_desc(9, 16, 64, 8).is_err());
        assert!(Geometry::from_desc(abi::KIND_I8, 0, 64, 8).is_err());
    }

    #[test]
    fn stub_geometry_and_kernel_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let xclbin = dir.path().join("d.xclbin");
        let insts = dir.path().join("d.insts.bin");
        fs::write(
            &xclbin,
            r#"{"format":"npu-emu-xclbin","version":1,"kind":"q4","m_tile":16,"k":64,"n":8,"kernel":"MLIR_AIE"}"#,
        )
        .unwrap();
        fs::write(&insts, [0u8; 8]).unwrap();
        let good = Geometry::from_desc(abi::KIND_Q4, 16, 64, 8).unwrap();
        check_design_files(&good, &xclbin, &insts, "MLIR_AIE").unwrap();
        let wrong_n = Geometry { n: 16, ..good };
        let err = check_design_files(&wrong_n, &xclbin, &insts, "MLIR_AIE").unwrap_err();
        assert!(
            err.message.contains("built for q4 M16 K64 N8"),
            "{}",
            err.message
        );
        let err = check_design_files(&good, &xclbin, &insts, "OTHER").unwrap_err();
        assert_eq!(err.code, abi::ERR_NOT_FOUND);
        fs::write(&insts, [0u8; 7]).unwrap();
        let err = check_design_files(&good, &xclbin, &insts, "MLIR_AIE").unwrap_err();
        assert!(err.message.contains("u32 words"), "{}", err.message);
        let err =
            check_design_files(&good, &dir.path().join("none"), &insts, "MLIR_AIE").unwrap_err();
        assert_eq!(err.code, abi::ERR_NOT_FOUND);
        // A real (non-stub) xclbin is only checked to exist.
        fs::write(&xclbin, b"xclbin2\0binary").unwrap();
        fs::write(&insts, [0u8; 8]).unwrap();
        check_design_files(&wrong_n, &xclbin, &insts, "ANY").unwrap();
    }
}
