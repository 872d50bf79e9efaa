//! Hugging Face hub checkpoints: `config.json` plus `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`. Tensors are read block by block with positioned reads, so
//! memory stays bounded by one block whatever the checkpoint size (pages of a memory map would
//! count toward the process's resident set until unmapped).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use rayon::prelude::*;
use serde_json::Value;

use crate::container::{self, Dtype, Entry, HeaderError, LEN_PREFIX};
use crate::image_processor;
use crate::layout::{self, WeightPlan};
use crate::moe::{self, ExpertProj, FusedOrientation, MoeSemantics};
use crate::names;
use crate::quant::QuantKind;
use crate::semantics::{
    self, DeltaNetSemantics, ImagePreprocess, Semantics, SemanticsError, VisionSemantics,
    ARCH_QWEN3, ARCH_QWEN3_5, ARCH_QWEN3_5_MOE, ARCH_QWEN3_VL, ARCH_QWEN3_VL_MOE,
};

pub const CONFIG: &str = "config.json";
pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX: &str = "model.safetensors.index.json";
pub use crate::image_processor::{PREPROCESSOR, PROCESSOR};

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {what}")]
    Json { path: PathBuf, what: String },
    #[error("{path}: {key}: {what}")]
    Key {
        path: PathBuf,
        key: String,
        what: String,
    },
    #[error("{path}: {len} bytes, more than the {max} a JSON file of a checkpoint may hold")]
    TooLarge { path: PathBuf, len: u64, max: u64 },
    #[error("{path}: model_type {found:?} is not supported (expected \"qwen3_vl\", \"qwen3_vl_moe\", \"qwen3_5\", \"qwen3_5_moe\" or text-only \"qwen3\")")]
    ModelType { path: PathBuf, found: String },
    #[error(
        "{path}: the config declares MRoPE (qwen3_vl) but {key}.mrope_section is missing; \
         state it with --mrope-section (Qwen3-VL ships 24,20,20) rather than guessing the axis layout"
    )]
    MissingMropeSection { path: PathBuf, key: String },
    #[error(
        "{path}: {key}.mrope_section = {section} is not three non-negative integers summing to at \
         most head_dim/2 = {half}"
    )]
    BadMropeSection {
        path: PathBuf,
        key: String,
        section: String,
        half: usize,
    },
    #[error("{path}: {key}.mrope_section = {section} is not three non-negative integers")]
    MalformedMropeSection {
        path: PathBuf,
        key: String,
        section: String,
    },
    #[error("--mrope-section {given:?} is not three non-negative integers summing to at most head_dim/2 = {half}")]
    BadMropeOverride { given: [usize; 3], half: usize },
    #[error("{path}: {key}.mrope_section is {config:?} but --mrope-section says {given:?}")]
    MropeConflict {
        path: PathBuf,
        key: String,
        config: [usize; 3],
        given: [usize; 3],
    },
    #[error("{path}: --mrope-section was given but a text-only qwen3 model has no MRoPE")]
    MropeOverrideWithoutMrope { path: PathBuf },
    #[error(
        "{path}: {key}.mrope_interleaved is false, but transformers' Qwen3-VL always interleaves \
         the MRoPE planes; fix the config"
    )]
    NotInterleaved { path: PathBuf, key: String },
    #[error("{path}: {key}.rope_type {found:?} is not supported (expected \"default\")")]
    RopeType {
        path: PathBuf,
        key: String,
        found: String,
    },
    #[error("{dir}: no {SINGLE_FILE} and no {INDEX}")]
    NoWeights { dir: PathBuf },
    #[error("{path}: not a safetensors file: {source}")]
    Shard { path: PathBuf, source: HeaderError },
    #[error("{path}: weight_map names shard {shard:?}, which is not a plain file name in the checkpoint directory")]
    ShardName { path: PathBuf, shard: String },
    #[error("{dir}: tensor {name} is missing from the checkpoint")]
    MissingTensor { dir: PathBuf, name: String },
    #[error("{path}: weight_map puts tensor {name} in this shard, but it is not there")]
    NotInShard { path: PathBuf, name: String },
    #[error("{path}: tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error(
        "{path}: fused expert tensor {name} has shape {found:?}, expected {expected:?} \
         (transformers 5.x) or {transposed:?} (the hub's, transposed)"
    )]
    FusedShape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        expected: [usize; 3],
        transposed: [usize; 3],
    },
    #[error("{path}: tensor {name} is {dtype}, expected BF16, F16 or F32")]
    TensorDtype {
        path: PathBuf,
        name: String,
        dtype: Dtype,
    },
    #[error("{path}: invalid model: {source}")]
    Semantics {
        path: PathBuf,
        source: SemanticsError,
    },
    /// The image processor's settings cannot be followed or disagree with the tower; `path` is
    /// the file they were read from, `within` the key holding them there (`image_processor: `
    /// in `processor_config.json`, empty in `preprocessor_config.json`).
    #[error("{path}: {within}{what}")]
    Preprocess {
        path: PathBuf,
        within: String,
        what: String,
    },
}

/// The facts of `config.json`, before head_dim is known for certain.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigFacts {
    /// Everything but `head_dim` (0 when the config omits it), `quant` and `source`.
    pub semantics: Semantics,
    /// `head_dim` as the config states it.
    pub head_dim: Option<usize>,
    /// Where the rope keys live ("text_config.rope_scaling", ...), for messages.
    pub rope_key: String,
    /// The rotated part of each head (Qwen3.5), as the config states it or defaults it.
    pub partial_rotary_factor: Option<f64>,
}

