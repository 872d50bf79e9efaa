//! bf16 products: the AVX-512 BF16 kernel bit-equal to the oracle on every tail, the oracle's
//! order worked by hand, and controls showing each check can fail.

use super::*;
use crate::kernels::row_blocks::test_hooks;
use crate::kernels::self_check::Rng;

fn inputs(rng: &mut Rng, rows: usize, n: usize, k: usize) -> (Vec<f32>, Vec<bf16>) {
    let x = (0..rows * k).map(|_| rng.unit() * 3.0).collect();
    let w = (0..n * k).map(|_| bf16::from_f32(rng.unit())).collect();
    (x, w)
}

/// `out[r][j]` by the oracle, straight from the f32 rows.
fn oracle(x: &[f32], w: &[bf16], rows: usize, n: usize, k: usize) -> Vec<Vec<f32>> {
    (0..rows)
        .map(|r| {
            let a: Vec<bf16> = x[r * k..(r + 1) * k]
                .iter()
                .map(|&v| bf16_dot::to_bf16(v))
                .collect();
            (0..n)
                .map(|j| dot_bf16_products(&a, &w[j * k..(j + 1) * k]))
                .collect()
        })
        .collect()
}

fn run(
    kernels: Kernels,
    x: &[f32],
    w: &[bf16],
    rows: usize,
    n: usize,
    k: usize,
    n0: usize,
) -> Vec<Vec<f32>> {
    let mut prepared = Bf16Rows::default();
    prepared.prepare(kernels, x, rows, k);
    let mut out = vec![vec![f32::NAN; n - n0]; rows];
    let mut spans: Vec<&mut [f32]> = out.iter_mut().map(|o| &mut o[..]).collect();
    kernels.bf16_products_block(w, k, n0, &prepared, &mut spans);
    out
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|f| f.to_bits()).collect())
        .collect()
}

/// The kernels to check: the AVX-512 BF16 path where the CPU runs it, and always the portable one.
fn paths() -> Vec<Kernels> {
    let mut paths = vec![Kernels { isa: Isa::Scalar }];
    let best = Kernels::best();
    if best.runs_bf16_products() {
        paths.push(best);
    } else {
        eprintln!("no AVX-512 BF16 kernel here: only the portable bf16 products are checked");
    }
    paths
}

#[test]
fn the_tree_sums_halves_not_ascending() {
    // 1 in lane 0, 2^-24 in lanes 1..16: ascending loses every 2^-24 (each is half an ulp of 1, a
    // tie to even); the tree adds the small lanes together first (s8[1..8] = 2^-23, ...).
    let mut l = [2f32.powi(-24); 16];
    l[0] = 1.0;
    let ascending = l.iter().fold(0f32, |s, &v| s + v);
    assert_eq!(ascending, 1.0);
    // s8 = [1 + 2^-24 -> 1, 2^-23 x7]; s4 = [1 + 2^-23, 2^-22 x3]; s2 = [1 + 2^-23 + 2^-22, 2^-21];
    // sum = 1 + 2^-23 + 2^-22 + 2^-21 (all representable: 7 x 2^-23 above 1).
    assert_eq!(sum_lanes(l), 1.0 + 7.0 * 2f32.powi(-23));
}

#[test]
fn the_oracle_pairs_elements_in_lanes_by_blocks() {
    // K = 34: lane 0 takes pairs (0, 1) and (32, 33); the rest of block 1 is padding.
    let k = 34;
    let mut a = vec![bf16::ZERO; k];
    let mut w = vec![bf16::ZERO; k];
    for j in [0, 1, 32, 33, 5] {
        a[j] = bf16::from_f32(1.5);
        w[j] = bf16::from_f32(2.0);
    }
    // lane 0: 3 + 3 + 3 + 3 = 12; lane 2 (pair 4, 5): 3. Tree: 12 + 3 = 15.
    assert_eq!(dot_bf16_products(&a, &w), 15.0);
    // An odd K reads the missing element of its last pair as zero.
    assert_eq!(dot_bf16_products(&a[..33], &w[..33]), 12.0);
}

