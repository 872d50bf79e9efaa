//! What a decoder is made with, what a step returns, and the deliberate mistakes controls plant.

use compute::ops::rope::RopeLayout;

use crate::kv::KvDtype;

/// Which rows' logits a step returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Logits {
    #[default]
    LastRow,
    AllRows,
}

/// Deliberate mistakes, for controls: tests and probes show that the checks catch each one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ablation {
    /// Use this rotary layout instead of the pack's.
    pub rope_layout: Option<RopeLayout>,
    /// Add DeepStack set l before decoder layer l instead of after it.
    pub deepstack_before_layer: bool,
    /// Add DeepStack to every prompt row (row r takes set row r % image_rows), not only image rows.
    pub deepstack_every_row: bool,
    /// Leave DeepStack out after the sparse (MoE) layers.
    pub deepstack_skip_sparse_layers: bool,
    /// Keep the raw softmax weights of the top-k experts where the pack asks for renormalization.
    pub moe_skip_renormalize: bool,
    /// Run every expert with its gate and up projections swapped.
    pub moe_swap_gate_up: bool,
    /// In a step over several sequences, attend each over the previous sequence's cache (the
    /// first over the last's) instead of its own: a sequence reading another's slots.
    pub attend_other_sequence: bool,
    /// Break routing ties by the lower expert index instead of torch.topk's order.
    pub moe_ties_lower_index: bool,
    /// Qwen3.5-MoE: add the shared expert's output without its sigmoid gate.
    pub moe_skip_shared_gate: bool,
    /// Qwen3.5: the zero-centred norms as plain weights (w instead of 1 + w).
    pub norm_without_one: bool,
    /// Qwen3.5: full attention without its sigmoid output gate.
    pub skip_attention_gate: bool,
    /// Qwen3.5: the DeltaNet conv's history one row behind (the current input never enters it).
    pub conv_state_lags_one_row: bool,
    /// Qwen3.5: the decay g = −exp(A_log)·(a + dt_bias), without the softplus.
    pub decay_without_softplus: bool,
    /// Qwen3.5: rotate every value of each head instead of the first head_dim x
    /// partial_rotary_factor.
    pub rotary_all_dims: bool,
}

#[derive(Clone, Debug)]
pub struct DecoderOptions {
    /// KV cache slots (the longest prompt + generation).
    pub capacity: usize,
    pub kv_dtype: KvDtype,
    /// Keep every layer's output hidden states (for per-layer comparison with a reference).
    pub trace_layers: bool,
    pub ablation: Ablation,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            capacity: 2048,
            kv_dtype: KvDtype::F32,
            trace_layers: false,
            ablation: Ablation::default(),
        }
    }
}