/// Parses a config. `mrope_override` is `--mrope-section`. The section's sum is checked later,
/// once head_dim is known (`finish_config`).
pub fn parse_config(
    path: &Path,
    config: &Value,
    mrope_override: Option<[usize; 3]>,
) -> Result<ConfigFacts, HfError> {
    let key_err = |key: &str, what: &str| HfError::Key {
        path: path.to_path_buf(),
        key: key.to_string(),
        what: what.to_string(),
    };
    if !config.is_object() {
        return Err(key_err("(top level)", "expected a JSON object"));
    }
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (architecture, text, text_prefix) = match model_type {
        ARCH_QWEN3_VL | ARCH_QWEN3_VL_MOE | ARCH_QWEN3_5 | ARCH_QWEN3_5_MOE => {
            let text = config.get("text_config").filter(|t| t.is_object());
            (
                match model_type {
                    ARCH_QWEN3_VL => ARCH_QWEN3_VL,
                    ARCH_QWEN3_5 => ARCH_QWEN3_5,
                    ARCH_QWEN3_5_MOE => ARCH_QWEN3_5_MOE,
                    _ => ARCH_QWEN3_VL_MOE,
                },
                text.ok_or_else(|| key_err("text_config", "missing object"))?,
                "text_config.",
            )
        }
        ARCH_QWEN3 => (ARCH_QWEN3, config, ""),
        other => {
            return Err(HfError::ModelType {
                path: path.to_path_buf(),
                found: other.to_string(),
            })
        }
    };
    let hybrid = architecture == ARCH_QWEN3_5 || architecture == ARCH_QWEN3_5_MOE;
    let full = |key: &str| format!("{text_prefix}{key}");
    let size = |key: &str| -> Result<Option<usize>, HfError> {
        match text.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| {
                    key_err(
                        &full(key),
                        &format!("expected a non-negative integer, got {v}"),
                    )
                }),
        }
    };
    let required = |key: &str| size(key)?.ok_or_else(|| key_err(&full(key), "missing"));
    let float = |obj: &Value, prefix: &str, key: &str| -> Result<Option<f64>, HfError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                key_err(
                    &format!("{prefix}{key}"),
                    &format!("expected a number, got {v}"),
                )
            }),
        }
    };
    let token_id = |key: &str| -> Result<Option<u32>, HfError> {
        match config.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| key_err(key, &format!("expected a token id, got {v}"))),
        }
    };

    let num_heads = required("num_attention_heads")?;
    let num_kv_heads = size("num_key_value_heads")?.unwrap_or(num_heads);
    let rms_norm_eps = float(text, text_prefix, "rms_norm_eps")?.unwrap_or(1e-6);

    // transformers 5.x: rope_parameters {rope_type, rope_theta, mrope_section, ...};
    // 4.57 hub configs: rope_scaling {rope_type, mrope_section, ...} with rope_theta beside it.
    let (rope, rope_key) = match (text.get("rope_parameters"), text.get("rope_scaling")) {
        (Some(p), _) if p.is_object() => (Some(p), full("rope_parameters")),
        (_, Some(s)) if s.is_object() => (Some(s), full("rope_scaling")),
        _ => (None, full("rope_scaling")),
    };
    let rope_prefix = format!("{rope_key}.");
    let rope_theta = match rope
        .map(|r| float(r, &rope_prefix, "rope_theta"))
        .transpose()?
        .flatten()
    {
        Some(theta) => theta,
        None => float(text, text_prefix, "rope_theta")?.ok_or_else(|| {
            key_err(
                &full("rope_theta"),
                "missing (looked beside and inside the rope parameters)",
            )
        })?,
    };
    if let Some(rope) = rope {
        let rope_type = rope
            .get("rope_type")
            .or_else(|| rope.get("type"))
            .and_then(Value::as_str);
        if let Some(t) = rope_type.filter(|t| *t != "default" && *t != "mrope") {
            return Err(HfError::RopeType {
                path: path.to_path_buf(),
                key: rope_key,
                found: t.to_string(),
            });
        }
    }

    let mrope = architecture != ARCH_QWEN3;
    let (mrope_section, mrope_interleaved) = if mrope {
        let from_config = match rope.and_then(|r| r.get("mrope_section")) {
            None | Some(Value::Null) => None,
            Some(v) => Some(section_of(v).ok_or_else(|| HfError::MalformedMropeSection {
                path: path.to_path_buf(),
                key: rope_key.clone(),
                section: v.to_string(),
            })?),
        };
        // transformers' Qwen3.5 rotary falls back to [11, 11, 10] when the config has none.
        let from_config = from_config.or((hybrid).then_some([11, 11, 10]));
        let section = match (from_config, mrope_override) {
            (Some(c), Some(g)) if c != g => {
                return Err(HfError::MropeConflict {
                    path: path.to_path_buf(),
                    key: rope_key,
                    config: c,
                    given: g,
                })
            }
            (Some(c), _) => c,
            (None, Some(g)) => g,
            (None, None) => {
                return Err(HfError::MissingMropeSection {
                    path: path.to_path_buf(),
                    key: rope_key,
                })
            }
        };
        if rope
            .and_then(|r| r.get("mrope_interleaved"))
            .and_then(Value::as_bool)
            == Some(false)
        {
            return Err(HfError::NotInterleaved {
                path: path.to_path_buf(),
                key: rope_key,
            });
        }
        (Some(section), true)
    } else {
        if mrope_override.is_some() {
            return Err(HfError::MropeOverrideWithoutMrope {
                path: path.to_path_buf(),
            });
        }
        (None, false)
    };

    let deepstack_sets = if hybrid {
        0 // Qwen3.5's tower has no DeepStack mergers
    } else if mrope {
        config
            .get("vision_config")
            .and_then(|v| v.get("deepstack_visual_indexes"))
            .and_then(Value::as_array)
            .map(Vec::len)
            .ok_or_else(|| key_err("vision_config.deepstack_visual_indexes", "missing array"))?
    } else {
        0
    };

    let tie = match config
        .get("tie_word_embeddings")
        .or_else(|| text.get("tie_word_embeddings"))
    {
        None | Some(Value::Null) => false,
        Some(v) => v.as_bool().ok_or_else(|| {
            key_err(
                "tie_word_embeddings",
                &format!("expected a boolean, got {v}"),
            )
        })?,
    };

    // Qwen3_5TextConfig defaults head_dim to 256 (not hidden / heads).
    let head_dim = match size("head_dim")? {
        None if hybrid => Some(256),
        d => d,
    };
    let num_layers = required("num_hidden_layers")?;
    let delta_net = if hybrid {
        Some(parse_delta_net(path, text, num_layers)?)
    } else {
        None
    };
    // transformers reads partial_rotary_factor from the rope parameters (5.x) or beside them,
    // and Qwen3.5's config sets 0.25 when neither has it.
    let partial_rotary_factor = match rope
        .map(|r| float(r, &rope_prefix, "partial_rotary_factor"))
        .transpose()?
        .flatten()
    {
        Some(f) => Some(f),
        None => float(text, text_prefix, "partial_rotary_factor")?,
    };
    let partial_rotary_factor = match (partial_rotary_factor, hybrid) {
        (f, true) => Some(f.unwrap_or(0.25)),
        (Some(f), false) if f != 1.0 => {
            return Err(key_err(
                &full("partial_rotary_factor"),
                &format!("{f}: only Qwen3.5 (qwen3_5) rotates part of each head here"),
            ))
        }
        _ => None,
    };
    if let Some(f) = partial_rotary_factor.filter(|f| !(*f > 0.0 && *f <= 1.0)) {
        return Err(key_err(
            &full("partial_rotary_factor"),
            &format!("{f} must be in (0, 1]"),
        ));
    }
    let moe = match architecture {
        ARCH_QWEN3_VL_MOE => Some(parse_moe(path, text, num_layers)?),
        ARCH_QWEN3_5_MOE => {
            let mut m = parse_moe(path, text, num_layers)?;
            // Qwen3_5MoeDecoderLayer routes every layer (it has no decoder_sparse_step or
            // mlp_only_layers), and runs a shared expert beside the routed ones.
            m.sparse_layers = (0..num_layers).collect();
            m.shared_expert_intermediate_size =
                Some(size("shared_expert_intermediate_size")?.unwrap_or(512));
            Some(m)
        }
        _ => None,
    };
    // Only dense layers use it; transformers' Qwen3VLMoeTextConfig defaults it to 5632.
    let intermediate_size = match (size("intermediate_size")?, &moe) {
        (Some(v), _) => v,
        (None, Some(_)) => 5632,
        (None, None) => required("intermediate_size")?,
    };
    let semantics = Semantics {
        architecture: architecture.to_string(),
        vocab_size: required("vocab_size")?,
        hidden_size: required("hidden_size")?,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim: head_dim.unwrap_or(0),
        intermediate_size,
        rms_norm_eps,
        rope_theta,
        mrope,
        mrope_section,
        mrope_interleaved,
        deepstack_sets,
        image_token_id: token_id("image_token_id")?,
        video_token_id: token_id("video_token_id")?,
        vision_start_token_id: token_id("vision_start_token_id")?,
        vision_end_token_id: token_id("vision_end_token_id")?,
        tie_word_embeddings: tie,
        source: String::new(),
        quant: QuantKind::F32,
        vision: None,
        preprocess: None,
        moe,
        delta_net,
    };
    Ok(ConfigFacts {
        semantics,
        head_dim,
        rope_key,
        partial_rotary_factor,
    })
}