#[test]
fn the_kernel_equals_the_oracle_on_every_tail() {
    let mut rng = Rng(0xbf16_0001);
    for path in paths() {
        for k in [1, 2, 31, 32, 33, 64, 95, 1031, 1536] {
            for rows in [1, 2, 3, 4, 5, 7, 9, 17] {
                for n in [1, 3, 4, 5, 9] {
                    let (x, w) = inputs(&mut rng, rows, n, k);
                    let want = oracle(&x, &w, rows, n, k);
                    for n0 in [0, n / 2] {
                        let got = run(path, &x, &w, rows, n, k, n0);
                        let want: Vec<Vec<f32>> = want.iter().map(|r| r[n0..].to_vec()).collect();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{} rows {rows} k {k} n {n} from {n0}",
                            path.isa()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn row_blocks_change_no_bit() {
    // Blocks of 4 and 8 rows over 19 rows (tiles and remainders in several blocks); the control
    // plants a skipped last block, which leaves NaNs the comparison must see.
    let mut rng = Rng(0xbf16_0002);
    let (rows, n, k) = (19, 9, 200);
    let (x, w) = inputs(&mut rng, rows, n, k);
    let want = bits(&oracle(&x, &w, rows, n, k));
    for path in paths() {
        for block in [4, 8] {
            let _guard = test_hooks::set(block, None);
            assert_eq!(
                bits(&run(path, &x, &w, rows, n, k, 0)),
                want,
                "{}",
                path.isa()
            );
        }
        let _guard = test_hooks::set(4, Some(test_hooks::Fault::SkipLast));
        assert_ne!(bits(&run(path, &x, &w, rows, n, k, 0)), want, "control");
    }
}

#[test]
fn denormals_and_huge_values_follow_the_instructions() {
    // Denormal activations and weights are zeros; products overflow to infinity as f32 would.
    let mut rng = Rng(0xbf16_0003);
    let (rows, n, k) = (5, 6, 70);
    let (mut x, mut w) = inputs(&mut rng, rows, n, k);
    for (i, v) in x.iter_mut().enumerate() {
        match i % 17 {
            3 => *v = f32::from_bits(0x0000_1234),
            9 => *v = -2.5e38,
            _ => {}
        }
    }
    for (i, v) in w.iter_mut().enumerate() {
        if i % 13 == 4 {
            *v = bf16::from_bits(0x8003);
        }
    }
    let want = bits(&oracle(&x, &w, rows, n, k));
    for path in paths() {
        assert_eq!(
            bits(&run(path, &x, &w, rows, n, k, 0)),
            want,
            "{}",
            path.isa()
        );
    }
}

#[test]
fn the_order_and_the_rounding_are_real_constraints() {
    // Controls: on these inputs a single lane walking all pairs, the lanes summed ascending, or
    // activations truncated to bf16 all give other bits than the oracle; so the kernel's bit
    // equality checks the stated order and rounding, not merely a bf16 dot.
    let mut rng = Rng(0xbf16_0004);
    let k = 1536;
    let (x, w) = inputs(&mut rng, 1, 1, k);
    let a: Vec<bf16> = x.iter().map(|&v| bf16_dot::to_bf16(v)).collect();
    let want = dot_bf16_products(&a, &w);
    let one_lane = bf16_dot::dot(0.0, &a, &w);
    let mut lanes = [0f32; BF16_LANES];
    for (b, (ab, wb)) in a.chunks(BF16_BLOCK).zip(w.chunks(BF16_BLOCK)).enumerate() {
        let _ = b;
        for i in 0..BF16_LANES {
            lanes[i] = dot_pair(
                lanes[i],
                [ab[2 * i], ab[2 * i + 1]],
                [wb[2 * i], wb[2 * i + 1]],
            );
        }
    }
    let ascending = lanes.iter().fold(0f32, |s, &v| s + v);
    let truncated: Vec<bf16> = x
        .iter()
        .map(|&v| bf16::from_bits((v.to_bits() >> 16) as u16))
        .collect();
    let trunc = dot_bf16_products(&truncated, &w);
    for (name, other) in [
        ("one lane", one_lane),
        ("ascending lanes", ascending),
        ("truncation", trunc),
    ] {
        assert_ne!(
            other.to_bits(),
            want.to_bits(),
            "{name} gives the oracle's bits"
        );
    }
    // And the tree of the lanes above is the oracle.
    assert_eq!(sum_lanes(lanes).to_bits(), want.to_bits());
}

#[test]
fn prepared_rows_are_rounded_and_padded() {
    let mut rng = Rng(0xbf16_0005);
    for path in paths() {
        for k in [1, 31, 32, 47, 100] {
            let rows = 5;
            let mut x: Vec<f32> = (0..rows * k).map(|_| rng.unit() * 1e3).collect();
            x[0] = f32::from_bits(0x0040_0000); // a denormal: zero
            let mut p = Bf16Rows::default();
            // Stale bits from a larger input must not survive in the padding.
            p.prepare(path, &vec![7.0; rows * 64], rows, 64);
            p.prepare(path, &x, rows, k);
            assert_eq!(p.stride(), k.div_ceil(32) * 32);
            for r in 0..rows {
                let row = p.row(r);
                for j in 0..p.stride() {
                    let want = if j < k {
                        bf16_dot::to_bf16(x[r * k + j])
                    } else {
                        bf16::ZERO
                    };
                    assert_eq!(
                        row[j].to_bits(),
                        want.to_bits(),
                        "{} k {k} [{r}][{j}]",
                        path.isa()
                    );
                }
            }
        }
    }
}

#[test]
fn the_self_check_passes_where_the_kernel_runs() {
    if !bf16_dot::has_avx512_bf16() {
        eprintln!("no AVX-512 BF16 here: the self-check does not run");
        return;
    }
    assert_eq!(self_check(), Ok(()));
    if Kernels::best().isa() == Isa::Avx512Vnni {
        assert!(
            Kernels::best().runs_bf16_products(),
            "the kernel is not used"
        );
    }
}

/// The peak of `vdpbf16ps` on `zmm` (12 independent accumulators, operands in registers) per thread
/// count, for PERF.md: `cargo test --release -p compute --lib vdpbf16ps_peak -- --ignored
/// --nocapture`.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "timing"]
fn vdpbf16ps_peak() {
    use std::arch::x86_64::*;
    if !bf16_dot::has_avx512_bf16() {
        eprintln!("no AVX-512 BF16 here");
        return;
    }
    const ACCS: usize = 12;
    /// # Safety
    /// The CPU must support AVX-512 F and BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn spin(iters: usize) -> f32 {
        // SAFETY: register-only intrinsics; the caller guarantees the features.
        unsafe {
            let a = _mm512_set1_epi32(std::hint::black_box(0x3f80_3f80));
            let b = _mm512_set1_epi32(std::hint::black_box(0x3c00_3c00));
            let mut acc = [_mm512_setzero_ps(); ACCS];
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = bf16_dot::x86::dpbf16_zmm(*v, a, b);
                }
            }
            let mut s = _mm512_setzero_ps();
            for v in acc {
                s = _mm512_add_ps(s, v);
            }
            _mm512_reduce_add_ps(s)
        }
    }
    let iters = 20_000_000;
    for threads in [1, 2] {
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                // SAFETY: AVX-512 F and BF16 were detected above.
                s.spawn(|| std::hint::black_box(unsafe { spin(iters) }));
            }
        });
        let macs = (threads * iters * ACCS * 32) as f64;
        println!(
            "vdpbf16ps zmm, {threads} thread(s): {:.1} GMAC/s",
            macs / t.elapsed().as_secs_f64() / 1e9
        );
    }
}

