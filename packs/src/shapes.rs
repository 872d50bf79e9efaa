//! The named model shapes of random-weight packs (`packs random --shape`): the semantics of each,
//! no weights. `crate::random` writes their packs.

use crate::quant::QuantKind;
use crate::semantics::{
    DeltaNetSemantics, ImagePreprocess, MoeSemantics, Semantics, VisionSemantics, ARCH_QWEN3_5,
    ARCH_QWEN3_VL, ARCH_QWEN3_VL_MOE, RESAMPLE_BICUBIC, VISION_ACT,
};

/// A named model shape.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomShape {
    pub name: &'static str,
    /// Everything but `quant` and `source`, which `write_random` sets.
    pub semantics: Semantics,
}

impl RandomShape {
    pub const NAMES: [&'static str; 7] = [
        "tiny",
        "tiny-vl",
        "qwen3-vl-2b",
        "qwen3-vl-30b-a3b-reduced",
        "qwen3.5-2b",
        "qwen3.5-0.8b",
        "qwen3.5-35b-a3b-reduced",
    ];

    pub fn named(name: &str) -> Option<RandomShape> {
        match name {
            "tiny" => Some(RandomShape::tiny()),
            "tiny-vl" => Some(RandomShape::tiny_vl()),
            "qwen3-vl-2b" => Some(RandomShape::qwen3_vl_2b()),
            "qwen3-vl-30b-a3b-reduced" => Some(RandomShape::qwen3_vl_30b_a3b_reduced()),
            "qwen3.5-2b" => Some(RandomShape::qwen3_5_2b()),
            "qwen3.5-0.8b" => Some(RandomShape::qwen3_5_0_8b()),
            "qwen3.5-35b-a3b-reduced" => Some(RandomShape::qwen3_5_35b_a3b_reduced()),
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
        // The decoder is what this shape measures; its tower is the 2B shape's concern.
        semantics.vision = None;
        semantics.preprocess = None;
        semantics.moe = Some(MoeSemantics {
            num_experts: 128,
            top_k: 8,
            moe_intermediate_size: 768,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            sparse_layers: (0..LAYERS).collect(),
            shared_expert_intermediate_size: None,
        });
        RandomShape {
            name: "qwen3-vl-30b-a3b-reduced",
            semantics,
        }
    }

    /// Qwen3.5-35B-A3B's text decoder (Qwen3.6's architecture, `qwen3_5_moe`; the hub config as
    /// we read it, not checked against a download: hidden 2048, 16/2 heads of 256, DeltaNet key
    /// heads 16 and value heads 32 of 128, 256 experts, top-8, expert and shared intermediate
    /// 512, untied head) with 4 of its 40 layers ([DeltaNet x3, full]), so a q4 pack is ~3 GB:
    /// per layer and token the same bytes are read as in the full model.
    pub fn qwen3_5_35b_a3b_reduced() -> RandomShape {
        const LAYERS: usize = 4;
        let mut semantics = RandomShape::qwen3_5_2b().semantics;
        semantics.architecture = crate::semantics::ARCH_QWEN3_5_MOE.into();
        semantics.num_layers = LAYERS;
        semantics.num_heads = 16;
        semantics.num_kv_heads = 2;
        semantics.tie_word_embeddings = false;
        semantics.vision = None;
        semantics.preprocess = None;
        if let Some(d) = &mut semantics.delta_net {
            d.linear_layers = (0..LAYERS).filter(|l| l % 4 != 3).collect();
            d.num_value_heads = 32;
        }
        semantics.moe = Some(MoeSemantics {
            num_experts: 256,
            top_k: 8,
            moe_intermediate_size: 512,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            sparse_layers: (0..LAYERS).collect(),
            shared_expert_intermediate_size: Some(512),
        });
        RandomShape {
            name: "qwen3.5-35b-a3b-reduced",
            semantics,
        }
    }

    /// Qwen3.5-2B's text decoder (REFERENCE.md "Qwen3.5"): hidden 2048, 24 layers in the pattern
    /// [linear, linear, linear, full] x 6 (18 Gated DeltaNet, 6 gated full attention), intermediate
    /// 6144; full attention 8 query / 2 KV heads of 256, rotary on the first 64 dims (partial
    /// rotary factor 0.25), interleaved MRoPE [11, 11, 10], theta 1e7; DeltaNet 16 key heads and
    /// 16 value heads of 128, conv kernel 4; vocab 248320, tied head.
    ///
    /// The tower is the hub checkpoint's (REFERENCE.md): Qwen3-VL's without DeepStack at depth 27,
    /// hidden 1152 (16 heads of 72), intermediate 4304, out hidden 2048.
    pub fn qwen3_5_2b() -> RandomShape {
        const LAYERS: usize = 24;
        let mut semantics = RandomShape::qwen3_vl_2b().semantics;
        semantics.architecture = ARCH_QWEN3_5.into();
        semantics.vocab_size = 248_320;
        semantics.num_layers = LAYERS;
        semantics.num_heads = 8;
        semantics.num_kv_heads = 2;
        semantics.head_dim = 256;
        semantics.rope_theta = 10_000_000.0;
        // Half the 64 rotated dims: 32 frequencies.
        semantics.mrope_section = Some([11, 11, 10]);
        semantics.deepstack_sets = 0;
        semantics.image_token_id = Some(248_056);
        semantics.video_token_id = Some(248_057);
        semantics.vision_start_token_id = Some(248_053);
        semantics.vision_end_token_id = Some(248_054);
        if let Some(v) = &mut semantics.vision {
            v.deepstack_visual_indexes = Vec::new();
            v.depth = 27;
            v.hidden_size = 1152;
            v.intermediate_size = 4304;
        }
        semantics.delta_net = Some(DeltaNetSemantics {
            linear_layers: (0..LAYERS).filter(|l| l % 4 != 3).collect(),
            num_key_heads: 16,
            num_value_heads: 16,
            key_head_dim: 128,
            value_head_dim: 128,
            conv_kernel: 4,
            rotary_dim: 64,
            // The hub checkpoint's MTP head is not part of the bench shape.
            mtp: false,
        });
        RandomShape {
            name: "qwen3.5-2b",
            semantics,
        }
    }

    /// `qwen3.5-2b` narrowed to hidden 1024 and intermediate 3584 (Qwen3.5-0.8B's width), the
    /// rest as the 2B's; the tower's output follows the hidden size.
    pub fn qwen3_5_0_8b() -> RandomShape {
        let mut shape = RandomShape::qwen3_5_2b();
        shape.name = "qwen3.5-0.8b";
        shape.semantics.hidden_size = 1024;
        shape.semantics.intermediate_size = 3584;
        if let Some(v) = &mut shape.semantics.vision {
            v.out_hidden_size = 1024;
        }
        shape
    }

    /// This shape with a vision tower: itself when it has one, `tiny-vl` for `tiny` (which stays
    /// text-only: the NPU design plans of its packs are pinned by npu-sys's tests).
    pub fn with_tower(&self) -> Option<RandomShape> {
        match (self.semantics.vision.is_some(), self.name) {
            (true, _) => Some(self.clone()),
            (false, "tiny") => Some(RandomShape::tiny_vl()),
            _ => None,
        }
    }

    /// Qwen3-VL-2B-Instruct: its text decoder and its vision tower and preprocessing
    /// (REFERENCE.md; the checkpoint's config.json vision_config and preprocessor_config.json).
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
                vision: Some(VisionSemantics {
                    depth: 24,
                    hidden_size: 1024,
                    num_heads: 16,
                    intermediate_size: 4096,
                    out_hidden_size: 2048,
                    in_channels: 3,
                    patch_size: 16,
                    spatial_merge_size: 2,
                    temporal_patch_size: 2,
                    num_position_embeddings: 2304,
                    deepstack_visual_indexes: vec![5, 11, 17],
                    hidden_act: VISION_ACT.into(),
                    rope_theta: 10_000.0,
                    layer_norm_eps: 1e-6,
                    quant: QuantKind::F32,
                    bf16_products: false,
                }),
                preprocess: Some(preprocess(16, 65_536, 16_777_216)),
                moe: None,
                delta_net: None,
            },
        }
    }

    /// `tiny` with the tiny chat checkpoint's tower (depth 2, hidden 32, 2 heads, DeepStack after
    /// both blocks, patch 16) and a small pixel budget (32² to 128² pixels), so a 1920x1080 image
    /// is a few dozen patches and a benchmark of it takes moments.
    pub fn tiny_vl() -> RandomShape {
        let mut shape = RandomShape::tiny();
        shape.name = "tiny-vl";
        shape.semantics.vision = Some(VisionSemantics {
            depth: 2,
            hidden_size: 32,
            num_heads: 2,
            intermediate_size: 64,
            out_hidden_size: shape.semantics.hidden_size,
            in_channels: 3,
            patch_size: 16,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            num_position_embeddings: 64,
            deepstack_visual_indexes: vec![0, 1],
            hidden_act: VISION_ACT.into(),
            rope_theta: 10_000.0,
            layer_norm_eps: 1e-6,
            quant: QuantKind::F32,
            bf16_products: false,
        });
        shape.semantics.preprocess = Some(preprocess(16, 32 * 32, 128 * 128));
        shape
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
                delta_net: None,
            },
        }
    }

    /// The semantics of a pack of this shape in `quant` made from `seed`.
    /// The tower's linears follow `quant` (norms, biases and the position table stay f32), except
    /// where the tower's widths refuse a q4 tower (Qwen3.5-2B's intermediate 4304 is no multiple
    /// of 32): then the tower is what `packs build --quant q4` stores by default, bf16 with bf16
    /// products.
    pub fn semantics_for(&self, quant: QuantKind, seed: u64) -> Semantics {
        let mut sem = Semantics {
            quant,
            source: format!("random:{}:seed={seed}", self.name),
            ..self.semantics.clone()
        };
        if let Some(v) = &mut sem.vision {
            if quant == QuantKind::Q4 && v.q4_refusal().is_some() {
                v.quant = QuantKind::Bf16;
                v.bf16_products = true;
            } else {
                v.quant = quant;
            }
        }
        sem
    }
}