/// The Gated DeltaNet keys of a `qwen3_5` text config: `layer_types` (else every
/// `full_attention_interval`-th layer full, transformers' default rule with interval 4) and the
/// linear heads. `rotary_dim` is set once head_dim is known (`finish_config`).
fn parse_delta_net(
    path: &Path,
    text: &Value,
    num_layers: usize,
) -> Result<DeltaNetSemantics, HfError> {
    let key_err = |key: &str, what: String| HfError::Key {
        path: path.to_path_buf(),
        key: format!("text_config.{key}"),
        what,
    };
    let size = |key: &str, default: usize| -> Result<usize, HfError> {
        match text.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| key_err(key, format!("expected a non-negative integer, got {v}"))),
        }
    };
    let linear_layers = match text.get("layer_types") {
        None | Some(Value::Null) => {
            let interval = size("full_attention_interval", 4)?;
            if interval == 0 {
                return Err(key_err("full_attention_interval", "must be > 0".into()));
            }
            (0..num_layers)
                .filter(|l| (l + 1) % interval != 0)
                .collect()
        }
        Some(Value::Array(kinds)) => {
            if kinds.len() != num_layers {
                return Err(key_err(
                    "layer_types",
                    format!("{} entries for {num_layers} layers", kinds.len()),
                ));
            }
            let mut linear = Vec::new();
            for (l, kind) in kinds.iter().enumerate() {
                match kind.as_str() {
                    Some("linear_attention") => linear.push(l),
                    Some("full_attention") => {}
                    _ => {
                        return Err(key_err(
                            "layer_types",
                            format!(
                                "entry {l} is {kind}, expected \"linear_attention\" or \"full_attention\""
                            ),
                        ))
                    }
                }
            }
            linear
        }
        Some(v) => {
            return Err(key_err(
                "layer_types",
                format!("expected a list of layer kinds, got {v}"),
            ))
        }
    };
    // transformers' Qwen3.5 attention always gates its output; a config without the gate
    // describes another model than the one transformers runs.
    match text.get("attn_output_gate") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(v) => {
            return Err(key_err(
                "attn_output_gate",
                format!(
                    "{v}: transformers' Qwen3.5 attention always has its output gate (q_proj \
                     carries it); fix the config"
                ),
            ))
        }
    }
    // The defaults are Qwen3_5TextConfig's.
    Ok(DeltaNetSemantics {
        linear_layers,
        num_key_heads: size("linear_num_key_heads", 16)?,
        num_value_heads: size("linear_num_value_heads", 32)?,
        key_head_dim: size("linear_key_head_dim", 128)?,
        value_head_dim: size("linear_value_head_dim", 128)?,
        conv_kernel: size("linear_conv_kernel_dim", 4)?,
        rotary_dim: 0,
        // Set by `Checkpoint::open` when the shards hold the head.
        mtp: false,
    })
}

