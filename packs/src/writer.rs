//! Streaming pack writer: the header is laid out from the plan up front, then tensors are written
//! in plan order into a temp file beside the output, which is renamed into place only when every
//! byte is written. A failure (or a drop before `finish`) leaves no file behind.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use tempfile::NamedTempFile;

use crate::container::{Dtype, LEN_PREFIX};
use crate::layout::TensorSpec;
use crate::names::PAD_PREFIX;
use crate::semantics::{Semantics, SemanticsError};

/// `__metadata__.format` of every pack this crate writes and reads.
pub const FORMAT: &str = "xdna-vl-pack/5";
/// Absolute file alignment of every tensor's first byte.
pub const ALIGN: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid semantics: {0}")]
    Semantics(#[from] SemanticsError),
    #[error("writer expected tensor {expected}, got {got}")]
    OutOfOrder { expected: String, got: String },
    #[error("tensor {name}: expected {expected} bytes, got {got}")]
    WrongSize {
        name: String,
        expected: u64,
        got: u64,
    },
    #[error("tensor {0} written before the previous one was ended")]
    Unfinished(String),
    #[error("pack incomplete: tensor {0} was never written")]
    Incomplete(String),
}

struct Slot {
    spec: TensorSpec,
    /// Absolute file offset of the first byte.
    offset: u64,
}

pub struct PackWriter {
    out: PathBuf,
    file: BufWriter<NamedTempFile>,
    slots: Vec<Slot>,
    /// Index of the next tensor to begin (or the one being written when `open` is set).
    next: usize,
    open: bool,
    written: u64,
    pos: u64,
}

impl PackWriter {
    /// Lays out `specs` (in that order) and writes the header into a temp file in `out`'s directory.
    pub fn create(
        out: &Path,
        sem: &Semantics,
        specs: Vec<TensorSpec>,
    ) -> Result<PackWriter, WriteError> {
        sem.validate()?;
        let dir = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let io = |source| WriteError::Io {
            path: out.to_path_buf(),
            source,
        };
        let file_name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{file_name}."))
            .suffix(".tmp")
            .tempfile_in(&dir)
            .map_err(|source| WriteError::Io {
                path: dir.clone(),
                source,
            })?;

        // Offsets relative to the data section; the header is padded so that the data section
        // starts 64-aligned, which makes relative alignment absolute alignment.
        let mut header = Map::new();
        let semantics_json = serde_json::to_string(sem).expect("semantics serialize");
        header.insert(
            "__metadata__".into(),
            json!({ "format": FORMAT, "semantics": semantics_json }),
        );
        let mut rel = 0u64;
        let mut rel_offsets = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let aligned = rel.next_multiple_of(ALIGN);
            if aligned > rel {
                // safetensors requires contiguous offsets: fill the gap with a named U8 entry.
                header.insert(
                    format!("{PAD_PREFIX}{i}"),
                    entry(Dtype::U8, &[(aligned - rel) as usize], rel, aligned),
                );
            }
            let end = aligned + spec.byte_len();
            header.insert(
                spec.name.clone(),
                entry(spec.dtype, &spec.shape, aligned, end),
            );
            rel_offsets.push(aligned);
            rel = end;
        }
        let mut header_bytes =
            serde_json::to_vec(&Value::Object(header)).expect("header serialize");
        let data_start = (LEN_PREFIX + header_bytes.len() as u64).next_multiple_of(ALIGN);
        header_bytes.resize((data_start - LEN_PREFIX) as usize, b' ');

        let mut file = BufWriter::with_capacity(8 << 20, tmp);
        file.write_all(&(header_bytes.len() as u64).to_le_bytes())
            .map_err(io)?;
        file.write_all(&header_bytes).map_err(io)?;
        let slots = specs
            .into_iter()
            .zip(rel_offsets)
            .map(|(spec, rel)| Slot {
                spec,
                offset: data_start + rel,
            })
            .collect();
        Ok(PackWriter {
            out: out.to_path_buf(),
            file,
            slots,
            next: 0,
            open: false,
            written: 0,
            pos: data_start,
        })
    }

    fn io(&self, source: std::io::Error) -> WriteError {
        WriteError::Io {
            path: self.out.clone(),
            source,
        }
    }

    /// Starts the next tensor of the plan, which must be `name`.
    pub fn begin(&mut self, name: &str) -> Result<(), WriteError> {
        if self.open {
            return Err(WriteError::Unfinished(name.to_string()));
        }
        let Some(slot) = self.slots.get(self.next) else {
            return Err(WriteError::OutOfOrder {
                expected: "(end of pack)".into(),
                got: name.into(),
            });
        };
        if slot.spec.name != name {
            return Err(WriteError::OutOfOrder {
                expected: slot.spec.name.clone(),
                got: name.into(),
            });
        }
        let pad = slot.offset - self.pos;
        self.file
            .write_all(&vec![0u8; pad as usize])
            .map_err(|e| self.io(e))?;
        self.pos += pad;
        self.open = true;
        self.written = 0;
        Ok(())
    }

    /// Appends bytes to the tensor begun last.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        let slot = &self.slots[self.next];
        let expected = slot.spec.byte_len();
        if !self.open || self.written + bytes.len() as u64 > expected {
            return Err(WriteError::WrongSize {
                name: slot.spec.name.clone(),
                expected,
                got: self.written + bytes.len() as u64,
            });
        }
        self.file.write_all(bytes).map_err(|e| self.io(e))?;
        self.written += bytes.len() as u64;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Ends the current tensor; its byte count must match its spec.
    pub fn end(&mut self) -> Result<(), WriteError> {
        let slot = &self.slots[self.next];
        if !self.open || self.written != slot.spec.byte_len() {
            return Err(WriteError::WrongSize {
                name: slot.spec.name.clone(),
                expected: slot.spec.byte_len(),
                got: self.written,
            });
        }
        self.open = false;
        self.next += 1;
        Ok(())
    }

    /// `begin`, `write`, `end` in one call.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<(), WriteError> {
        self.begin(name)?;
        self.write(bytes)?;
        self.end()
    }

    /// The spec of the next tensor to write, if any.
    pub fn next_spec(&self) -> Option<&TensorSpec> {
        self.slots.get(self.next).map(|s| &s.spec)
    }

    /// Checks every tensor was written, syncs, and renames the temp file to the output path.
    /// Returns the file size.
    pub fn finish(self) -> Result<u64, WriteError> {
        if let Some(slot) = self.slots.get(self.next) {
            return Err(WriteError::Incomplete(slot.spec.name.clone()));
        }
        let out = self.out.clone();
        let io = |source| WriteError::Io {
            path: out.clone(),
            source,
        };
        let tmp = self.file.into_inner().map_err(|e| io(e.into_error()))?;
        let file: &File = tmp.as_file();
        // Temp files are created 0600; a pack is an ordinary shareable output file.
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io)?;
        file.sync_all().map_err(io)?;
        tmp.persist(&out).map_err(|e| io(e.error))?;
        Ok(self.pos)
    }
}

fn entry(dtype: Dtype, shape: &[usize], start: u64, end: u64) -> Value {
    json!({ "dtype": dtype.as_str(), "shape": shape, "data_offsets": [start, end] })
}
