//! Qwen3.5's text model (`Qwen3_5TextModel`): Gated DeltaNet layers ("linear attention", a
//! recurrent state per sequence) between full-attention layers with an output gate and partial
//! interleaved MRoPE, a dense MLP in every layer (routed experts and a shared expert in
//! Qwen3.5-MoE), zero-centred norms (stored as 1 + w by the pack).
//! It runs on the same decoder loop as Qwen3-VL's layers, beside them.

pub mod delta_net;
pub mod delta_rule;
pub mod gated_attention;
pub mod layer;
pub mod mtp;

pub use layer::Layer;