/// The MoE keys of a `qwen3_vl_moe` text config. Range checks (zero experts, top-k above the
/// expert count, ...) are `MoeSemantics::validate`'s.
fn parse_moe(path: &Path, text: &Value, num_layers: usize) -> Result<MoeSemantics, HfError> {
    let key_err = |key: &str, what: String| HfError::Key {
        path: path.to_path_buf(),
        key: format!("text_config.{key}"),
        what,
    };
    let size = |key: &str| -> Result<Option<usize>, HfError> {
        match text.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| key_err(key, format!("expected a non-negative integer, got {v}"))),
        }
    };
    // 4.57 and the hub write num_experts; 5.x writes its attribute name, num_local_experts.
    let num_experts = match (size("num_experts")?, size("num_local_experts")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(key_err(
                "num_experts",
                format!("{a} disagrees with text_config.num_local_experts {b}"),
            ))
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            return Err(key_err(
                "num_experts",
                "missing (the expert count; transformers 5.x spells it num_local_experts)".into(),
            ))
        }
    };
    let top_k = size("num_experts_per_tok")?.ok_or_else(|| {
        key_err(
            "num_experts_per_tok",
            "missing (the experts each token is routed to, top-k)".into(),
        )
    })?;
    let moe_intermediate_size = size("moe_intermediate_size")?.ok_or_else(|| {
        key_err(
            "moe_intermediate_size",
            "missing (each expert's intermediate size)".into(),
        )
    })?;
    let decoder_sparse_step = size("decoder_sparse_step")?.unwrap_or(1);
    let mlp_only_layers = match text.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => index_list(v, "layer indexes").map_err(|w| key_err("mlp_only_layers", w))?,
    };
    // transformers' Qwen3-VL-MoE router always divides the top-k weights by their sum; a config
    // asking for the raw softmax weights describes another model than the one transformers runs.
    match text.get("norm_topk_prob") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            return Err(key_err(
                "norm_topk_prob",
                "false, but transformers' Qwen3-VL-MoE always renormalizes the top-k routing \
                 weights (it has no such option): fix the config"
                    .into(),
            ))
        }
        Some(v) => {
            return Err(key_err(
                "norm_topk_prob",
                format!("expected a boolean, got {v}"),
            ))
        }
    }
    let sparse_layers = MoeSemantics::sparse_layers_of(
        num_layers,
        num_experts,
        decoder_sparse_step,
        &mlp_only_layers,
    );
    Ok(MoeSemantics {
        num_experts,
        top_k,
        moe_intermediate_size,
        norm_topk_prob: true,
        decoder_sparse_step,
        mlp_only_layers,
        sparse_layers,
        shared_expert_intermediate_size: None,
    })
}

/// Three non-negative integers.
fn section_of(v: &Value) -> Option<[usize; 3]> {
    let a = v.as_array().filter(|a| a.len() == 3)?;
    let mut out = [0usize; 3];
    for (o, x) in out.iter_mut().zip(a) {
        *o = usize::try_from(x.as_u64()?).ok()?;
    }
    Some(out)
}

