//! Mixture of experts (Qwen3-VL-MoE, `qwen3_vl_moe`): the facts a pack records, the names of the
//! router and the experts, and how the checkpoint's fused expert tensors map onto ordinary linears.
//!
//! transformers 5.x keeps a layer's experts in two 3-D tensors, `mlp.experts.gate_up_proj`
//! `[experts, 2 * moe_intermediate, hidden]` (each expert's gate rows, then its up rows) and
//! `mlp.experts.down_proj` `[experts, hidden, moe_intermediate]`; the hub checkpoints written by
//! 4.57 store them transposed (`[experts, hidden, 2 * moe_intermediate]`, `[experts,
//! moe_intermediate, hidden]`). transformers loads either (`conversion_mapping.py`: `Transpose(1, 2,
//! check_dims=True)`: a tensor already of the 5.x shape is taken as it is, any other is transposed).
//! A pack stores every expert's gate, up and down as ordinary linears `[N, K]`, so the dense layouts
//! and kernels apply to them unchanged, and each expert's three linears sit together in the file.

use serde::{Deserialize, Serialize};

use crate::names;
use crate::quant::{QuantKind, Q4_GROUP};
use crate::semantics::SemanticsError;

/// The MoE facts of a pack (`text_config` of a `qwen3_vl_moe` checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSemantics {
    /// Experts per sparse layer (`num_experts`, spelled `num_local_experts` by 5.x).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's intermediate size (`moe_intermediate_size`).
    pub moe_intermediate_size: usize,
    /// The top-k routing weights are divided by their sum. transformers' Qwen3-VL-MoE always does
    /// (it has no such option); the field says what the forward does.
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step` as the config states it (layer l is sparse when (l + 1) % step == 0).
    pub decoder_sparse_step: usize,
    /// `mlp_only_layers` as the config states it (dense whatever the step says).
    pub mlp_only_layers: Vec<usize>,
    /// The layers with a router and experts, ascending (derived from the two fields above).
    pub sparse_layers: Vec<usize>,
}

impl MoeSemantics {
    /// transformers' rule (`Qwen3VLMoeTextDecoderLayer`): layer l is sparse unless it is listed in
    /// `mlp_only_layers`, when `num_experts > 0` and `(l + 1) % decoder_sparse_step == 0`.
    pub fn sparse_layers_of(
        num_layers: usize,
        num_experts: usize,
        decoder_sparse_step: usize,
        mlp_only_layers: &[usize],
    ) -> Vec<usize> {
        if num_experts == 0 || decoder_sparse_step == 0 {
            return Vec::new();
        }
        (0..num_layers)
            .filter(|l| !mlp_only_layers.contains(l) && (l + 1) % decoder_sparse_step == 0)
            .collect()
    }

    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.binary_search(&layer).is_ok()
    }

    /// Refuses, by field, what the forward could not run or would run wrongly.
    pub fn validate(&self, num_layers: usize, quant: QuantKind) -> Result<(), SemanticsError> {
        let err = |what: String| Err(SemanticsError::Moe(what));
        for (field, value) in [
            ("num_experts", self.num_experts),
            ("top_k (num_experts_per_tok)", self.top_k),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ] {
            if value == 0 {
                return err(format!("{field} must be > 0"));
            }
            if value > 1 << 20 {
                return err(format!("{field} = {value} is too large"));
            }
        }
        if self.top_k > self.num_experts {
            return err(format!(
                "top_k (num_experts_per_tok) {} is more than num_experts {}",
                self.top_k, self.num_experts
            ));
        }
        if let Some(&l) = self.mlp_only_layers.iter().find(|&&l| l >= num_layers) {
            return err(format!(
                "mlp_only_layers holds {l}, past the last layer {}",
                num_layers - 1
            ));
        }
        let derived = Self::sparse_layers_of(
            num_layers,
            self.num_experts,
            self.decoder_sparse_step,
            &self.mlp_only_layers,
        );
        if self.sparse_layers != derived {
            return err(format!(
                "sparse_layers {:?} disagree with decoder_sparse_step {} and mlp_only_layers {:?} ({derived:?})",
                self.sparse_layers, self.decoder_sparse_step, self.mlp_only_layers
            ));
        }
        if quant == QuantKind::Q4 && self.moe_intermediate_size % Q4_GROUP != 0 {
            return err(format!(
                "q4 needs moe_intermediate_size = {} to be a multiple of {Q4_GROUP} (the K of each expert's down projection)",
                self.moe_intermediate_size
            ));
        }
        Ok(())
    }
}

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
    format!("{}.mlp.gate.weight", names::layer_prefix(layer))
}

/// `...layers.{layer}.mlp.experts.gate_up_proj`: the checkpoint's fused gate/up tensor.
pub fn fused_gate_up(layer: usize) -> String {
    format!("{}.mlp.experts.gate_up_proj", names::layer_prefix(layer))
}

/// `...layers.{layer}.mlp.experts.down_proj`: the checkpoint's fused down tensor.
pub fn fused_down(layer: usize) -> String {
    format!("{}.mlp.experts.down_proj", names::layer_prefix(layer))
}

/// `...layers.{layer}.mlp.experts.{expert}.gate_proj.weight` (up_proj, down_proj): one expert's
/// linear in a pack (the per-expert name the original Qwen MoE checkpoints used).
pub fn expert(layer: usize, expert: usize, p: ExpertProj) -> String {
    format!(
        "{}.mlp.experts.{expert}.{}.weight",
        names::layer_prefix(layer),
        p.file_name()
    )
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
