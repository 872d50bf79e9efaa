//! Tensor names in a pack: the hub layout of Qwen3-VL's text decoder, no renaming.

pub const EMBED: &str = "model.language_model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.language_model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

const LAYERS: &str = "model.language_model.layers";

/// Suffix of the scales tensor of a quantized weight: `X` keeps its scales in `X.scales`.
pub const SCALES_SUFFIX: &str = ".scales";

/// The seven linear projections of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The path of this projection inside a layer.
    pub fn suffix(self) -> &'static str {
        match self {
            Proj::Q => "self_attn.q_proj.weight",
            Proj::K => "self_attn.k_proj.weight",
            Proj::V => "self_attn.v_proj.weight",
            Proj::O => "self_attn.o_proj.weight",
            Proj::Gate => "mlp.gate_proj.weight",
            Proj::Up => "mlp.up_proj.weight",
            Proj::Down => "mlp.down_proj.weight",
        }
    }
}

/// The four norm weights of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Norm {
    Input,
    PostAttention,
    QNorm,
    KNorm,
}

impl Norm {
    pub const ALL: [Norm; 4] = [Norm::Input, Norm::PostAttention, Norm::QNorm, Norm::KNorm];

    pub fn suffix(self) -> &'static str {
        match self {
            Norm::Input => "input_layernorm.weight",
            Norm::PostAttention => "post_attention_layernorm.weight",
            Norm::QNorm => "self_attn.q_norm.weight",
            Norm::KNorm => "self_attn.k_norm.weight",
        }
    }
}

/// The tensors of a Qwen3.5 Gated DeltaNet layer's mixer (`linear_attn.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeltaNetPart {
    /// [q | k | v] projection: `2 x key_dim + value_dim` rows.
    InProjQkv,
    /// The output gate's projection: `value_dim` rows.
    InProjZ,
    /// β's projection: one row per value head.
    InProjB,
    /// The decay's projection: one row per value head.
    InProjA,
    /// `[conv_dim, 1, kernel]` in the checkpoint, `[conv_dim, kernel]` in the pack.
    Conv,
    /// `A_log`, one per value head.
    ALog,
    /// `dt_bias`, one per value head.
    DtBias,
    /// The gated RMSNorm's weight (`value_head_dim`; a plain weight, not zero-centred).
    Norm,
    OutProj,
}

impl DeltaNetPart {
    pub fn suffix(self) -> &'static str {
        match self {
            DeltaNetPart::InProjQkv => "linear_attn.in_proj_qkv.weight",
            DeltaNetPart::InProjZ => "linear_attn.in_proj_z.weight",
            DeltaNetPart::InProjB => "linear_attn.in_proj_b.weight",
            DeltaNetPart::InProjA => "linear_attn.in_proj_a.weight",
            DeltaNetPart::Conv => "linear_attn.conv1d.weight",
            DeltaNetPart::ALog => "linear_attn.A_log",
            DeltaNetPart::DtBias => "linear_attn.dt_bias",
            DeltaNetPart::Norm => "linear_attn.norm.weight",
            DeltaNetPart::OutProj => "linear_attn.out_proj.weight",
        }
    }
}

/// "model.language_model.layers.{layer}.linear_attn.in_proj_qkv.weight", ...
pub fn delta_net(layer: usize, part: DeltaNetPart) -> String {
    format!("{LAYERS}.{layer}.{}", part.suffix())
}

/// "model.language_model.layers.{layer}": the prefix of every tensor of a decoder layer.
pub fn layer_prefix(layer: usize) -> String {
    format!("{LAYERS}.{layer}")
}

/// "model.language_model.layers.{layer}.self_attn.q_proj.weight", ".mlp.gate_proj.weight", ...
pub fn proj(layer: usize, p: Proj) -> String {
    format!("{LAYERS}.{layer}.{}", p.suffix())
}

/// "model.language_model.layers.{layer}.input_layernorm.weight", ...
pub fn norm(layer: usize, n: Norm) -> String {
    format!("{LAYERS}.{layer}.{}", n.suffix())
}

/// The scales tensor of quantized weight `name`: `name` + ".scales".
pub fn scales_of(name: &str) -> String {
    format!("{name}{SCALES_SUFFIX}")
}

/// Padding entries that keep the container's offsets contiguous; readers hide them.
pub const PAD_PREFIX: &str = "__pad__.";

pub fn is_padding(name: &str) -> bool {
    name.starts_with(PAD_PREFIX)
}

/// Raw files a pack carries beside the tensors (tokenizer, chat template, ...): `__asset__.<file>`.
pub const ASSET_PREFIX: &str = "__asset__.";

pub fn asset(file: &str) -> String {
    format!("{ASSET_PREFIX}{file}")
}

/// The vision tower's tensors: the hub names (`model.visual.*`), no renaming.
pub mod visual {
    /// Stored as a linear `[hidden, channels * temporal * patch * patch]`: the checkpoint's Conv3d
    /// weight `[hidden, C, T, P, P]` flattened row-major (the same bytes), since a stride-equal
    /// Conv3d over one patch is that matrix product.
    pub const PATCH_EMBED: &str = "model.visual.patch_embed.proj.weight";
    pub const PATCH_EMBED_BIAS: &str = "model.visual.patch_embed.proj.bias";
    /// `[num_position_embeddings, hidden]`.
    pub const POS_EMBED: &str = "model.visual.pos_embed.weight";

    /// `model.visual.blocks.{i}.{suffix}` (`attn.qkv.weight`, `norm1.bias`, ...).
    pub fn block(i: usize, suffix: &str) -> String {
        format!("model.visual.blocks.{i}.{suffix}")
    }
    /// `model.visual.merger.{suffix}`.
    pub fn merger(suffix: &str) -> String {
        format!("model.visual.merger.{suffix}")
    }
    /// `model.visual.deepstack_merger_list.{j}.{suffix}`.
    pub fn deepstack_merger(j: usize, suffix: &str) -> String {
        format!("model.visual.deepstack_merger_list.{j}.{suffix}")
    }
}

/// The checkpoint name of a pack tensor for a text-only Qwen3 checkpoint (`model.layers.*`,
/// `model.embed_tokens.weight`, ...): the same path without `language_model.`.
pub fn text_only_name(pack_name: &str) -> String {
    match pack_name.strip_prefix("model.language_model.") {
        Some(rest) => format!("model.{rest}"),
        None => pack_name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_hub_layout() {
        assert_eq!(
            proj(3, Proj::Q),
            "model.language_model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            proj(0, Proj::Down),
            "model.language_model.layers.0.mlp.down_proj.weight"
        );
        assert_eq!(
            norm(1, Norm::KNorm),
            "model.language_model.layers.1.self_attn.k_norm.weight"
        );
        assert_eq!(
            norm(2, Norm::PostAttention),
            "model.language_model.layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(scales_of(LM_HEAD), "lm_head.weight.scales");
        assert_eq!(text_only_name(EMBED), "model.embed_tokens.weight");
        assert_eq!(text_only_name(LM_HEAD), "lm_head.weight");
        assert_eq!(
            visual::block(4, "attn.qkv.weight"),
            "model.visual.blocks.4.attn.qkv.weight"
        );
        assert_eq!(
            visual::deepstack_merger(1, "norm.bias"),
            "model.visual.deepstack_merger_list.1.norm.bias"
        );
        assert_eq!(asset("tokenizer.json"), "__asset__.tokenizer.json");
    }
}