/// The portable bf16 products against the widening kernels (f32 products) on one thread, for the
/// choice made on CPUs without AVX-512 BF16: `cargo test --release -p compute --lib
/// portable_bf16_products_timing -- --ignored --nocapture`.
#[test]
#[ignore = "timing"]
fn portable_bf16_products_timing() {
    use packs::LinearData;
    let (rows, n, k) = (64, 256, 1024);
    let mut rng = Rng(0xbf16_0006);
    let (x, w) = inputs(&mut rng, rows, n, k);
    let time = |f: &mut dyn FnMut()| {
        (0..3)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let scalar = Kernels { isa: Isa::Scalar };
    let portable = time(&mut || {
        run(scalar, &x, &w, rows, n, k, 0);
    });
    let widening = Kernels::best();
    let mut out = vec![vec![0f32; n]; rows];
    let widened = time(&mut || {
        let mut spans: Vec<&mut [f32]> = out.iter_mut().map(|o| &mut o[..]).collect();
        let acts = crate::kernels::Activations::default();
        widening.gemm_block(&LinearData::Bf16(&w), k, 0, &x, &acts, &mut spans);
    });
    let macs = (rows * n * k) as f64;
    println!(
        "{rows} x {n} x {k}: portable bf16 products {:.2} GMAC/s, f32 products on {} {:.2} GMAC/s \
         ({:.0}x)",
        macs / portable / 1e9,
        widening.isa(),
        macs / widened / 1e9,
        portable / widened
    );
}

/// The AVX-512 BF16 products kernel alone on one thread (the tower's shapes: 256 weight rows, K
/// 1024 and 4096, 196 activation rows), as GMAC/s and a share of the `vdpbf16ps` peak timed in the
/// same run: `cargo test --release -p compute --lib bf16_products_timing -- --ignored --nocapture`.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "timing"]
fn bf16_products_timing() {
    if !bf16_dot::has_avx512_bf16() {
        eprintln!("no AVX-512 BF16 here");
        return;
    }
    let kernels = Kernels::best();
    let mut rng = Rng(0xbf16_0007);
    for (rows, n, k) in [(196, 256, 1024), (196, 256, 4096), (784, 256, 1024)] {
        let (x, w) = inputs(&mut rng, rows, n, k);
        let mut prepared = Bf16Rows::default();
        prepared.prepare(kernels, &x, rows, k);
        let mut out = vec![vec![0f32; n]; rows];
        let best = (0..20)
            .map(|_| {
                let mut spans: Vec<&mut [f32]> = out.iter_mut().map(|o| &mut o[..]).collect();
                let t = std::time::Instant::now();
                kernels.bf16_products_block(&w, k, 0, &prepared, &mut spans);
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        let gmac = (rows * n * k) as f64 / best / 1e9;
        println!(
            "rows {rows} n {n} k {k}: {:.1} us, {gmac:.1} GMAC/s",
            best * 1e6
        );
    }
}
