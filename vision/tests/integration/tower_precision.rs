//! The tower precisions side by side (the numbers behind `packs build`'s default tower, README):
//! every kind's image rows and DeepStack sets against transformers' f32 run and against our f32
//! tower; and bf16 products held to their own bound, with the control that they are another
//! arithmetic than f32 products.

use crate::common;

use common::{encode_on, max_abs, max_abs_diff, pool, Case, Reference};
use compute::{HostGemm, Products, Runtime};
use packs::{BuildOptions, Pack, QuantKind};
use std::path::Path;
use std::sync::Arc;
use vision::tower::{Tower, TowerAblation, VisionOutput};

/// bf16 products (and with them bf16 attention operands) against transformers' f32 run, relative
/// to the largest value: measured 3.3e-3 on the wide case (bf16 weights, so the activations'
/// rounding is the whole difference; 3.0e-3 with f32 attention).
const BF16_PRODUCTS_TOLERANCE: f32 = 1e-2;

/// A pack of `case` with an f32 decoder and the tower stored as `kind` (bf16 products when asked).
fn tower_pack(case: Case, kind: QuantKind, bf16_products: bool, dir: &Path) -> Arc<Pack> {
    let out = dir.join(format!("{case:?}-{kind}-{bf16_products}.pack"));
    let opts = BuildOptions {
        vision_quant: Some(kind),
        vision_bf16_products: bf16_products,
        ..BuildOptions::new(QuantKind::F32)
    };
    packs::build_from_hf(&case.checkpoint(), &out, &opts).unwrap();
    Arc::new(Pack::open(&out).unwrap())
}

/// The tower's output and the arithmetic it ran.
fn run(pack: &Arc<Pack>, images: &Reference) -> (VisionOutput, String) {
    let pool = pool();
    let runtime = Runtime::with_backend(pool.clone(), Box::new(HostGemm::new(pool)));
    let arithmetic = Tower::new(pack, &runtime).unwrap().arithmetic();
    let out = encode_on(
        pack,
        &runtime,
        &images.image_refs(),
        TowerAblation::default(),
    );
    (out, arithmetic)
}

/// Image rows and DeepStack sets together: (max |Δ| / max |want|, mean |Δ| / mean |want|).
fn relative(got: &VisionOutput, want_rows: &[f32], want_sets: &[f32]) -> (f32, f32) {
    let got: Vec<f32> = got
        .image_embeds
        .iter()
        .chain(&got.deepstack)
        .copied()
        .collect();
    let want: Vec<f32> = want_rows.iter().chain(want_sets).copied().collect();
    let mean = |v: &mut dyn Iterator<Item = f32>| v.sum::<f32>() / want.len() as f32;
    let mean_diff = mean(&mut got.iter().zip(&want).map(|(a, b)| (a - b).abs()));
    let mean_want = mean(&mut want.iter().map(|b| b.abs()));
    (
        max_abs_diff(&got, &want) / max_abs(&want),
        mean_diff / mean_want,
    )
}

#[test]
fn tower_precisions_against_transformers_and_the_f32_tower() {
    let dir = tempfile::tempdir().unwrap();
    for case in [Case::Chat, Case::Wide] {
        let reference = Reference::open(case, QuantKind::F32);
        let f32_pack = tower_pack(case, QuantKind::F32, false, dir.path());
        let (ours, _) = run(&f32_pack, &reference);
        for (kind, bf16_products) in [
            (QuantKind::F32, false),
            (QuantKind::Bf16, false),
            (QuantKind::Bf16, true),
            (QuantKind::I8, false),
            (QuantKind::Q4, false),
        ] {
            let pack = tower_pack(case, kind, bf16_products, dir.path());
            let (out, arithmetic) = run(&pack, &reference);
            let (hf_max, hf_mean) = relative(&out, &reference.image_embeds, &reference.deepstack);
            let (f32_max, f32_mean) = relative(&out, &ours.image_embeds, &ours.deepstack);
            println!(
                "{case:?} {arithmetic:45}: vs transformers max {hf_max:.2e} mean {hf_mean:.2e}; \
                 vs our f32 tower max {f32_max:.2e} mean {f32_mean:.2e}"
            );
            if kind == QuantKind::Bf16 && bf16_products {
                assert!(
                    hf_max <= BF16_PRODUCTS_TOLERANCE,
                    "{case:?} bf16 products: {hf_max:e} from transformers"
                );
            }
        }
    }
}

