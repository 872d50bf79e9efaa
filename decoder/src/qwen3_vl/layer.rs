//! One Qwen3-VL decoder layer (`Qwen3VLTextDecoderLayer`), as the model card reads: input norm,
//! q/k/v, q/k norms, rotate, attend over the cache, o, residual; post-attention norm, gate/up,
//! SiLU, down (or the routed experts of a MoE layer), residual.

use compute::ops::mathf::silu_mul;
use compute::ops::norm::{rmsnorm, rmsnorm_inplace};
use compute::ops::rope::rotate_half;
use compute::ops::rows::{add_rows, for_rows, grow};
use compute::{GemmBackend, LinearHandle, PackLinear, Runtime, WeightRef};
use packs::moe::ExpertProj;
use packs::names::{self, Norm, Proj};
use packs::{LinearIndex, NormIndex, Pack};

use super::moe;
use crate::attention::attend_rows_parallel;
use crate::kv::{KvCache, KvData, KvElem, KvStore};
use crate::step::{Segment, Step, StepState};
use crate::DecoderError;

/// The attention block's weights: `self_attn.{q,k,v,o}_proj` and the per-head q/k RMSNorms.
pub struct AttentionWeights {
    pub q: LinearHandle,
    pub k: LinearHandle,
    pub v: LinearHandle,
    pub o: LinearHandle,
    pub q_norm: NormIndex,
    pub k_norm: NormIndex,
}

/// A dense MLP's or one expert's gate, up and down projections.
#[derive(Clone, Copy)]
pub struct GatedMlp {
    pub gate: LinearHandle,
    pub up: LinearHandle,
    pub down: LinearHandle,
}

/// The MLP of a layer: dense, or a router over experts (`Qwen3VLMoeTextSparseMoeBlock`).
pub enum Mlp {
    Dense(GatedMlp),
    Sparse {
        /// The router runs on the host in f32 whatever the backend (its logits pick experts).
        router: LinearIndex,
        experts: Vec<GatedMlp>,
    },
}

/// One layer's weights, resolved in the pack and registered with the runtime once.
pub struct Layer {
    pub input_norm: NormIndex,
    pub post_attention_norm: NormIndex,
    pub attention: AttentionWeights,
    pub mlp: Mlp,
}

impl Layer {
    /// Layer `l` of `pack`: a broken pack fails here by name, not mid-step, and a step looks no
    /// weight up by name.
    pub fn resolve(pack: &Pack, runtime: &Runtime, l: usize) -> Result<Layer, DecoderError> {
        let sem = pack.semantics();
        let table = |name: &str| -> Result<PackLinear, DecoderError> {
            Ok(PackLinear::Table(pack.linear_index(name)?))
        };
        let proj = |p: Proj| table(&names::proj(l, p));
        // Table lookups first, in the checkpoint's order (a missing tensor is named before any
        // weight is uploaded), then one registration per layer.
        let mut linears = vec![
            proj(Proj::Q)?,
            proj(Proj::K)?,
            proj(Proj::V)?,
            proj(Proj::O)?,
        ];
        let router = match sem.moe.as_ref().filter(|_| sem.is_sparse(l)) {
            None => {
                linears.extend([proj(Proj::Gate)?, proj(Proj::Up)?, proj(Proj::Down)?]);
                None
            }
            Some(m) => {
                for e in 0..m.num_experts {
                    for p in ExpertProj::ALL {
                        linears.push(table(&packs::moe::expert(l, e, p))?);
                    }
                }
                Some(pack.linear_index(&packs::moe::router(l))?)
            }
        };
        let norm = |n: Norm| pack.norm_index(&names::norm(l, n));
        let (input_norm, post_attention_norm) = (norm(Norm::Input)?, norm(Norm::PostAttention)?);
        let (q_norm, k_norm) = (norm(Norm::QNorm)?, norm(Norm::KNorm)?);
        let handles = runtime.register(pack, &linears)?;
        let (attention, mlp) = handles.split_at(4);
        let mlp = match router {
            None => Mlp::Dense(gated(mlp)),
            Some(router) => Mlp::Sparse {
                router,
                experts: mlp.chunks_exact(3).map(gated).collect(),
            },
        };
        Ok(Layer {
            input_norm,
            post_attention_norm,
            attention: AttentionWeights {
                q: attention[0],
                k: attention[1],
                v: attention[2],
                o: attention[3],
                q_norm,
                k_norm,
            },
            mlp,
        })
    }

    pub fn is_sparse(&self) -> bool {
        matches!(self.mlp, Mlp::Sparse { .. })
    }

    /// The layer over the step's rows `x` (`rows x hidden`), in place; each segment's K/V go to
    /// its cache (`caches[i]` for `step.segments[i]`) at layer `l`.
    pub(crate) fn forward(
        &self,
        l: usize,
        step: &Step<'_>,
        caches: &mut [&mut KvCache],
        st: &mut StepState,
        x: &mut [f32],
    ) -> Result<(), DecoderError> {
        self.attention_block(l, step, caches, st, x)?;
        self.mlp_block(step, st, x)
    }

