//! Every refusal of the engine, each naming the file, field or value it is about.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A pack or checkpoint without the chat files the engine needs.
    #[error("{source_name}: has no {asset} — rebuild the pack with `packs build` from a checkpoint that has it")]
    MissingAsset {
        source_name: String,
        asset: &'static str,
    },
    #[error("{path}: cannot read: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{name}: {what}")]
    Asset { name: String, what: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Prompt(String),
    #[error("the prompt is {prompt} tokens, over the context of {context} tokens (raise --ctx or shorten the prompt)")]
    OverContext { prompt: usize, context: usize },
    #[error("the logits hold {value} at token id {token} (decode step {step}): refusing to sample from non-finite logits")]
    NonFiniteLogits {
        value: f32,
        token: usize,
        step: usize,
    },
    #[error("sampling: {0}")]
    Sampling(String),
    /// A response format or tool grammar the constraint parser refuses, or a constraint that
    /// failed while decoding.
    #[error("constraint: {0}")]
    Grammar(String),
    #[error("image {name}: {what}")]
    Image { name: String, what: String },
    /// Decoding or preprocessing refused the picture (its message names the file).
    #[error("image {0}")]
    Preprocess(#[from] vision::preprocess::PreprocessError),
    #[error(transparent)]
    Decoder(#[from] decoder::DecoderError),
    #[error(transparent)]
    Runtime(#[from] compute::RuntimeError),
    #[error(transparent)]
    Pack(#[from] packs::PackError),
    #[error(transparent)]
    Vision(#[from] vision::tower::VisionError),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
