//! The error of writing a pack (`build`: from a checkpoint, `random`: from generated values),
//! raised by the modules that do the writing (`build`, `encode`, `random`). It has a module of its
//! own so that they share it without depending on each other for it.

use std::path::PathBuf;

use crate::hf::HfError;
use crate::semantics::SemanticsError;
use crate::shapes::RandomShape;
use crate::writer::WriteError;

/// Why a pack could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Checkpoint(#[from] HfError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("invalid semantics: {0}")]
    Semantics(#[from] SemanticsError),
    #[error("tensor {tensor}: row {row} holds a non-finite value ({value})")]
    NonFinite {
        tensor: String,
        row: usize,
        value: f32,
    },
    #[error("{path}: tensor {tensor}: row {row} holds a non-finite value ({value}); weights must be finite")]
    NonFiniteWeight {
        path: PathBuf,
        tensor: String,
        row: usize,
        value: f32,
    },
    #[error("{path}: {what}")]
    Asset { path: PathBuf, what: String },
    #[error("unknown random shape {0:?} (expected one of: {names})", names = RandomShape::NAMES.join(", "))]
    UnknownShape(String),
}
