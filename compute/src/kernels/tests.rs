//! Every kernel path this machine can run (plus the VNNI bodies with `vpdpbusd` emulated) against
//! the `packs::quant` oracles and `scalar::dot_f32`, byte for byte, on random and adversarial inputs.

use super::*;
use half::bf16;
use packs::quant::{self, Q4_GROUP};

use super::self_check::{check_path, Rng};

/// A way to run `gemm_block`: a real path, or the VNNI bodies with `vpdpbusd` emulated.
#[derive(Clone, Copy, Debug)]
enum Path {
    Real(Kernels),
    #[cfg(target_arch = "x86_64")]
    EmulatedVnni,
}

fn paths() -> Vec<Path> {
    let mut p: Vec<Path> = Isa::available()
        .into_iter()
        .map(|i| Path::Real(Kernels::new(i).expect("every path passes its self-check")))
        .collect();
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        p.push(Path::EmulatedVnni);
    }
    p
}

fn run(
    path: Path,
    w: &LinearData<'_>,
    k: usize,
    n0: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [Vec<f32>],
) {
    let mut spans: Vec<&mut [f32]> = out.iter_mut().map(|o| o.as_mut_slice()).collect();
    match path {
        Path::Real(kern) => kern.gemm_block(w, k, n0, x, acts, &mut spans),
        #[cfg(target_arch = "x86_64")]
        Path::EmulatedVnni => {
            let nb = spans[0].len();
            let block = WeightBlock::new(w, k, n0, nb);
            // SAFETY: `paths` offers this only when the CPU has AVX2 + FMA; shapes match by construction.
            unsafe { x86::gemm_block_emulated_vnni(&block, k, x, acts, &mut spans) }
        }
    }
}

/// Activation rows: random, with every row's largest magnitude at a random sign (codes reach ±127).
fn activations(rng: &mut Rng, rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k).map(|_| rng.unit() * 3.0).collect()
}

/// A random q4 weight of `n` rows of `k`: codes (every nibble) and bf16 group scales.
fn q4_weight(rng: &mut Rng, n: usize, k: usize) -> (Vec<u8>, Vec<bf16>) {
    let codes = (0..n * k / 2).map(|_| rng.byte()).collect();
    let scales = (0..n * k / Q4_GROUP)
        .map(|_| bf16::from_f32(rng.unit() * 0.05))
        .collect();
    (codes, scales)
}

fn quantize_oracle(x: &[f32], rows: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut codes = vec![0i8; rows * k];
    let mut scales = vec![0f32; rows];
    for r in 0..rows {
        scales[r] =
            quant::quantize_activation_row(&x[r * k..(r + 1) * k], &mut codes[r * k..(r + 1) * k]);
    }
    (codes, scales)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Compares every path's block `n0..n0+nb` with `expect` (`rows x n`, the oracle's layout).
#[allow(clippy::too_many_arguments)]
fn check_all_paths(
    what: &str,
    w: &LinearData<'_>,
    k: usize,
    n: usize,
    x: &[f32],
    rows: usize,
    layout: Option<ActivationLayout>,
    expect: &[f32],
) {
    if let Some(m) = first_mismatch(what, w, k, n, x, rows, layout, expect) {
        panic!("{m}");
    }
}

/// [`check_all_paths`]' comparison: the first path, block offset and row whose bits differ.
#[allow(clippy::too_many_arguments)]
fn first_mismatch(
    what: &str,
    w: &LinearData<'_>,
    k: usize,
    n: usize,
    x: &[f32],
    rows: usize,
    layout: Option<ActivationLayout>,
    expect: &[f32],
) -> Option<String> {
    for n0 in [0, n / 3] {
        let nb = n - n0;
        for path in paths() {
            let kern = match path {
                Path::Real(kern) => kern,
                #[cfg(target_arch = "x86_64")]
                Path::EmulatedVnni => Kernels::best(),
            };
            let mut acts = Activations::default();
            if let Some(l) = layout {
                acts.prepare(kern, l, x, rows, k);
            }
            let mut out = vec![vec![f32::NAN; nb]; rows];
            run(path, w, k, n0, x, &acts, &mut out);
            for r in 0..rows {
                let want = &expect[r * n + n0..(r + 1) * n];
                if bits(&out[r]) != bits(want) {
                    return Some(format!(
                        "{what}: {path:?} rows {rows} k {k} n {n} n0 {n0} row {r}: {:?} != {want:?}",
                        &out[r]
                    ));
                }
            }
        }
    }
    None
}