    fn attention_block(
        &self,
        l: usize,
        step: &Step<'_>,
        caches: &mut [&mut KvCache],
        st: &mut StepState,
        x: &mut [f32],
    ) -> Result<(), DecoderError> {
        let (pack, pool, rows, eps) = (step.pack, step.pool, step.rows, step.eps);
        let shape = step.shape;
        let (hidden, d) = (step.hidden, shape.head_dim);
        let (q_dim, kv_dim, half) = (shape.q_dim(), shape.kv_dim(), d / 2);
        let w = &self.attention;
        let s = &mut st.scratch;
        let w_in = pack.norm_at(self.input_norm);
        let xn = grow(&mut s.xn, rows * hidden);
        for_rows(pool, xn, hidden, |r, nr| {
            rmsnorm(&x[r * hidden..(r + 1) * hidden], w_in, eps, nr)
        });
        step.runtime.gemm_group(
            pack,
            [w.q, w.k, w.v],
            &s.xn[..rows * hidden],
            rows,
            [
                grow(&mut s.q, rows * q_dim),
                grow(&mut s.k, rows * kv_dim),
                grow(&mut s.v, rows * kv_dim),
            ],
        )?;
        let (cos, sin) = (&s.cos, &s.sin);
        let norm_rotate = |w: &[f32], r: usize, row: &mut [f32]| {
            let (cos, sin) = (
                &cos[r * half..(r + 1) * half],
                &sin[r * half..(r + 1) * half],
            );
            for head in row.chunks_exact_mut(d) {
                rmsnorm_inplace(head, w, eps);
                rotate_half(head, cos, sin);
            }
        };
        let (w_q, w_k) = (pack.norm_at(w.q_norm), pack.norm_at(w.k_norm));
        for_rows(pool, &mut s.q[..rows * q_dim], q_dim, |r, row| {
            norm_rotate(w_q, r, row)
        });
        for_rows(pool, &mut s.k[..rows * kv_dim], kv_dim, |r, row| {
            norm_rotate(w_k, r, row)
        });
        let attn = grow(&mut s.attn, rows * q_dim);
        st.attention_time.time(|| {
            write_and_attend(step, l, caches, &s.q, &s.k, &s.v, attn);
        });
        step.runtime.gemm(
            pack,
            w.o,
            &s.attn[..rows * q_dim],
            rows,
            grow(&mut s.proj, rows * hidden),
        )?;
        add_rows(pool, x, &s.proj, hidden);
        Ok(())
    }

    fn mlp_block(
        &self,
        step: &Step<'_>,
        st: &mut StepState,
        x: &mut [f32],
    ) -> Result<(), DecoderError> {
        let w_post = step.pack.norm_at(self.post_attention_norm);
        match &self.mlp {
            Mlp::Dense(mlp) => dense_mlp_block(step, st, w_post, *mlp, x),
            Mlp::Sparse { router, experts } => {
                let (pool, rows, hidden) = (step.pool, step.rows, step.hidden);
                let xn = grow(&mut st.scratch.xn, rows * hidden);
                for_rows(pool, xn, hidden, |r, nr| {
                    rmsnorm(&x[r * hidden..(r + 1) * hidden], w_post, step.eps, nr)
                });
                sparse_mlp(step, st, *router, experts)?;
                add_rows(pool, x, &st.scratch.proj, hidden);
                Ok(())
            }
        }
    }
}

/// The dense MLP block on the rows `x`, in place: post-attention norm (`w_post`), gate/up, SiLU,
/// down, residual. Qwen3-VL's dense layers and Qwen3.5's layers share it.
pub(crate) fn dense_mlp_block(
    step: &Step<'_>,
    st: &mut StepState,
    w_post: &[f32],
    mlp: GatedMlp,
    x: &mut [f32],
) -> Result<(), DecoderError> {
    let (pool, rows, hidden) = (step.pool, step.rows, step.hidden);
    let s = &mut st.scratch;
    let xn = grow(&mut s.xn, rows * hidden);
    for_rows(pool, xn, hidden, |r, nr| {
        rmsnorm(&x[r * hidden..(r + 1) * hidden], w_post, step.eps, nr)
    });
    gated_mlp(
        step,
        mlp,
        step.intermediate,
        &s.xn[..rows * hidden],
        rows,
        &mut s.gate,
        &mut s.up,
        grow(&mut s.proj, rows * hidden),
        false,
    )?;
    add_rows(pool, x, &s.proj, hidden);
    Ok(())
}

