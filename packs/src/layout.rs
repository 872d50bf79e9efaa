//! Which tensors a pack holds, in which dtype and shape: one plan shared by the writer (what to
//! produce) and the reader (what to require).

use crate::container::Dtype;
use crate::moe::{self, ExpertProj, ExpertSlice};
use crate::names::{self, visual, Norm, Proj, EMBED, FINAL_NORM, LM_HEAD};
use crate::quant::{QuantKind, Q4_GROUP};
use crate::semantics::{Semantics, VisionSemantics};

/// What a weight is; decides how it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightRole {
    Embedding,
    Norm,
    Linear,
    /// Kept in f32 as it is: the tower's biases, LayerNorm weights and biases, position table.
    Param,
}

/// One logical weight: `rows x cols` (`cols` only for norms and 1-D params, `rows == 1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightPlan {
    /// Name in the pack.
    pub name: String,
    /// Pack-layout name of the weight whose values it holds (the embedding for a tied head).
    pub source: String,
    pub role: WeightRole,
    pub rows: usize,
    pub cols: usize,
    /// How its linear (or embedding) values are stored: the pack's kind for the decoder, the
    /// tower's own kind (`--vision-quant`) for the tower.
    pub quant: QuantKind,
    /// Its shape in the checkpoint, when that is not `[rows, cols]` (the patch embedding's Conv3d).
    pub source_shape: Option<Vec<usize>>,
    /// An expert's linear: its part of the fused tensor `source` (`crate::moe`).
    pub slice: Option<ExpertSlice>,
    /// A zero-centred norm (Qwen3.5: `x * (1 + w)`), stored as `1 + w` in f32.
    pub stored_plus_one: bool,
}

/// How a weight's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
    I8,
    Q4,
}

/// One tensor of the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn byte_len(&self) -> u64 {
        self.shape
            .iter()
            .fold(self.dtype.size() as u64, |acc, &d| acc * d as u64)
    }
}

/// A tied head in an f32/bf16 pack is the embedding itself; every other head is stored.
pub fn head_is_stored(sem: &Semantics) -> bool {
    !sem.tie_word_embeddings || sem.quant.is_integer()
}

impl WeightPlan {
    /// The stored shape of its values: 1-D for norms and single-row params.
    pub fn dims(&self) -> Vec<usize> {
        match self.role {
            WeightRole::Norm => vec![self.cols],
            WeightRole::Param if self.rows == 1 => vec![self.cols],
            _ => vec![self.rows, self.cols],
        }
    }

    /// The shape the checkpoint must hold.
    pub fn checkpoint_shape(&self) -> Vec<usize> {
        self.source_shape.clone().unwrap_or_else(|| self.dims())
    }

    pub fn storage(&self) -> Storage {
        match (self.role, self.quant) {
            (WeightRole::Norm | WeightRole::Param, _) => Storage::F32,
            (WeightRole::Embedding, QuantKind::F32) => Storage::F32,
            (WeightRole::Embedding, _) => Storage::Bf16,
            (WeightRole::Linear, QuantKind::F32) => Storage::F32,
            (WeightRole::Linear, QuantKind::Bf16) => Storage::Bf16,
            (WeightRole::Linear, QuantKind::I8) => Storage::I8,
            (WeightRole::Linear, QuantKind::Q4) => Storage::Q4,
        }
    }

    /// The container tensors of this weight: the values, then the scales if quantized.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let dims = self.dims();
        let spec = |name: String, dtype, shape| TensorSpec { name, dtype, shape };
        match self.storage() {
            Storage::F32 => vec![spec(self.name.clone(), Dtype::F32, dims)],
            Storage::Bf16 => vec![spec(self.name.clone(), Dtype::BF16, dims)],
            Storage::I8 => vec![
                spec(self.name.clone(), Dtype::I8, dims),
                spec(names::scales_of(&self.name), Dtype::F32, vec![self.rows]),
            ],
            Storage::Q4 => vec![
                spec(self.name.clone(), Dtype::U8, vec![self.rows, self.cols / 2]),
                spec(
                    names::scales_of(&self.name),
                    Dtype::BF16,
                    vec![self.rows, self.cols / Q4_GROUP],
                ),
            ],
        }
    }
}

