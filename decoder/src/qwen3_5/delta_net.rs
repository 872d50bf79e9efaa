//! Qwen3.5's Gated DeltaNet (`Qwen3_5GatedDeltaNet`), the recurrent form transformers decodes
//! with (`torch_recurrent_gated_delta_rule`), row after row for prompts too:
//!
//! 1. `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` on the normalized rows (one GEMM group);
//! 2. a depthwise causal conv over [q | k | v] (taps oldest first, the sequence's last
//!    `kernel - 1` inputs as its left context), then SiLU;
//! 3. q and k L2-normalized per key head, q scaled by 1/√key_head_dim; β = sigmoid(b);
//!    g = −exp(A_log)·softplus(a + dt_bias);
//! 4. per value head (key head `h / (value_heads / key_heads)`), the gated delta rule on its
//!    key x value state S: S ← e^g·S; δ = β·(v − kᵀS); S ← S + k⊗δ; o = qᵀS;
//! 5. o RMS-normalized per value head, times the norm weight and silu(z); `out_proj`.
//!
//! transformers prefills with the chunked form of step 4; the two are the same sums in another
//! order (3.2e-5 max |Δlogit| on the q35-odd fixture, `tools/hf_reference.py`).

use compute::ops::norm::rmsnorm_inplace;
use compute::ops::rows::{add_rows, for_rows, grow};
use compute::{LinearHandle, PackLinear, Runtime};
use packs::names::{self, DeltaNetPart};
use packs::semantics::DeltaNetSemantics;
use packs::Pack;
use rayon::prelude::*;

use crate::kv::KvCache;
use crate::step::{Step, StepState};
use crate::DecoderError;

/// One DeltaNet layer's weights: linears registered with the runtime, the rest read from the pack.
pub struct DeltaNet {
    pub qkv: LinearHandle,
    pub z: LinearHandle,
    pub b: LinearHandle,
    pub a: LinearHandle,
    pub out: LinearHandle,
    /// `conv_dim x kernel`, taps oldest first.
    pub conv: Vec<f32>,
    /// −exp(A_log) per value head (computed once: it is a constant of the layer).
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// The gated RMSNorm's weight (`value_head_dim`).
    pub norm: Vec<f32>,
    pub geometry: DeltaNetSemantics,
}

impl DeltaNet {
    pub fn resolve(pack: &Pack, runtime: &Runtime, l: usize) -> Result<DeltaNet, DecoderError> {
        let sem = pack.semantics();
        let Some(d) = sem.delta_net.clone() else {
            return Err(DecoderError::Options(format!(
                "{}: layer {l} is a DeltaNet layer in a pack without its geometry",
                pack.path().display()
            )));
        };
        let name = |p: DeltaNetPart| names::delta_net(l, p);
        let linear = |p: DeltaNetPart| -> Result<PackLinear, DecoderError> {
            Ok(PackLinear::Table(pack.linear_index(&name(p))?))
        };
        let linears = [
            linear(DeltaNetPart::InProjQkv)?,
            linear(DeltaNetPart::InProjZ)?,
            linear(DeltaNetPart::InProjB)?,
            linear(DeltaNetPart::InProjA)?,
            linear(DeltaNetPart::OutProj)?,
        ];
        let param = |p: DeltaNetPart| -> Result<Vec<f32>, DecoderError> {
            Ok(pack.f32_tensor(&name(p))?.to_vec())
        };
        let conv = param(DeltaNetPart::Conv)?;
        // transformers: `-self.A_log.float().exp()`.
        let neg_a = param(DeltaNetPart::ALog)?
            .iter()
            .map(|a| -a.exp())
            .collect();
        let dt_bias = param(DeltaNetPart::DtBias)?;
        let norm = param(DeltaNetPart::Norm)?;
        let h = runtime.register(pack, &linears)?;
        Ok(DeltaNet {
            qkv: h[0],
            z: h[1],
            b: h[2],
            a: h[3],
            out: h[4],
            conv,
            neg_a,
            dt_bias,
            norm,
            geometry: d,
        })
    }

