//! Hand-computed cases for the quant rules. Each rule has a control: the value a plausible
//! wrong implementation (banker's rounding, last-on-ties, unrounded scale, swapped nibbles)
//! would produce, asserted to differ.

use super::*;

#[test]
fn i8_row_rounds_half_away_from_zero() {
    // max 127 makes the scale exactly 1, so every tie below is an exact .5.
    let w = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -127.0, 0.0];
    let (codes, scales) = quantize_i8_rows(&w, 1, 8);
    assert_eq!(scales, [1.0]);
    assert_eq!(codes, [127, 3, -3, 1, -1, 2, -127, 0]);
    // Control: round-half-even would give 2, -2, 0, 0, 2.
    let banker: Vec<i8> = w.iter().map(|v| v.round_ties_even() as i8).collect();
    assert_ne!(codes, banker);
}

#[test]
fn i8_scale_is_row_max_over_127_and_rows_are_independent() {
    let w = [
        0.5, -1.0, 0.25, 0.0, /* row 1 */ 0.0, 0.0, 0.0, 0.0, /* row 2 */ 3.0, 1.5, -3.0,
        0.75,
    ];
    let (codes, scales) = quantize_i8_rows(&w, 3, 4);
    assert_eq!(scales, [1.0 / 127.0, 0.0, 3.0 / 127.0]);
    assert_eq!(&codes[4..8], &[0, 0, 0, 0], "zero row: codes 0");
    assert_eq!(codes[1], -127);
    assert_eq!(codes[8], 127);
    assert_eq!(codes[10], -127);
    assert_eq!(codes[0], (0.5f32 / (1.0 / 127.0)).round() as i8);
    let back = dequantize_i8_rows(&codes, &scales, 3, 4);
    assert!(back.iter().all(|v| v.is_finite()));
    assert_eq!(&back[4..8], &[0.0; 4]);
}

#[test]
fn activation_rows_follow_the_i8_rule() {
    let x = [254.0, 5.0, -5.0, 1.0, -3.0];
    let mut codes = [0i8; 5];
    let s = quantize_activation_row(&x, &mut codes);
    assert_eq!(s, 2.0);
    assert_eq!(codes, [127, 3, -3, 1, -2]); // 2.5 -> 3, -2.5 -> -3, 0.5 -> 1, -1.5 -> -2
    let mut zero = [9i8; 3];
    assert_eq!(quantize_activation_row(&[0.0; 3], &mut zero), 0.0);
    assert_eq!(zero, [0; 3]);
    let mut nan_codes = [0i8; 2];
    assert!(
        quantize_activation_row(&[f32::NAN, 1.0], &mut nan_codes).is_nan(),
        "NaN must stay visible"
    );
}

fn group(values: &[f32]) -> Vec<f32> {
    let mut g = values.to_vec();
    g.resize(Q4_GROUP, 0.0);
    g
}

#[test]
fn q4_hand_case_codes_and_nibbles() {
    // m = 8 (largest magnitude) -> s = bf16(8 / -8) = -1; codes = round(w / -1).
    let w = group(&[8.0, -7.0, 3.5, -2.5, 0.5, 6.5, -0.49, 1.0]);
    let (codes, scales) = quantize_q4(&w, 1, 32).unwrap();
    assert_eq!(scales, [bf16::from_f32(-1.0)]);
    let unpacked: Vec<i8> = (0..8).map(|j| q4_code(&codes, j)).collect();
    assert_eq!(unpacked, [-8, 7, -4, 3, -1, -7, 0, -1]);
    // Element 2i low nibble, 2i+1 high nibble, each code + 8: (-8, 7) -> 0xF0, (-4, 3) -> 0xB4.
    assert_eq!(codes[0], 0xF0);
    assert_eq!(codes[1], 0xB4);
    assert_eq!(codes[2], 0x17); // (-1, -7) -> low 0x7, high 0x1
                                // Control: two's complement (the format before xdna-vl-pack/4) would store (-8, 7) as 0x78.
    assert_ne!(codes[0], 0x78);
    // Control: the GGUF Q4_0 order (element j low, j+16 high) would put w[16] = 0 in byte 0's high nibble.
    assert_ne!(codes[0] >> 4, 0);
    assert_eq!(dequantize_q4(&codes, &scales, 1, 32)[..3], [8.0, -7.0, 4.0]);
}

