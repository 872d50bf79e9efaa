//! Qwen3.5's full attention (`Qwen3_5Attention`): `q_proj` gives each head its query and a gate
//! (head_dim values each, query first); q/k RMSNorm per head; rotary on the first `rotary_dim`
//! values of each head only; attention over the sequence's cache; the output times
//! sigmoid(gate) before `o_proj`.

use compute::ops::mathf::sigmoid;
use compute::ops::norm::rmsnorm_inplace;
use compute::ops::rope::rotate_half;
use compute::ops::rows::{add_rows, for_rows, grow};
use compute::{LinearHandle, PackLinear, Runtime};
use packs::names::{self, Norm, Proj};
use packs::{NormIndex, Pack};

use super::layer::norm_weights;
use crate::kv::KvCache;
use crate::qwen3_vl::layer::write_and_attend;
use crate::step::{Step, StepState};
use crate::DecoderError;

pub struct GatedAttention {
    /// `2 x heads x head_dim` rows: per head, the query then the gate.
    pub q_gate: LinearHandle,
    pub k: LinearHandle,
    pub v: LinearHandle,
    pub o: LinearHandle,
    pub q_norm: NormIndex,
    pub k_norm: NormIndex,
}

impl GatedAttention {
    /// The attention of the layer whose tensors start with `prefix`.
    pub fn resolve(
        pack: &Pack,
        runtime: &Runtime,
        prefix: &str,
    ) -> Result<GatedAttention, DecoderError> {
        let proj = |p: Proj| -> Result<PackLinear, DecoderError> {
            Ok(PackLinear::Table(
                pack.linear_index(&names::proj_in(prefix, p))?,
            ))
        };
        let linears = [
            proj(Proj::Q)?,
            proj(Proj::K)?,
            proj(Proj::V)?,
            proj(Proj::O)?,
        ];
        let norm = |n: Norm| pack.norm_index(&names::norm_in(prefix, n));
        let (q_norm, k_norm) = (norm(Norm::QNorm)?, norm(Norm::KNorm)?);
        let h = runtime.register(pack, &linears)?;
        Ok(GatedAttention {
            q_gate: h[0],
            k: h[1],
            v: h[2],
            o: h[3],
            q_norm,
            k_norm,
        })
    }

    /// The block on the normalized rows `scratch.xn`; adds its output to `x`.
    pub(crate) fn forward(
        &self,
        kv_layer: usize,
        step: &Step<'_>,
        caches: &mut [&mut KvCache],
        st: &mut StepState,
        x: &mut [f32],
    ) -> Result<(), DecoderError> {
        let (pack, pool, rows, eps, hidden) =
            (step.pack, step.pool, step.rows, step.eps, step.hidden);
        let shape = step.shape;
        let d = shape.head_dim;
        let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
        let (rot, half) = (step.rotary_dim, step.rotary_dim / 2);
        let s = &mut st.scratch;
        step.runtime.gemm_group(
            pack,
            [self.q_gate, self.k, self.v],
            &s.xn[..rows * hidden],
            rows,
            [
                grow(&mut s.gate, rows * 2 * q_dim),
                grow(&mut s.k, rows * kv_dim),
                grow(&mut s.v, rows * kv_dim),
            ],
        )?;
        let (w_q, w_k) = (
            norm_weights(step, self.q_norm),
            norm_weights(step, self.k_norm),
        );
        // Split each row's [query | gate] heads: queries to `q`, gates stay in `gate`.
        let q = grow(&mut s.q, rows * q_dim);
        for (qr, gr) in q
            .chunks_exact_mut(q_dim)
            .zip(s.gate.chunks_exact(2 * q_dim))
        {
            for (qh, gh) in qr.chunks_exact_mut(d).zip(gr.chunks_exact(2 * d)) {
                qh.copy_from_slice(&gh[..d]);
            }
        }
        let (cos, sin) = (&s.cos, &s.sin);
        let norm_rotate = |w: &[f32], r: usize, row: &mut [f32]| {
            let (cos, sin) = (
                &cos[r * half..(r + 1) * half],
                &sin[r * half..(r + 1) * half],
            );
            for head in row.chunks_exact_mut(d) {
                rmsnorm_inplace(head, w, eps);
                rotate_half(&mut head[..rot], cos, sin);
            }
        };
        for_rows(pool, &mut s.q[..rows * q_dim], q_dim, |r, row| {
            norm_rotate(&w_q, r, row)
        });
        for_rows(pool, &mut s.k[..rows * kv_dim], kv_dim, |r, row| {
            norm_rotate(&w_k, r, row)
        });
        let attn = grow(&mut s.attn, rows * q_dim);
        st.attention_time.time(|| {
            write_and_attend(step, kv_layer, caches, &s.q, &s.k, &s.v, attn);
        });
        if !step.ablation.skip_attention_gate {
            let gate = &s.gate;
            for_rows(pool, &mut s.attn[..rows * q_dim], q_dim, |r, row| {
                let g = &gate[r * 2 * q_dim..(r + 1) * 2 * q_dim];
                for (oh, gh) in row.chunks_exact_mut(d).zip(g.chunks_exact(2 * d)) {
                    for (o, &z) in oh.iter_mut().zip(&gh[d..]) {
                        *o *= sigmoid(z);
                    }
                }
            });
        }
        step.runtime.gemm(
            pack,
            self.o,
            &s.attn[..rows * q_dim],
            rows,
            grow(&mut s.proj, rows * hidden),
        )?;
        add_rows(pool, x, &s.proj, hidden);
        Ok(())
    }
}