/// Sets head_dim (the config's, else `inferred`) and checks the section against it.
pub fn finish_config(
    path: &Path,
    facts: &ConfigFacts,
    inferred_head_dim: usize,
    mrope_override: Option<[usize; 3]>,
) -> Result<Semantics, HfError> {
    let mut sem = facts.semantics.clone();
    sem.head_dim = facts.head_dim.unwrap_or(inferred_head_dim);
    if let (Some(d), Some(f)) = (&mut sem.delta_net, facts.partial_rotary_factor) {
        // Python's int(head_dim * partial_rotary_factor).
        d.rotary_dim = (sem.head_dim as f64 * f) as usize;
    }
    if let Some(section) = sem.mrope_section {
        if let Err(SemanticsError::MropeSectionTooLarge { half, .. }) =
            semantics::check_mrope_section(section, sem.rotary_dim())
        {
            return Err(if mrope_override == Some(section) {
                HfError::BadMropeOverride {
                    given: section,
                    half,
                }
            } else {
                HfError::BadMropeSection {
                    path: path.to_path_buf(),
                    key: facts.rope_key.clone(),
                    section: format!("[{}, {}, {}]", section[0], section[1], section[2]),
                    half,
                }
            });
        }
    }
    sem.validate().map_err(|source| HfError::Semantics {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(sem)
}

/// The tower's facts from `vision_config` (the 4.57 and 5.x spellings). `quant` is set by the build.
pub fn parse_vision_config(path: &Path, config: &Value) -> Result<VisionSemantics, HfError> {
    let key_err = |key: &str, what: String| HfError::Key {
        path: path.to_path_buf(),
        key: format!("vision_config.{key}"),
        what,
    };
    let vision = config
        .get("vision_config")
        .filter(|v| v.is_object())
        .ok_or_else(|| HfError::Key {
            path: path.to_path_buf(),
            key: "vision_config".into(),
            what: "missing object (the checkpoint holds model.visual.* tensors)".into(),
        })?;
    let size = |key: &str| -> Result<usize, HfError> {
        let v = vision
            .get(key)
            .ok_or_else(|| key_err(key, "missing".into()))?;
        v.as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| key_err(key, format!("expected a non-negative integer, got {v}")))
    };
    let hidden_size = size("hidden_size")?;
    let num_heads = size("num_heads")?;
    if let Some(v) = vision.get("head_dim").filter(|v| !v.is_null()) {
        if v.as_u64() != Some((hidden_size / num_heads.max(1)) as u64) {
            return Err(key_err(
                "head_dim",
                format!("{v} differs from hidden_size / num_heads; such a tower is not supported"),
            ));
        }
    }
    let model_type = config.get("model_type").and_then(Value::as_str);
    let qwen3_5 = model_type == Some(ARCH_QWEN3_5) || model_type == Some(ARCH_QWEN3_5_MOE);
    let deepstack_visual_indexes = match vision.get("deepstack_visual_indexes") {
        // Qwen3.5's tower is Qwen3-VL's without the DeepStack mergers.
        None | Some(Value::Null) if qwen3_5 => Vec::new(),
        Some(_) if qwen3_5 => {
            return Err(key_err(
                "deepstack_visual_indexes",
                "set in a qwen3_5 config, whose tower has no DeepStack mergers".into(),
            ))
        }
        Some(v) => {
            index_list(v, "block indexes").map_err(|w| key_err("deepstack_visual_indexes", w))?
        }
        None => return Err(key_err("deepstack_visual_indexes", "missing".into())),
    };
    let hidden_act = match vision.get("hidden_act") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => semantics::VISION_ACT.to_string(),
        Some(v) => return Err(key_err("hidden_act", format!("expected a string, got {v}"))),
    };
    let theta = vision
        .get("rope_parameters")
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| vision.get("rope_theta"));
    let rope_theta = match theta {
        None | Some(Value::Null) => 10_000.0,
        Some(v) => v.as_f64().ok_or_else(|| {
            key_err(
                "rope_parameters.rope_theta",
                format!("expected a number, got {v}"),
            )
        })?,
    };
    Ok(VisionSemantics {
        depth: size("depth")?,
        hidden_size,
        num_heads,
        intermediate_size: size("intermediate_size")?,
        out_hidden_size: size("out_hidden_size")?,
        in_channels: match vision.get("in_channels") {
            None | Some(Value::Null) => 3,
            Some(_) => size("in_channels")?,
        },
        patch_size: size("patch_size")?,
        spatial_merge_size: size("spatial_merge_size")?,
        temporal_patch_size: size("temporal_patch_size")?,
        num_position_embeddings: size("num_position_embeddings")?,
        deepstack_visual_indexes,
        hidden_act,
        rope_theta,
        // transformers builds every tower LayerNorm with eps=1e-6 whatever the config says.
        layer_norm_eps: 1e-6,
        quant: QuantKind::F32,
        bf16_products: false,
    })
}

/// A JSON array of indexes (`what` names them), or what the refusal says instead.
fn index_list(value: &Value, what: &str) -> Result<Vec<usize>, String> {
    let Value::Array(a) = value else {
        return Err(format!("expected an array, got {value}"));
    };
    a.iter()
        .map(|v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| format!("expected {what}, got {value}"))
}

/// What preprocessing needs from `preprocessor_config.json` (the image processor at the top level
/// of `config`), with transformers' defaults for the keys it leaves out (Qwen2VLImageProcessor's
/// class attributes) and `min_pixels` / `max_pixels` overriding `size` as its constructor does
/// (`image_processor::parse`).
pub fn parse_preprocessor_config(path: &Path, config: &Value) -> Result<ImagePreprocess, HfError> {
    image_processor::parse(path, "", config)
}

struct Shard {
    path: PathBuf,
    file: File,
    data_start: u64,
}

struct SourceTensor {
    shard: usize,
    entry: Entry,
    /// How a fused expert tensor is laid out (`None` for every other tensor).
    fused: Option<FusedOrientation>,
}

/// An opened checkpoint: config facts and the location of every decoder tensor.
pub struct Checkpoint {
    dir: PathBuf,
    semantics: Semantics,
    shards: Vec<Shard>,
    /// Keyed by pack name.
    tensors: HashMap<String, SourceTensor>,
    /// What was left out and why.
    warnings: Vec<String>,
}

impl Checkpoint {
    /// Reads the config and every shard header, and checks that each decoder tensor is present
    /// with the expected shape and a float dtype. With `with_vision`, a checkpoint that holds the
    /// vision tower (`model.visual.patch_embed.proj.weight`) must hold all of it, with its
    /// `vision_config` and its image processor's settings (`processor_config.json`'s
    /// `image_processor`, else `preprocessor_config.json`: `image_processor::find`); without
    /// either file, the tower is left out.
    pub fn open(
        dir: &Path,
        mrope_override: Option<[usize; 3]>,
        with_vision: bool,
    ) -> Result<Checkpoint, HfError> {
        let config_path = dir.join(CONFIG);
        let config = read_json(&config_path)?;
        let facts = parse_config(&config_path, &config, mrope_override)?;
        let text_only = facts.semantics.architecture == ARCH_QWEN3;
        let source_name = |pack_name: &str| {
            if text_only {
                names::text_only_name(pack_name)
            } else {
                pack_name.to_string()
            }
        };

        // Which shard holds which tensor.
        let index_path = dir.join(INDEX);
        let mut shard_files: Vec<String> = Vec::new();
        let mut weight_map: HashMap<String, usize> = HashMap::new();
        if index_path.exists() {
            let index = read_json(&index_path)?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| HfError::Key {
                    path: index_path.clone(),
                    key: "weight_map".into(),
                    what: "missing object".into(),
                })?;
            for (name, file) in map {
                let file = file.as_str().unwrap_or_default();
                if file.is_empty()
                    || file.contains('/')
                    || file.contains('\\')
                    || file == "."
                    || file == ".."
                {
                    return Err(HfError::ShardName {
                        path: index_path,
                        shard: file.to_string(),
                    });
                }
                let i = match shard_files.iter().position(|f| f == file) {
                    Some(i) => i,
                    None => {
                        shard_files.push(file.to_string());
                        shard_files.len() - 1
                    }
                };
                weight_map.insert(name.clone(), i);
            }
        } else if dir.join(SINGLE_FILE).exists() {
            shard_files.push(SINGLE_FILE.to_string());
        } else {
            return Err(HfError::NoWeights {
                dir: dir.to_path_buf(),
            });
        }

