//! The few-row kernels (2..=[`FEW_MAX_ROWS`] activation rows: several decode streams in one
//! forward, or a verified draft window) on every path: against the oracles, each row bit-equal to
//! the same row computed alone (what lets a conversation's greedy ids beside others equal its ids
//! alone), and the control that a planted wrong activation row stride is caught.

use super::*;

#[cfg(target_arch = "x86_64")]
use x86::few_test_hooks::with_row_step;

/// Row counts around the few-row range: the GEMV (1), every few-row count, the prefill kernels (17).
fn few_rows() -> impl Iterator<Item = usize> {
    1..=FEW_MAX_ROWS + 1
}

#[test]
fn q4_few_rows_match_the_oracle_on_every_path() {
    // K: one group, three (an odd count), one block of 8 groups (the scales' transpose), a block
    // and a tail group, 2 and 3 blocks and a tail, a 2B model's K; N: a single row, short, one
    // whole 16-row pack panel, one and a row, several panels (one short).
    let mut rng = Rng(41);
    for k in [32, 96, 256, 288, 544, 800, 2048] {
        for rows in few_rows() {
            for n in [1, 13, 16, 17, 37, 48] {
                let x = activations(&mut rng, rows, k);
                let (codes, scales) = q4_weight(&mut rng, n, k);
                check_q4(rows, k, n, &x, &codes, &scales);
            }
        }
    }
}

#[test]
fn i8_few_rows_match_the_oracle_on_every_path() {
    // K below, at and past the 32- and 64-code steps, with odd tails; N short and several tiles.
    let mut rng = Rng(42);
    for k in [1, 31, 33, 64, 100, 257, 2048 + 17] {
        for rows in few_rows() {
            for n in [1, 3, 5, 13] {
                let x = activations(&mut rng, rows, k);
                let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
                let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
                check_i8(rows, k, n, &x, &codes, &scales);
            }
        }
    }
}

/// The first path and row whose bits beside `rows - 1` other rows differ from the same row's
/// computed alone (one row: the GEMV), for weight rows `n0..n`.
fn beside_vs_alone(
    w: &LinearData<'_>,
    k: usize,
    n: usize,
    x: &[f32],
    rows: usize,
    layout: ActivationLayout,
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
            acts.prepare(kern, layout, x, rows, k);
            let mut beside = vec![vec![f32::NAN; nb]; rows];
            run(path, w, k, n0, x, &acts, &mut beside);
            for (r, got) in beside.iter().enumerate() {
                let xr = &x[r * k..(r + 1) * k];
                let mut one = Activations::default();
                one.prepare(kern, layout, xr, 1, k);
                let mut alone = vec![vec![f32::NAN; nb]];
                run(path, w, k, n0, xr, &one, &mut alone);
                if bits(got) != bits(&alone[0]) {
                    return Some(format!(
                        "{path:?} rows {rows} k {k} n {n} n0 {n0} row {r}: beside {got:?} != alone {:?}",
                        alone[0]
                    ));
                }
            }
        }
    }
    None
}

