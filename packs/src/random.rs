//! Random-weight packs with a named model shape, for benchmarks and tests. Values come from a
//! counter-based hash of (seed, weight, element), so a pack is reproducible whatever the block
//! size or thread count; a tied head gets exactly the embedding's values.

use std::path::Path;

use rayon::prelude::*;

use crate::build::{self, BuildError, BuildReport};
use crate::layout::{WeightPlan, WeightRole};
use crate::moe::MoeSemantics;
use crate::names::EMBED;
use crate::quant::QuantKind;
use crate::semantics::{Semantics, ARCH_QWEN3_VL, ARCH_QWEN3_VL_MOE};

/// A named model shape.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomShape {
    pub name: &'static str,
    /// Everything but `quant` and `source`, which `write_random` sets.
    pub semantics: Semantics,
}

impl RandomShape {
    pub const NAMES: [&'static str; 3] = ["tiny", "qwen3-vl-2b", "qwen3-vl-30b-a3b-reduced"];

    pub fn named(name: &str) -> Option<RandomShape> {
        match name {
            "tiny" => Some(RandomShape::tiny()),
            "qwen3-vl-2b" => Some(RandomShape::qwen3_vl_2b()),
            "qwen3-vl-30b-a3b-reduced" => Some(RandomShape::qwen3_vl_30b_a3b_reduced()),
            _ => None,
        }
    }

    /// Qwen3-VL-30B-A3B's text decoder (REFERENCE.md: hidden 2048, 32/4 heads of 128, 128 experts,
    /// top-8, expert intermediate 768, untied head) with 4 of its 48 layers, so a q4 pack is ~2 GB
    /// instead of ~17: per layer and token the same bytes are read as in the full model.
    pub fn qwen3_vl_30b_a3b_reduced() -> RandomShape {
        const LAYERS: usize = 4;
        let mut semantics = RandomShape::qwen3_vl_2b().semantics;
        semantics.architecture = ARCH_QWEN3_VL_MOE.into();
        semantics.num_layers = LAYERS;
        semantics.num_heads = 32;
        semantics.num_kv_heads = 4;
        semantics.tie_word_embeddings = false;
        semantics.moe = Some(MoeSemantics {
            num_experts: 128,
            top_k: 8,
            moe_intermediate_size: 768,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            sparse_layers: (0..LAYERS).collect(),
        });
        RandomShape {
            name: "qwen3-vl-30b-a3b-reduced",
            semantics,
        }
    }

    /// Qwen3-VL-2B-Instruct's text decoder (REFERENCE.md).
    pub fn qwen3_vl_2b() -> RandomShape {
        RandomShape {
            name: "qwen3-vl-2b",
            semantics: Semantics {
                architecture: ARCH_QWEN3_VL.into(),
                vocab_size: 151936,
                hidden_size: 2048,
                num_layers: 28,
                num_heads: 16,
                num_kv_heads: 8,
                head_dim: 128,
                intermediate_size: 6144,
                rms_norm_eps: 1e-6,
                rope_theta: 5_000_000.0,
                mrope: true,
                mrope_section: Some([24, 20, 20]),
                mrope_interleaved: true,
                deepstack_sets: 3,
                image_token_id: Some(151655),
                video_token_id: Some(151656),
                vision_start_token_id: Some(151652),
                vision_end_token_id: Some(151653),
                tie_word_embeddings: true,
                source: String::new(),
                quant: QuantKind::F32,
                vision: None,
                preprocess: None,
                moe: None,
            },
        }
    }

    /// A few-kilobyte model with the 2B's structure (GQA 2:1, interleaved MRoPE, DeepStack, tied);
    /// the special token ids sit at the top of its 256-token vocabulary.
    pub fn tiny() -> RandomShape {
        RandomShape {
            name: "tiny",
            semantics: Semantics {
                architecture: ARCH_QWEN3_VL.into(),
                vocab_size: 256,
                hidden_size: 64,
                num_layers: 2,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 16,
                intermediate_size: 128,
                rms_norm_eps: 1e-6,
                rope_theta: 10_000.0,
                mrope: true,
                mrope_section: Some([3, 3, 2]),
                mrope_interleaved: true,
                deepstack_sets: 2,
                image_token_id: Some(251),
                video_token_id: Some(252),
                vision_start_token_id: Some(249),
                vision_end_token_id: Some(250),
                tie_word_embeddings: true,
                source: String::new(),
                quant: QuantKind::F32,
                vision: None,
                preprocess: None,
                moe: None,
            },
        }
    }

    /// The semantics of a pack of this shape in `quant` made from `seed`.
    pub fn semantics_for(&self, quant: QuantKind, seed: u64) -> Semantics {
        Semantics {
            quant,
            source: format!("random:{}:seed={seed}", self.name),
            ..self.semantics.clone()
        }
    }
}

/// Writes a random-weight pack of `shape` in `quant` to `out` (atomically).
pub fn write_random(
    shape: &RandomShape,
    quant: QuantKind,
    seed: u64,
    out: &Path,
) -> Result<BuildReport, BuildError> {
    write_random_with_progress(shape, quant, seed, out, false)
}

pub fn write_random_with_progress(
    shape: &RandomShape,
    quant: QuantKind,
    seed: u64,
    out: &Path,
    progress: bool,
) -> Result<BuildReport, BuildError> {
    let sem = shape.semantics_for(quant, seed);
    sem.validate()?;
    build::write_pack(out, &sem, &[], progress, |weight, first_row, values| {
        fill_random(seed, weight, first_row, values);
        Ok(())
    })
}

/// The random values of rows `first_row..` of `weight`.
pub fn fill_random(seed: u64, weight: &WeightPlan, first_row: usize, values: &mut [f32]) {
    // An expert's linear is keyed by its own name (its source is the layer's fused tensor).
    let keyed = if weight.slice.is_some() {
        &weight.name
    } else {
        &weight.source
    };
    let key = splitmix64(seed ^ fnv1a(keyed.as_bytes()));
    let cols = weight.cols;
    // Uniform amplitudes: linears keep activations O(1) (std 1/sqrt(k)); norms near 1.
    // A tied head (source = the embedding) takes the embedding's values.
    let role = if weight.source == EMBED {
        WeightRole::Embedding
    } else {
        weight.role
    };
    let (center, amplitude) = match role {
        WeightRole::Embedding => (0.0, 0.1),
        WeightRole::Norm => (1.0, 0.1),
        WeightRole::Linear => (0.0, (3.0 / cols as f32).sqrt()),
        // The tower's LayerNorm weights near 1, its biases and position table small.
        WeightRole::Param if weight.name.contains("norm") && weight.name.ends_with(".weight") => {
            (1.0, 0.1)
        }
        WeightRole::Param => (0.0, 0.02),
    };
    let first = (first_row * cols) as u64;
    values
        .par_chunks_mut(1 << 14)
        .enumerate()
        .for_each(|(chunk, vals)| {
            let base = first + (chunk as u64) * (1 << 14);
            for (i, v) in vals.iter_mut().enumerate() {
                let bits = splitmix64(key.wrapping_add(base + i as u64));
                // 24 random bits -> uniform in [-1, 1).
                let unit = (bits >> 40) as f32 * (1.0 / (1u64 << 23) as f32) - 1.0;
                *v = center + amplitude * unit;
            }
        });
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}
