//! The decoder against transformers, on every committed case: f32 and bf16 packs within 1e-3,
//! i8/q4 packs against their quantization-aware references, and the controls that must fail.

use compute::ops::rope::RopeLayout;
use decoder::{Ablation, Logits};
use packs::QuantKind;
use testkit::compare::{count_differing, max_abs_diff, QUANTIZED_MAX_ABS_LOGIT_DIFF};
use testkit::replay;
use xdna_vl_tests::{ablated, cases, forward, options, Case};

const EXACT: f32 = 1e-3;

/// Every prompt row, decode step and text row within `tol`, and the same greedy ids.
fn assert_exact(case: &Case, kind: QuantKind, tol: f32) {
    let (_dir, pack) = case.pack(kind);
    let inputs = case.inputs();
    let reference = case.reference(kind);
    let mut fwd = forward(&pack, options());
    let r = replay(&mut fwd, &inputs, &reference, |_, _, _, _| {}).unwrap();
    println!(
        "{} {kind}: prompt max |Δ| {:.2e}, decode {:.2e}, text {:.2e}, greedy {:?}",
        case.name,
        r.prompt.max_abs_diff(),
        r.decode.max_abs_diff(),
        r.text.max_abs_diff(),
        r.greedy_ids
    );
    assert!(
        r.prompt.max_abs_diff() <= tol,
        "{}: prompt rows {:?}",
        case.name,
        r.prompt.per_row_max_abs_diff
    );
    assert!(
        r.decode.max_abs_diff() <= tol,
        "{}: decode steps {:?}",
        case.name,
        r.decode.per_row_max_abs_diff
    );
    assert!(
        r.text.max_abs_diff() <= tol,
        "{}: text rows {:?}",
        case.name,
        r.text.per_row_max_abs_diff
    );
    let ref_ids: Vec<u32> = reference.greedy_ids.iter().map(|&t| t as u32).collect();
    assert_eq!(r.greedy_ids, ref_ids, "{}: greedy ids", case.name);
    assert_eq!(
        r.text.first_divergence(),
        None,
        "{}: text control argmax",
        case.name
    );
}

#[test]
fn f32_packs_match_transformers_on_every_case() {
    for name in cases() {
        assert_exact(&Case::new(&name), QuantKind::F32, EXACT);
    }
}

#[test]
fn bf16_packs_from_bf16_checkpoints_match_and_from_f32_are_reported() {
    let mut exact_cases = 0;
    for name in cases() {
        let case = Case::new(&name);
        if case.is_bf16_checkpoint() {
            assert_exact(&case, QuantKind::Bf16, EXACT);
            exact_cases += 1;
        } else {
            let (_dir, pack) = case.pack(QuantKind::Bf16);
            let mut fwd = forward(&pack, options());
            let reference = case.reference(QuantKind::F32);
            let r = replay(&mut fwd, &case.inputs(), &reference, |_, _, _, _| {}).unwrap();
            println!(
                "{name} bf16 pack from an f32 checkpoint: max |Δ| {:.3e}, top-1 {:.3}, cosine {:.6}",
                r.max_abs_logit_diff(),
                r.top1_agreement(),
                r.cosine
            );
        }
    }
    assert!(exact_cases >= 1, "no bf16-saved case among the fixtures");
}

#[test]
fn quantized_packs_match_their_quantization_aware_references() {
    for name in cases() {
        let case = Case::new(&name);
        let inputs = case.inputs();
        for kind in [QuantKind::I8, QuantKind::Q4] {
            let (_dir, pack) = case.pack(kind);
            let mut fwd = forward(&pack, options());
            let reference = case.reference(kind);
            let r = replay(&mut fwd, &inputs, &reference, |_, _, _, _| {}).unwrap();
            let text_top1 = r.text.agreeing() as f64 / r.text.rows as f64;
            // The quantization cost against the f32 reference: reported, not gated.
            let exact = case.reference(QuantKind::F32);
            let cost = replay(&mut fwd, &inputs, &exact, |_, _, _, _| {}).unwrap();
            println!(
                "{name} {kind}: vs its reference max |Δ| {:.3e}, top-1 {:.4}, text top-1 {text_top1:.4}; vs f32 reference top-1 {:.4}, cosine {:.6}",
                r.max_abs_logit_diff(),
                r.top1_agreement(),
                cost.top1_agreement(),
                cost.cosine
            );
            assert!(
                r.top1_agreement() >= 0.97,
                "{name} {kind}: top-1 {}",
                r.top1_agreement()
            );
            assert!(text_top1 >= 0.97, "{name} {kind}: text top-1 {text_top1}");
            assert!(
                r.max_abs_logit_diff() <= QUANTIZED_MAX_ABS_LOGIT_DIFF,
                "{name} {kind}: max |Δ| {}",
                r.max_abs_logit_diff()
            );
            assert!(
                r.text.max_abs_diff() <= QUANTIZED_MAX_ABS_LOGIT_DIFF,
                "{name} {kind}: text max |Δ| {}",
                r.text.max_abs_diff()
            );
        }
    }
}

