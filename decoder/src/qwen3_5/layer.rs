//! One Qwen3.5 decoder layer (`Qwen3_5DecoderLayer`): input norm, the token mixer (Gated
//! DeltaNet or gated full attention), residual; post-attention norm, the MLP (dense, or routed
//! with a shared expert in Qwen3.5-MoE), residual.

use std::borrow::Cow;

use compute::ops::mathf::sigmoid;
use compute::ops::norm::rmsnorm;
use compute::ops::rows::{add_rows, for_rows, grow};
use compute::{GemmBackend, LinearHandle, PackLinear, Runtime, WeightRef};
use packs::moe::{self, ExpertProj};
use packs::names::{self, Norm, Proj};
use packs::{LinearIndex, NormIndex, Pack};

use super::delta_net::DeltaNet;
use super::gated_attention::GatedAttention;
use crate::kv::KvCache;
use crate::qwen3_vl::layer::{dense_mlp_block, gated_mlp, sparse_mlp, GatedMlp};
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

/// The MLP of a layer: dense (Qwen3.5), or routed experts with a shared expert (Qwen3.5-MoE).
pub enum Mlp {
    Dense(GatedMlp),
    Sparse {
        /// The router runs on the host in f32 whatever the backend (its logits pick experts).
        router: LinearIndex,
        experts: Vec<GatedMlp>,
        shared: GatedMlp,
        /// `[1, hidden]`, f32 on the host like the router: sigmoid of it scales `shared`.
        shared_gate: LinearIndex,
        shared_intermediate: usize,
    },
}

pub struct Layer {
    pub input_norm: NormIndex,
    pub post_attention_norm: NormIndex,
    pub mixer: Mixer,
    pub mlp: Mlp,
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
                attn: GatedAttention::resolve(pack, runtime, &names::layer_prefix(l))?,
                kv_layer,
            }
        };
        Layer::with_mixer(
            pack,
            runtime,
            &names::layer_prefix(l),
            sem.is_sparse(l),
            mixer,
        )
    }

    /// The MTP head's one layer (`mtp.layers.0`): full attention over its own one-layer cache
    /// and the MLP of the model's kind (vLLM builds it as a decoder layer of the model): dense,
    /// or routed with a shared expert in a Qwen3.5-MoE pack.
    pub fn resolve_mtp(pack: &Pack, runtime: &Runtime) -> Result<Layer, DecoderError> {
        let prefix = names::mtp::LAYER;
        let mixer = Mixer::Attention {
            attn: GatedAttention::resolve(pack, runtime, prefix)?,
            kv_layer: 0,
        };
        let sparse = pack.semantics().moe.is_some();
        Layer::with_mixer(pack, runtime, prefix, sparse, mixer)
    }

    /// The layer at `prefix` (a decoder layer's or the MTP layer's) with its mixer: the norms
    /// and the MLP, routed when `sparse`.
    fn with_mixer(
        pack: &Pack,
        runtime: &Runtime,
        prefix: &str,
        sparse: bool,
        mixer: Mixer,
    ) -> Result<Layer, DecoderError> {
        let sem = pack.semantics();
        let table = |name: &str| -> Result<PackLinear, DecoderError> {
            Ok(PackLinear::Table(pack.linear_index(name)?))
        };
        let gated = |h: &[LinearHandle]| GatedMlp {
            gate: h[0],
            up: h[1],
            down: h[2],
        };
        let mlp = match sem.moe.as_ref().filter(|_| sparse) {
            None => {
                let linears = [Proj::Gate, Proj::Up, Proj::Down]
                    .map(|p| table(&names::proj_in(prefix, p)))
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()?;
                Mlp::Dense(gated(&runtime.register(pack, &linears)?))
            }
            Some(m) => {
                let Some(shared_intermediate) = m.shared_expert_intermediate_size else {
                    return Err(DecoderError::Options(format!(
                        "{}: a qwen3_5_moe layer without its shared expert",
                        pack.path().display()
                    )));
                };
                let mut linears = Vec::with_capacity(3 * (m.num_experts + 1));
                for p in ExpertProj::ALL {
                    linears.push(table(&moe::shared_expert_in(prefix, p))?);
                }
                for e in 0..m.num_experts {
                    for p in ExpertProj::ALL {
                        linears.push(table(&moe::expert_in(prefix, e, p))?);
                    }
                }
                let router = pack.linear_index(&moe::router_in(prefix))?;
                let shared_gate = pack.linear_index(&moe::shared_expert_gate_in(prefix))?;
                let h = runtime.register(pack, &linears)?;
                Mlp::Sparse {
                    router,
                    shared: gated(&h[..3]),
                    experts: h[3..].chunks_exact(3).map(gated).collect(),
                    shared_gate,
                    shared_intermediate,
                }
            }
        };
        let norm = |n: Norm| pack.norm_index(&names::norm_in(prefix, n));
        Ok(Layer {
            input_norm: norm(Norm::Input)?,
            post_attention_norm: norm(Norm::PostAttention)?,
            mixer,
            mlp,
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
        match &self.mlp {
            Mlp::Dense(mlp) => dense_mlp_block(step, st, &w_post, *mlp, x),
            Mlp::Sparse {
                router,
                experts,
                shared,
                shared_gate,
                shared_intermediate,
            } => {
                let xn = grow(&mut st.scratch.xn, rows * hidden);
                for_rows(pool, xn, hidden, |r, nr| {
                    rmsnorm(&x[r * hidden..(r + 1) * hidden], &w_post, eps, nr)
                });
                sparse_mlp(step, st, *router, experts)?;
                // Qwen3NextSparseMoeBlock: routed + sigmoid(shared_gate · x) · shared(x).
                let s = &mut st.scratch;
                gated_mlp(
                    step,
                    *shared,
                    *shared_intermediate,
                    &s.xn[..rows * hidden],
                    rows,
                    &mut s.gate,
                    &mut s.up,
                    grow(&mut s.shared, rows * hidden),
                    false,
                )?;
                let Some(gemm) = st.router_gemm.as_mut() else {
                    unreachable!("a sparse layer has the router's host GEMM (Decoder::new)")
                };
                let gate = WeightRef::new(0, step.pack.linear_at(*shared_gate));
                gemm.gemm(
                    &gate,
                    &s.xn[..rows * hidden],
                    rows,
                    grow(&mut s.shared_gate, rows),
                )?;
                let (shared, g) = (&s.shared, &s.shared_gate);
                let skip_gate = step.ablation.moe_skip_shared_gate;
                for_rows(pool, &mut s.proj[..rows * hidden], hidden, |r, row| {
                    let w = if skip_gate { 1.0 } else { sigmoid(g[r]) };
                    for (p, &v) in row.iter_mut().zip(&shared[r * hidden..(r + 1) * hidden]) {
                        *p += w * v;
                    }
                });
                add_rows(pool, x, &s.proj, hidden);
                Ok(())
            }
        }
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
