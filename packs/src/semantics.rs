//! The flattened model facts a forward needs, stored in the pack header beside the tensors.

use serde::{Deserialize, Serialize};

use crate::quant::{QuantKind, Q4_GROUP};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Semantics {
    /// "qwen3_vl" (or "qwen3" for a text-only, no-MRoPE model).
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// The model declares MRoPE.
    pub mrope: bool,
    /// t, h, w frequency counts.
    pub mrope_section: Option<[usize; 3]>,
    pub mrope_interleaved: bool,
    /// len(vision_config.deepstack_visual_indexes).
    pub deepstack_sets: usize,
    pub image_token_id: Option<u32>,
    pub video_token_id: Option<u32>,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
    pub tie_word_embeddings: bool,
    /// Checkpoint dir / generator it came from.
    pub source: String,
    pub quant: QuantKind,
    /// The vision tower, when the pack carries one (`model.visual.*`).
    pub vision: Option<VisionSemantics>,
    /// What image preprocessing needs (`preprocessor_config.json`), with the tower.
    pub preprocess: Option<ImagePreprocess>,
    /// The experts and router of a `qwen3_vl_moe` pack; absent (not even null) in dense packs,
    /// whose header is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSemantics>,
    /// Qwen3.5's Gated DeltaNet layers and its gated, partially rotated full attention
    /// (`qwen3_5`); absent (not even null) in the other families' packs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_net: Option<DeltaNetSemantics>,
}

/// The facts of Qwen3.5's hybrid decoder (`text_config` of a `qwen3_5` checkpoint): which layers
/// are Gated DeltaNet ("linear attention"), their geometry, and the full-attention layers' rotary
/// width. Every norm of the family except the DeltaNet output norm is zero-centred
/// (`x * (1 + w)`); the pack stores those weights as `1 + w` (computed in f32, as transformers
/// does), so the forward's RMSNorm is the same as Qwen3-VL's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltaNetSemantics {
    /// The `linear_attention` layers, ascending; the others are `full_attention`.
    pub linear_layers: Vec<usize>,
    /// `linear_num_key_heads`: q and k heads of a DeltaNet layer.
    pub num_key_heads: usize,
    /// `linear_num_value_heads`: each key head serves num_value_heads / num_key_heads of them.
    pub num_value_heads: usize,
    /// `linear_key_head_dim`.
    pub key_head_dim: usize,
    /// `linear_value_head_dim`.
    pub value_head_dim: usize,
    /// `linear_conv_kernel_dim`: taps of the depthwise causal conv over [q | k | v].
    pub conv_kernel: usize,
    /// Rotated values at the front of each full-attention head: head_dim x partial_rotary_factor.
    pub rotary_dim: usize,
    /// The pack carries the multi-token-prediction head (`mtp.*`): a draft source.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mtp: bool,
}

impl DeltaNetSemantics {
    pub fn is_linear(&self, layer: usize) -> bool {
        self.linear_layers.binary_search(&layer).is_ok()
    }
    /// q (and k) width of a DeltaNet layer: key heads x key head dim.
    pub fn key_dim(&self) -> usize {
        self.num_key_heads * self.key_head_dim
    }
    /// v (and z, and the output) width: value heads x value head dim.
    pub fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }
    /// Channels of the conv (and rows of `in_proj_qkv`): [q | k | v].
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// f32 values of one sequence's recurrent state in one DeltaNet layer: the conv's last
    /// kernel - 1 inputs and the delta rule's key x value matrix per value head.
    pub fn state_values(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
            + self.num_value_heads * self.key_head_dim * self.value_head_dim
    }

    /// Refuses, by field, what the forward could not run or would run wrongly.
    pub fn validate(&self, text: &Semantics) -> Result<(), SemanticsError> {
        let err = |what: String| Err(SemanticsError::DeltaNet(what));
        for (field, value) in [
            ("linear_num_key_heads", self.num_key_heads),
            ("linear_num_value_heads", self.num_value_heads),
            ("linear_key_head_dim", self.key_head_dim),
            ("linear_value_head_dim", self.value_head_dim),
            ("linear_conv_kernel_dim", self.conv_kernel),
            (
                "rotary dims (head_dim x partial_rotary_factor)",
                self.rotary_dim,
            ),
        ] {
            if value == 0 {
                return err(format!("{field} must be > 0"));
            }
            if value > 1 << 16 {
                return err(format!("{field} = {value} is too large"));
            }
        }
        if !self.num_value_heads.is_multiple_of(self.num_key_heads) {
            return err(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {} (each \
                 key head serves a group of value heads)",
                self.num_value_heads, self.num_key_heads
            ));
        }
        if !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > text.head_dim {
            return err(format!(
                "{} rotated dims (head_dim {} x partial_rotary_factor) must be even and at most \
                 head_dim",
                self.rotary_dim, text.head_dim
            ));
        }
        if let Some(&last) = self.linear_layers.last() {
            if last >= text.num_layers {
                return err(format!(
                    "linear layer {last} is past the {} layers (layer_types)",
                    text.num_layers
                ));
            }
        }
        if self.linear_layers.windows(2).any(|w| w[0] >= w[1]) {
            return err("the linear layers must be ascending, each once".into());
        }
        if text.quant == QuantKind::Q4 && !self.value_dim().is_multiple_of(Q4_GROUP) {
            return err(format!(
                "q4 needs linear_num_value_heads x linear_value_head_dim = {} to be a multiple \
                 of {Q4_GROUP} (the K of out_proj)",
                self.value_dim()
            ));
        }
        Ok(())
    }
}

