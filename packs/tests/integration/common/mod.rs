//! Synthetic hub checkpoints written by the tests: config.json in either rope spelling, weights in
//! f32/bf16/f16, single file or sharded with an index, serialized by the `safetensors` crate.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::{bf16, f16};
use packs::layout::{self, WeightRole};
use packs::names;
use packs::names::LM_HEAD;
use packs::quant;
use packs::{Embedding, LinearData, Pack, QuantKind, Semantics};
use safetensors::tensor::TensorView;
use safetensors::Dtype as StDtype;
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeSpelling {
    /// transformers 4.57: text_config.rope_scaling + text_config.rope_theta.
    RopeScaling,
    /// transformers 5.x: text_config.rope_parameters with rope_theta inside.
    RopeParameters,
}

#[derive(Clone, Debug)]
pub struct HfSpec {
    pub dtype: StDtype,
    pub shards: usize,
    pub spelling: RopeSpelling,
    /// The config's mrope_section value (None: key absent).
    pub section: Option<Value>,
    pub tied: bool,
    pub text_only: bool,
    pub write_head_dim: bool,
    pub hidden: usize,
    pub head_dim: usize,
}

impl Default for HfSpec {
    fn default() -> Self {
        HfSpec {
            dtype: StDtype::F32,
            shards: 1,
            spelling: RopeSpelling::RopeParameters,
            section: Some(json!([3, 3, 2])),
            tied: true,
            text_only: false,
            write_head_dim: true,
            hidden: 64,
            head_dim: 16,
        }
    }
}

pub const VOCAB: usize = 96;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const INTERMEDIATE: usize = 96;
pub const THETA: f64 = 12345.0;

/// The semantics a correct build derives from `spec` (before quant/source).
pub fn expected_semantics(spec: &HfSpec, quant: QuantKind, dir: &Path) -> Semantics {
    Semantics {
        architecture: if spec.text_only { "qwen3" } else { "qwen3_vl" }.into(),
        vocab_size: VOCAB,
        hidden_size: spec.hidden,
        num_layers: LAYERS,
        num_heads: HEADS,
        num_kv_heads: KV_HEADS,
        head_dim: spec.head_dim,
        intermediate_size: INTERMEDIATE,
        rms_norm_eps: 1e-6,
        rope_theta: THETA,
        mrope: !spec.text_only,
        mrope_section: if spec.text_only {
            None
        } else {
            Some([3, 3, 2])
        },
        mrope_interleaved: !spec.text_only,
        deepstack_sets: if spec.text_only { 0 } else { 3 },
        image_token_id: if spec.text_only { None } else { Some(90) },
        video_token_id: if spec.text_only { None } else { Some(91) },
        vision_start_token_id: if spec.text_only { None } else { Some(92) },
        vision_end_token_id: None,
        tie_word_embeddings: spec.tied,
        source: dir.display().to_string(),
        quant,
        vision: None,
        preprocess: None,
        moe: None,
        delta_net: None,
    }
}

pub fn config_json(spec: &HfSpec) -> Value {
    let mut rope = serde_json::Map::new();
    rope.insert("rope_type".into(), json!("default"));
    if !spec.text_only {
        if let Some(s) = &spec.section {
            rope.insert("mrope_section".into(), s.clone());
        }
        rope.insert("mrope_interleaved".into(), json!(true));
    }
    let mut text = json!({
        "vocab_size": VOCAB, "hidden_size": spec.hidden, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "intermediate_size": INTERMEDIATE, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    });
    if spec.write_head_dim {
        text["head_dim"] = json!(spec.head_dim);
    }
    match spec.spelling {
        RopeSpelling::RopeParameters => {
            rope.insert("rope_theta".into(), json!(THETA));
            text["rope_parameters"] = Value::Object(rope);
        }
        RopeSpelling::RopeScaling => {
            text["rope_theta"] = json!(THETA);
            text["rope_scaling"] = if spec.text_only {
                Value::Null
            } else {
                Value::Object(rope)
            };
        }
    }
    if spec.text_only {
        text["model_type"] = json!("qwen3");
        text["tie_word_embeddings"] = json!(spec.tied);
        return text;
    }
    text["model_type"] = json!("qwen3_vl_text");
    json!({
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": { "depth": 4, "deepstack_visual_indexes": [1, 2, 3] },
        "image_token_id": 90, "video_token_id": 91, "vision_start_token_id": 92,
        "tie_word_embeddings": spec.tied,
    })
}

/// Deterministic test values in about [-1, 1) (norms near 1).
fn values(name: &str, n: usize, role: WeightRole) -> Vec<f32> {
    let mut state = name.bytes().fold(0x9E37_79B9_7F4A_7C15u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    });
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if role == WeightRole::Norm {
                1.0 + 0.25 * u
            } else {
                u
            }
        })
        .collect()
}