/// Qwen3-VL's image processor settings (mean = std = 0.5, bicubic, rescale 1/255, merge 2,
/// temporal 2) with `patch` and the pixel bounds.
fn preprocess(patch: usize, min_pixels: u64, max_pixels: u64) -> ImagePreprocess {
    ImagePreprocess {
        patch_size: patch,
        merge_size: 2,
        temporal_patch_size: 2,
        min_pixels,
        max_pixels,
        image_mean: [0.5; 3],
        image_std: [0.5; 3],
        rescale_factor: 1.0 / 255.0,
        do_resize: true,
        do_rescale: true,
        do_normalize: true,
        do_convert_rgb: true,
        resample: RESAMPLE_BICUBIC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every named shape is a valid model in every kind; the towers' shapes are the checkpoints'.
    #[test]
    fn named_shapes_validate_and_towers_follow_the_pack_quant() {
        for name in RandomShape::NAMES {
            let shape = RandomShape::named(name).unwrap();
            for kind in [
                QuantKind::F32,
                QuantKind::Bf16,
                QuantKind::I8,
                QuantKind::Q4,
            ] {
                let sem = shape.semantics_for(kind, 1);
                sem.validate()
                    .unwrap_or_else(|e| panic!("{name} {kind}: {e}"));
                if let Some(v) = &sem.vision {
                    // Qwen3.5's hub tower refuses q4 (intermediate 4304): bf16 products instead.
                    let q35_q4 = name.starts_with("qwen3.5") && kind == QuantKind::Q4;
                    let expect = if q35_q4 { QuantKind::Bf16 } else { kind };
                    assert_eq!((v.quant, v.bf16_products), (expect, q35_q4), "{name}");
                }
            }
        }
        let v = RandomShape::qwen3_vl_2b().semantics.vision.unwrap();
        assert_eq!(
            (v.depth, v.hidden_size, v.num_heads, v.intermediate_size),
            (24, 1024, 16, 4096)
        );
        assert_eq!(
            (v.out_hidden_size, v.patch_row_len(), v.merged_hidden()),
            (2048, 1536, 4096)
        );
        assert_eq!(v.deepstack_visual_indexes, [5, 11, 17]);
        let q35 = RandomShape::qwen3_5_2b().semantics;
        let d = q35.delta_net.as_ref().unwrap();
        assert_eq!((d.linear_layers.len(), d.conv_dim()), (18, 6144));
        assert!(!d.is_linear(3) && d.is_linear(22) && !d.is_linear(23));
        assert_eq!(
            q35.mrope_section.unwrap().iter().sum::<usize>() * 2,
            d.rotary_dim
        );
        let v35 = q35.vision.unwrap();
        assert!(v35.deepstack_visual_indexes.is_empty());
        assert_eq!(
            (
                v35.depth,
                v35.hidden_size,
                v35.num_heads,
                v35.intermediate_size
            ),
            (27, 1152, 16, 4304)
        );
        let p = RandomShape::qwen3_vl_2b().semantics.preprocess.unwrap();
        assert_eq!(
            (p.min_pixels, p.max_pixels, p.image_std),
            (65_536, 16_777_216, [0.5; 3])
        );
        // tiny stays text-only; its tower variant is tiny-vl.
        assert!(RandomShape::tiny().semantics.vision.is_none());
        assert_eq!(RandomShape::tiny().with_tower().unwrap().name, "tiny-vl");
        // Control: a DeepStack tap past the last block is refused.
        let mut bad = RandomShape::qwen3_vl_2b();
        bad.semantics
            .vision
            .as_mut()
            .unwrap()
            .deepstack_visual_indexes = vec![5, 11, 24];
        assert!(bad.semantics_for(QuantKind::F32, 1).validate().is_err());
    }
}