#[test]
fn q4_first_of_equal_magnitudes_sets_the_sign() {
    let (codes, scales) = quantize_q4(&group(&[-4.0, 4.0, 2.0]), 1, 32).unwrap();
    assert_eq!(scales, [bf16::from_f32(0.5)]); // m = -4 (first), s = -4 / -8
    assert_eq!(
        [q4_code(&codes, 0), q4_code(&codes, 1), q4_code(&codes, 2)],
        [-8, 7, 4]
    );
    // Control: last-on-ties would choose m = 4, s = -0.5 and codes [7, -8, -4].
    let (codes_rev, scales_rev) = quantize_q4(&group(&[4.0, -4.0, 2.0]), 1, 32).unwrap();
    assert_eq!(scales_rev, [bf16::from_f32(-0.5)]);
    assert_eq!([q4_code(&codes_rev, 0), q4_code(&codes_rev, 1)], [-8, 7]);
}

#[test]
fn q4_scale_is_rounded_to_nearest_even_and_codes_use_it() {
    // m = 1 + 3/256: m / -8 = -0.12646484375 lies exactly between the bf16 neighbours
    // -0.125 (mantissa 1) and -0.126953125 (mantissa 2); nearest-even picks -0.126953125.
    let m = 1.0 + 3.0 / 256.0;
    let w_mid = 0.8233f32; // |w / s| = 6.51 with the unrounded scale, 6.485 with the rounded one
    let (codes, scales) = quantize_q4(&group(&[m, w_mid]), 1, 32).unwrap();
    assert_eq!(scales[0].to_f32(), -65.0 / 512.0);
    // Controls: truncation would give -0.125; the unrounded scale gives code -7.
    assert_ne!(scales[0].to_f32(), -0.125);
    assert_eq!((w_mid / (m / -8.0)).round(), -7.0);
    assert_eq!(q4_code(&codes, 1), -6);
    assert_eq!(q4_code(&codes, 0), -8);
}

#[test]
fn q4_zero_group_has_zero_scale_and_codes() {
    let mut w = vec![0.0f32; 64];
    w[32] = 1.0;
    let (codes, scales) = quantize_q4(&w, 1, 64).unwrap();
    assert_eq!(scales[0].to_bits(), 0, "a zero group's scale is +0");
    assert!(codes[..16].iter().all(|&b| b == 0x88), "code 0 is nibble 8");
    assert_eq!(scales[1], bf16::from_f32(-0.125));
    assert_eq!(q4_code(&codes[16..], 0), -8);
    assert!(dequantize_q4(&codes, &scales, 1, 64)
        .iter()
        .all(|v| v.is_finite()));
}

#[test]
fn q4_refuses_k_not_multiple_of_32() {
    assert_eq!(
        quantize_q4(&[0.0; 48], 1, 48),
        Err(QuantError::Q4GroupMismatch { k: 48 })
    );
    assert!(matches!(
        quantize_q4(&[0.0; 64], 1, 32),
        Err(QuantError::LengthMismatch { .. })
    ));
}

#[test]
fn q4_nibbles_are_codes_plus_8() {
    for nibble in 0u8..16 {
        let byte = nibble | (nibble << 4);
        let code = nibble as i8 - 8;
        assert_eq!(q4_code(&[byte], 0), code);
        assert_eq!(q4_code(&[byte], 1), code);
        assert_eq!(q4_byte(code, code), byte);
        assert_eq!(q4_byte_codes(byte), (code, code));
    }
    for (lo, hi) in [(-8, 7), (7, -8), (0, -1), (-1, 0)] {
        let byte = q4_byte(lo, hi);
        assert_eq!(q4_byte_codes(byte), (lo, hi));
        assert_eq!([q4_code(&[byte], 0), q4_code(&[byte], 1)], [lo, hi]);
    }
    // Control: read as two's complement (sign-extended), an offset-binary byte gives other codes:
    // nibble 0 (code -8) would be 0, nibble 0xF (code 7) would be -1.
    let sign_extended = |nibble: u8| ((nibble << 4) as i8) >> 4;
    assert_ne!(sign_extended(q4_byte(-8, -8) & 0x0F), -8);
    assert_ne!(sign_extended(q4_byte(7, 7) & 0x0F), 7);
}

#[test]
fn gemm_oracles_follow_the_documented_arithmetic() {
    let k = 64;
    let a: Vec<i8> = (0..2 * k)
        .map(|i| ((i * 37 % 255) as i32 - 127) as i8)
        .collect();
    let a_scales = [0.01f32, 0.02];
    let w: Vec<f32> = (0..3 * k)
        .map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.1)
        .collect();

    let (wc, ws) = quantize_i8_rows(&w, 3, k);
    let mut out = vec![0f32; 6];
    gemm_i8_ref(&a, &a_scales, 2, k, &wc, &ws, 3, &mut out);
    for i in 0..2 {
        for j in 0..3 {
            let acc: i32 = (0..k)
                .map(|t| a[i * k + t] as i32 * wc[j * k + t] as i32)
                .sum();
            assert_eq!(
                out[i * 3 + j].to_bits(),
                ((acc as f32 * a_scales[i]) * ws[j]).to_bits()
            );
        }
    }

    let (qc, qs) = quantize_q4(&w, 3, k).unwrap();
    gemm_q4_ref(&a, &a_scales, 2, k, &qc, &qs, 3, &mut out);
    for i in 0..2 {
        for j in 0..3 {
            let mut sum = 0f32;
            for g in 0..2 {
                let acc: i32 = (g * 32..g * 32 + 32)
                    .map(|t| a[i * k + t] as i32 * q4_code(&qc[j * 32..], t) as i32)
                    .sum();
                sum += acc as f32 * qs[j * 2 + g].to_f32();
            }
            assert_eq!(out[i * 3 + j].to_bits(), (sum * a_scales[i]).to_bits());
        }
    }
}