/// Writes the checkpoint into `dir`; returns the f32 value of every decoder weight as stored
/// (after rounding to the checkpoint dtype), keyed by pack name.
pub fn write_checkpoint(dir: &Path, spec: &HfSpec) -> HashMap<String, Vec<f32>> {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&config_json(spec)).unwrap(),
    )
    .unwrap();
    let mut sem = expected_semantics(spec, QuantKind::F32, dir);
    sem.tie_word_embeddings = spec.tied;
    let mut stored = HashMap::new();
    // (checkpoint name, shape, bytes)
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for w in layout::weights(&sem) {
        let shape = w.checkpoint_shape();
        let vals = values(&w.name, w.rows * w.cols, w.role);
        let (bytes, rounded) = encode(&vals, spec.dtype);
        let ck_name = if spec.text_only {
            names::text_only_name(&w.name)
        } else {
            w.name.clone()
        };
        tensors.push((ck_name, shape, bytes));
        stored.insert(w.name.clone(), rounded);
    }
    if !spec.text_only {
        // Vision tensors the pack must ignore: without the patch embedding there is no tower.
        let vals = values("visual", 4 * 8, WeightRole::Linear);
        let (bytes, _) = encode(&vals, spec.dtype);
        tensors.push((
            "model.visual.merger.linear_fc1.weight".into(),
            vec![4, 8],
            bytes,
        ));
    }
    let shards = spec.shards.max(1);
    let mut weight_map = BTreeMap::new();
    for s in 0..shards {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", s + 1, shards)
        };
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .enumerate()
            .filter(|(i, _)| i % shards == s)
            .map(|(_, (name, shape, bytes))| {
                weight_map.insert(name.clone(), file.clone());
                (
                    name.clone(),
                    TensorView::new(spec.dtype, shape.clone(), bytes).unwrap(),
                )
            })
            .collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(meta), &dir.join(&file)).unwrap();
    }
    if shards > 1 {
        let index = json!({ "metadata": { "total_size": 0 }, "weight_map": weight_map });
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index).unwrap(),
        )
        .unwrap();
    }
    stored
}

fn encode(vals: &[f32], dtype: StDtype) -> (Vec<u8>, Vec<f32>) {
    match dtype {
        StDtype::F32 => (
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            vals.to_vec(),
        ),
        StDtype::BF16 => {
            let b: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                b.iter().flat_map(|v| v.to_le_bytes()).collect(),
                b.iter().map(|v| v.to_f32()).collect(),
            )
        }
        StDtype::F16 => {
            let h: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        other => panic!("test checkpoints use F32/BF16/F16, not {other:?}"),
    }
}

/// Every tensor of the pack equals the documented encoding of the checkpoint's values.
pub fn check_pack(pack: &Pack, stored: &HashMap<String, Vec<f32>>) {
    let sem = pack.semantics();
    let quant = sem.quant;
    for w in layout::weights(sem) {
        // An expert's linear is keyed by its own name (its source is the layer's fused tensor).
        let values = &stored[if w.slice.is_some() {
            &w.name
        } else {
            &w.source
        }];
        match w.role {
            WeightRole::Embedding => match pack.embedding() {
                Embedding::F32(e) => {
                    assert_eq!(quant, QuantKind::F32);
                    assert!(e == &values[..], "embedding differs");
                }
                Embedding::Bf16(e) => {
                    assert_ne!(quant, QuantKind::F32);
                    assert!(
                        e.iter().zip(values).all(|(a, b)| *a == bf16::from_f32(*b)),
                        "embedding differs"
                    );
                }
            },
            WeightRole::Param => assert!(
                pack.f32_tensor(&w.name).unwrap() == &values[..],
                "{} differs",
                w.name
            ),
            WeightRole::Norm => assert!(
                pack.norm(&w.name).unwrap() == &values[..],
                "{} differs",
                w.name
            ),
            WeightRole::Linear => {
                let lin = pack.linear(&w.name).unwrap();
                assert_eq!((lin.n, lin.k), (w.rows, w.cols), "{}", w.name);
                let same = match lin.data {
                    LinearData::F32(d) => d == &values[..],
                    LinearData::Bf16(d) => {
                        d.iter().zip(values).all(|(a, b)| *a == bf16::from_f32(*b))
                    }
                    LinearData::I8 { codes, scales } => {
                        let (c, s) = quant::quantize_i8_rows(values, lin.n, lin.k);
                        codes == &c[..] && scales == &s[..]
                    }
                    LinearData::Q4 { codes, scales } => {
                        let (c, s) = quant::quantize_q4(values, lin.n, lin.k).unwrap();
                        let c = quant::q4_to_panels(&c, lin.n, lin.k);
                        codes == &c[..] && scales == &s[..]
                    }
                };
                assert!(
                    same,
                    "{} ({quant}) differs from the encoding of the checkpoint values",
                    w.name
                );
            }
        }
    }
    let head = pack.head();
    assert_eq!((head.n, head.k), (sem.vocab_size, sem.hidden_size));
    let head_stored = pack.tensor(LM_HEAD).is_some();
    assert_eq!(
        head_stored,
        !sem.tie_word_embeddings || quant.is_integer(),
        "{quant}"
    );
}
