//! Qwen3.5's Gated DeltaNet (`Qwen3_5GatedDeltaNet`), the recurrent form transformers decodes
//! with (`torch_recurrent_gated_delta_rule`), for prompts too (the kernels, and the chunked form
//! beside it, are in `delta_rule.rs`; PERF.md has why the recurrent one runs prompts):
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

use compute::ops::mathf::{sigmoid, silu};
use compute::ops::norm::rmsnorm_inplace;
use compute::ops::rows::{add_rows, for_rows, grow};
use compute::{LinearHandle, PackLinear, Runtime};
use packs::names::{self, DeltaNetPart};
use packs::semantics::DeltaNetSemantics;
use packs::Pack;
use rayon::prelude::*;

use super::delta_rule::{
    chunked_rows, conv_taps, mul_silu, recurrent_rows, ChunkScratch, DeltaIsa, DeltaRuleForm,
};
use crate::kv::KvCache;
use crate::recurrent::{LayerViews, MAX_ROLLBACK_ROWS};
use crate::step::{Step, StepState};
use crate::DecoderError;

/// One DeltaNet layer's weights: linears registered with the runtime, the rest read from the pack.
pub struct DeltaNet {
    pub qkv: LinearHandle,
    pub z: LinearHandle,
    pub b: LinearHandle,
    pub a: LinearHandle,
    pub out: LinearHandle,
    /// The conv's weights tap-major, oldest tap first (`kernel x conv_dim`; the checkpoint's are
    /// channel-major): its sums run over contiguous channels.
    pub conv_taps: Vec<f32>,
    /// −exp(A_log) per value head (computed once: it is a constant of the layer).
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// The gated RMSNorm's weight (`value_head_dim`).
    pub norm: Vec<f32>,
    pub geometry: DeltaNetSemantics,
    /// The delta rule kernels' instruction set, and the form of steps that keep no row states.
    pub isa: DeltaIsa,
    pub form: DeltaRuleForm,
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
        let kernel = d.conv_kernel;
        let channels = conv.len() / kernel;
        let conv_taps = (0..kernel * channels)
            .map(|i| conv[(i % channels) * kernel + i / channels])
            .collect();
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
            conv_taps,
            neg_a,
            dt_bias,
            norm,
            geometry: d,
            isa: DeltaIsa::best(),
            form: DeltaRuleForm::from_env(),
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
        let started = std::time::Instant::now();
        let isa = self.isa;
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
            let layout = state.layout();
            let LayerViews {
                state: layer,
                mut window,
            } = state.layer_views(index);
            let (conv_state, delta_state) = layer.split_at_mut((g.conv_kernel - 1) * conv_dim);
            let conv_values = conv_state.len();
            // A window step starts from the state before it (the matrices are copied per head
            // below, in cache) and keeps its rows' inputs for a rollback.
            if let Some((before, w)) = &mut window {
                conv_state.copy_from_slice(&before[..conv_values]);
                w.isa = Some(isa);
            }
            let seg_mixed = &mut mixed[seg.row0 * conv_dim..(seg.row0 + seg.rows) * conv_dim];
            if let Some((_, w)) = &mut window {
                w.raw.clear();
                w.raw.extend_from_slice(seg_mixed);
            }
            // The conv with SiLU, then q and k normalized per key head and q scaled.
            let past = g.conv_kernel - 1;
            let (dk, scale) = (g.key_head_dim, (g.key_head_dim as f32).sqrt());
            let normalize = |row: &mut [f32]| {
                let (q, rest) = row.split_at_mut(key_dim);
                for (qh, kh) in q
                    .chunks_exact_mut(dk)
                    .zip(rest[..key_dim].chunks_exact_mut(dk))
                {
                    l2norm(qh);
                    l2norm(kh);
                    for v in qh.iter_mut() {
                        *v /= scale;
                    }
                }
            };
            if step.ablation.conv_state_lags_one_row {
                for row in seg_mixed.chunks_exact_mut(conv_dim) {
                    conv_row(
                        &self.conv_taps,
                        g.conv_kernel,
                        conv_state,
                        row,
                        step.ablation.conv_state_lags_one_row,
                    );
                    normalize(row);
                }
            } else {
                // The inputs behind their history, `(past + rows) x conv_dim`: row r's taps are
                // rows r..=r + past, so the rows are independent and run on the pool (a 512-row
                // prefill of the 2B shape has 57 M conv outputs, each a SiLU).
                let inputs = grow(&mut s.proj, (past + seg.rows) * conv_dim);
                inputs[..past * conv_dim].copy_from_slice(conv_state);
                inputs[past * conv_dim..].copy_from_slice(seg_mixed);
                let inputs = &*inputs;
                for_rows(pool, seg_mixed, conv_dim, |r, row| {
                    conv_taps(
                        isa,
                        &self.conv_taps,
                        &inputs[r * conv_dim..(r + past + 1) * conv_dim],
                        row,
                    );
                    normalize(row);
                });
                conv_state.copy_from_slice(&inputs[seg.rows * conv_dim..]);
            }
            // β and g per value head.
            let seg_beta = &mut beta[seg.row0 * nv..(seg.row0 + seg.rows) * nv];
            let seg_decay = &mut decay[seg.row0 * nv..(seg.row0 + seg.rows) * nv];
            for r in 0..seg.rows {
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
            let (seg_mixed, seg_beta, seg_decay) = (&*seg_mixed, &*seg_beta, &*seg_decay);
            let before = match window {
                Some((before, w)) => {
                    for (dst, src) in [
                        (&mut w.mixed, seg_mixed),
                        (&mut w.beta, seg_beta),
                        (&mut w.log_decay, seg_decay),
                    ] {
                        dst.clear();
                        dst.extend_from_slice(src);
                    }
                    Some(&before[conv_values..])
                }
                None => None,
            };
            // The delta rule per value head, on the pool: recurrent (always for a window, which
            // a rollback replays), or chunked when `form` asks for it.
            let hs = g.key_head_dim * g.value_head_dim;
            let chunked = self.form == DeltaRuleForm::Chunked
                && before.is_none()
                && seg.rows > MAX_ROLLBACK_ROWS;
            let dv = g.value_head_dim;
            let seg_core = &mut core[seg.row0 * value_dim..(seg.row0 + seg.rows) * value_dim];
            let head_rows =
                |h: usize| layout.head_rows(h, seg.rows, seg_mixed, seg_beta, seg_decay);
            // A window's head starts from its matrix before the step.
            let start_from = |h: usize, s: &mut [f32]| {
                if let Some(b) = before {
                    s.copy_from_slice(&b[h * hs..(h + 1) * hs]);
                }
            };
            if seg.rows == 1 {
                // Decode: the heads write their rows of `core` directly (one row: value_dim).
                pool.install(|| {
                    delta_state
                        .par_chunks_exact_mut(hs)
                        .zip(seg_core.par_chunks_exact_mut(dv))
                        .enumerate()
                        .for_each(|(h, (s, out))| {
                            start_from(h, s);
                            recurrent_rows(isa, s, &head_rows(h), out);
                        });
                });
            } else {
                // Head-major outputs (`nv x rows x dv`) in the MLP's `up` buffer (free until the
                // MLP), interleaved into `core` after.
                let outs = grow(&mut s.up, nv * seg.rows * dv);
                pool.install(|| {
                    delta_state
                        .par_chunks_exact_mut(hs)
                        .zip(outs.par_chunks_exact_mut(seg.rows * dv))
                        .enumerate()
                        .for_each(|(h, (s, out))| {
                            start_from(h, s);
                            let inp = head_rows(h);
                            if chunked {
                                chunked_rows(isa, s, &inp, out, &mut ChunkScratch::default());
                            } else {
                                recurrent_rows(isa, s, &inp, out);
                            }
                        });
                });
                for (h, out) in outs.chunks_exact(seg.rows * dv).enumerate() {
                    for (r, o) in out.chunks_exact(dv).enumerate() {
                        seg_core[r * value_dim + h * dv..][..dv].copy_from_slice(o);
                    }
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
                    mul_silu(isa, oh, zh);
                }
            },
        );
        st.delta_net_time.add(started.elapsed());
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
/// `row[c] = silu(Σ_j w[j][c]·input[t − (kernel − 1) + j])` (`w` tap-major) with `history` the `kernel − 1`
/// previous inputs (oldest first), which then moves on by this row. `lag` (a control) leaves
/// the history one row behind. Only the control runs it: the forward runs [`conv_taps`].
pub fn conv_row(w: &[f32], kernel: usize, history: &mut [f32], row: &mut [f32], lag: bool) {
    let c_dim = row.len();
    let past = kernel - 1;
    for (c, x) in row.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for j in 0..past {
            acc += w[j * c_dim + c] * history[j * c_dim + c];
        }
        acc += w[past * c_dim + c] * *x;
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