fn check_i8(rows: usize, k: usize, n: usize, x: &[f32], codes: &[i8], w_scales: &[f32]) {
    if let Some(m) = i8_mismatch(rows, k, n, x, codes, w_scales) {
        panic!("{m}");
    }
}

fn i8_mismatch(
    rows: usize,
    k: usize,
    n: usize,
    x: &[f32],
    codes: &[i8],
    w_scales: &[f32],
) -> Option<String> {
    let (a, a_s) = quantize_oracle(x, rows, k);
    let mut expect = vec![0f32; rows * n];
    quant::gemm_i8_ref(&a, &a_s, rows, k, codes, w_scales, n, &mut expect);
    let w = LinearData::I8 {
        codes,
        scales: w_scales,
    };
    first_mismatch(
        "i8",
        &w,
        k,
        n,
        x,
        rows,
        Some(ActivationLayout::Natural),
        &expect,
    )
}

fn check_q4(rows: usize, k: usize, n: usize, x: &[f32], codes: &[u8], w_scales: &[bf16]) {
    if let Some(m) = q4_mismatch(rows, k, n, x, codes, w_scales) {
        panic!("{m}");
    }
}

fn q4_mismatch(
    rows: usize,
    k: usize,
    n: usize,
    x: &[f32],
    codes: &[u8],
    w_scales: &[bf16],
) -> Option<String> {
    let (a, a_s) = quantize_oracle(x, rows, k);
    let mut expect = vec![0f32; rows * n];
    quant::gemm_q4_ref(&a, &a_s, rows, k, codes, w_scales, n, &mut expect);
    // The kernels read the pack layout; the oracle, row-major codes.
    let panels = quant::q4_to_panels(codes, n, k);
    let w = LinearData::Q4 {
        codes: &panels,
        scales: w_scales,
    };
    first_mismatch(
        "q4",
        &w,
        k,
        n,
        x,
        rows,
        Some(ActivationLayout::Q4Groups),
        &expect,
    )
}