        let mut shards = Vec::with_capacity(shard_files.len());
        let mut headers = Vec::with_capacity(shard_files.len());
        for file_name in &shard_files {
            let path = dir.join(file_name);
            let (shard, header) = open_shard(&path)?;
            shards.push(shard);
            headers.push(header);
        }
        let find = |name: &str| -> Result<(usize, Entry), HfError> {
            let candidates: Vec<usize> = match weight_map.get(name) {
                Some(&i) => vec![i],
                None if weight_map.is_empty() => (0..headers.len()).collect(),
                None => {
                    return Err(HfError::MissingTensor {
                        dir: dir.to_path_buf(),
                        name: name.to_string(),
                    })
                }
            };
            for i in candidates.iter().copied() {
                if let Some(e) = headers[i].iter().find(|e| e.name == name) {
                    return Ok((i, e.clone()));
                }
            }
            match candidates.as_slice() {
                [i] if !weight_map.is_empty() => Err(HfError::NotInShard {
                    path: shards[*i].path.clone(),
                    name: name.to_string(),
                }),
                _ => Err(HfError::MissingTensor {
                    dir: dir.to_path_buf(),
                    name: name.to_string(),
                }),
            }
        };

        // head_dim: the config's, else the q_norm length (what the weights were trained with).
        let inferred_head_dim = match facts.head_dim {
            Some(d) => d,
            None => {
                let q_norm = source_name(&names::norm(0, names::Norm::QNorm));
                let (_, e) = find(&q_norm)?;
                e.shape.first().copied().unwrap_or(0)
            }
        };
        let mut semantics = finish_config(&config_path, &facts, inferred_head_dim, mrope_override)?;
        let mut warnings = Vec::new();
        // Qwen3.5's MTP head: carried when the shards hold it (transformers itself ignores it).
        let text_key = |k: &str| config.get("text_config").and_then(|t| t.get(k));
        let mtp_layers = text_key("mtp_num_hidden_layers")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let mtp_own_embeddings = text_key("mtp_use_dedicated_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if let Some(d) = semantics.delta_net.as_mut() {
            // A MoE checkpoint's head routes its MLP like the decoder layers (its experts are
            // read below with theirs); a head missing any tensor is refused by that tensor's name.
            if find(names::mtp::FC).is_ok() {
                if mtp_own_embeddings {
                    warnings.push(format!(
                        "{}: mtp_use_dedicated_embeddings is true: the MTP head reads \
                         embeddings of its own, which packs do not carry, so it is left out; \
                         decoding is unchanged",
                        dir.display()
                    ));
                } else {
                    if mtp_layers > 1 {
                        warnings.push(format!(
                            "{}: mtp_num_hidden_layers {mtp_layers}: only the first MTP layer is \
                             carried (drafts chain it)",
                            dir.display()
                        ));
                    }
                    d.mtp = true;
                }
            }
        }
        let has_tower = !text_only && find(names::visual::PATCH_EMBED).is_ok();
        let processor_settings = if with_vision && has_tower {
            image_processor::find(dir)?
        } else {
            None
        };
        match processor_settings {
            None if with_vision && has_tower => {
                // The tower alone cannot take an image: the resize limits, mean and std are the
                // checkpoint's. A text pack still answers text; say what was left out.
                warnings.push(format!(
                    "{}: no {PREPROCESSOR} and no {PROCESSOR}, so the vision tower is left out (a \
                     text-only pack: image prompts will be refused); add the model's \
                     {PREPROCESSOR} (or save its processor with transformers' \
                     `processor.save_pretrained`, which writes {PROCESSOR}) to carry it",
                    dir.display()
                ));
            }
            None => {}
            Some(found) => {
                let vision = parse_vision_config(&config_path, &config)?;
                let preprocess = found.parse()?;
                preprocess
                    .validate(&vision)
                    .map_err(|source| match source {
                        SemanticsError::Preprocess(what) => HfError::Preprocess {
                            path: found.path.clone(),
                            within: found.key.map(|k| format!("{k}: ")).unwrap_or_default(),
                            what,
                        },
                        source => HfError::Semantics {
                            path: found.path.clone(),
                            source,
                        },
                    })?;
                if let Some(note) = image_processor::ignored_beside(dir, &found, &preprocess) {
                    warnings.push(note);
                }
                semantics.vision = Some(vision);
                semantics.preprocess = Some(preprocess);
                semantics.validate().map_err(|source| HfError::Semantics {
                    path: config_path.clone(),
                    source,
                })?;
            }
        }

