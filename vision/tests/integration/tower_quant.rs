//! i8 and q4 towers against transformers' forward with every tower linear doing the pack kind's
//! exact arithmetic (tools/vision_reference.py's quant-aware references), and, as a control, the
//! same outputs against the f32 reference are much further off.

use crate::common;

use common::{build_pack, encode, worst, Case, Reference};
use packs::QuantKind;
use vision::tower::TowerAblation;

/// The f32 bound: the reference follows the pack's arithmetic exactly (measured 3.0e-7 at worst).
/// A last-bit difference upstream could flip one activation code (REFERENCE.md, "How far
/// quantized references can move"); none does on these inputs.
const QUANT_TOLERANCE: f32 = 1e-4;

#[test]
fn quantized_towers_follow_the_quant_aware_reference() {
    let dir = tempfile::tempdir().unwrap();
    for case in [Case::Chat, Case::Wide] {
        for kind in [QuantKind::I8, QuantKind::Q4] {
            let pack = build_pack(case, kind, dir.path());
            let r = Reference::open(case, kind);
            let out = encode(&pack, &r.image_refs(), TowerAblation::default());
            let w = worst(&out, &r);
            let f32_ref = Reference::open(case, QuantKind::F32);
            let vs_f32 = worst(&out, &f32_ref);
            println!("{case:?} {kind}: vs quant-aware {w:.3e}, vs f32 {vs_f32:.3e}");
            assert!(
                w <= QUANT_TOLERANCE,
                "{case:?} {kind}: {w:e} from the quant-aware reference"
            );
            // Control: the f32 reference is far from a quantized tower, so the check above is
            // sensitive to the quantization arithmetic itself.
            assert!(
                vs_f32 > 5.0 * QUANT_TOLERANCE,
                "{case:?} {kind}: only {vs_f32:e} from f32"
            );
        }
    }
}