/// Every weight of the pack in file order: the decoder, then the tower when the pack has one.
/// `sem` must be validated.
pub fn weights(sem: &Semantics) -> Vec<WeightPlan> {
    let mut plan = decoder_weights(sem);
    if let Some(v) = &sem.vision {
        plan.extend(tower_weights(v));
    }
    plan
}

fn plan_weight(
    name: String,
    role: WeightRole,
    rows: usize,
    cols: usize,
    quant: QuantKind,
) -> WeightPlan {
    WeightPlan {
        source: name.clone(),
        name,
        role,
        rows,
        cols,
        quant,
        source_shape: None,
        slice: None,
        stored_plus_one: false,
    }
}

fn decoder_weights(sem: &Semantics) -> Vec<WeightPlan> {
    let h = sem.hidden_size;
    let weight = |name: String, role, rows, cols| plan_weight(name, role, rows, cols, sem.quant);
    let norm = |name: String, len| weight(name, WeightRole::Norm, 1, len);
    let linear = |name: String, rows, cols| weight(name, WeightRole::Linear, rows, cols);
    // Qwen3.5's norms are zero-centred: stored as 1 + w (the DeltaNet output norm is not one).
    let norm = |name: String, len| WeightPlan {
        stored_plus_one: sem.delta_net.is_some(),
        ..norm(name, len)
    };
    // The projections of the layer under `prefix` (the attention's when `attention`, the dense
    // MLP's when `mlp`), each followed by the norms that come after it in file order.
    let projections = |prefix: &str, attention: bool, mlp: bool, plan: &mut Vec<WeightPlan>| {
        for p in Proj::ALL {
            let is_mlp = matches!(p, Proj::Gate | Proj::Up | Proj::Down);
            if (is_mlp && !mlp) || (!is_mlp && !attention) {
                continue;
            }
            let (rows, cols) = match p {
                Proj::Q => (sem.q_proj_rows(), h),
                Proj::K | Proj::V => (sem.kv_dim(), h),
                Proj::O => (h, sem.q_dim()),
                Proj::Gate | Proj::Up => (sem.intermediate_size, h),
                Proj::Down => (h, sem.intermediate_size),
            };
            plan.push(linear(names::proj_in(prefix, p), rows, cols));
            if p == Proj::K {
                plan.push(norm(names::norm_in(prefix, Norm::QNorm), sem.head_dim));
                plan.push(norm(names::norm_in(prefix, Norm::KNorm), sem.head_dim));
            }
            if p == Proj::O {
                plan.push(norm(names::norm_in(prefix, Norm::PostAttention), h));
            }
        }
    };
    // The routed MLP of the layer under `prefix` (a sparse decoder layer's, or the MTP layer's
    // in a MoE pack): the router, the shared expert and its gate, then every expert.
    let routed_mlp = |prefix: &str, m: &moe::MoeSemantics, plan: &mut Vec<WeightPlan>| {
        // The router stays f32 whatever the pack's kind: routing picks experts by its logits.
        plan.push(plan_weight(
            moe::router_in(prefix),
            WeightRole::Linear,
            m.num_experts,
            h,
            QuantKind::F32,
        ));
        if let Some(shared) = m.shared_expert_intermediate_size {
            // Qwen3.5-MoE's shared expert (the pack's kind) and its gate (f32, as the router).
            for (p, rows, cols) in [
                (ExpertProj::Gate, shared, h),
                (ExpertProj::Up, shared, h),
                (ExpertProj::Down, h, shared),
            ] {
                plan.push(linear(moe::shared_expert_in(prefix, p), rows, cols));
            }
            plan.push(plan_weight(
                moe::shared_expert_gate_in(prefix),
                WeightRole::Linear,
                1,
                h,
                QuantKind::F32,
            ));
        }
        let inter = m.moe_intermediate_size;
        for e in 0..m.num_experts {
            for proj in ExpertProj::ALL {
                let (source, rows, cols) = match proj {
                    ExpertProj::Gate | ExpertProj::Up => (moe::fused_gate_up_in(prefix), inter, h),
                    ExpertProj::Down => (moe::fused_down_in(prefix), h, inter),
                };
                let mut w = linear(moe::expert_in(prefix, e, proj), rows, cols);
                w.source = source;
                w.slice = Some(ExpertSlice { expert: e, proj });
                plan.push(w);
            }
        }
    };
    let mut plan = vec![weight(
        EMBED.to_string(),
        WeightRole::Embedding,
        sem.vocab_size,
        h,
    )];
    for layer in 0..sem.num_layers {
        plan.push(norm(names::norm(layer, Norm::Input), h));
        let sparse = sem.is_sparse(layer);
        if let Some(d) = sem.delta_net.as_ref().filter(|d| d.is_linear(layer)) {
            plan.extend(delta_net_weights(sem, d, layer));
            plan.push(norm(names::norm(layer, Norm::PostAttention), h));
        }
        let attention = !sem.is_linear_attention(layer);
        let prefix = names::layer_prefix(layer);
        projections(&prefix, attention, !sparse, &mut plan);
        if let Some(m) = sem.moe.as_ref().filter(|_| sparse) {
            routed_mlp(&prefix, m, &mut plan);
        }
    }
    plan.push(norm(FINAL_NORM.to_string(), h));
    if sem.delta_net.as_ref().is_some_and(|d| d.mtp) {
        // Qwen3.5's MTP head: its norms zero-centred like the model's, one full-attention layer
        // whose MLP is dense, or routed like every layer of a Qwen3.5-MoE model (vLLM builds it
        // as a decoder layer of the model's own kind).
        use names::mtp;
        plan.push(norm(mtp::NORM_EMBEDDING.to_string(), h));
        plan.push(norm(mtp::NORM_HIDDEN.to_string(), h));
        plan.push(linear(mtp::FC.to_string(), h, 2 * h));
        plan.push(norm(names::norm_in(mtp::LAYER, Norm::Input), h));
        projections(mtp::LAYER, true, sem.moe.is_none(), &mut plan);
        if let Some(m) = &sem.moe {
            routed_mlp(mtp::LAYER, m, &mut plan);
        }
        plan.push(norm(mtp::NORM.to_string(), h));
    }
    if head_is_stored(sem) {
        let mut head = linear(LM_HEAD.to_string(), sem.vocab_size, h);
        if sem.tie_word_embeddings {
            head.source = EMBED.to_string();
        }
        plan.push(head);
    }
    plan
}

