//! Qwen3-VL's text model (`Qwen3VLTextModel`, `Qwen3VLMoeTextModel`): GQA attention with q/k
//! norms and interleaved MRoPE, a dense or routed MLP per layer, DeepStack after the first layers.
//! Another family's layers sit in a folder of their own beside this one, on the same decoder loop.

pub mod deepstack;
pub mod layer;
pub mod moe;

pub use layer::Layer;