    /// The mixer on the normalized rows `scratch.xn`; each segment's state is its cache's
    /// recurrent state, linear layer `index`; adds the output to `x`.
    pub(crate) fn forward(
        &self,
        index: usize,
        step: &Step<'_>,
        caches: &mut [&mut KvCache],
        st: &mut StepState,
        x: &mut [f32],
    ) -> Result<(), DecoderError> {
        let g = &self.geometry;
        let (pack, pool, rows, hidden, eps) =
            (step.pack, step.pool, step.rows, step.hidden, step.eps);
        let (conv_dim, key_dim, value_dim, nv) =
            (g.conv_dim(), g.key_dim(), g.value_dim(), g.num_value_heads);
        let s = &mut st.scratch;
        step.runtime.gemm_group(
            pack,
            [self.qkv, self.z, self.b, self.a],
            &s.xn[..rows * hidden],
            rows,
            [
                grow(&mut s.q, rows * conv_dim),
                grow(&mut s.gate, rows * value_dim),
                grow(&mut s.k, rows * nv),
                grow(&mut s.v, rows * nv),
            ],
        )?;
        let (mixed, z) = (&mut s.q[..rows * conv_dim], &s.gate[..rows * value_dim]);
        let (beta, decay) = (&mut s.k[..rows * nv], &mut s.v[..rows * nv]);
        let core = grow(&mut s.attn, rows * value_dim);
        for (seg, cache) in step.segments.iter().zip(caches.iter_mut()) {
            let Some(state) = cache.recurrent.as_mut() else {
                return Err(DecoderError::Options(
                    "a Qwen3.5 sequence needs a cache with a recurrent state: make it with \
                     Decoder::new_cache"
                        .into(),
                ));
            };
            let (layer, mut kept) = state.layer_views(index);
            let (conv_state, delta_state) = layer.split_at_mut((g.conv_kernel - 1) * conv_dim);
            let seg_mixed = &mut mixed[seg.row0 * conv_dim..(seg.row0 + seg.rows) * conv_dim];
            for (r, row) in seg_mixed.chunks_exact_mut(conv_dim).enumerate() {
                conv_row(
                    &self.conv,
                    g.conv_kernel,
                    conv_state,
                    row,
                    step.ablation.conv_state_lags_one_row,
                );
                if let Some(k) = kept.get_mut(r) {
                    k[..conv_state.len()].copy_from_slice(conv_state);
                }
            }
            // q, k normalized and scaled; β and g per value head.
            let seg_beta = &mut beta[seg.row0 * nv..(seg.row0 + seg.rows) * nv];
            let seg_decay = &mut decay[seg.row0 * nv..(seg.row0 + seg.rows) * nv];
            for r in 0..seg.rows {
                let row = &mut seg_mixed[r * conv_dim..(r + 1) * conv_dim];
                let (q, rest) = row.split_at_mut(key_dim);
                let k = &mut rest[..key_dim];
                let scale = (g.key_head_dim as f32).sqrt();
                for (qh, kh) in q
                    .chunks_exact_mut(g.key_head_dim)
                    .zip(k.chunks_exact_mut(g.key_head_dim))
                {
                    l2norm(qh);
                    l2norm(kh);
                    for v in qh.iter_mut() {
                        *v /= scale;
                    }
                }
                for h in 0..nv {
                    let i = r * nv + h;
                    seg_beta[i] = sigmoid(seg_beta[i]);
                    let a = seg_decay[i] + self.dt_bias[h];
                    let sp = if step.ablation.decay_without_softplus {
                        a
                    } else {
                        softplus(a)
                    };
                    seg_decay[i] = self.neg_a[h] * sp;
                }
            }
            // The delta rule per value head, rows in order.
            let hs = g.key_head_dim * g.value_head_dim;
            let conv_values = conv_state.len();
            let mut heads: Vec<(&mut [f32], Vec<&mut [f32]>)> = delta_state
                .chunks_exact_mut(hs)
                .map(|c| (c, Vec::new()))
                .collect();
            for k in kept.iter_mut() {
                for (h, c) in k[conv_values..].chunks_exact_mut(hs).enumerate() {
                    heads[h].1.push(c);
                }
            }
            let seg_core = &mut core[seg.row0 * value_dim..(seg.row0 + seg.rows) * value_dim];
            let mut outs: Vec<Vec<f32>> = vec![Vec::new(); nv];
            let group = nv / g.num_key_heads;
            let (seg_mixed, seg_beta, seg_decay) = (&*seg_mixed, &*seg_beta, &*seg_decay);
            pool.install(|| {
                heads
                    .par_iter_mut()
                    .zip(outs.par_iter_mut())
                    .enumerate()
                    .for_each(|(h, ((s, kept), out))| {
                        let kh = h / group;
                        out.resize(seg.rows * g.value_head_dim, 0.0);
                        for r in 0..seg.rows {
                            let row = &seg_mixed[r * conv_dim..(r + 1) * conv_dim];
                            let q = &row[kh * g.key_head_dim..(kh + 1) * g.key_head_dim];
                            let k = &row[key_dim + kh * g.key_head_dim..][..g.key_head_dim];
                            let v = &row[2 * key_dim + h * g.value_head_dim..][..g.value_head_dim];
                            let o = &mut out[r * g.value_head_dim..(r + 1) * g.value_head_dim];
                            delta_rule_row(
                                s,
                                q,
                                k,
                                v,
                                seg_beta[r * nv + h],
                                seg_decay[r * nv + h].exp(),
                                o,
                            );
                            if let Some(keep) = kept.get_mut(r) {
                                keep.copy_from_slice(s);
                            }
                        }
                    });
            });
            for (h, out) in outs.iter().enumerate() {
                for r in 0..seg.rows {
                    let dv = g.value_head_dim;
                    seg_core[r * value_dim + h * dv..r * value_dim + (h + 1) * dv]
                        .copy_from_slice(&out[r * dv..(r + 1) * dv]);
                }
            }
        }
        // RMSNormGated per value head: weight · norm(o) · silu(z).
        let dv = g.value_head_dim;
        for_rows(
            pool,
            &mut s.attn[..rows * value_dim],
            value_dim,
            |r, row| {
                let zr = &z[r * value_dim..(r + 1) * value_dim];
                for (oh, zh) in row.chunks_exact_mut(dv).zip(zr.chunks_exact(dv)) {
                    rmsnorm_inplace(oh, &self.norm, eps);
                    for (o, &zv) in oh.iter_mut().zip(zh) {
                        *o *= silu(zv);
                    }
                }
            },
        );
        step.runtime.gemm(
            pack,
            self.out,
            &s.attn[..rows * value_dim],
            rows,
            grow(&mut s.proj, rows * hidden),
        )?;
        add_rows(pool, x, &s.proj, hidden);
        Ok(())
    }
}