/// A Gated DeltaNet layer's mixer in checkpoint order: the four input projections and the output
/// projection are linears of the pack's kind; the conv, A_log, dt_bias and the output norm stay
/// f32 (they are per-channel or per-head numbers, not matrix products).
fn delta_net_weights(
    sem: &Semantics,
    d: &crate::semantics::DeltaNetSemantics,
    layer: usize,
) -> Vec<WeightPlan> {
    use names::DeltaNetPart as P;
    let h = sem.hidden_size;
    let linear = |p: P, rows, cols| {
        plan_weight(
            names::delta_net(layer, p),
            WeightRole::Linear,
            rows,
            cols,
            sem.quant,
        )
    };
    let param = |p: P, rows, cols| {
        plan_weight(
            names::delta_net(layer, p),
            WeightRole::Param,
            rows,
            cols,
            QuantKind::F32,
        )
    };
    let mut conv = param(P::Conv, d.conv_dim(), d.conv_kernel);
    conv.source_shape = Some(vec![d.conv_dim(), 1, d.conv_kernel]);
    vec![
        linear(P::InProjQkv, d.conv_dim(), h),
        linear(P::InProjZ, d.value_dim(), h),
        linear(P::InProjB, d.num_value_heads, h),
        linear(P::InProjA, d.num_value_heads, h),
        conv,
        param(P::ALog, 1, d.num_value_heads),
        param(P::DtBias, 1, d.num_value_heads),
        param(P::Norm, 1, d.value_head_dim),
        linear(P::OutProj, h, d.value_dim()),
    ]
}

