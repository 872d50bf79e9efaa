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
}

impl VisionSemantics {
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

pub const ARCH_QWEN3_VL: &str = "qwen3_vl";
pub const ARCH_QWEN3: &str = "qwen3";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SemanticsError {
    #[error("unsupported architecture {0:?} (expected \"qwen3_vl\" or \"qwen3\")")]
    Architecture(String),
    #[error("{field} must be > 0")]
    Zero { field: &'static str },
    #[error("num_heads {heads} is not a multiple of num_kv_heads {kv_heads}")]
    HeadGroups { heads: usize, kv_heads: usize },
    #[error("head_dim {0} must be even (rotary pairs j with j + head_dim/2)")]
    OddHeadDim(usize),
    #[error("the model declares MRoPE but mrope_section is missing")]
    MissingMropeSection,
    #[error("mrope_section {section:?} sums to {sum}, more than head_dim/2 = {half}")]
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
}

impl Semantics {
    /// Refuses by name anything a forward could not run or would run wrongly.
    pub fn validate(&self) -> Result<(), SemanticsError> {
        use SemanticsError as E;
        if self.architecture != ARCH_QWEN3_VL && self.architecture != ARCH_QWEN3 {
            return Err(E::Architecture(self.architecture.clone()));
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
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(E::HeadGroups {
                heads: self.num_heads,
                kv_heads: self.num_kv_heads,
            });
        }
        if self.head_dim % 2 != 0 {
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
            (true, Some(section)) => check_mrope_section(section, self.head_dim)?,
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
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
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