/// One row of the depthwise causal conv with SiLU, in place on `row` (`conv_dim` channels):
/// `row[c] = silu(Σ_j w[c][j]·input[t − (kernel − 1) + j])` with `history` the `kernel − 1`
/// previous inputs (oldest first), which then moves on by this row. `lag` (a control) leaves
/// the history one row behind.
pub fn conv_row(w: &[f32], kernel: usize, history: &mut [f32], row: &mut [f32], lag: bool) {
    let c_dim = row.len();
    let past = kernel - 1;
    for (c, x) in row.iter_mut().enumerate() {
        let taps = &w[c * kernel..(c + 1) * kernel];
        let mut acc = 0.0f32;
        for j in 0..past {
            acc += taps[j] * history[j * c_dim + c];
        }
        acc += taps[past] * *x;
        let input = *x;
        *x = silu(acc);
        if past > 0 && !lag {
            for j in 0..past - 1 {
                history[j * c_dim + c] = history[(j + 1) * c_dim + c];
            }
            history[(past - 1) * c_dim + c] = input;
        }
    }
}

/// One row of the gated delta rule for one value head: `s` is its `k_dim x v_dim` state (key
/// major), `decay` = e^g. Writes o = qᵀS (after the update).
pub fn delta_rule_row(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: f32,
    decay: f32,
    o: &mut [f32],
) {
    let dv = v.len();
    for x in s.iter_mut() {
        *x *= decay;
    }
    // kv_mem = kᵀS, summed over the key dim in order.
    let mut delta = vec![0.0f32; dv];
    for (srow, &ki) in s.chunks_exact(dv).zip(k) {
        for (m, &sv) in delta.iter_mut().zip(srow) {
            *m += sv * ki;
        }
    }
    for (d, &vv) in delta.iter_mut().zip(v) {
        *d = (vv - *d) * beta;
    }
    for (srow, &ki) in s.chunks_exact_mut(dv).zip(k) {
        for (sv, &d) in srow.iter_mut().zip(&delta) {
            *sv += ki * d;
        }
    }
    o.fill(0.0);
    for (srow, &qi) in s.chunks_exact(dv).zip(q) {
        for (ov, &sv) in o.iter_mut().zip(srow) {
            *ov += sv * qi;
        }
    }
}

/// `x · rsqrt(Σx² + 1e-6)` (transformers' `l2norm`, FLA's eps).
pub fn l2norm(x: &mut [f32]) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (sum + 1e-6).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// torch's `F.softplus` (β 1, threshold 20): x above 20, else log(1 + e^x).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x · sigmoid(x)`, as torch's SiLU.
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}
