//! Every kernel path this machine can run (plus the VNNI bodies with `vpdpbusd` emulated) against
//! the `packs::quant` oracles and `scalar::dot_f32`, byte for byte, on random and adversarial inputs.
//! This file holds the shared harness; the tests are in the submodules, by job.

use super::*;
use half::bf16;
use packs::quant::{self, Q4_GROUP};

use super::self_check::{check_path, Rng};

mod blocks;
mod few;
mod float;
mod integer;
mod preparation;
mod selection;

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
    if let Some(only) = ONLY_PATH.with(|o| o.borrow().clone()) {
        p.retain(|path| format!("{path:?}") == only);
    }
    p
}

thread_local! {
    /// The one path [`paths`] offers on this thread, by its `Debug` form ([`only_path`]).
    static ONLY_PATH: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// `f` with [`paths`] offering `path` alone on this thread (to see which path a check catches).
fn only_path<R>(path: Path, f: impl FnOnce() -> R) -> R {
    ONLY_PATH.with(|o| *o.borrow_mut() = Some(format!("{path:?}")));
    let r = f();
    ONLY_PATH.with(|o| *o.borrow_mut() = None);
    r
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
