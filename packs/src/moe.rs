//! Mixture of experts (Qwen3-VL-MoE, `qwen3_vl_moe`): the names of the router and the experts, and
//! how the checkpoint's fused expert tensors map onto ordinary linears. The MoE facts a pack records
//! are [`MoeSemantics`], which lives with the other semantics (`crate::semantics`) and is
//! re-exported here.
//!
//! transformers 5.x keeps a layer's experts in two 3-D tensors, `mlp.experts.gate_up_proj`
//! `[experts, 2 * moe_intermediate, hidden]` (each expert's gate rows, then its up rows) and
//! `mlp.experts.down_proj` `[experts, hidden, moe_intermediate]`; the hub checkpoints written by
//! 4.57 store them transposed (`[experts, hidden, 2 * moe_intermediate]`, `[experts,
//! moe_intermediate, hidden]`). transformers loads either (`conversion_mapping.py`: `Transpose(1, 2,
//! check_dims=True)`: a tensor already of the 5.x shape is taken as it is, any other is transposed).
//! A pack stores every expert's gate, up and down as ordinary linears `[N, K]`, so the dense layouts
//! and kernels apply to them unchanged, and each expert's three linears sit together in the file.

use crate::names;
pub use crate::semantics::MoeSemantics;

/// One of an expert's three linears.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertProj {
    Gate,
    Up,
    Down,
}

impl ExpertProj {
    pub const ALL: [ExpertProj; 3] = [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down];

    fn file_name(self) -> &'static str {
        match self {
            ExpertProj::Gate => "gate_proj",
            ExpertProj::Up => "up_proj",
            ExpertProj::Down => "down_proj",
        }
    }
}

/// Where an expert's linear comes from: expert `expert`'s part of the layer's fused tensor
/// (`WeightPlan::source` names that tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertSlice {
    pub expert: usize,
    pub proj: ExpertProj,
}

/// How a checkpoint stores a layer's fused expert tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedOrientation {
    /// transformers 5.x: `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`: each expert's linear
    /// is a contiguous `[N, K]` block.
    OutIn,
    /// The hub / transformers 4.57: `gate_up_proj [E, H, 2I]`, `down_proj [E, I, H]`: each expert's
    /// linear is the transpose of a block.
    InOut,
}

impl FusedOrientation {
    /// Which orientation a fused tensor of `shape` is, by transformers' rule: the 5.x shape as it
    /// is, else its transpose; `None` for any other shape. `n` and `k` are one expert's linear
    /// (`[2I, H]` for gate_up, `[H, I]` for down).
    pub fn of(shape: &[usize], experts: usize, n: usize, k: usize) -> Option<FusedOrientation> {
        if shape == [experts, n, k] {
            Some(FusedOrientation::OutIn)
        } else if shape == [experts, k, n] {
            Some(FusedOrientation::InOut)
        } else {
            None
        }
    }
}

/// `model.language_model.layers.{layer}.mlp.gate.weight`: the router `[experts, hidden]`, f32 in
/// every pack.
pub fn router(layer: usize) -> String {
    router_in(&names::layer_prefix(layer))
}

/// `...layers.{layer}.mlp.experts.gate_up_proj`: the checkpoint's fused gate/up tensor.
pub fn fused_gate_up(layer: usize) -> String {
    fused_gate_up_in(&names::layer_prefix(layer))
}

/// `...layers.{layer}.mlp.experts.down_proj`: the checkpoint's fused down tensor.
pub fn fused_down(layer: usize) -> String {
    fused_down_in(&names::layer_prefix(layer))
}

/// `...layers.{layer}.mlp.shared_expert.gate_proj.weight` (up_proj, down_proj): Qwen3.5-MoE's
/// shared expert, which every row runs beside its routed ones.
pub fn shared_expert(layer: usize, p: ExpertProj) -> String {
    shared_expert_in(&names::layer_prefix(layer), p)
}

/// `...layers.{layer}.mlp.shared_expert_gate.weight`: `[1, hidden]`, the shared expert's output
/// is scaled by sigmoid of this row's dot product.
pub fn shared_expert_gate(layer: usize) -> String {
    shared_expert_gate_in(&names::layer_prefix(layer))
}