#[test]
fn bf16_products_are_another_arithmetic_than_f32_products() {
    // The wide checkpoint's weights are bf16, so f32 products equal transformers' f32 run to 1e-4
    // (tower.rs) and bf16 products differ by the activations' rounding alone.
    let dir = tempfile::tempdir().unwrap();
    let reference = Reference::open(Case::Wide, QuantKind::F32);
    let pack = tower_pack(Case::Wide, QuantKind::Bf16, true, dir.path());
    let pool = pool();
    let runtime = Runtime::with_backend(pool.clone(), Box::new(HostGemm::new(pool)));
    let tower = Tower::new(&pack, &runtime).unwrap();
    if tower.products() != Products::Bf16 {
        eprintln!(
            "this CPU runs the tower as {}: the control needs bf16 products",
            tower.arithmetic()
        );
        return;
    }
    let (out, _) = run(&pack, &reference);
    let (max, _) = relative(&out, &reference.image_embeds, &reference.deepstack);
    assert!(
        max > 1e-4 && max <= BF16_PRODUCTS_TOLERANCE,
        "bf16 products {max:e} from transformers' f32 run"
    );
}

/// Attention follows the products: bf16 operands exactly when the tower is bf16 with bf16
/// products and the CPU has AVX-512 BF16; f32 otherwise. Controls: the same bf16 tower with f32
/// products keeps f32 operands, and so does every other kind.
#[test]
fn attention_operands_follow_the_products() {
    use compute::attention::Operands;
    use vision::tower::attention_operands_for;
    for quant in [
        QuantKind::F32,
        QuantKind::Bf16,
        QuantKind::I8,
        QuantKind::Q4,
    ] {
        for products in [Products::F32, Products::Bf16] {
            for simd in [false, true] {
                let want = if quant == QuantKind::Bf16 && products == Products::Bf16 && simd {
                    Operands::Bf16
                } else {
                    Operands::F32
                };
                assert_eq!(
                    attention_operands_for(quant, products, simd),
                    want,
                    "{quant} tower, {products}, AVX-512 BF16 {simd}"
                );
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let pool = pool();
    let runtime = Runtime::with_backend(pool.clone(), Box::new(HostGemm::new(pool)));
    let simd = Operands::Bf16.has_simd();
    let bf16 = tower_pack(Case::Wide, QuantKind::Bf16, true, dir.path());
    let mut tower = Tower::new(&bf16, &runtime).unwrap();
    let bf16_products = tower.products() == Products::Bf16;
    assert_eq!(
        tower.attention_operands() == Operands::Bf16,
        bf16_products && simd,
        "{}",
        tower.arithmetic()
    );
    // The override still turns it off (and back on where the CPU can).
    assert!(!tower.use_bf16_attention(false));
    assert_eq!(tower.attention_operands(), Operands::F32);
    assert_eq!(tower.use_bf16_attention(true), simd);
    let f32_products = tower_pack(Case::Wide, QuantKind::Bf16, false, dir.path());
    let tower = Tower::new(&f32_products, &runtime).unwrap();
    if tower.products() == Products::F32 {
        assert_eq!(tower.attention_operands(), Operands::F32, "control");
    }
    let q4 = tower_pack(Case::Wide, QuantKind::Q4, false, dir.path());
    let tower = Tower::new(&q4, &runtime).unwrap();
    assert_eq!(tower.attention_operands(), Operands::F32, "q4 tower");
}
