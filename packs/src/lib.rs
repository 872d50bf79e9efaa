//! Packs: Hugging Face Qwen3-VL checkpoints turned into one memory-mapped file, and the quant
//! layouts (`quant`) that host kernels and device designs share. The file format is described in
//! FORMAT.md.

#[cfg(target_endian = "big")]
compile_error!("packs are little-endian byte images; big-endian targets are not supported");

pub mod build;
pub mod container;
mod encode;
mod error;
pub mod hf;
pub mod image_processor;
pub mod layout;
pub mod moe;
pub mod names;
pub mod pack;
pub mod quant;
pub mod random;
pub mod semantics;
mod shapes;
pub mod stfile;
pub mod writer;

pub use build::{build_from_hf, BuildOptions, BuildReport};
pub use container::Dtype;
pub use encode::first_non_finite;
pub use error::BuildError;
pub use pack::{
    Embedding, Linear, LinearData, LinearIndex, NormIndex, Pack, PackError, TensorInfo, TensorKind,
};
pub use quant::{QuantError, QuantKind};
pub use random::{write_random, RandomShape};
pub use semantics::{Semantics, SemanticsError};
pub use writer::{PackWriter, WriteError, FORMAT};