        // The plan is a few weights per layer: bound the layer counts by the tensors the shards
        // hold before planning (the semantics allow 2^24 layers, a plan of tens of GB).
        let held: usize = headers.iter().map(Vec::len).sum();
        let text_key = if text_only {
            "num_hidden_layers"
        } else {
            "text_config.num_hidden_layers"
        };
        for (key, value) in [
            (text_key, semantics.num_layers),
            (
                "vision_config.depth",
                semantics.vision.as_ref().map_or(0, |v| v.depth),
            ),
        ] {
            if value > held {
                return Err(HfError::Key {
                    path: config_path.clone(),
                    key: key.into(),
                    what: format!(
                        "{value} layers, but the checkpoint's shards hold only {held} tensors \
                         (at least one per layer)"
                    ),
                });
            }
        }
        let mut tensors = HashMap::new();
        // The plan of an f32 pack reads every weight the checkpoint must provide.
        let plan_sem = Semantics {
            quant: QuantKind::F32,
            ..semantics.clone()
        };
        let mut needed = layout::weights(&plan_sem);
        needed.retain(|w| w.source == w.name);
        for weight in needed {
            let name = source_name(&weight.name);
            let (shard, entry) = find(&name)?;
            let expected = weight.checkpoint_shape();
            let path = &shards[shard].path;
            if entry.shape != expected {
                return Err(HfError::TensorShape {
                    path: path.clone(),
                    name,
                    found: entry.shape,
                    expected,
                });
            }
            if !matches!(entry.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                return Err(HfError::TensorDtype {
                    path: path.clone(),
                    name,
                    dtype: entry.dtype,
                });
            }
            tensors.insert(
                weight.name.clone(),
                SourceTensor {
                    shard,
                    entry,
                    fused: None,
                },
            );
        }
        // Each routed MLP's experts (the sparse layers', then the MTP layer's when the pack
        // carries it), per expert or fused in either orientation transformers loads.
        if let Some(m) = &semantics.moe {
            let mut prefixes: Vec<String> = m
                .sparse_layers
                .iter()
                .map(|&l| names::layer_prefix(l))
                .collect();
            if semantics.delta_net.as_ref().is_some_and(|d| d.mtp) {
                prefixes.push(names::mtp::LAYER.to_string());
            }
            let (e, h, inter) = (
                m.num_experts,
                semantics.hidden_size,
                m.moe_intermediate_size,
            );
            for prefix in &prefixes {
                // transformers 5's save_pretrained writes Qwen3.5-MoE's experts one tensor each
                // (`mlp.experts.{e}.gate_proj.weight`, the pack's own names), as the hub does.
                let fused_name = source_name(&moe::fused_gate_up_in(prefix));
                let per_expert = source_name(&moe::expert_in(prefix, 0, ExpertProj::Gate));
                if find(&fused_name).is_err() && find(&per_expert).is_ok() {
                    for ex in 0..e {
                        for (p, rows, cols) in [
                            (ExpertProj::Gate, inter, h),
                            (ExpertProj::Up, inter, h),
                            (ExpertProj::Down, h, inter),
                        ] {
                            let pack_name = moe::expert_in(prefix, ex, p);
                            let name = source_name(&pack_name);
                            let (shard, entry) = find(&name)?;
                            let path = &shards[shard].path;
                            if entry.shape != [rows, cols] {
                                return Err(HfError::TensorShape {
                                    path: path.clone(),
                                    name,
                                    found: entry.shape,
                                    expected: vec![rows, cols],
                                });
                            }
                            if !matches!(entry.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                                return Err(HfError::TensorDtype {
                                    path: path.clone(),
                                    name,
                                    dtype: entry.dtype,
                                });
                            }
                            let fused = None;
                            tensors.insert(
                                pack_name,
                                SourceTensor {
                                    shard,
                                    entry,
                                    fused,
                                },
                            );
                        }
                    }
                    continue;
                }
                for (pack_name, n, k) in [
                    (moe::fused_gate_up_in(prefix), 2 * inter, h),
                    (moe::fused_down_in(prefix), h, inter),
                ] {
                    let name = source_name(&pack_name);
                    let (shard, entry) = find(&name)?;
                    let path = &shards[shard].path;
                    let Some(orientation) = FusedOrientation::of(&entry.shape, e, n, k) else {
                        return Err(HfError::FusedShape {
                            path: path.clone(),
                            name,
                            found: entry.shape,
                            expected: [e, n, k],
                            transposed: [e, k, n],
                        });
                    };
                    if !matches!(entry.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                        return Err(HfError::TensorDtype {
                            path: path.clone(),
                            name,
                            dtype: entry.dtype,
                        });
                    }
                    tensors.insert(
                        pack_name,
                        SourceTensor {
                            shard,
                            entry,
                            fused: Some(orientation),
                        },
                    );
                }
            }
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            semantics,
            shards,
            tensors,
            warnings,
        })
    }

    /// The pack semantics for `quant` (the tower's linears in `vision_quant`, else `quant` too);
    /// `source` is the checkpoint directory.
    pub fn semantics(&self, quant: QuantKind, vision_quant: Option<QuantKind>) -> Semantics {
        let mut sem = Semantics {
            quant,
            source: self.dir.display().to_string(),
            ..self.semantics.clone()
        };
        if let Some(v) = &mut sem.vision {
            v.quant = vision_quant.unwrap_or(quant);
        }
        sem
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shard holding the weight with pack name `name`.
    pub fn source_path(&self, name: &str) -> Option<&Path> {
        let t = self.tensors.get(name)?;
        Some(&self.shards[t.shard].path)
    }

    /// What the pack will leave out, and why.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Reads rows `first_row..` of `weight` as f32 into `values` (a whole number of rows): rows of
    /// its own tensor, or of its expert's part of a fused tensor.
    pub fn read_weight(
        &self,
        weight: &WeightPlan,
        first_row: usize,
        values: &mut [f32],
    ) -> Result<(), HfError> {
        match weight.slice {
            None => self.read_rows(&weight.source, first_row, values),
            // The checkpoint holds this expert's linear as a tensor of its own.
            Some(_)
                if self
                    .tensors
                    .get(&weight.name)
                    .is_some_and(|t| t.fused.is_none()) =>
            {
                self.read_rows(&weight.name, first_row, values)
            }
            Some(slice) => {
                let t = self.tensor(&weight.source)?;
                let (Some(orientation), [_, a, b]) = (t.fused, t.entry.shape.as_slice()) else {
                    return Err(self.missing(&weight.source));
                };
                let (a, b) = (*a, *b);
                // Within the expert's block: the first stored row (5.x) or column (hub) of the part.
                let part = match slice.proj {
                    ExpertProj::Up => weight.rows,
                    ExpertProj::Gate | ExpertProj::Down => 0,
                };
                let block = slice.expert * a * b;
                let cols = weight.cols;
                match orientation {
                    FusedOrientation::OutIn => {
                        self.read_span(t, block + (part + first_row) * cols, values)
                    }
                    FusedOrientation::InOut => {
                        // The block is [K, N']: our row r is its column part + r. Read whole
                        // stored rows a chunk at a time and pick the columns.
                        let rows = values.len() / cols;
                        let chunk_rows = ((1 << 20) / b).clamp(1, a);
                        let mut buf = vec![0f32; chunk_rows * b];
                        let mut k0 = 0;
                        while k0 < a {
                            let n = chunk_rows.min(a - k0);
                            let buf = &mut buf[..n * b];
                            self.read_span(t, block + k0 * b, buf)?;
                            for (dk, stored) in buf.chunks_exact(b).enumerate() {
                                let src = &stored[part + first_row..part + first_row + rows];
                                for (r, &v) in src.iter().enumerate() {
                                    values[r * cols + k0 + dk] = v;
                                }
                            }
                            k0 += n;
                        }
                        Ok(())
                    }
                }
            }
        }
    }

    /// Reads rows `first_row..` of the weight with pack name `name` as f32 into `values`
    /// (a whole number of rows).
    pub fn read_rows(
        &self,
        name: &str,
        first_row: usize,
        values: &mut [f32],
    ) -> Result<(), HfError> {
        let t = self.tensor(name)?;
        // A row is everything but the first axis (the Conv3d patch embedding reads as [hidden, C*T*P*P]).
        let cols = match t.entry.shape.as_slice() {
            [] => 1,
            [n] => *n,
            [_, rest @ ..] => rest.iter().product::<usize>(),
        };
        self.read_span(t, first_row * cols, values)
    }

    fn missing(&self, name: &str) -> HfError {
        HfError::MissingTensor {
            dir: self.dir.clone(),
            name: name.to_string(),
        }
    }

    fn tensor(&self, name: &str) -> Result<&SourceTensor, HfError> {
        self.tensors.get(name).ok_or_else(|| self.missing(name))
    }

    /// Reads `values.len()` consecutive elements of `t` from element `first` on, as f32.
    fn read_span(&self, t: &SourceTensor, first: usize, values: &mut [f32]) -> Result<(), HfError> {
        let shard = &self.shards[t.shard];
        let size = t.entry.dtype.size() as u64;
        let offset = shard.data_start + t.entry.start + first as u64 * size;
        let len = values.len() as u64 * size;
        if offset + len > shard.data_start + t.entry.end {
            // Callers stay inside the tensor; this guards the arithmetic anyway.
            return Err(HfError::TensorShape {
                path: shard.path.clone(),
                name: t.entry.name.clone(),
                found: t.entry.shape.clone(),
                expected: vec![first + values.len()],
            });
        }
        let mut bytes = vec![0u8; len as usize];
        shard
            .file
            .read_exact_at(&mut bytes, offset)
            .map_err(|source| HfError::Io {
                path: shard.path.clone(),
                source,
            })?;
        const PAR: usize = 1 << 14;
        match t.entry.dtype {
            Dtype::BF16 => values
                .par_chunks_mut(PAR)
                .zip(bytes.par_chunks(PAR * 2))
                .for_each(|(v, b)| {
                    for (v, b) in v.iter_mut().zip(b.chunks_exact(2)) {
                        *v = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                    }
                }),
            Dtype::F16 => values
                .par_chunks_mut(PAR)
                .zip(bytes.par_chunks(PAR * 2))
                .for_each(|(v, b)| {
                    for (v, b) in v.iter_mut().zip(b.chunks_exact(2)) {
                        *v = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    }
                }),
            _ => values
                .par_chunks_mut(PAR)
                .zip(bytes.par_chunks(PAR * 4))
                .for_each(|(v, b)| {
                    for (v, b) in v.iter_mut().zip(b.chunks_exact(4)) {
                        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }),
        }
        Ok(())
    }
}

/// A config, preprocessor config or index larger than this is refused before it is read (the
/// index of a 235B checkpoint is ~2 MB; a JSON value in memory takes several times its text).
pub const MAX_JSON_BYTES: u64 = 64 << 20;

pub(crate) fn read_json(path: &Path) -> Result<Value, HfError> {
    let io = |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_JSON_BYTES {
        return Err(HfError::TooLarge {
            path: path.to_path_buf(),
            len,
            max: MAX_JSON_BYTES,
        });
    }
    let text = std::fs::read(path).map_err(io)?;
    serde_json::from_slice(&text).map_err(|e| HfError::Json {
        path: path.to_path_buf(),
        what: e.to_string(),
    })
}

fn open_shard(path: &Path) -> Result<(Shard, Vec<Entry>), HfError> {
    let io = |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let shard_err = |source| HfError::Shard {
        path: path.to_path_buf(),
        source,
    };
    let mut prefix = [0u8; LEN_PREFIX as usize];
    if file_len < LEN_PREFIX {
        return Err(shard_err(HeaderError::TooShort { len: file_len }));
    }
    file.read_exact_at(&mut prefix, 0).map_err(io)?;
    let header_len = container::header_len(&prefix, file_len).map_err(shard_err)?;
    let mut json = vec![0u8; header_len as usize];
    file.read_exact_at(&mut json, LEN_PREFIX).map_err(io)?;
    let data_start = LEN_PREFIX + header_len;
    let header =
        container::parse_header(&json, data_start, file_len - data_start).map_err(shard_err)?;
    Ok((
        Shard {
            path: path.to_path_buf(),
            file,
            data_start,
        },
        header.entries,
    ))
}