#[test]
fn each_row_beside_others_equals_it_alone() {
    let mut rng = Rng(43);
    let n = 37;
    for rows in [2, 3, 4, 5, 8, 9, 16] {
        let k = 800;
        let x = activations(&mut rng, rows, k);
        let (codes, scales) = q4_weight(&mut rng, n, k);
        let panels = quant::q4_to_panels(&codes, n, k);
        let w = LinearData::Q4 {
            codes: &panels,
            scales: &scales,
        };
        if let Some(m) = beside_vs_alone(&w, k, n, &x, rows, ActivationLayout::Q4Groups) {
            panic!("q4: {m}");
        }
        let k = 2048 + 17;
        let x = activations(&mut rng, rows, k);
        let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
        let w = LinearData::I8 {
            codes: &codes,
            scales: &scales,
        };
        if let Some(m) = beside_vs_alone(&w, k, n, &x, rows, ActivationLayout::Natural) {
            panic!("i8: {m}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_planted_row_stride_is_caught_on_every_simd_path_and_only_in_the_few_row_range() {
    // The few-row kernels reading activation row 2r (mod rows) for row r: every SIMD path's check
    // fails for every row count that takes them (i8 from 2, q4 from 1 but only 2 rows can read a
    // wrong one, to FEW_MAX_ROWS; q4 on VNNI to
    // Q4_FEW_CHUNKED_MAX_ROWS, as row chunks); fewer rows (the GEMVs) and more (the prefill
    // kernels) still pass, which shows where the host dispatches to them. The portable path has no
    // few-row kernel and passes throughout.
    use x86::{I8_FEW_MIN_ROWS, Q4_FEW_CHUNKED_MAX_ROWS};
    let mut rng = Rng(44);
    // 29 weight rows: one whole 16-row pack panel read straight from the pack, then 13 rows through
    // the packed copy.
    let (kq, ki, n) = (288, 2048 + 17, 29);
    for rows in few_rows().chain([Q4_FEW_CHUNKED_MAX_ROWS, Q4_FEW_CHUNKED_MAX_ROWS + 1]) {
        let x = activations(&mut rng, rows, ki);
        let (codes4, scales4) = q4_weight(&mut rng, n, kq);
        let codes: Vec<i8> = (0..n * ki).map(|_| rng.byte() as i8).collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
        // The q4 rows: each row's first `kq` values.
        let xq: Vec<f32> = (0..rows)
            .flat_map(|r| x[r * ki..r * ki + kq].iter().copied())
            .collect();
        for path in paths() {
            let simd = !matches!(path, Path::Real(k) if k.isa() == Isa::Scalar);
            let vnni = matches!(path, Path::EmulatedVnni)
                || matches!(path, Path::Real(k) if k.isa() == Isa::Avx512Vnni);
            let q4_max = if vnni {
                Q4_FEW_CHUNKED_MAX_ROWS
            } else {
                FEW_MAX_ROWS
            };
            // One row takes the same kernel, but has no other row to read.
            let q4_range = (2..=q4_max).contains(&rows);
            let i8_range = (I8_FEW_MIN_ROWS..=FEW_MAX_ROWS).contains(&rows);
            let (q4, i8) = with_row_step(2, || {
                only_path(path, || {
                    (
                        q4_mismatch(rows, kq, n, &xq, &codes4, &scales4),
                        i8_mismatch(rows, ki, n, &x, &codes, &scales),
                    )
                })
            });
            assert_eq!(
                (q4.is_some(), i8.is_some()),
                (simd && q4_range, simd && i8_range),
                "{path:?} rows {rows}: q4 {q4:?} i8 {i8:?}"
            );
        }
        // Without the fault every path passes (the control's own control).
        assert_eq!(q4_mismatch(rows, kq, n, &xq, &codes4, &scales4), None);
        assert_eq!(i8_mismatch(rows, ki, n, &x, &codes, &scales), None);
    }
}

/// Timing, not a check (`cargo test -p compute --release few_row_timing -- --ignored --nocapture`):
/// one thread, the least time of many runs per 256 weight rows (a host task's chunk, L2-resident
/// like the decoder's repeated tasks are not, so this times the arithmetic), per path, kind, K and
/// row count; beside it the time of the rows one at a time (the GEMV per row).
#[test]
#[ignore]
fn few_row_timing() {
    use std::time::Instant;
    let mut rng = Rng(45);
    let n = 256;
    for k in [2048, 6144] {
        let x = activations(&mut rng, 32, k);
        let (codes4, scales4) = q4_weight(&mut rng, n, k);
        let panels = quant::q4_to_panels(&codes4, n, k);
        let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
        let kinds = [
            (
                "q4",
                LinearData::Q4 {
                    codes: &panels,
                    scales: &scales4,
                },
                ActivationLayout::Q4Groups,
            ),
            (
                "i8",
                LinearData::I8 {
                    codes: &codes,
                    scales: &scales,
                },
                ActivationLayout::Natural,
            ),
        ];
        // `FEW_TIMING=q4` (or i8) times one kind (for a profiler).
        let only = std::env::var("FEW_TIMING").ok();
        for (kind, w, layout) in &kinds {
            if only.as_deref().is_some_and(|o| o != *kind) {
                continue;
            }
            for path in paths() {
                let Path::Real(kern) = path else { continue };
                if kern.isa() == Isa::Scalar {
                    continue;
                }
                let mut line = format!("{kind} k {k} {:>10}:", kern.isa().name());
                for rows in [1, 2, 3, 4, 6, 8, 12, 16, 20, 32] {
                    let mut acts = Activations::default();
                    acts.prepare(kern, *layout, &x[..rows * k], rows, k);
                    let mut out = vec![vec![0f32; n]; rows];
                    let best = |f: &mut dyn FnMut()| {
                        let mut best = f64::MAX;
                        for _ in 0..200 {
                            let t = Instant::now();
                            f();
                            best = best.min(t.elapsed().as_secs_f64() * 1e6);
                        }
                        best
                    };
                    let together = best(&mut || run(path, w, k, 0, &x, &acts, &mut out));
                    line += &format!("  {rows}r {together:6.1}");
                }
                println!("{line}  (µs per 256 weight rows)");
            }
        }
    }
}
