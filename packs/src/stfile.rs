//! Reading small safetensors files (hybrid inputs, references) with errors that name the file and
//! tensor. The one reader every tool uses for these formats.

use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{}: {msg}", path.display())]
pub struct StError {
    pub path: PathBuf,
    pub msg: String,
}

/// A safetensors file read into memory.
pub struct StFile {
    pub path: PathBuf,
    bytes: Vec<u8>,
    metadata: HashMap<String, String>,
}

impl StFile {
    pub fn open(path: impl AsRef<Path>) -> Result<StFile, StError> {
        StFile::open_path(path.as_ref())
    }

    /// [`StFile::open`] without the generic: its body is compiled once, here, not again in
    /// every crate and test binary that opens one.
    fn open_path(path: &Path) -> Result<StFile, StError> {
        let path = path.to_path_buf();
        let bytes = std::fs::read(&path).map_err(|e| StError {
            path: path.clone(),
            msg: format!("cannot read: {e}"),
        })?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| StError {
            path: path.clone(),
            msg: format!("not a safetensors file: {e}"),
        })?;
        let metadata = meta.metadata().clone().unwrap_or_default();
        // Validate the whole header and every offset once, here.
        SafeTensors::deserialize(&bytes).map_err(|e| StError {
            path: path.clone(),
            msg: format!("not a valid safetensors file: {e}"),
        })?;
        Ok(StFile {
            path,
            bytes,
            metadata,
        })
    }

    pub fn err(&self, msg: impl Into<String>) -> StError {
        StError {
            path: self.path.clone(),
            msg: msg.into(),
        }
    }

    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(|s| s.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors().names().contains(&name)
    }

    fn tensors(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("validated in open")
    }

    fn raw(&self, name: &str, dtype: Dtype, rank: usize) -> Result<(Vec<u8>, Vec<usize>), StError> {
        let st = self.tensors();
        let view = st
            .tensor(name)
            .map_err(|_| self.err(format!("tensor `{name}` is missing")))?;
        if view.dtype() != dtype {
            return Err(self.err(format!(
                "tensor `{name}` is {:?}, expected {dtype:?}",
                view.dtype()
            )));
        }
        if view.shape().len() != rank {
            return Err(self.err(format!(
                "tensor `{name}` has shape {:?}, expected {rank} dimensions",
                view.shape()
            )));
        }
        Ok((view.data().to_vec(), view.shape().to_vec()))
    }

    /// An F32 tensor of the given rank, with its shape.
    pub fn f32(&self, name: &str, rank: usize) -> Result<(Vec<f32>, Vec<usize>), StError> {
        let (raw, shape) = self.raw(name, Dtype::F32, rank)?;
        let v = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((v, shape))
    }

    /// An I64 tensor of the given rank, with its shape.
    pub fn i64(&self, name: &str, rank: usize) -> Result<(Vec<i64>, Vec<usize>), StError> {
        let (raw, shape) = self.raw(name, Dtype::I64, rank)?;
        let v = raw
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        Ok((v, shape))
    }

    /// A metadata value parsed as an integer.
    pub fn meta_i64(&self, key: &str) -> Result<i64, StError> {
        let v = self
            .metadata(key)
            .ok_or_else(|| self.err(format!("metadata `{key}` is missing")))?;
        v.trim()
            .parse()
            .map_err(|_| self.err(format!("metadata `{key}` = {v:?} is not an integer")))
    }
}
