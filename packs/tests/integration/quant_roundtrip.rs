//! Round-trip error of each kind on Gaussian weights with rows of different magnitudes, against
//! bounds derived from the rules; beside each, a plausible wrong layout that the same bounds catch.
//! Run with `--nocapture` to see the measured errors.

use half::bf16;
use packs::quant::{self, Q4_GROUP};

const N: usize = 96;
const K: usize = 1024;

/// Gaussian values (Box-Muller on an LCG); row r scaled by 2^(r % 7 - 3) so that rows differ.
fn weights() -> Vec<f32> {
    let mut state = 0x1234_5678_9ABC_DEF0u64;
    let mut uniform = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut w = Vec::with_capacity(N * K);
    for r in 0..N {
        let row_scale = 2f64.powi(r as i32 % 7 - 3);
        for _ in 0..K {
            let g = (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
            w.push((g * 0.02 * row_scale) as f32);
        }
    }
    w
}

struct Errors {
    /// max over rows (i8) or groups (q4) of max|err| / max|w| in that row/group.
    max_rel: f64,
    /// sqrt(mean err^2) / sqrt(mean w^2), per row then averaged (rows differ in magnitude).
    rms_rel: f64,
}

fn errors(w: &[f32], back: &[f32], block: usize) -> Errors {
    let mut max_rel = 0f64;
    for (wb, bb) in w.chunks(block).zip(back.chunks(block)) {
        let m = wb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let e = wb
            .iter()
            .zip(bb)
            .fold(0f64, |e, (a, b)| e.max((a - b).abs() as f64));
        if m > 0.0 {
            max_rel = max_rel.max(e / m);
        }
    }
    let mut rms_sum = 0f64;
    for (wr, br) in w.chunks(K).zip(back.chunks(K)) {
        let err2: f64 = wr
            .iter()
            .zip(br)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let w2: f64 = wr.iter().map(|a| (*a as f64).powi(2)).sum();
        rms_sum += (err2 / w2).sqrt();
    }
    Errors {
        max_rel,
        rms_rel: rms_sum / N as f64,
    }
}

#[test]
fn f32_and_bf16_round_trips() {
    let w = weights();
    // bf16 keeps 8 significant bits; round-to-nearest-even: relative error at most 2^-8.
    let back: Vec<f32> = w.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    let rel = w
        .iter()
        .zip(&back)
        .fold(0f64, |e, (a, b)| e.max(((a - b) / a).abs() as f64));
    let e = errors(&w, &back, K);
    println!(
        "bf16: max elementwise rel {rel:.3e}, rms rel {:.3e}",
        e.rms_rel
    );
    assert!(rel <= 2f64.powi(-8));
    // Control: truncation (round toward zero) reaches 2^-7.
    let trunc: Vec<f32> = w
        .iter()
        .map(|&v| f32::from_bits(v.to_bits() & 0xFFFF_0000))
        .collect();
    let rel_trunc = w
        .iter()
        .zip(&trunc)
        .fold(0f64, |e, (a, b)| e.max(((a - b) / a).abs() as f64));
    assert!(rel_trunc > 2f64.powi(-8), "{rel_trunc}");
}

#[test]
fn i8_round_trip() {
    let w = weights();
    let (codes, scales) = quant::quantize_i8_rows(&w, N, K);
    let back = quant::dequantize_i8_rows(&codes, &scales, N, K);
    let e = errors(&w, &back, K);
    println!(
        "i8: max rel (per row) {:.3e}, rms rel {:.3e}",
        e.max_rel, e.rms_rel
    );
    // Half a step of max|row| / 127, plus f32 rounding.
    let max_bound = 0.5 / 127.0 * (1.0 + 1e-4);
    // A Gaussian row's max is ~3.3 sigma: step/sqrt(12) ~ 0.0075 of the row RMS.
    let rms_bound = 9e-3;
    assert!(e.max_rel <= max_bound && e.rms_rel <= rms_bound);

    // Control: one scale for the whole tensor breaks the per-row bound on the small rows.
    let tensor_max = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = tensor_max / 127.0;
    let per_tensor: Vec<f32> = w.iter().map(|&v| (v / s).round() * s).collect();
    let c = errors(&w, &per_tensor, K);
    println!(
        "i8 control (per-tensor scale): max rel {:.3e}, rms rel {:.3e}",
        c.max_rel, c.rms_rel
    );
    assert!(c.max_rel > max_bound && c.rms_rel > rms_bound);
}

/// Dequantize with the nibbles read the other way round (element 2i high, 2i+1 low).
fn dequantize_swapped(codes: &[u8], scales: &[bf16]) -> Vec<f32> {
    let swapped: Vec<u8> = codes.iter().map(|b| b.rotate_left(4)).collect();
    quant::dequantize_q4(&swapped, scales, N, K)
}

/// Dequantize with GGUF Q4_0's order: byte j of a group holds elements j (low) and j + 16 (high).
fn dequantize_gguf_order(codes: &[u8], scales: &[bf16]) -> Vec<f32> {
    let mut out = vec![0f32; N * K];
    for (g, (group_codes, scale)) in codes.chunks(Q4_GROUP / 2).zip(scales).enumerate() {
        for j in 0..Q4_GROUP / 2 {
            let (lo, hi) = quant::q4_byte_codes(group_codes[j]);
            out[g * Q4_GROUP + j] = lo as f32 * scale.to_f32();
            out[g * Q4_GROUP + j + 16] = hi as f32 * scale.to_f32();
        }
    }
    out
}

#[test]
fn q4_round_trip() {
    let w = weights();
    let (codes, scales) = quant::quantize_q4(&w, N, K).unwrap();
    let back = quant::dequantize_q4(&codes, &scales, N, K);
    let e = errors(&w, &back, Q4_GROUP);
    // The group's extreme m maps to code -8 exactly, up to the scale's bf16 rounding (relative
    // 2^-8 of s = |m|/8, times 8 steps): |m - dequant(m)| <= |m| * 2^-8.
    let extreme_rel = group_extreme_error(&w, &back);
    println!(
        "q4: max rel (per group) {:.3e}, rms rel {:.3e}, group-extreme rel {:.3e}",
        e.max_rel, e.rms_rel, extreme_rel
    );
    // Max: half a step (|m|/16), or up to a full step (|m|/8) where a value of the other sign is
    // clamped at +7; plus the scale's bf16 rounding on those 7 steps (7/8 |m| 2^-8).
    let max_bound = 0.125 + 7.0 / 8.0 * 2f64.powi(-8);
    // Step |m|/8 with |m| ~ 2.1 sigma for groups of 32: step/sqrt(12) ~ 0.076 sigma, plus clamps.
    let rms_bound = 0.09;
    let extreme_bound = 2f64.powi(-8);
    assert!(e.max_rel <= max_bound, "{}", e.max_rel);
    assert!(e.rms_rel <= rms_bound, "{}", e.rms_rel);
    assert!(extreme_rel <= extreme_bound, "{extreme_rel}");

    // Controls: the wrong nibble order or GGUF's j / j+16 pairing scramble the values.
    for (name, wrong) in [
        ("swapped nibbles", dequantize_swapped(&codes, &scales)),
        ("gguf order", dequantize_gguf_order(&codes, &scales)),
    ] {
        let c = errors(&w, &wrong, Q4_GROUP);
        println!(
            "q4 control ({name}): max rel {:.3e}, rms rel {:.3e}",
            c.max_rel, c.rms_rel
        );
        assert!(c.max_rel > max_bound && c.rms_rel > rms_bound, "{name}");
    }
    // Control: `m / 8` without the sign trick wants code +8 for the extreme and clamps it to +7;
    // the symmetric rule max|w| / 7 gives up code -8 and widens every step by 8/7.
    let wrong = quantize_with_scale_rule(&w, -8.0);
    let (c, x) = (
        errors(&w, &wrong, Q4_GROUP),
        group_extreme_error(&w, &wrong),
    );
    println!(
        "q4 control (m/+8): max rel {:.3e}, rms rel {:.3e}, group-extreme rel {x:.3e}",
        c.max_rel, c.rms_rel
    );
    assert!(x > extreme_bound);
    let wrong = quantize_with_scale_rule(&w, 7.0);
    let c = errors(&w, &wrong, Q4_GROUP);
    println!(
        "q4 control (max/7): max rel {:.3e}, rms rel {:.3e}",
        c.max_rel, c.rms_rel
    );
    assert!(c.rms_rel > rms_bound);
}

/// max over groups of |m - dequant(m)| / |m| for the group's extreme m.
fn group_extreme_error(w: &[f32], back: &[f32]) -> f64 {
    let mut worst = 0f64;
    for (wg, bg) in w.chunks(Q4_GROUP).zip(back.chunks(Q4_GROUP)) {
        let (i, m) = wg.iter().enumerate().fold((0, 0f32), |(bi, bm), (i, &v)| {
            if v.abs() > bm.abs() {
                (i, v)
            } else {
                (bi, bm)
            }
        });
        if m != 0.0 {
            worst = worst.max(((m - bg[i]) / m).abs() as f64);
        }
    }
    worst
}

/// A wrong q4 scale: `max|w| / divisor` (divisor 7: the symmetric rule; divisor -8 gives m/8 with
/// the sign of m, so the extreme wants code +8 and is clamped to +7).
fn quantize_with_scale_rule(w: &[f32], divisor: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(w.len());
    for g in w.chunks(Q4_GROUP) {
        let m = g
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let s = if divisor > 0.0 {
            bf16::from_f32(m.abs() / divisor)
        } else {
            bf16::from_f32(m / -divisor)
        }
        .to_f32();
        out.extend(g.iter().map(|&v| {
            if s == 0.0 {
                0.0
            } else {
                (v / s).round().clamp(-8.0, 7.0) * s
            }
        }));
    }
    out
}