#[test]
fn quant_kind_names() {
    for k in QuantKind::ALL {
        assert_eq!(k.to_string().parse::<QuantKind>(), Ok(k));
        assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{k}\""));
    }
    assert!("int4".parse::<QuantKind>().is_err());
}

#[test]
fn round_clamp_matches_f32_round() {
    let reference = |x: f32, lo: i8, hi: i8| x.round().clamp(lo as f32, hi as f32) as i8;
    let mut checked = 0u64;
    // Every 61st f32 bit pattern of both signs (covers ties, near-ties, huge values, NaN, inf).
    for bits in (0..=u32::MAX).step_by(61) {
        let x = f32::from_bits(bits);
        for (lo, hi) in [(-127, 127), (-8, 7)] {
            assert_eq!(
                round_clamp(x, lo, hi),
                reference(x, lo, hi),
                "x = {x:e} ({bits:#x})"
            );
        }
        checked += 1;
    }
    // Every tie and its neighbours in the code ranges.
    for half in -300..=300 {
        let tie = half as f32 + 0.5;
        for x in [
            tie,
            f32::from_bits(tie.to_bits() + 1),
            f32::from_bits(tie.to_bits() - 1),
        ] {
            assert_eq!(
                round_clamp(x, -127, 127),
                reference(x, -127, 127),
                "x = {x:e}"
            );
            assert_eq!(round_clamp(x, -8, 7), reference(x, -8, 7), "x = {x:e}");
        }
    }
    assert!(checked > 70_000_000);
}

#[test]
fn q4_panels_put_16_rows_chunks_side_by_side() {
    // 17 rows of K = 96 (48 bytes a row, three groups): one whole panel of 16 rows, then a partial
    // panel of 1 row that stays row-major.
    let (n, k) = (17, 96);
    let at = |j, g| q4_group_chunks(n, k, j, g);
    // Group g of the panel at 256 g; row c's chunk 0 at 4 c; its chunks 64 apart.
    assert_eq!(
        [at(0, 0), at(1, 0), at(15, 0)],
        [(0, 64), (4, 64), (60, 64)]
    );
    assert_eq!([at(0, 1), at(3, 2)], [(256, 64), (512 + 12, 64)]);
    // The partial panel: row-major after the whole panel, chunks adjacent.
    assert_eq!([at(16, 0), at(16, 2)], [(16 * 48, 4), (16 * 48 + 32, 4)]);
    // Control: row 1's group 0 does not start where it would row-major.
    assert_ne!(at(1, 0).0, 48);
    // Every chunk lands somewhere once, and the two directions undo each other.
    let mut seen = vec![false; n * k / 2 / Q4_CHUNK];
    for j in 0..n {
        for g in 0..k / 32 {
            let (start, step) = at(j, g);
            for t in 0..Q4_CHUNKS {
                let o = start + t * step;
                assert_eq!(o % Q4_CHUNK, 0);
                assert!(
                    !std::mem::replace(&mut seen[o / Q4_CHUNK], true),
                    "row {j} group {g} chunk {t}"
                );
            }
        }
    }
    assert!(seen.iter().all(|&s| s));
    let row_major: Vec<u8> = (0..n * k / 2).map(|i| (i * 7 + 3) as u8).collect();
    let panels = q4_to_panels(&row_major, n, k);
    assert_ne!(panels, row_major);
    assert_eq!(
        &panels[4..8],
        &row_major[48..52],
        "row 1's group 0, chunk 0"
    );
    assert_eq!(
        &panels[64 + 4..64 + 8],
        &row_major[52..56],
        "row 1's group 0, chunk 1"
    );
    for j in 0..n {
        for g in 0..k / 32 {
            let bytes = q4_group_bytes(&panels, n, k, j, g);
            assert_eq!(
                &bytes[..],
                &row_major[j * 48 + 16 * g..][..16],
                "row {j} group {g}"
            );
        }
    }
    assert_eq!(q4_from_panels(&panels, n, k), row_major);
}