/// `...layers.{layer}.mlp.experts.{expert}.gate_proj.weight` (up_proj, down_proj): one expert's
/// linear in a pack (the per-expert name the original Qwen MoE checkpoints used).
pub fn expert(layer: usize, expert: usize, p: ExpertProj) -> String {
    expert_in(&names::layer_prefix(layer), expert, p)
}

// The same names under any layer's prefix: a decoder layer's (`names::layer_prefix`) or the MTP
// head's layer (`names::mtp::LAYER`), whose MLP is routed too in a MoE checkpoint.

/// `{prefix}.mlp.gate.weight`: the router.
pub fn router_in(prefix: &str) -> String {
    format!("{prefix}.mlp.gate.weight")
}

/// `{prefix}.mlp.experts.gate_up_proj`.
pub fn fused_gate_up_in(prefix: &str) -> String {
    format!("{prefix}.mlp.experts.gate_up_proj")
}

/// `{prefix}.mlp.experts.down_proj`.
pub fn fused_down_in(prefix: &str) -> String {
    format!("{prefix}.mlp.experts.down_proj")
}

/// `{prefix}.mlp.shared_expert.gate_proj.weight` (up_proj, down_proj).
pub fn shared_expert_in(prefix: &str, p: ExpertProj) -> String {
    format!("{prefix}.mlp.shared_expert.{}.weight", p.file_name())
}

/// `{prefix}.mlp.shared_expert_gate.weight`.
pub fn shared_expert_gate_in(prefix: &str) -> String {
    format!("{prefix}.mlp.shared_expert_gate.weight")
}

/// `{prefix}.mlp.experts.{expert}.gate_proj.weight` (up_proj, down_proj).
pub fn expert_in(prefix: &str, expert: usize, p: ExpertProj) -> String {
    format!("{prefix}.mlp.experts.{expert}.{}.weight", p.file_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_the_sparse_rule() {
        assert_eq!(router(2), "model.language_model.layers.2.mlp.gate.weight");
        assert_eq!(
            fused_gate_up(0),
            "model.language_model.layers.0.mlp.experts.gate_up_proj"
        );
        assert_eq!(
            expert(1, 7, ExpertProj::Down),
            "model.language_model.layers.1.mlp.experts.7.down_proj.weight"
        );
        // The MTP head's layer: the hub's names under its prefix.
        assert_eq!(
            expert_in(names::mtp::LAYER, 3, ExpertProj::Up),
            "mtp.layers.0.mlp.experts.3.up_proj.weight"
        );
        assert_eq!(
            fused_down_in(names::mtp::LAYER),
            "mtp.layers.0.mlp.experts.down_proj"
        );
        assert_eq!(
            shared_expert_gate_in(names::mtp::LAYER),
            "mtp.layers.0.mlp.shared_expert_gate.weight"
        );
        assert_eq!(MoeSemantics::sparse_layers_of(4, 8, 1, &[1]), [0, 2, 3]);
        assert_eq!(MoeSemantics::sparse_layers_of(4, 8, 2, &[]), [1, 3]);
        assert!(MoeSemantics::sparse_layers_of(4, 0, 1, &[]).is_empty());
    }

    #[test]
    fn orientation_follows_transformers_rule() {
        // gate_up of 4 experts, I = 16, H = 64: 5.x [4, 32, 64], hub [4, 64, 32].
        assert_eq!(
            FusedOrientation::of(&[4, 32, 64], 4, 32, 64),
            Some(FusedOrientation::OutIn)
        );
        assert_eq!(
            FusedOrientation::of(&[4, 64, 32], 4, 32, 64),
            Some(FusedOrientation::InOut)
        );
        // Square: the 5.x reading wins, as transformers' check_dims does.
        assert_eq!(
            FusedOrientation::of(&[4, 64, 64], 4, 64, 64),
            Some(FusedOrientation::OutIn)
        );
        assert_eq!(FusedOrientation::of(&[4, 32, 63], 4, 32, 64), None);
        assert_eq!(FusedOrientation::of(&[5, 32, 64], 4, 32, 64), None);
    }
}
