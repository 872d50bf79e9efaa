//! The text decoders, on the `compute` runtime.
//!
//! [`Decoder`] runs one pass per step and reads like the model card — embed, the layers, final
//! norm, head — with the mechanics (kernels, cache, backends) one call away. What every family
//! shares sits at the top (`attention`, `kv`, the step's inputs); a family's layers sit in its
//! folder (`qwen3_vl/`). Cache slot and rotary position are separate numbers everywhere.

pub mod attention;
mod decoder;
mod error;
pub mod hybrid;
pub mod kv;
mod options;
pub mod qwen3_5;
pub mod qwen3_vl;
pub mod recurrent;
mod step;

pub use decoder::{decode_step, Decoder, MtpSequenceStep, SequenceLogits, SequenceStep, StepInput};
pub use error::DecoderError;
pub use hybrid::HybridInputs;
pub use kv::{KvCache, KvDtype};
pub use options::{Ablation, DecoderOptions, Logits};
