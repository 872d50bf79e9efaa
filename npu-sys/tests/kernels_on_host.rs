//! The AIE kernels (designs/kernels/*.cc) compiled for the host against a stand-in for the AIE
//! API (tests/kernel_host/aie_api/aie.hpp) and run on one core tile the way a core runs them:
//! zero, then one call per K tile in ascending order, operands in the blocks the memory tiles
//! deliver (the layouts dma_plan.rs is simulated against). The result must equal packs::quant's
//! oracle bit for bit. This checks the kernels' indexing and summation order; the AIE's own
//! arithmetic is checked only by `npu-designs verify` on a Ryzen AI machine. Needs a host C++
//! compiler (`c++`), like the loader tests need `cc`.

use std::path::{Path, PathBuf};
use std::process::Command;

use half::bf16;
use npu_sys::design_params::{design_params, DesignParams};
use npu_sys::tiling::NpuTarget;
use npu_sys::{DesignKind, Geometry};
use packs::quant::{dot_i8, q4_row_scaled_sum, quantize_q4};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn compile(params: &DesignParams, dir: &Path) -> PathBuf {
    let root = Path::new(MANIFEST_DIR);
    let lib = dir.join(format!("{}.so", params.name));
    let mut command = Command::new("c++");
    command
        .args(["-std=c++20", "-O1", "-shared", "-fPIC", "-w"])
        .arg("-I")
        .arg(root.join("tests/kernel_host"))
        .arg("-I")
        .arg(root.join("designs/kernels"));
    for (define, value) in &params.kernel.defines {
        command.arg(format!("-D{define}={value}"));
    }
    let out = command
        .arg(root.join("designs").join(&params.kernel.source))
        .arg("-o")
        .arg(&lib)
        .output()
        .expect("a host C++ compiler (c++)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

fn blocked<T: Copy>(
    rows: usize,
    cols: usize,
    br: usize,
    bc: usize,
    at: impl Fn(usize, usize) -> T,
) -> Vec<T> {
    let mut out = Vec::with_capacity(rows * cols);
    for bi in 0..rows / br {
        for bj in 0..cols / bc {
            for i in 0..br {
                for j in 0..bc {
                    out.push(at(bi * br + i, bj * bc + j));
                }
            }
        }
    }
    out
}

fn unblocked<T: Copy + Default>(c: &[T], rows: usize, cols: usize, br: usize, bc: usize) -> Vec<T> {
    let mut out = vec![T::default(); rows * cols];
    let order = blocked(rows, cols, br, bc, |i, j| i * cols + j);
    for (value, at) in c.iter().zip(order) {
        out[at] = *value;
    }
    out
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn i8(&mut self) -> i8 {
        // -127..=127 (the subtraction in i32: in i8 it overflowed, which debug builds refuse).
        ((self.next() % 255) as i32 - 127) as i8
    }
    fn f32(&mut self) -> f32 {
        (self.next() % 2001) as f32 / 1000.0 - 1.0
    }
}

/// One core tile of `params` over its whole K: (A [m][K], the operands per K tile, in order).
struct CoreCase {
    m: usize,
    k: usize,
    n: usize,
    a: Vec<i8>,
    b_i8: Vec<i8>,
    codes: Vec<u8>,
    scales: Vec<bf16>,
}

impl CoreCase {
    fn new(params: &DesignParams, seed: u64) -> CoreCase {
        let (m, k, n) = (params.m, params.k, params.n_tile);
        let mut rng = Lcg(seed);
        let a: Vec<i8> = (0..m * k).map(|_| rng.i8()).collect();
        let b_i8: Vec<i8> = (0..n * k).map(|_| rng.i8()).collect();
        // Weights spread over magnitudes, so that group products differ in exponent.
        let w: Vec<f32> = (0..n * k)
            .map(|i| rng.f32() * [1.0, 1e-3, 37.0, 0.02][(i / 32) % 4])
            .collect();
        let (codes, scales) = quantize_q4(&w, n, k).unwrap();
        CoreCase {
            m,
            k,
            n,
            a,
            b_i8,
            codes,
            scales,
        }
    }
}

type ZeroFn = unsafe extern "C" fn(*mut u8);
type MatmulI8 = unsafe extern "C" fn(*const i8, *const i8, *mut i32);
type MatmulQ4 = unsafe extern "C" fn(*const i8, *const u8, *const u8, *mut f32);

/// Runs the kernel over the K tiles in `order`; returns C row-major [m][n] as raw bits.
fn run_core(params: &DesignParams, lib: &Path, case: &CoreCase, order: &[usize]) -> Vec<u32> {
    let [r, s, t] = params.mmul;
    let (m, k, n, kt) = (case.m, case.k, case.n, params.k_tile);
    // SAFETY: the library was just compiled from our kernel sources; it has no initialisers.
    let library = unsafe { libloading::Library::new(lib) }.unwrap();
    let mut c = vec![0u32; m * n];
    // SAFETY: the symbols' C signatures are those declared in designs/kernels/gemm_*.cc, and every
    // buffer passed below has the length the kernel reads or writes for this DIM_* tile.
    unsafe {
        let zero: libloading::Symbol<ZeroFn> = library.get(params.kernel.zero.as_bytes()).unwrap();
        zero(c.as_mut_ptr().cast());
        for &tile in order {
            let a = blocked(m, kt, r, s, |i, x| case.a[i * k + tile * kt + x]);
            match params.kind {
                DesignKind::I8 => {
                    let b = blocked(n, kt, t, s, |i, x| case.b_i8[i * k + tile * kt + x]);
                    let f: libloading::Symbol<MatmulI8> =
                        library.get(params.kernel.matmul.as_bytes()).unwrap();
                    f(a.as_ptr(), b.as_ptr(), c.as_mut_ptr().cast());
                }
                DesignKind::Q4 => {
                    let codes = blocked(n, kt / 2, t, s / 2, |i, x| {
                        case.codes[i * k / 2 + tile * kt / 2 + x]
                    });
                    let groups = kt / 32;
                    let scales: Vec<u8> = (0..n)
                        .flat_map(|i| {
                            (0..groups).flat_map(move |g| {
                                case.scales[i * k / 32 + tile * groups + g]
                                    .to_bits()
                                    .to_le_bytes()
                            })
                        })
                        .collect();
                    let f: libloading::Symbol<MatmulQ4> =
                        library.get(params.kernel.matmul.as_bytes()).unwrap();
                    f(
                        a.as_ptr(),
                        codes.as_ptr(),
                        scales.as_ptr(),
                        c.as_mut_ptr().cast(),
                    );
                }
            }
        }
    }
    unblocked(&c, m, n, r, t)
}

/// packs::quant's result for the core tile, as raw bits.
fn oracle(kind: DesignKind, case: &CoreCase) -> Vec<u32> {
    let (m, k, n) = (case.m, case.k, case.n);
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        let a_row = &case.a[i * k..(i + 1) * k];
        for j in 0..n {
            out.push(match kind {
                DesignKind::I8 => dot_i8(a_row, &case.b_i8[j * k..(j + 1) * k]) as u32,
                DesignKind::Q4 => q4_row_scaled_sum(
                    a_row,
                    &case.codes[j * k / 2..(j + 1) * k / 2],
                    &case.scales[j * k / 32..(j + 1) * k / 32],
                )
                .to_bits(),
            });
        }
    }
    out
}

fn check(kind: DesignKind, m_tile: usize, k: usize, n: usize, target: NpuTarget) {
    let params = design_params(Geometry::new(kind, m_tile, k, n), target).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lib = compile(&params, dir.path());
    let case = CoreCase::new(&params, 7 + m_tile as u64);
    let ascending: Vec<usize> = (0..params.k_tiles).collect();
    let got = run_core(&params, &lib, &case, &ascending);
    let want = oracle(kind, &case);
    let differing = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    assert_eq!(
        differing,
        0,
        "{}: {differing} of {} differ",
        params.name,
        want.len()
    );
    if kind == DesignKind::Q4 {
        // Control: the same tiles in descending K order sum the groups in another order, which
        // changes some results' last bits: the comparison above sees the order.
        let descending: Vec<usize> = (0..params.k_tiles).rev().collect();
        let reordered = run_core(&params, &lib, &case, &descending);
        assert!(
            reordered.iter().zip(&want).any(|(g, w)| g != w),
            "{}: the group order left no trace",
            params.name
        );
    } else {
        // Control: one K tile skipped changes the exact sums.
        let skipped = run_core(&params, &lib, &case, &ascending[1..]);
        assert!(skipped.iter().zip(&want).any(|(g, w)| g != w));
    }
}

#[test]
fn q4_kernel_sums_groups_in_the_specified_order() {
    // Core tiles 4x256x128 (npu1 decode), 8x256x128 (npu2 decode), 32x256x64 (npu1 prefill).
    check(DesignKind::Q4, 16, 2048, 2048, NpuTarget::Npu1);
    check(DesignKind::Q4, 16, 2048, 6144, NpuTarget::Npu2);
    check(DesignKind::Q4, 128, 1024, 2048, NpuTarget::Npu1);
}

#[test]
fn i8_kernel_is_exact() {
    // Core tiles 4x256x64 (npu1 decode) and 32x192x64 (npu2 prefill, K 6144).
    check(DesignKind::I8, 16, 2048, 2048, NpuTarget::Npu1);
    check(DesignKind::I8, 128, 6144, 2048, NpuTarget::Npu2);
}
