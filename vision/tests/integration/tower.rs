//! The tower against transformers (tests/fixtures/vision, tools/vision_reference.py): f32 packs
//! within 1e-4 of the largest value for the image rows and every DeepStack set, several images
//! of different sizes in one call; and the controls — each planted mistake breaks the comparison.

use crate::common;

use common::{build_pack, encode, worst, worst_relative, Case, Reference};
use packs::QuantKind;
use vision::tower::TowerAblation;

const F32_TOLERANCE: f32 = 1e-4;

#[test]
fn f32_tower_equals_transformers() {
    let dir = tempfile::tempdir().unwrap();
    for case in [Case::Chat, Case::Wide] {
        let pack = build_pack(case, QuantKind::F32, dir.path());
        let r = Reference::open(case, QuantKind::F32);
        let out = encode(&pack, &r.image_refs(), TowerAblation::default());
        assert_eq!(out.tokens_per_image.iter().sum::<usize>(), r.tokens);
        assert_eq!(
            out.grids,
            r.images.iter().map(|i| i.grid).collect::<Vec<_>>()
        );
        let (rows, sets) = worst_relative(&out, &r);
        println!("{case:?} f32: image rows {rows:.3e}, DeepStack sets {sets:?}");
        assert!(
            rows <= F32_TOLERANCE,
            "{case:?}: image rows differ by {rows:e}"
        );
        for (j, s) in sets.iter().enumerate() {
            assert!(
                *s <= F32_TOLERANCE,
                "{case:?}: DeepStack set {j} differs by {s:e}"
            );
        }
    }
}

/// The wide checkpoint holds bf16 values: a bf16 pack stores them exactly.
#[test]
fn bf16_tower_of_a_bf16_checkpoint_equals_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Wide, QuantKind::Bf16, dir.path());
    let r = Reference::open(Case::Wide, QuantKind::F32);
    let out = encode(&pack, &r.image_refs(), TowerAblation::default());
    let w = worst(&out, &r);
    println!("wide bf16: {w:.3e}");
    assert!(w <= F32_TOLERANCE, "bf16 pack differs by {w:e}");
}

/// bf16 attention (AVX-512 BF16 only) forced on a bf16 tower with f32 products, the wide bf16
/// checkpoint: how far its rows move from transformers' and from the f32 attention's, per output
/// row (relative to the row's largest value), printed; bounded at 2e-3. Control: that tower's
/// default is the f32 attention (its products are f32).
#[test]
fn bf16_attention_stays_near_the_f32_tower() {
    use compute::attention::Operands;
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Wide, QuantKind::Bf16, dir.path());
    let r = Reference::open(Case::Wide, QuantKind::F32);
    let runtime = common::runtime(|pool| Box::new(compute::HostGemm::new(pool)));
    let mut tower = vision::tower::Tower::new(&pack, &runtime).unwrap();
    assert_eq!(tower.attention_operands(), Operands::F32, "f32 by default");
    let f32_out = tower.encode(&r.image_refs()).unwrap();
    if !tower.use_bf16_attention(true) {
        eprintln!("this CPU lacks AVX-512 BF16: the tower keeps f32 attention");
        return;
    }
    let out = tower.encode(&r.image_refs()).unwrap();
    let per_row = |a: &[f32], b: &[f32]| {
        a.chunks(r.out_hidden)
            .zip(b.chunks(r.out_hidden))
            .map(|(x, y)| common::max_abs_diff(x, y) / common::max_abs(y).max(1e-6))
            .fold(0.0, f32::max)
    };
    let vs_f32 = per_row(&out.image_embeds, &f32_out.image_embeds);
    let vs_ref = per_row(&out.image_embeds, &r.image_embeds);
    let f32_vs_ref = per_row(&f32_out.image_embeds, &r.image_embeds);
    println!(
        "wide bf16 pack, image rows, max relative error per row: bf16 attention vs f32 attention \
         {vs_f32:.3e}, vs transformers {vs_ref:.3e} (f32 attention vs transformers {f32_vs_ref:.3e}); \
         worst over the tensors vs transformers {:.3e}",
        worst(&out, &r)
    );
    assert!(vs_f32 > 0.0, "bf16 attention gave the f32 bits");
    assert!(
        vs_f32 <= 2e-3 && vs_ref <= 2e-3,
        "bf16 attention: {vs_f32:e}, {vs_ref:e}"
    );
}

/// The decoder quantized, the tower kept f32 (`--vision-quant f32`): the tower reads its own storage.
#[test]
fn f32_tower_beside_an_i8_decoder_equals_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mixed.pack");
    let opts = packs::BuildOptions {
        vision_quant: Some(QuantKind::F32),
        ..packs::BuildOptions::new(QuantKind::I8)
    };
    packs::build_from_hf(&Case::Chat.checkpoint(), &out, &opts).unwrap();
    let pack = std::sync::Arc::new(packs::Pack::open(&out).unwrap());
    let r = Reference::open(Case::Chat, QuantKind::F32);
    let w = worst(
        &encode(&pack, &r.image_refs(), TowerAblation::default()),
        &r,
    );
    assert!(w <= F32_TOLERANCE, "mixed pack: {w:e}");
}

/// One call with all images gives each image's rows exactly as a call with that image alone.
#[test]
fn images_in_one_call_equal_images_alone() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(Case::Wide, QuantKind::F32, dir.path());
    let r = Reference::open(Case::Wide, QuantKind::F32);
    let all = encode(&pack, &r.image_refs(), TowerAblation::default());
    let out_h = r.out_hidden;
    let mut row = 0;
    for (i, im) in r.images.iter().enumerate() {
        let one = encode(&pack, &[im], TowerAblation::default());
        let t = one.tokens_per_image[0];
        assert_eq!(
            one.image_embeds,
            all.image_embeds[row * out_h..(row + t) * out_h],
            "image {i}"
        );
        for j in 0..r.sets {
            let set = &all.deepstack[j * r.tokens * out_h..(j + 1) * r.tokens * out_h];
            assert_eq!(
                one.deepstack[j * t * out_h..(j + 1) * t * out_h],
                set[row * out_h..(row + t) * out_h],
                "image {i}, set {j}"
            );
        }
        row += t;
    }
}

/// Every planted mistake fails the f32 check on both cases (the tower itself is ~1e-6 off; the
/// smallest control, the tanh GELU in the mergers, moves the rows by 2.3e-4 on chat).
#[test]
fn controls_break_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let ablations = [
        (
            "rows in raster order",
            TowerAblation {
                raster_positions: true,
                ..Default::default()
            },
        ),
        (
            "positions without aligned corners",
            TowerAblation {
                pos_embed_half_pixel: true,
                ..Default::default()
            },
        ),
        (
            "tanh GELU in the mergers",
            TowerAblation {
                merger_gelu_tanh: true,
                ..Default::default()
            },
        ),
        (
            "DeepStack tapped one block early",
            TowerAblation {
                deepstack_before_block: true,
                ..Default::default()
            },
        ),
        (
            "images attending to each other",
            TowerAblation {
                joint_attention: true,
                ..Default::default()
            },
        ),
    ];
    for case in [Case::Chat, Case::Wide] {
        let pack = build_pack(case, QuantKind::F32, dir.path());
        let r = Reference::open(case, QuantKind::F32);
        for (what, ablation) in ablations {
            let w = worst(&encode(&pack, &r.image_refs(), ablation), &r);
            println!("{case:?}, {what}: {w:.3e}");
            assert!(w > F32_TOLERANCE, "{case:?}: {what} passes ({w:e})");
        }
    }
}