/// The tower's weights in file order: patch embedding, position table, blocks, merger, DeepStack
/// mergers.
fn tower_weights(v: &VisionSemantics) -> Vec<WeightPlan> {
    let (h, inter, merged) = (v.hidden_size, v.intermediate_size, v.merged_hidden());
    let linear =
        |name: String, rows, cols| plan_weight(name, WeightRole::Linear, rows, cols, v.quant);
    let param =
        |name: String, rows, cols| plan_weight(name, WeightRole::Param, rows, cols, v.quant);
    // A linear and its bias.
    let biased = |plan: &mut Vec<WeightPlan>, weight: String, rows, cols| {
        let bias = weight.replace(".weight", ".bias");
        plan.push(linear(weight, rows, cols));
        plan.push(param(bias, 1, rows));
    };
    // A LayerNorm's weight and bias.
    let layer_norm = |plan: &mut Vec<WeightPlan>, prefix: String, len| {
        plan.push(param(format!("{prefix}.weight"), 1, len));
        plan.push(param(format!("{prefix}.bias"), 1, len));
    };

    let mut plan = Vec::new();
    let mut patch = linear(visual::PATCH_EMBED.to_string(), h, v.patch_row_len());
    patch.source_shape = Some(vec![
        h,
        v.in_channels,
        v.temporal_patch_size,
        v.patch_size,
        v.patch_size,
    ]);
    plan.push(patch);
    plan.push(param(visual::PATCH_EMBED_BIAS.to_string(), 1, h));
    plan.push(param(
        visual::POS_EMBED.to_string(),
        v.num_position_embeddings,
        h,
    ));
    for i in 0..v.depth {
        layer_norm(&mut plan, visual::block(i, "norm1"), h);
        biased(&mut plan, visual::block(i, "attn.qkv.weight"), 3 * h, h);
        biased(&mut plan, visual::block(i, "attn.proj.weight"), h, h);
        layer_norm(&mut plan, visual::block(i, "norm2"), h);
        biased(
            &mut plan,
            visual::block(i, "mlp.linear_fc1.weight"),
            inter,
            h,
        );
        biased(
            &mut plan,
            visual::block(i, "mlp.linear_fc2.weight"),
            h,
            inter,
        );
    }
    // The merger normalizes each patch before the 2x2 concatenation; the DeepStack mergers
    // normalize the concatenation (use_postshuffle_norm).
    let mergers = std::iter::once((
        visual::merger("norm"),
        h,
        visual::merger("linear_fc1.weight"),
        visual::merger("linear_fc2.weight"),
    ))
    .chain((0..v.deepstack_visual_indexes.len()).map(|j| {
        (
            visual::deepstack_merger(j, "norm"),
            merged,
            visual::deepstack_merger(j, "linear_fc1.weight"),
            visual::deepstack_merger(j, "linear_fc2.weight"),
        )
    }));
    for (norm, norm_len, fc1, fc2) in mergers {
        layer_norm(&mut plan, norm, norm_len);
        biased(&mut plan, fc1, merged, merged);
        biased(&mut plan, fc2, v.out_hidden_size, merged);
    }
    plan
}

/// Every weight tensor of the pack in file order (assets follow them).
pub fn tensor_specs(sem: &Semantics) -> Vec<TensorSpec> {
    weights(sem).iter().flat_map(|w| w.tensors()).collect()
}

/// The files a pack may carry beside its tensors, so one pack is self-contained: the tokenizer,
/// the chat template, the generation defaults and the raw processor configs
/// (`preprocessor_config.json`, the hub's; `processor_config.json`, transformers 5's).
pub const ASSETS: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
];

/// The container tensor holding asset `file` (`len` bytes): 1-D U8.
pub fn asset_spec(file: &str, len: usize) -> TensorSpec {
    TensorSpec {
        name: names::asset(file),
        dtype: Dtype::U8,
        shape: vec![len],
    }
}
