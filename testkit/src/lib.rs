//! What the tests, the probes and the C ABI tests share to hold the decoder to transformers, as
//! llm.c's reference tests do: Python (`tools/`) writes a prompt's inputs and transformers' logits
//! as small safetensors files; this crate reads them ([`PromptInputs`], [`Reference`]), replays the
//! prompt through the decoder ([`replay`]) and compares row by row ([`compare`]).

pub mod compare;
pub mod inputs;
pub mod reference;
pub mod replay;

pub use inputs::PromptInputs;
pub use reference::Reference;
pub use replay::{replay, Replay};