/// The vision tower's facts (`vision_config`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionSemantics {
    pub depth: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    /// The merger's output width: the decoder's hidden size.
    pub out_hidden_size: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
    /// Rows of the learned position table (a square: sqrt(n) x sqrt(n)).
    pub num_position_embeddings: usize,
    /// Tower blocks after which DeepStack sets are tapped.
    pub deepstack_visual_indexes: Vec<usize>,
    /// The blocks' MLP activation as the config names it ("gelu_pytorch_tanh").
    pub hidden_act: String,
    /// Theta of the tower's 2-D rotary.
    pub rope_theta: f64,
    /// The tower's LayerNorm epsilon (transformers fixes 1e-6).
    pub layer_norm_eps: f64,
    /// How the tower's linears are stored (norms, biases and the position table stay f32).
    pub quant: QuantKind,
    /// The tower's bf16 linears multiply by bf16 products — activations rounded to bf16, the
    /// products summed in f32 as `vdpbf16ps` does — instead of f32 products (the weights widened).
    /// Only with `quant` bf16 (`packs build --vision-quant bf16 --vision-products bf16`). Absent
    /// in a pack: f32 products.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bf16_products: bool,
}

/// The only MLP activation the tower implements (transformers' Qwen3-VL default).
pub const VISION_ACT: &str = "gelu_pytorch_tanh";