const ROWS: [usize; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16];
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
    for rows in [1, 3, 16] {
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
        for rows in [4, 5, 8, 9, 16] {
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
    // Every nibble -8 (0x88) or 7 (0x77), activations all ±127: the largest group dots, and the
    // largest i16 sums the packed AVX2 kernel accumulates.
    let (k, n) = (2048, 9);
    for rows in [1, 4, 16] {
        for &(a_sign, byte) in &[
            (1.0f32, 0x88u8),
            (-1.0, 0x88),
            (1.0, 0x77),
            (-1.0, 0x78),
            (1.0, 0x87),
        ] {
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

#[test]
fn f32_and_bf16_match_the_scalar_dot_bit_for_bit() {
    let mut rng = Rng(4);
    for k in [1, 15, 16, 17, 33, 100, 2048] {
        for rows in [1, 2, 3] {
            for n in [1, 4, 7] {
                let x = activations(&mut rng, rows, k);
                let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
                let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
                let wbf: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
                let mut expect = vec![0f32; rows * n];
                let mut expect_b = vec![0f32; rows * n];
                for r in 0..rows {
                    for j in 0..n {
                        let xr = &x[r * k..(r + 1) * k];
                        expect[r * n + j] = scalar::dot_f32(xr, &w[j * k..(j + 1) * k]);
                        expect_b[r * n + j] = scalar::dot_f32(xr, &wbf[j * k..(j + 1) * k]);
                    }
                }
                check_all_paths("f32", &LinearData::F32(&w), k, n, &x, rows, None, &expect);
                check_all_paths(
                    "bf16",
                    &LinearData::Bf16(&wb),
                    k,
                    n,
                    &x,
                    rows,
                    None,
                    &expect_b,
                );
            }
        }
    }
}

#[test]
fn the_f32_order_matters_so_the_bit_check_can_fail() {
    // Control for the f32 test: a plain left-to-right sum of the same products differs in the last
    // bits on these inputs, so matching `dot_f32` bit for bit is a real constraint.
    let mut rng = Rng(5);
    let a: Vec<f32> = (0..2048).map(|_| rng.unit()).collect();
    let b: Vec<f32> = (0..2048).map(|_| rng.unit()).collect();
    let plain = a.iter().zip(&b).fold(0f32, |s, (x, y)| s + x * y);
    assert_ne!(plain.to_bits(), scalar::dot_f32(&a, &b).to_bits());
}

/// f32 weights `w`, or (`as_bf16`) `w` rounded to bf16, against `scalar::dot_f32`.
fn f32_mismatch(
    rows: usize,
    k: usize,
    n: usize,
    x: &[f32],
    w: &[f32],
    as_bf16: bool,
) -> Option<String> {
    let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
    let wf: Vec<f32> = if as_bf16 {
        wb.iter().map(|v| v.to_f32()).collect()
    } else {
        w.to_vec()
    };
    let mut expect = vec![0f32; rows * n];
    for r in 0..rows {
        for j in 0..n {
            expect[r * n + j] = scalar::dot_f32(&x[r * k..(r + 1) * k], &wf[j * k..(j + 1) * k]);
        }
    }
    let (what, data) = if as_bf16 {
        ("bf16", LinearData::Bf16(&wb))
    } else {
        ("f32", LinearData::F32(w))
    };
    first_mismatch(what, &data, k, n, x, rows, None, &expect)
}

/// Every kind on `rows` rows: the first mismatch against its oracle.
fn all_kinds_mismatch(rng: &mut Rng, rows: usize, k: usize, n: usize) -> Option<String> {
    let x = activations(rng, rows, k);
    let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
    let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
    let (codes4, scales4) = q4_weight(rng, n, k / Q4_GROUP * Q4_GROUP);
    let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
    i8_mismatch(rows, k, n, &x, &codes, &scales)
        // q4 weights have whole groups of 32 only.
        .or_else(|| {
            k.is_multiple_of(Q4_GROUP)
                .then(|| q4_mismatch(rows, k, n, &x, &codes4, &scales4))?
        })
        .or_else(|| f32_mismatch(rows, k, n, &x, &w, false))
        .or_else(|| f32_mismatch(rows, k, n, &x, &w, true))
}

#[test]
fn row_blocks_of_every_kernel_match_the_oracle() {
    // Many rows in blocks of 8 (the test height; tiles of 4 and single rows inside), row counts
    // below, at and past a block and not a multiple of it, K with and without tails, panels whole
    // and short.
    let _ = paths(); // self-checks first, with the ordinary blocks
    let mut rng = Rng(10);
    let _blocks = row_blocks::test_hooks::set(8, None);
    for k in [32, 96, 100, 288] {
        for rows in [1, 3, 4, 7, 8, 9, 13, 16, 21, 37] {
            for n in [5, 17, 40] {
                if let Some(m) = all_kinds_mismatch(&mut rng, rows, k, n) {
                    panic!("blocks of 8: {m}");
                }
            }
        }
    }
}

#[test]
fn prefill_sized_row_counts_in_natural_blocks_match_the_oracle() {
    // K = 2048 as in the 2B decoder: blocks of 128 i8 rows, 112 q4 rows, 64 f32 rows; 300 rows
    // span three to five blocks, the last one short.
    let _ = paths();
    let mut rng = Rng(11);
    let (rows, k, n) = (300, 2048, 19);
    if let Some(m) = all_kinds_mismatch(&mut rng, rows, k, n) {
        panic!("{m}");
    }
}

#[test]
fn a_skipped_or_short_row_block_fails_the_oracle_check() {
    // Controls for the two tests above: the same comparison catches a last block never computed
    // and blocks that each stop one row short, in every kind (the outputs start as NaN).
    use row_blocks::test_hooks::{set, Fault};
    let _ = paths();
    let mut rng = Rng(12);
    let (rows, k, n) = (21, 96, 17);
    for fault in [Fault::SkipLast, Fault::ShortByOne] {
        let _blocks = set(8, Some(fault));
        let x = activations(&mut rng, rows, k);
        let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
        let (codes4, scales4) = q4_weight(&mut rng, n, k);
        let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
        assert!(
            i8_mismatch(rows, k, n, &x, &codes, &scales).is_some(),
            "i8 {fault:?}"
        );
        assert!(
            q4_mismatch(rows, k, n, &x, &codes4, &scales4).is_some(),
            "q4 {fault:?}"
        );
        for as_bf16 in [false, true] {
            assert!(
                f32_mismatch(rows, k, n, &x, &w, as_bf16).is_some(),
                "f32 (bf16 {as_bf16}) {fault:?}"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_i16_pair_i8_kernel_checks_catch_each_planted_mistake() {
    // Controls for the many-row AVX2 i8 kernel (`x86/i8_pairs.rs`): the oracle comparison passes as
    // built and catches a dropped last code pair, swapped codes within a pair and an unstored last
    // weight row. K = 608 spans three K chunks with no padding (a dropped padding pair would change
    // nothing; padded K tails are in the random tests); 17 weight rows leave a short last panel and
    // a short last tile of panels; 6 rows a short last tile of rows. 40 weight rows (5 panels: a
    // tile of 3, then one of 2) and 25 (3, then 1) run the narrower tiles.
    use x86::i8_pairs::test_hooks::{plant, Fault};
    if !Isa::Avx2.is_available() {
        return;
    }
    let mut rng = Rng(31);
    let (rows, k, n) = (6, 608, 17);
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

/// Inputs for the quantizer: ties at exactly .5 after the division, values at the clamp, zeros,
/// signed zeros, subnormals, huge and non-finite values, lengths around the vector widths.
fn quantizer_rows() -> Vec<Vec<f32>> {
    let mut rng = Rng(6);
    let mut rows = Vec::new();
    for len in [0, 1, 7, 8, 9, 31, 32, 33, 100, 2048] {
        rows.push((0..len).map(|_| rng.unit() * 10.0).collect::<Vec<f32>>());
    }
    // max = 127 makes the scale exactly 1: x.5 values are exact ties.
    let mut ties: Vec<f32> = (-127..127).map(|i| i as f32 + 0.5).collect();
    ties.push(127.0);
    rows.push(ties);
    // max = 254: scale 2, odd integers are ties after the division.
    rows.push(
        (-127..=127)
            .map(|i| (2 * i + 1) as f32)
            .chain([254.0])
            .collect(),
    );
    rows.push(vec![0.0; 40]);
    rows.push(vec![-0.0; 40]);
    rows.push(
        (0..40)
            .map(|i| if i % 2 == 0 { -0.0 } else { 1e-40 })
            .collect(),
    );
    rows.push((0..40).map(|i| f32::from_bits(1 + i)).collect());
    rows.push(
        (0..40)
            .map(|i| if i == 17 { f32::MAX } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| if i == 3 { f32::NAN } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| if i == 39 { f32::NAN } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| if i == 5 { f32::INFINITY } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| {
                if i == 5 {
                    f32::NEG_INFINITY
                } else {
                    -(i as f32)
                }
            })
            .collect(),
    );
    rows
}

#[test]
fn the_q4_layout_is_the_same_on_every_path() {
    // Every instruction set reorders codes and sums groups as the portable form does: extreme and
    // random codes, K from one group to an unpaired last group past the 2B shapes.
    let mut rng = Rng(10);
    for groups in [1usize, 2, 3, 8, 9, 64, 193] {
        for fill in 0..3 {
            let codes: Vec<i8> = (0..groups * Q4_GROUP)
                .map(|i| match fill {
                    0 => rng.byte() as i8,
                    1 => 127,
                    _ => [-127, -128, 127][i % 3],
                })
                .collect();
            let mut want = codes.clone();
            let mut want_sums = vec![0i32; groups];
            activations::q4_groups_row_scalar(&mut want, &mut want_sums);
            for kern in Isa::available()
                .into_iter()
                .map(|i| Kernels::new(i).unwrap())
            {
                let mut got = codes.clone();
                let mut sums = vec![1i32; groups];
                kern.q4_groups_row(&mut got, &mut sums);
                assert_eq!(got, want, "{kern:?} {groups} groups fill {fill}");
                assert_eq!(sums, want_sums, "{kern:?} {groups} groups fill {fill}");
            }
        }
    }
}

#[test]
fn quantizer_gives_the_oracle_bytes() {
    for kern in Isa::available()
        .into_iter()
        .map(|i| Kernels::new(i).unwrap())
    {
        for (i, x) in quantizer_rows().iter().enumerate() {
            let mut want = vec![0i8; x.len()];
            let mut got = vec![1i8; x.len()];
            let s_want = quant::quantize_activation_row(x, &mut want);
            let s_got = kern.quantize_row(x, &mut got);
            assert_eq!(s_got.to_bits(), s_want.to_bits(), "{kern:?} row {i} scale");
            assert_eq!(got, want, "{kern:?} row {i} codes");
        }
    }
}

#[test]
fn the_tie_rows_hold_real_ties() {
    // Control: round-half-to-even gives other codes on the tie rows, so they test the rounding rule.
    let rows = quantizer_rows();
    let ties = rows
        .iter()
        .find(|r| r.len() == 255 && r[0] == -126.5)
        .expect("tie row");
    let differs = ties
        .iter()
        .filter(|&&v| v.round() != v.round_ties_even())
        .count();
    assert!(differs > 100, "{differs}");
}

#[test]
fn prepared_activations_are_reused_only_for_the_same_bits() {
    let kern = Kernels::best();
    let mut acts = Activations::default();
    let mut x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
    assert!(acts.prepare(kern, ActivationLayout::Natural, &x, 2, 32));
    assert!(!acts.prepare(kern, ActivationLayout::Natural, &x, 2, 32));
    // Another layout, shape, or a single changed bit recomputes.
    assert!(acts.prepare(kern, ActivationLayout::Q4Groups, &x, 2, 32));
    assert!(acts.prepare(kern, ActivationLayout::Q4Groups, &x, 1, 64));
    x[63] = f32::from_bits(x[63].to_bits() ^ 1);
    assert!(acts.prepare(kern, ActivationLayout::Q4Groups, &x, 1, 64));
    // The q4 layout of a pair: evens of group 0, evens of group 1, odds of 0, odds of 1; sums are
    // 8 x each group's sum.
    let mut natural = vec![0i8; 64];
    let s = quant::quantize_activation_row(&x, &mut natural);
    assert_eq!(acts.scale(0), s);
    let c = acts.codes(0);
    assert_eq!((c[0], c[1], c[15]), (natural[0], natural[2], natural[30]));
    assert_eq!((c[16], c[17]), (natural[32], natural[34]));
    assert_eq!(
        (c[32], c[33], c[48], c[63]),
        (natural[1], natural[3], natural[33], natural[63])
    );
    // A last unpaired group keeps its evens, then its odds.
    assert_eq!(q4_halves(2, 3), (64, 80));
    assert_eq!(q4_halves(1, 3), (16, 48));
    let group_sum: i32 = natural[32..].iter().map(|&v| v as i32).sum();
    assert_eq!(acts.sums(0)[1], 8 * group_sum);
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

#[test]
fn every_path_this_cpu_runs_passes_its_self_check() {
    for isa in Isa::available() {
        assert_eq!(isa.self_check(), Some(Ok(())), "{isa}");
    }
    if std::env::var_os(KERNELS_ENV).is_none() {
        assert_eq!(Isa::best(), Isa::available()[0]);
    }
    // The VNNI bodies, with the instruction emulated, pass the same check.
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        let kern = Kernels::new(Isa::Avx2).unwrap();
        check_path(kern, &|w, k, n0, x, acts, out| {
            let block = WeightBlock::new(w, k, n0, out[0].len());
            // SAFETY: AVX2 + FMA checked above; the self-check builds matching shapes.
            unsafe { x86::gemm_block_emulated_vnni(&block, k, x, acts, out) }
        })
        .unwrap();
    }
}

#[test]
fn the_self_check_refuses_one_wrong_bit_and_names_the_case() {
    // Control: the portable path with the last bit of one q4 output flipped (9 rows, the last
    // row's last column) is refused, so the check reads every output of every case.
    let scalar = Kernels::new(Isa::Scalar).unwrap();
    let err = check_path(scalar, &|w, k, n0, x, acts, out| {
        scalar.gemm_block(w, k, n0, x, acts, out);
        if matches!(w, LinearData::Q4 { .. }) && out.len() == 9 && k == 288 {
            let last = out[8].len() - 1;
            out[8][last] = f32::from_bits(out[8][last].to_bits() ^ 1);
        }
    })
    .unwrap_err();
    assert!(
        err.case
            .starts_with("q4 rows 9 k 288 weight rows 0..37: output row 8 column 36"),
        "{err}"
    );
    // And the unmodified portable path passes.
    check_path(scalar, &|w, k, n0, x, acts, out| {
        scalar.gemm_block(w, k, n0, x, acts, out)
    })
    .unwrap();
}

#[test]
fn the_self_check_refuses_a_saturating_i8_offset() {
    // Control: i8 done as `vpmaddubsw` would do the VNNI offset form — pair sums of (w + 128) * a
    // saturated to i16 — is refused at the first i8 case, so a VNNI instruction (or an emulation
    // of one) that saturated would not be used.
    let scalar = Kernels::new(Isa::Scalar).unwrap();
    let err = check_path(scalar, &|w, k, n0, x, acts, out| {
        let LinearData::I8 { codes, scales } = *w else {
            return scalar.gemm_block(w, k, n0, x, acts, out);
        };
        for (r, o) in out.iter_mut().enumerate() {
            let a = acts.codes(r);
            for (j, o) in o.iter_mut().enumerate() {
                let wr = &codes[(n0 + j) * k..(n0 + j + 1) * k];
                let pair = |i: usize| {
                    let p = |t: usize| wr.get(t).map_or(0, |&c| (c as i32 + 128) * a[t] as i32);
                    (p(2 * i) + p(2 * i + 1)).clamp(i16::MIN as i32, i16::MAX as i32)
                };
                let sum_a: i32 = a.iter().map(|&c| c as i32).sum();
                let acc = (0..k.div_ceil(2)).map(pair).sum::<i32>() - 128 * sum_a;
                *o = quant::finish_i8(acc, acts.scale(r), scales[n0 + j]);
            }
        }
    })
    .unwrap_err();
    assert!(err.case.starts_with("i8 rows 1 k 17"), "{err}");
}

#[test]
fn the_kernels_variable_picks_a_usable_path_and_explains_otherwise() {
    let only_avx2 = |i: Isa| i != Isa::Avx512Vnni;
    assert_eq!(super::choose(None, only_avx2, Isa::Avx2), (Isa::Avx2, None));
    assert_eq!(
        super::choose(Some("scalar"), only_avx2, Isa::Avx2),
        (Isa::Scalar, None)
    );
    // Controls: a path the CPU cannot use, and a name that is no path, keep the fastest and say why.
    let (isa, why) = super::choose(Some("avx512vnni"), only_avx2, Isa::Avx2);
    assert_eq!(isa, Isa::Avx2);
    assert!(why.unwrap().contains("cannot use the avx512vnni kernels"));
    let (isa, why) = super::choose(Some("avx-2"), only_avx2, Isa::Avx2);
    assert_eq!(isa, Isa::Avx2);
    assert!(why.unwrap().contains("unknown instruction set \"avx-2\""));
}

/// The bf16 cache's writes give `half::bf16::from_f32`'s bits on every element: ties to even either
/// way, the largest finite values rounding to infinity, infinities, NaNs with payloads, subnormals,
/// lengths around the 8-lane blocks. The control (plain truncation) differs on these inputs.
#[test]
fn f32_to_bf16_gives_halfs_bits() {
    let special: Vec<u32> = vec![
        0x0000_0000,
        0x8000_0000,
        0x3F80_8000,
        0x3F81_8000,
        0x3F80_8001,
        0x3F80_7FFF,
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        0x7F80_0000,
        0xFF80_0000,
        0x7F80_0001,
        0xFFC1_2345,
        0x7FFF_FFFF,
        0x0000_8000,
        0x0001_8000,
        0x807F_FFFF,
    ];
    let mut rng = Rng(17);
    let random: Vec<u32> = (0..1000).map(|_| rng.next() as u32).collect();
    for len in [0, 1, 7, 8, 9, 16, 17, special.len()] {
        let src: Vec<f32> = special
            .iter()
            .cycle()
            .take(len)
            .map(|&b| f32::from_bits(b))
            .collect();
        let mut got = vec![bf16::ZERO; len];
        f32_to_bf16(&mut got, &src);
        let want: Vec<u16> = src.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        let got: Vec<u16> = got.iter().map(|b| b.to_bits()).collect();
        assert_eq!(got, want, "len {len}");
    }
    let src: Vec<f32> = random.iter().map(|&b| f32::from_bits(b)).collect();
    let mut got = vec![bf16::ZERO; src.len()];
    f32_to_bf16(&mut got, &src);
    for (x, g) in src.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            bf16::from_f32(*x).to_bits(),
            "{:#010x}",
            x.to_bits()
        );
    }
    // Control: truncating instead of rounding gives other bits on the ties and near-ties above.
    let truncated: Vec<u16> = special.iter().map(|&b| (b >> 16) as u16).collect();
    let rounded: Vec<u16> = special
        .iter()
        .map(|&b| bf16::from_f32(f32::from_bits(b)).to_bits())
        .collect();
    assert_ne!(truncated, rounded);
}
