//! i8 and q4 on every path against the `packs::quant` oracles: random and extreme codes, the shapes
//! of each kernel (GEMV, tiles, packed panels, the AVX2 i16 pairs), and the controls that show the
//! checks can fail.

use super::*;

/// Every kernel's row counts: the GEMV, the few-row kernels, the prefill tiles (with remainders).
const ROWS: [usize; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 22];
const NS: [usize; 4] = [1, 5, 8, 13];

#[test]
fn i8_random_matches_the_oracle_on_every_path() {
    let mut rng = Rng(1);
    for k in [1, 31, 32, 33, 64, 100, 257] {
        for rows in ROWS {
            for n in NS {
                let x = activations(&mut rng, rows, k);
                let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
                let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
                check_i8(rows, k, n, &x, &codes, &scales);
            }
        }
    }
}

#[test]
fn i8_extremes_are_exact_without_saturation() {
    // Activation codes all ±127 and weights at -128, -127 and 127: the largest pair sums the sign
    // trick and the VNNI offset ever see.
    let (k, n) = (2048 + 17, 11);
    for rows in [1, 3, 16, FEW_MAX_ROWS + 4] {
        for &(a_sign, w_byte) in &[
            (1.0f32, -128i8),
            (-1.0, -128),
            (1.0, 127),
            (-1.0, -127),
            (-1.0, 127),
        ] {
            let x = vec![a_sign; rows * k];
            let codes = vec![w_byte; n * k];
            let scales = vec![1.0f32; n];
            check_i8(rows, k, n, &x, &codes, &scales);
        }
    }
}

#[test]
fn q4_random_matches_the_oracle_on_every_path() {
    let mut rng = Rng(2);
    for k in [32, 64, 96, 256, 288, 544] {
        for rows in ROWS {
            for n in NS {
                let x = activations(&mut rng, rows, k);
                let (codes, scales) = q4_weight(&mut rng, n, k);
                check_q4(rows, k, n, &x, &codes, &scales);
            }
        }
    }
}

#[test]
fn q4_many_rows_across_several_panels_match_the_oracle() {
    // The packed kernels (4+ rows) over several panels of 8 and of 16 weight rows (the wide VNNI
    // kernel, emulated here), whole and short, from block offsets.
    let mut rng = Rng(9);
    for k in [32, 96, 288] {
        for rows in [4, 5, 8, 9, 16, 17, 22] {
            for n in [16, 17, 37, 48] {
                let x = activations(&mut rng, rows, k);
                let (codes, scales) = q4_weight(&mut rng, n, k);
                check_q4(rows, k, n, &x, &codes, &scales);
            }
        }
    }
}

#[test]
fn q4_with_no_groups_gives_zeros_on_every_path() {
    // K = 0: no codes at all, any row count (a block must not ask the codes for its rows).
    for rows in [1, 4] {
        check_q4(rows, 0, 9, &[], &[], &[]);
    }
}

#[test]
fn q4_extreme_nibbles_are_exact() {
    // Every code -8 or 7, activations all ±127: the largest group dots, and the largest i16 sums
    // the packed AVX2 kernel accumulates.
    let (k, n) = (2048, 9);
    for rows in [1, 4, 16, FEW_MAX_ROWS + 4] {
        for &(a_sign, (lo, hi)) in &[
            (1.0f32, (-8, -8)),
            (-1.0, (-8, -8)),
            (1.0, (7, 7)),
            (-1.0, (-8, 7)),
            (1.0, (7, -8)),
        ] {
            let byte = quant::q4_byte(lo, hi);
            let x = vec![a_sign; rows * k];
            let codes = vec![byte; n * k / 2];
            let scales: Vec<bf16> = (0..n * k / Q4_GROUP)
                .map(|g| bf16::from_f32(0.01 * (1 + g % 7) as f32))
                .collect();
            check_q4(rows, k, n, &x, &codes, &scales);
        }
    }
}

#[test]
fn every_path_reading_twos_complement_q4_codes_is_caught() {
    // Control for the offset-binary storage (`quant::q4_byte`): the same codes stored as packs up
    // to xdna-vl-pack/3 stored them (two's complement, each byte xor 0x88) give other results on
    // every path (GEMV, few rows, packed panels), so the oracle comparisons above see which
    // encoding each kernel reads.
    let mut rng = Rng(41);
    let (k, n) = (288, 13);
    let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
    let (codes, scales) = quant::quantize_q4(&w, n, k).unwrap();
    let twos_complement: Vec<u8> = codes.iter().map(|b| b ^ 0x88).collect();
    let panels = quant::q4_to_panels(&twos_complement, n, k);
    let fed = LinearData::Q4 {
        codes: &panels,
        scales: &scales,
    };
    for rows in [1, 3, 8] {
        let x = activations(&mut rng, rows, k);
        check_q4(rows, k, n, &x, &codes, &scales);
        let (a, a_s) = quantize_oracle(&x, rows, k);
        let mut expect = vec![0f32; rows * n];
        quant::gemm_q4_ref(&a, &a_s, rows, k, &codes, &scales, n, &mut expect);
        for path in paths() {
            let caught = only_path(path, || {
                first_mismatch(
                    "q4",
                    &fed,
                    k,
                    n,
                    &x,
                    rows,
                    Some(ActivationLayout::Q4Groups),
                    &expect,
                )
            });
            assert!(
                caught.is_some(),
                "{path:?} rows {rows}: two's complement codes went unnoticed"
            );
        }
    }
}

