//! One Qwen3.5 decoder layer (`Qwen3_5DecoderLayer`): input norm, the token mixer (Gated
//! DeltaNet or gated full attention), residual; post-attention norm, the dense MLP, residual.

use std::borrow::Cow;

use compute::ops::norm::rmsnorm;
use compute::ops::rows::{for_rows, grow};
use compute::{PackLinear, Runtime};
use packs::names::{self, Norm, Proj};
use packs::{NormIndex, Pack};

use super::delta_net::DeltaNet;
use super::gated_attention::GatedAttention;
use crate::kv::KvCache;
use crate::qwen3_vl::layer::{dense_mlp_block, GatedMlp};
use crate::step::{Step, StepState};
use crate::DecoderError;

/// What mixes the rows across positions.
pub enum Mixer {
    /// `linear_attn`: its index among the linear layers (its part of a sequence's state).
    DeltaNet { net: DeltaNet, index: usize },
    /// `self_attn`: its index among the full layers (its part of a sequence's KV cache).
    Attention {
        attn: GatedAttention,
        kv_layer: usize,
    },
}

pub struct Layer {
    pub input_norm: NormIndex,
    pub post_attention_norm: NormIndex,
    pub mixer: Mixer,
    pub mlp: GatedMlp,
}

impl Layer {
    /// Layer `l` of `pack`, its weights resolved and registered once.
    pub fn resolve(pack: &Pack, runtime: &Runtime, l: usize) -> Result<Layer, DecoderError> {
        let sem = pack.semantics();
        let d = sem.delta_net.as_ref().ok_or_else(|| {
            DecoderError::Options(format!(
                "{}: a qwen3_5 layer in a pack without its layer kinds",
                pack.path().display()
            ))
        })?;
        let mixer = if d.is_linear(l) {
            let index = d.linear_layers.binary_search(&l).unwrap_or(0);
            Mixer::DeltaNet {
                net: DeltaNet::resolve(pack, runtime, l)?,
                index,
            }
        } else {
            let kv_layer = (0..l).filter(|&j| !d.is_linear(j)).count();
            Mixer::Attention {
                attn: GatedAttention::resolve(pack, runtime, l)?,
                kv_layer,
            }
        };
        let proj = |p: Proj| -> Result<PackLinear, DecoderError> {
            Ok(PackLinear::Table(pack.linear_index(&names::proj(l, p))?))
        };
        let h = runtime.register(
            pack,
            &[proj(Proj::Gate)?, proj(Proj::Up)?, proj(Proj::Down)?],
        )?;
        let norm = |n: Norm| pack.norm_index(&names::norm(l, n));
        Ok(Layer {
            input_norm: norm(Norm::Input)?,
            post_attention_norm: norm(Norm::PostAttention)?,
            mixer,
            mlp: GatedMlp {
                gate: h[0],
                up: h[1],
                down: h[2],
            },
        })
    }

    pub fn is_linear(&self) -> bool {
        matches!(self.mixer, Mixer::DeltaNet { .. })
    }

    /// The layer over the step's rows `x` (`rows x hidden`), in place.
    pub(crate) fn forward(
        &self,
        step: &Step<'_>,
        caches: &mut [&mut KvCache],
        st: &mut StepState,
        x: &mut [f32],
    ) -> Result<(), DecoderError> {
        let (pool, rows, hidden, eps) = (step.pool, step.rows, step.hidden, step.eps);
        let w_in = norm_weights(step, self.input_norm);
        let xn = grow(&mut st.scratch.xn, rows * hidden);
        for_rows(pool, xn, hidden, |r, nr| {
            rmsnorm(&x[r * hidden..(r + 1) * hidden], &w_in, eps, nr)
        });
        match &self.mixer {
            Mixer::DeltaNet { net, index } => net.forward(*index, step, caches, st, x)?,
            Mixer::Attention { attn, kv_layer } => attn.forward(*kv_layer, step, caches, st, x)?,
        }
        let w_post = norm_weights(step, self.post_attention_norm);
        dense_mlp_block(step, st, &w_post, self.mlp, x)
    }
}

/// A zero-centred norm's weights as the pack stores them (1 + w), or w alone under the control
/// `norm_without_one`.
pub(crate) fn norm_weights<'a>(step: &Step<'a>, at: NormIndex) -> Cow<'a, [f32]> {
    let w = step.pack.norm_at(at);
    if step.ablation.norm_without_one {
        Cow::Owned(w.iter().map(|w| w - 1.0).collect())
    } else {
        Cow::Borrowed(w)
    }
}