#[test]
fn equal_planes_are_byte_identical_to_the_token_path() {
    for name in cases() {
        let case = Case::new(&name);
        let (_dir, pack) = case.pack(QuantKind::F32);
        let mut fwd = forward(&pack, options());
        let reference = case.reference(QuantKind::F32);
        let ids: Vec<u32> = reference.text_ids.iter().map(|&t| t as u32).collect();
        let tokens = fwd
            .step_batch(&ids, 0, 0, Logits::AllRows)
            .unwrap()
            .to_vec();
        fwd.reset();
        let h = fwd.semantics().hidden_size;
        let mut embeds = vec![0.0; ids.len() * h];
        for (row, &t) in embeds.chunks_exact_mut(h).zip(&ids) {
            fwd.embed_row(t, row);
        }
        let mut hybrid = decoder::HybridInputs::text(0);
        hybrid.planes = Some(decoder::HybridInputs::equal_planes(ids.len(), 0));
        let planes = fwd
            .step_batch_embeds(&embeds, &hybrid, 0, Logits::AllRows)
            .unwrap()
            .to_vec();
        assert_eq!(count_differing(&tokens, &planes), 0, "{name}");
        // Control: shifting one plane moves the logits.
        fwd.reset();
        let mut shifted = hybrid.clone();
        if let Some(p) = shifted.planes.as_mut() {
            let rows = ids.len();
            for r in 0..rows {
                p[rows + r] += 3;
            }
        }
        let moved = fwd
            .step_batch_embeds(&embeds, &shifted, 0, Logits::AllRows)
            .unwrap()
            .to_vec();
        assert!(
            count_differing(&tokens, &moved) > 0,
            "{name}: the h plane is not used"
        );
    }
}

#[test]
fn control_contiguous_rule_on_an_interleaved_pack_fails() {
    for name in cases() {
        let case = Case::new(&name);
        let (_dir, pack) = case.pack(QuantKind::F32);
        let sem = pack.semantics();
        let Some(section) = sem.mrope_section.filter(|_| sem.mrope_interleaved) else {
            continue;
        };
        let worst = ablated(
            &case,
            Ablation {
                rope_layout: Some(RopeLayout::Contiguous(section)),
                ..Ablation::default()
            },
        );
        println!("{name}: contiguous rule max |Δ| {worst:.3e}");
        assert!(
            worst > 10.0 * EXACT,
            "{name}: the contiguous reading went unnoticed ({worst})"
        );
    }
}

#[test]
fn control_deepstack_before_the_layer_or_on_every_row_fails() {
    for name in cases() {
        let case = Case::new(&name);
        if case.inputs().deepstack_sets == 0 {
            continue; // Qwen3.5's tower has no DeepStack
        }
        let before = ablated(
            &case,
            Ablation {
                deepstack_before_layer: true,
                ..Ablation::default()
            },
        );
        let every_row = ablated(
            &case,
            Ablation {
                deepstack_every_row: true,
                ..Ablation::default()
            },
        );
        println!(
            "{name}: DeepStack before the layer max |Δ| {before:.3e}, on every row {every_row:.3e}"
        );
        assert!(
            before > 10.0 * EXACT,
            "{name}: DeepStack before the layer went unnoticed"
        );
        assert!(
            every_row > 10.0 * EXACT,
            "{name}: DeepStack on every row went unnoticed"
        );
    }
}

#[test]
fn control_coupling_cache_slot_and_rotary_position_after_an_image_fails() {
    for name in cases() {
        let case = Case::new(&name);
        let inputs = case.inputs();
        assert_ne!(
            inputs.rope_delta, 0,
            "{name}: the prompt has no image, the control cannot bite"
        );
        let reference = case.reference(QuantKind::F32);
        let (_dir, pack) = case.pack(QuantKind::F32);
        let mut fwd = forward(&pack, options());
        let vocab = reference.vocab;
        let rows = inputs.rows();
        let embeds = inputs.embeds(&fwd);
        let decode = |fwd: &mut decoder::Decoder, coupled: bool| -> f32 {
            fwd.reset();
            fwd.step_batch_embeds(&embeds, &inputs.hybrid(), 0, Logits::LastRow)
                .unwrap();
            let mut worst = 0.0f32;
            for (i, &id) in reference.greedy_ids[..reference.greedy_ids.len() - 1]
                .iter()
                .enumerate()
            {
                let slot = rows + i;
                let pos = if coupled {
                    slot as i64
                } else {
                    inputs.next_rotary_pos() + i as i64
                };
                let logits = fwd.step(id as u32, pos, slot).unwrap();
                worst = worst.max(max_abs_diff(
                    logits,
                    &reference.decode_logits[i * vocab..(i + 1) * vocab],
                ));
            }
            worst
        };
        let right = decode(&mut fwd, false);
        let coupled = decode(&mut fwd, true);
        println!("{name}: decode max |Δ| separate {right:.3e}, coupled {coupled:.3e}");
        assert!(right <= EXACT);
        assert!(
            coupled > 10.0 * EXACT,
            "{name}: coupling slot and position went unnoticed"
        );
    }
}