impl VisionSemantics {
    /// Refuses, by field, a tower the vision crate could not run or would run wrongly.
    pub fn validate(&self, text: &Semantics) -> Result<(), SemanticsError> {
        let err = |what: String| Err(SemanticsError::Vision(what));
        for (field, value) in [
            ("depth", self.depth),
            ("hidden_size", self.hidden_size),
            ("num_heads", self.num_heads),
            ("intermediate_size", self.intermediate_size),
            ("out_hidden_size", self.out_hidden_size),
            ("in_channels", self.in_channels),
            ("patch_size", self.patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("num_position_embeddings", self.num_position_embeddings),
        ] {
            if value == 0 {
                return err(format!("{field} must be > 0"));
            }
            if value > 1 << 20 {
                return err(format!("{field} = {value} is too large"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return err(format!(
                "hidden_size {} is not a multiple of num_heads {}",
                self.hidden_size, self.num_heads
            ));
        }
        // The 2-D rotary gives head_dim/4 frequencies to the row and as many to the column.
        if !self.head_dim().is_multiple_of(4) {
            return err(format!(
                "head_dim {} (hidden_size / num_heads) must be a multiple of 4 for the 2-D rotary",
                self.head_dim()
            ));
        }
        let side = (self.num_position_embeddings as f64).sqrt() as usize;
        if side * side != self.num_position_embeddings {
            return err(format!(
                "num_position_embeddings {} is not a square (the table is sqrt(n) x sqrt(n))",
                self.num_position_embeddings
            ));
        }
        if self.out_hidden_size != text.hidden_size {
            return err(format!(
                "out_hidden_size {} differs from the decoder's hidden_size {}",
                self.out_hidden_size, text.hidden_size
            ));
        }
        if self.deepstack_visual_indexes.len() != text.deepstack_sets {
            return err(format!(
                "{} deepstack_visual_indexes, but the decoder expects {} DeepStack sets",
                self.deepstack_visual_indexes.len(),
                text.deepstack_sets
            ));
        }
        if let Some(&i) = self
            .deepstack_visual_indexes
            .iter()
            .find(|&&i| i >= self.depth)
        {
            return err(format!(
                "deepstack_visual_indexes holds {i}, past the last block {}",
                self.depth - 1
            ));
        }
        if self.hidden_act != VISION_ACT {
            return err(format!(
                "hidden_act {:?} is not supported (expected {VISION_ACT:?})",
                self.hidden_act
            ));
        }
        for (field, value) in [
            ("rope_theta", self.rope_theta),
            ("layer_norm_eps", self.layer_norm_eps),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return err(format!("{field} = {value} must be finite and > 0"));
            }
        }
        if self.bf16_products && self.quant != QuantKind::Bf16 {
            return err(format!(
                "bf16 products are an arithmetic of bf16 linears; this tower's are {} (build with \
                 --vision-quant bf16 --vision-products bf16)",
                self.quant
            ));
        }
        if self.quant == QuantKind::Q4 {
            if let Some(why) = self.q4_refusal() {
                return err(why);
            }
        }
        Ok(())
    }

    /// Why this tower's widths cannot be q4 (a width not a multiple of the q4 group), if so.
    pub fn q4_refusal(&self) -> Option<String> {
        [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            (
                "patch row (channels x temporal x patch^2)",
                self.patch_row_len(),
            ),
            ("merged hidden (hidden x merge^2)", self.merged_hidden()),
        ]
        .into_iter()
        .find(|(_, value)| value % Q4_GROUP != 0)
        .map(|(field, value)| {
            format!(
                "a q4 tower needs {field} = {value} to be a multiple of {Q4_GROUP}; \
                 build with --vision-quant i8 (or bf16, f32)"
            )
        })
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
    /// Values in one patch row: channels x temporal x patch x patch (1536 in Qwen3-VL).
    pub fn patch_row_len(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
    /// The merger's input width: merge^2 patches concatenated.
    pub fn merged_hidden(&self) -> usize {
        self.hidden_size * self.spatial_merge_size * self.spatial_merge_size
    }
}

/// What the image processor needs (`preprocessor_config.json`), parsed at build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagePreprocess {
    pub patch_size: usize,
    pub merge_size: usize,
    pub temporal_patch_size: usize,
    /// `size.shortest_edge` (or `min_pixels`): the least pixels after resize.
    pub min_pixels: u64,
    /// `size.longest_edge` (or `max_pixels`): the most pixels after resize.
    pub max_pixels: u64,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
    pub rescale_factor: f64,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub do_normalize: bool,
    pub do_convert_rgb: bool,
    /// PIL resample filter code (3 = bicubic).
    pub resample: u32,
}

/// PIL's code for BICUBIC, Qwen3-VL's resample filter.
pub const RESAMPLE_BICUBIC: u32 = 3;
/// PIL's convolution filters, the ones the preprocessing implements: LANCZOS 1, BILINEAR 2,
/// BICUBIC 3, BOX 4, HAMMING 5 (NEAREST 0 is not).
pub const RESAMPLE_SUPPORTED: std::ops::RangeInclusive<u32> = 1..=5;

impl ImagePreprocess {
    /// Refuses, by key, a config the preprocessing could not follow or that disagrees with the tower.
    pub fn validate(&self, vision: &VisionSemantics) -> Result<(), SemanticsError> {
        let err = |what: String| Err(SemanticsError::Preprocess(what));
        for (key, ours, tower) in [
            ("patch_size", self.patch_size, vision.patch_size),
            ("merge_size", self.merge_size, vision.spatial_merge_size),
            (
                "temporal_patch_size",
                self.temporal_patch_size,
                vision.temporal_patch_size,
            ),
        ] {
            if ours != tower {
                return err(format!(
                    "{key} = {ours} differs from the tower's {tower} (vision_config)"
                ));
            }
        }
        if self.min_pixels == 0 || self.min_pixels > self.max_pixels {
            return err(format!(
                "size.shortest_edge (min pixels) {} must be > 0 and at most size.longest_edge (max pixels) {}",
                self.min_pixels, self.max_pixels
            ));
        }
        if let Some(s) = self
            .image_std
            .iter()
            .find(|s| !(s.is_finite() && **s != 0.0))
        {
            return err(format!(
                "image_std holds {s}: every entry must be finite and non-zero"
            ));
        }
        if let Some(m) = self.image_mean.iter().find(|m| !m.is_finite()) {
            return err(format!("image_mean holds {m}: every entry must be finite"));
        }
        if !(self.rescale_factor.is_finite() && self.rescale_factor > 0.0) {
            return err(format!(
                "rescale_factor = {} must be finite and > 0",
                self.rescale_factor
            ));
        }
        if !RESAMPLE_SUPPORTED.contains(&self.resample) {
            return err(format!(
                "resample = {} is not supported (expected one of PIL's convolution filters 1..=5; Qwen3-VL uses {RESAMPLE_BICUBIC}, bicubic)",
                self.resample
            ));
        }
        if vision.in_channels != 3 {
            return err(format!(
                "the tower takes {} channels; images are preprocessed to 3 (RGB)",
                vision.in_channels
            ));
        }
        Ok(())
    }
}

/// The MoE facts of a pack (`text_config` of a `qwen3_vl_moe` checkpoint). The router's and the
/// experts' tensor names, and the mapping of the fused expert tensors, are in `crate::moe`.
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
    /// Qwen3.5-MoE: the intermediate size of the shared expert every sparse layer runs beside
    /// the routed ones (behind a sigmoid gate); absent in Qwen3-VL-MoE packs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_intermediate_size: Option<usize>,
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
        if let Some(shared) = self.shared_expert_intermediate_size {
            if shared == 0 || shared > 1 << 24 {
                return err(format!(
                    "shared_expert_intermediate_size = {shared} must be in 1..=2^24"
                ));
            }
            if quant == QuantKind::Q4 && !shared.is_multiple_of(Q4_GROUP) {
                return err(format!(
                    "q4 needs shared_expert_intermediate_size = {shared} to be a multiple of \
                     {Q4_GROUP} (the K of the shared expert's down projection)"
                ));
            }
        }
        if quant == QuantKind::Q4 && !self.moe_intermediate_size.is_multiple_of(Q4_GROUP) {
            return err(format!(
                "q4 needs moe_intermediate_size = {} to be a multiple of {Q4_GROUP} (the K of each expert's down projection)",
                self.moe_intermediate_size
            ));
        }
        Ok(())
    }
}

pub const ARCH_QWEN3_VL: &str = "qwen3_vl";
pub const ARCH_QWEN3: &str = "qwen3";
/// Qwen3-VL with mixture-of-experts layers (Qwen3-VL-30B-A3B); `Semantics::moe` says which.
pub const ARCH_QWEN3_VL_MOE: &str = "qwen3_vl_moe";
/// Qwen3.5 (dense): Gated DeltaNet layers between gated full-attention layers; `Semantics::
/// delta_net` says which.
pub const ARCH_QWEN3_5: &str = "qwen3_5";
/// Qwen3.5-MoE (and Qwen3.6): Qwen3.5's layers with routed experts and a shared expert in every
/// layer.
pub const ARCH_QWEN3_5_MOE: &str = "qwen3_5_moe";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SemanticsError {
    #[error(
        "unsupported architecture {0:?} (expected \"qwen3_vl\", \"qwen3_vl_moe\", \"qwen3_5\", \"qwen3_5_moe\" or \"qwen3\")"
    )]
    Architecture(String),
    #[error("Gated DeltaNet (qwen3_5): {0}")]
    DeltaNet(String),
    #[error("{field} must be > 0")]
    Zero { field: &'static str },
    #[error("num_heads {heads} is not a multiple of num_kv_heads {kv_heads}")]
    HeadGroups { heads: usize, kv_heads: usize },
    #[error("head_dim {0} must be even (rotary pairs j with j + head_dim/2)")]
    OddHeadDim(usize),
    #[error("the model declares MRoPE but mrope_section is missing")]
    MissingMropeSection,
    #[error("mrope_section {section:?} sums to {sum}, more than the rotated dims / 2 = {half}")]
    MropeSectionTooLarge {
        section: [usize; 3],
        sum: usize,
        half: usize,
    },
    #[error("mrope_section {0:?} is set but the model does not declare MRoPE")]
    MropeSectionWithoutMrope([usize; 3]),
    #[error("{field} = {value} must be finite and > 0")]
    NotPositive { field: &'static str, value: f64 },
    #[error("q4 needs {field} = {value} to be a multiple of {Q4_GROUP} (it is the K of a quantized linear)")]
    Q4Group { field: &'static str, value: usize },
    #[error("{field} = {value} is too large")]
    Overflow { field: &'static str, value: usize },
    #[error("vision_config: {0}")]
    Vision(String),
    #[error("preprocessor_config: {0}")]
    Preprocess(String),
    #[error("mixture of experts: {0}")]
    Moe(String),
}

impl Semantics {
    /// Refuses by name anything a forward could not run or would run wrongly.
    pub fn validate(&self) -> Result<(), SemanticsError> {
        use SemanticsError as E;
        if ![
            ARCH_QWEN3_VL,
            ARCH_QWEN3_VL_MOE,
            ARCH_QWEN3_5,
            ARCH_QWEN3_5_MOE,
            ARCH_QWEN3,
        ]
        .contains(&self.architecture.as_str())
        {
            return Err(E::Architecture(self.architecture.clone()));
        }
        let arch = self.architecture.as_str();
        let hybrid = arch == ARCH_QWEN3_5 || arch == ARCH_QWEN3_5_MOE;
        match (&self.delta_net, hybrid) {
            (Some(d), true) => d.validate(self)?,
            (None, false) => {}
            (None, true) => {
                return Err(E::DeltaNet(format!(
                    "architecture {ARCH_QWEN3_5} without its layer kinds (delta_net)"
                )))
            }
            (Some(_), false) => {
                return Err(E::DeltaNet(format!(
                    "DeltaNet layers in a {} pack",
                    self.architecture
                )))
            }
        }
        let sparse = arch == ARCH_QWEN3_VL_MOE || arch == ARCH_QWEN3_5_MOE;
        match (&self.moe, sparse) {
            (Some(moe), true) => {
                moe.validate(self.num_layers, self.quant)?;
                if moe.shared_expert_intermediate_size.is_some() != (arch == ARCH_QWEN3_5_MOE) {
                    return Err(E::Moe(format!(
                        "a shared expert belongs to {ARCH_QWEN3_5_MOE} packs only ({arch})"
                    )));
                }
            }
            (None, false) => {}
            (None, true) => {
                return Err(E::Moe(format!(
                    "architecture {arch} without its experts (moe)"
                )))
            }
            (Some(_), false) => {
                return Err(E::Moe(format!(
                    "experts (moe) in a {} pack",
                    self.architecture
                )))
            }
        }
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
        ] {
            if value == 0 {
                return Err(E::Zero { field });
            }
            // Keeps every derived byte size (a few products of these) far from usize overflow.
            if value > 1 << 24 {
                return Err(E::Overflow { field, value });
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(E::HeadGroups {
                heads: self.num_heads,
                kv_heads: self.num_kv_heads,
            });
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(E::OddHeadDim(self.head_dim));
        }
        for (field, value) in [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(E::NotPositive { field, value });
            }
        }
        match (self.mrope, self.mrope_section) {
            (true, None) => return Err(E::MissingMropeSection),
            (false, Some(section)) => return Err(E::MropeSectionWithoutMrope(section)),
            (true, Some(section)) => check_mrope_section(section, self.rotary_dim())?,
            (false, None) => {}
        }
        if self.quant == QuantKind::Q4 {
            for (field, value) in [
                ("hidden_size", self.hidden_size),
                ("num_heads * head_dim", self.num_heads * self.head_dim),
                ("intermediate_size", self.intermediate_size),
            ] {
                if value % Q4_GROUP != 0 {
                    return Err(E::Q4Group { field, value });
                }
            }
        }
        match (&self.vision, &self.preprocess) {
            (Some(v), Some(p)) => {
                v.validate(self)?;
                p.validate(v)?;
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(E::Preprocess(
                    "a pack with a vision tower needs its preprocessing config".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(E::Preprocess(
                    "a preprocessing config without a vision tower".into(),
                ))
            }
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Values rotated at the front of each attention head: all of head_dim, or Qwen3.5's part.
    pub fn rotary_dim(&self) -> usize {
        self.delta_net
            .as_ref()
            .map_or(self.head_dim, |d| d.rotary_dim)
    }

    /// Rows of `q_proj`: the queries, and in Qwen3.5 a sigmoid gate per query value beside them
    /// (per head: head_dim query values, then head_dim gate values).
    pub fn q_proj_rows(&self) -> usize {
        if self.delta_net.is_some() {
            2 * self.q_dim()
        } else {
            self.q_dim()
        }
    }

    /// Whether decoder layer `layer` is a Gated DeltaNet layer (Qwen3.5).
    pub fn is_linear_attention(&self, layer: usize) -> bool {
        self.delta_net.as_ref().is_some_and(|d| d.is_linear(layer))
    }

    /// Layers with attention over a KV cache: all, or Qwen3.5's full-attention layers.
    pub fn kv_layers(&self) -> Vec<usize> {
        (0..self.num_layers)
            .filter(|&l| !self.is_linear_attention(l))
            .collect()
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Whether decoder layer `layer` has a router and experts instead of the dense MLP.
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_sparse(layer))
    }
}

/// Three counts summing to at most head_dim/2 (the number of rotary frequencies).
pub fn check_mrope_section(section: [usize; 3], head_dim: usize) -> Result<(), SemanticsError> {
    let sum = section
        .iter()
        .try_fold(0usize, |acc, &v| acc.checked_add(v))
        .unwrap_or(usize::MAX);
    let half = head_dim / 2;
    if sum > half {
        return Err(SemanticsError::MropeSectionTooLarge { section, sum, half });
    }
    Ok(())
}