#[test]
fn decoder_sized_blocks_match_the_oracle() {
    // A 2B-shaped K, 128 rows (the packed q4 kernel and the 2x4 i8 tiles), a short last panel.
    let mut rng = Rng(3);
    let (rows, k, n) = (128, 2048, 12);
    let x = activations(&mut rng, rows, k);
    let codes: Vec<i8> = (0..n * k).map(|_| (rng.byte() as i8).max(-127)).collect();
    let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
    check_i8(rows, k, n, &x, &codes, &scales);
    let (codes4, scales4) = q4_weight(&mut rng, n, k);
    check_q4(rows, k, n, &x, &codes4, &scales4);
}

#[test]
fn q4_gemv_at_the_down_projections_k_matches_the_oracle() {
    // K = 6144 (24 blocks of 8 groups, a panel of 24 KB: the GEMV prefetches a whole panel ahead)
    // and K = 6176 (one group past the blocks), few rows, a short last panel, from block offsets.
    let mut rng = Rng(7);
    for (k, n) in [(6144, 17), (6176, 9)] {
        for rows in [1, 2, 3] {
            let x = activations(&mut rng, rows, k);
            let (codes, scales) = q4_weight(&mut rng, n, k);
            check_q4(rows, k, n, &x, &codes, &scales);
        }
    }
}

#[test]
fn the_q4_group_order_matters_so_the_gemv_check_can_fail() {
    // Control for the q4 GEMV tests: adding each block of 8 scaled groups first and then the blocks
    // (an order a lanes-are-groups kernel would find natural) gives other bits than the ascending
    // chain on such rows, so matching the oracle checks the chain's order per output.
    let mut rng = Rng(8);
    let k = 6144;
    let mut differs = 0;
    for _ in 0..16 {
        let x = activations(&mut rng, 1, k);
        let (a, _) = quantize_oracle(&x, 1, k);
        let (codes, scales) = q4_weight(&mut rng, 1, k);
        let scaled: Vec<f32> = (0..k / Q4_GROUP)
            .map(|g| {
                let acc: i32 = (g * Q4_GROUP..(g + 1) * Q4_GROUP)
                    .map(|j| a[j] as i32 * quant::q4_code(&codes, j) as i32)
                    .sum();
                acc as f32 * scales[g].to_f32()
            })
            .collect();
        let chain = scaled.iter().fold(0f32, |s, &v| s + v);
        assert_eq!(
            chain.to_bits(),
            quant::q4_row_scaled_sum(&a, &codes, &scales).to_bits()
        );
        let blocked = scaled
            .chunks(8)
            .map(|b| b.iter().fold(0f32, |s, &v| s + v))
            .fold(0f32, |s, v| s + v);
        differs += usize::from(blocked.to_bits() != chain.to_bits());
    }
    assert!(differs > 4, "{differs}");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_i16_pair_i8_kernel_checks_catch_each_planted_mistake() {
    // Controls for the many-row AVX2 i8 kernel (`x86/i8_pairs.rs`): the oracle comparison passes as
    // built and catches a dropped last code pair, swapped codes within a pair and an unstored last
    // weight row. K = 608 spans three K chunks with no padding (a dropped padding pair would change
    // nothing; padded K tails are in the random tests); 17 weight rows leave a short last panel and
    // a short last tile of panels; FEW_MAX_ROWS + 6 rows (past the few-row kernels) a short last
    // tile of rows. 40 weight rows (5 panels: a tile of 3, then one of 2) and 25 (3, then 1) run the
    // narrower tiles.
    use x86::i8_pairs::test_hooks::{plant, Fault};
    if !Isa::Avx2.is_available() {
        return;
    }
    let mut rng = Rng(31);
    let (rows, k, n) = (FEW_MAX_ROWS + 6, 608, 17);
    let x = activations(&mut rng, rows, k);
    let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
    let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
    assert_eq!(i8_mismatch(rows, k, n, &x, &codes, &scales), None);
    for fault in [
        Fault::LastPairDropped,
        Fault::PairHalvesSwapped,
        Fault::LastRowUnstored,
    ] {
        let _planted = plant(fault);
        assert!(
            i8_mismatch(rows, k, n, &x, &codes, &scales).is_some(),
            "{fault:?} went unnoticed"
        );
    }
    for n in [40, 25] {
        let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
        assert_eq!(i8_mismatch(rows, k, n, &x, &codes, &scales), None, "n {n}");
        let _planted = plant(Fault::ShortTileNarrowed);
        assert!(
            i8_mismatch(rows, k, n, &x, &codes, &scales).is_some(),
            "n {n}: a narrowed short tile went unnoticed"
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_adversarial_i8_inputs_would_saturate_an_unsigned_offset_on_avx2() {
    // Control for the i8 extremes test: `maddubs(w + 128, a)` (the VNNI offset form done with the
    // AVX2 instruction) saturates on those inputs, so they do reach the i16 limit the sign trick avoids.
    if !Isa::Avx2.is_available() {
        return;
    }
    /// The first i16 of `maddubs(w + 128, a)` on vectors of `w` and `a`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn offset_pairs(w: i8, a: i8) -> i16 {
        use std::arch::x86_64::*;
        let wu = _mm256_xor_si256(_mm256_set1_epi8(w), _mm256_set1_epi8(i8::MIN));
        let p = _mm256_maddubs_epi16(wu, _mm256_set1_epi8(a));
        _mm256_extract_epi16::<0>(p) as i16
    }
    // SAFETY: AVX2 checked above.
    let got = unsafe { offset_pairs(127, 127) };
    assert_eq!(got, i16::MAX, "saturated: 2 * 255 * 127 does not fit");
    assert_ne!(got as i32, 2 * 255 * 127);
}
