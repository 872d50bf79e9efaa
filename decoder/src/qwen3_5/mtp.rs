//! Qwen3.5's multi-token-prediction head (`mtp.*`, one layer; vLLM's
//! `Qwen3_5MultiTokenPredictor`), a draft source for verified windows. For row j it reads the
//! model's final (normed) hidden state of row j and the embedding fed at row j + 1:
//! `fc([norm_e(embedding) | norm_h(hidden)])`, one full-attention layer over its own one-layer
//! cache at row j's positions (its MLP dense, or routed with a shared expert in a Qwen3.5-MoE
//! pack, as the model's layers), `norm`, then the model's head: the logits of the token after the
//! next. Its output rows chain: a second draft reads the first draft's embedding and the head's
//! own output row.

use compute::ops::norm::rmsnorm;
use compute::ops::rows::{for_rows, grow};
use compute::{LinearHandle, PackLinear, Runtime};
use packs::names::mtp;
use packs::{NormIndex, Pack};

use super::layer::{norm_weights, Layer};
use crate::kv::KvCache;
use crate::step::{Step, StepState};
use crate::DecoderError;

pub struct Mtp {
    pub fc: LinearHandle,
    pub norm_embedding: NormIndex,
    pub norm_hidden: NormIndex,
    pub norm: NormIndex,
    pub layer: Layer,
}

impl Mtp {
    /// The pack's MTP head, if it carries one.
    pub fn resolve(pack: &Pack, runtime: &Runtime) -> Result<Option<Mtp>, DecoderError> {
        let sem = pack.semantics();
        if !sem.delta_net.as_ref().is_some_and(|d| d.mtp) {
            return Ok(None);
        }
        let fc = runtime.register(pack, &[PackLinear::Table(pack.linear_index(mtp::FC)?)])?[0];
        Ok(Some(Mtp {
            fc,
            norm_embedding: pack.norm_index(mtp::NORM_EMBEDDING)?,
            norm_hidden: pack.norm_index(mtp::NORM_HIDDEN)?,
            norm: pack.norm_index(mtp::NORM)?,
            layer: Layer::resolve_mtp(pack, runtime)?,
        }))
    }

    /// The head over the step's rows: `hidden` and `embeds` (`rows x hidden` each, the
    /// segments' rows one after another) in, its output rows (after `norm`, before the model's
    /// head) into `out`; each segment's K/V to its cache in `caches`.
    pub(crate) fn forward(
        &self,
        step: &Step<'_>,
        caches: &mut [&mut KvCache],
        st: &mut StepState,
        hidden: &[f32],
        embeds: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<(), DecoderError> {
        let (pool, rows, h, eps) = (step.pool, step.rows, step.hidden, step.eps);
        // The routes trace holds the last step's routing: this step's, the MTP layer's alone.
        st.routes_trace.clear();
        let (w_e, w_h) = (
            norm_weights(step, self.norm_embedding),
            norm_weights(step, self.norm_hidden),
        );
        // [norm_e(embedding) | norm_h(hidden)] per row (vLLM's torch.cat order).
        let s = &mut st.scratch;
        let cat = grow(&mut s.shared, rows * 2 * h);
        for_rows(pool, cat, 2 * h, |r, row| {
            let (e, hh) = row.split_at_mut(h);
            rmsnorm(&embeds[r * h..(r + 1) * h], &w_e, eps, e);
            rmsnorm(&hidden[r * h..(r + 1) * h], &w_h, eps, hh);
        });
        let x = grow(out, rows * h);
        step.runtime
            .gemm(step.pack, self.fc, &s.shared[..rows * 2 * h], rows, x)?;
        self.layer.forward(step, caches, st, x)?;
        let w = norm_weights(step, self.norm);
        for_rows(pool, x, h, |_, row| {
            let copy = row.to_vec();
            rmsnorm(&copy, &w, eps, row);
        });
        Ok(())
    }
}