/// Each segment's K/V rows (`k`, `v`: the step's rows) into its own cache at KV layer
/// `kv_layer`, then attention of each segment's queries `q` over its own slots into `attn`
/// (the control `attend_other_sequence` reads the previous sequence's cache instead).
pub(crate) fn write_and_attend(
    step: &Step<'_>,
    kv_layer: usize,
    caches: &mut [&mut KvCache],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    attn: &mut [f32],
) {
    let (q_dim, kv_dim) = (step.shape.q_dim(), step.shape.kv_dim());
    for (seg, kv) in step.segments.iter().zip(caches.iter_mut()) {
        let (k, v) = (seg.of(k, kv_dim), seg.of(v, kv_dim));
        match &mut kv.data {
            KvData::F32(store) => write_rows(store, kv_layer, seg, k, v),
            KvData::Bf16(store) => write_rows(store, kv_layer, seg, k, v),
        }
    }
    let n = step.segments.len();
    for (i, seg) in step.segments.iter().enumerate() {
        let read = if step.ablation.attend_other_sequence {
            (i + n - 1) % n
        } else {
            i
        };
        let q = seg.of(q, q_dim);
        let out = &mut attn[seg.row0 * q_dim..(seg.row0 + seg.rows) * q_dim];
        let (pool, shape, slot) = (step.pool, step.shape, seg.start_slot);
        match &caches[read].data {
            KvData::F32(store) => {
                attend_rows_parallel(pool, shape, store.layer(kv_layer), slot, seg.rows, q, out)
            }
            KvData::Bf16(store) => {
                attend_rows_parallel(pool, shape, store.layer(kv_layer), slot, seg.rows, q, out)
            }
        }
    }
}

fn gated(h: &[LinearHandle]) -> GatedMlp {
    GatedMlp {
        gate: h[0],
        up: h[1],
        down: h[2],
    }
}

/// `down(silu(gate(x)) * up(x))` of `rows` rows `x` into `y`; `swap` (a control) runs gate as up.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_mlp(
    step: &Step<'_>,
    mlp: GatedMlp,
    inter: usize,
    x: &[f32],
    rows: usize,
    gate: &mut Vec<f32>,
    up: &mut Vec<f32>,
    y: &mut [f32],
    swap: bool,
) -> Result<(), DecoderError> {
    let (g, u) = if swap {
        (mlp.up, mlp.gate)
    } else {
        (mlp.gate, mlp.up)
    };
    step.runtime.gemm_group(
        step.pack,
        [g, u],
        x,
        rows,
        [grow(gate, rows * inter), grow(up, rows * inter)],
    )?;
    let up = &up[..rows * inter];
    for_rows(step.pool, &mut gate[..rows * inter], inter, |r, g| {
        silu_mul(g, &up[r * inter..(r + 1) * inter])
    });
    step.runtime
        .gemm(step.pack, mlp.down, &gate[..rows * inter], rows, y)?;
    Ok(())
}

/// The MoE MLP of sparse layer `l` on the normalized rows `scratch.xn`, into `scratch.proj`: the
/// router on the host in f32, then each chosen expert's gate/up/down on the backend, once per
/// batch ([`moe`]).
pub(crate) fn sparse_mlp(
    step: &Step<'_>,
    st: &mut StepState,
    router: LinearIndex,
    experts: &[GatedMlp],
) -> Result<(), DecoderError> {
    let (rows, hidden) = (step.rows, step.hidden);
    let (Some(rule), Some(router_gemm)) = (st.routing, st.router_gemm.as_mut()) else {
        unreachable!("a sparse layer has a router and routing rule (set in Decoder::new)")
    };
    let inter = step
        .pack
        .semantics()
        .moe
        .as_ref()
        .map_or(0, |m| m.moe_intermediate_size);
    let s = &mut st.scratch;
    let logits = grow(&mut s.router, rows * rule.num_experts);
    let router = WeightRef::new(0, step.pack.linear_at(router));
    router_gemm.gemm(&router, &s.xn[..rows * hidden], rows, logits)?;
    moe::route(
        &s.router[..rows * rule.num_experts],
        rows,
        rule,
        &mut st.moe,
    );
    if st.trace_routes {
        st.routes_trace.push(st.moe.routes.experts.clone());
    }
    let swap = step.ablation.moe_swap_gate_up;
    let (gate, up) = (&mut s.gate, &mut s.up);
    moe::sparse_mlp(
        &s.xn[..rows * hidden],
        rows,
        hidden,
        rule,
        &mut st.moe,
        grow(&mut s.proj, rows * hidden),
        |e, x, m, y| gated_mlp(step, experts[e], inter, x, m, gate, up, y, swap),
    )
}

/// Writes a segment's K/V (`rows x kv_dim` each) at its slots of `layer`.
fn write_rows<T: KvElem>(
    store: &mut KvStore<T>,
    layer: usize,
    seg: &Segment<'_>,
    k: &[f32],
    v: &[f32],
) {
    let kv_dim = k.len() / seg.rows.max(1);
    for r in 0..seg.rows {
        store.write(
            layer,
            seg.start_slot + r,
            &k[r * kv_dim..(r + 1) * kv_dim],
            &v[r * kv_dim..(r + 1) * kv_dim],
        );
    }
}
