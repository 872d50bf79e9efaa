use super::segments::{attend_planned, attend_segments, Plan, SegmentScratch};
use super::*;

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Reproducible values in `[-amp, amp]`.
fn values(n: usize, seed: usize, amp: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i.wrapping_mul(7919) ^ seed.wrapping_mul(104_729)) % 2003) as f32 / 1001.5 - 1.0)
        .map(|x| x * amp)
        .collect()
}

fn segments_of(lens: &[usize]) -> Vec<(usize, usize)> {
    lens.iter()
        .scan(0, |at, &len| {
            *at += len;
            Some((*at - len, len))
        })
        .collect()
}

/// Softmax attention written out plainly, per row and head, in f64.
fn naive(qkv: &[f32], heads: usize, d: usize, segments: &[(usize, usize)]) -> Vec<f64> {
    let hidden = heads * d;
    let rows = qkv.len() / (3 * hidden);
    let mut out = vec![0f64; rows * hidden];
    for &(start, len) in segments {
        for r in start..start + len {
            for h in 0..heads {
                let q = &qkv[r * 3 * hidden + h * d..][..d];
                let s: Vec<f64> = (start..start + len)
                    .map(|j| {
                        let k = &qkv[j * 3 * hidden + hidden + h * d..][..d];
                        q.iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (jj, x) in s.iter().enumerate() {
                    let v = &qkv[(start + jj) * 3 * hidden + 2 * hidden + h * d..][..d];
                    for c in 0..d {
                        out[r * hidden + h * d + c] += (x - m).exp() / z * v[c] as f64;
                    }
                }
            }
        }
    }
    out
}

fn worst(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

/// Two segments of 2 rows, one head of d = 2: each row's output is a mix of its own segment's v
/// only; the joint segment (the control) mixes in the other's.
#[test]
fn rows_attend_only_within_their_segment() {
    // q = k = 0 -> uniform weights; v of segment 0 = 1, 3; segment 1 = 10, 30.
    let mut data = vec![0.0f32; 4 * 6];
    for (r, v) in [1.0f32, 3.0, 10.0, 30.0].into_iter().enumerate() {
        data[r * 6 + 4] = v;
        data[r * 6 + 5] = -v;
    }
    let mut out = vec![0.0; 8];
    let mut scratch = SegmentScratch::default();
    let pool = pool();
    pool.install(|| {
        attend_segments(
            &data,
            1,
            2,
            &[(0, 2), (2, 2)],
            Operands::F32,
            &mut scratch,
            &mut out,
        )
    });
    assert_eq!(out, vec![2.0, -2.0, 2.0, -2.0, 20.0, -20.0, 20.0, -20.0]);
    pool.install(|| {
        attend_segments(
            &data,
            1,
            2,
            &[(0, 4)],
            Operands::F32,
            &mut scratch,
            &mut out,
        )
    });
    assert_eq!(out[0], 11.0);
}

/// The oracle is the plain formula within f32 rounding (segments across tiles and short of
/// one, d = 20 with a padded column tail); control: a segment one row short (its last key
/// missed) moves its rows past the bound.
#[test]
fn the_oracle_is_softmax_attention() {
    let (heads, d) = (2, 20);
    let lens = [37, 5, 130];
    let rows: usize = lens.iter().sum();
    let segments = segments_of(&lens);
    let qkv = values(rows * 3 * heads * d, 1, 1.5);
    let want = naive(&qkv, heads, d, &segments);
    let mut scratch = SegmentScratch::default();
    let mut out = vec![0f32; rows * heads * d];
    let plan = Plan {
        path: AttnPath::Scalar,
        block_rows: BLOCK_ROWS_TEST,
        planted: Planted::default(),
    };
    pool().install(|| {
        attend_planned(
            &qkv,
            heads,
            d,
            &segments,
            Operands::F32,
            &mut scratch,
            &mut out,
            plan,
        )
    });
    let w = worst(&out, &want);
    assert!(w < 1e-5, "max |diff| {w}");
    let short = segments_of(&[36, 6, 130]);
    pool().install(|| {
        attend_planned(
            &qkv,
            heads,
            d,
            &short,
            Operands::F32,
            &mut scratch,
            &mut out,
            plan,
        )
    });
    let moved = worst(&out[..36 * heads * d], &want);
    assert!(moved > 1e-3, "a missing key moved nothing ({moved})");
}

const BLOCK_ROWS_TEST: usize = 7;

/// Every path this CPU runs, every block size: each row's bits are the oracle's, for segments
/// of 1, 5, 16, 63, 64, 65 and 150 rows (short last tiles, a segment shorter than a register
/// tile, blocks not a multiple of the register tile) and head dims 64, 72 (a padded column
/// vector) and 20. A path the CPU lacks is reported and skipped (the oracle stands alone).
/// Control: the SIMD path skipping one key tile is caught.
#[test]
fn every_path_gives_the_oracle_bits() {
    let pool = pool();
    let lens = [1, 5, 16, 63, 64, 65, 150];
    let rows: usize = lens.iter().sum();
    let segments = segments_of(&lens);
    let mut scratch = SegmentScratch::default();
    let mut simd_ran = false;
    for (heads, d) in [(2, 64), (1, 72), (3, 20)] {
        let hidden = heads * d;
        let qkv = values(rows * 3 * hidden, d, 2.0);
        let run = |plan: Plan, scratch: &mut SegmentScratch| {
            let mut out = vec![f32::NAN; rows * hidden];
            pool.install(|| {
                attend_planned(
                    &qkv,
                    heads,
                    d,
                    &segments,
                    Operands::F32,
                    scratch,
                    &mut out,
                    plan,
                )
            });
            out
        };
        let oracle = run(
            Plan {
                path: AttnPath::Scalar,
                block_rows: 64,
                planted: Planted::default(),
            },
            &mut scratch,
        );
        let w = worst(&oracle, &naive(&qkv, heads, d, &segments));
        assert!(w < 1e-5, "d {d}: oracle vs the formula {w}");
        for path in [AttnPath::Avx2, AttnPath::Avx512] {
            if !path.is_available() {
                eprintln!("this CPU lacks {path}: its test is skipped");
                continue;
            }
            simd_ran = true;
            for block_rows in [1, 3, 4, 9, 64, 200] {
                let plan = Plan {
                    path,
                    block_rows,
                    planted: Planted::default(),
                };
                // A fresh scratch: the oracle's packed tiles left in the shared one would hide a
                // value the SIMD packing does not write.
                let got = run(plan, &mut SegmentScratch::default());
                for r in 0..rows {
                    assert_eq!(
                        bits(&got[r * hidden..][..hidden]),
                        bits(&oracle[r * hidden..][..hidden]),
                        "{path}, d {d}, block {block_rows}: row {r} differs from the oracle"
                    );
                }
            }
            // Control: a skipped key tile (the second of the 65- and 150-row segments).
            let skipped = run(
                Plan {
                    path,
                    block_rows: 64,
                    planted: Planted {
                        skip_tile: Some(1),
                        ..Planted::default()
                    },
                },
                &mut scratch,
            );
            assert_ne!(
                bits(&skipped),
                bits(&oracle),
                "{path}: a skipped tile went unseen"
            );
        }
    }
    if !simd_ran {
        eprintln!("no SIMD attention path on this CPU: the oracle stands alone");
    }
}

/// The dispatched path (what the tower calls) gives the oracle's bits; scores far apart (one
/// key dominating a later tile: the running max moves and α rescales a large sum).
#[test]
fn the_dispatched_path_rescales_as_the_oracle() {
    let (heads, d) = (1, 64);
    let rows = 200;
    let mut qkv = values(rows * 3 * d, 5, 1.0);
    // Row 150's key points along every query: its score dominates from tile 2 on.
    for c in 0..d {
        qkv[150 * 3 * d + d + c] = 8.0 * qkv[c].signum();
    }
    let segments = [(0, rows)];
    let mut scratch = SegmentScratch::default();
    let mut got = vec![0f32; rows * d];
    let pool = pool();
    pool.install(|| {
        attend_segments(
            &qkv,
            heads,
            d,
            &segments,
            Operands::F32,
            &mut scratch,
            &mut got,
        )
    });
    let mut want = vec![0f32; rows * d];
    let plan = Plan {
        path: AttnPath::Scalar,
        block_rows: 64,
        planted: Planted::default(),
    };
    pool.install(|| {
        attend_planned(
            &qkv,
            heads,
            d,
            &segments,
            Operands::F32,
            &mut scratch,
            &mut want,
            plan,
        )
    });
    assert_eq!(
        bits(&got),
        bits(&want),
        "{} vs the oracle",
        AttnPath::best()
    );
    let w = worst(&got, &naive(&qkv, heads, d, &segments));
    assert!(w < 1e-5, "max |diff| {w}");
}

/// The bf16 variant: its oracle is the plain formula within bf16 rounding, and the AVX-512 BF16
/// path gives the oracle's bits for every block size, segments of 1..150 rows (odd tiles: a key
/// paired with a zero one) and d 64, 72, 20, 40, 96, 144 (`p · V` in passes of 4 column vectors
/// and tails of 1); skipped with a message on a CPU without it.
/// Controls: the f32 variant's bits differ (so the comparison sees the operands), and a key
/// rounded the other way (a planted wrong value) is caught.
#[test]
fn the_bf16_path_gives_its_oracle_bits() {
    let pool = pool();
    let lens = [1, 5, 16, 63, 64, 65, 150];
    let rows: usize = lens.iter().sum();
    let segments = segments_of(&lens);
    let mut scratch = SegmentScratch::default();
    let simd = Operands::Bf16.has_simd();
    if !simd {
        eprintln!("this CPU lacks AVX-512 BF16: the bf16 oracle stands alone");
    }
    for (heads, d) in [(2, 64), (1, 72), (3, 20), (1, 40), (1, 96), (1, 144)] {
        let hidden = heads * d;
        let mut qkv = values(rows * 3 * hidden, d + 1, 2.0);
        let run = |plan: Plan, ops: Operands, qkv: &[f32], scratch: &mut SegmentScratch| {
            let mut out = vec![f32::NAN; rows * hidden];
            pool.install(|| attend_planned(qkv, heads, d, &segments, ops, scratch, &mut out, plan));
            out
        };
        let scalar = Plan {
            path: AttnPath::Scalar,
            block_rows: 64,
            planted: Planted::default(),
        };
        let oracle = run(scalar, Operands::Bf16, &qkv, &mut scratch);
        let w = worst(&oracle, &naive(&qkv, heads, d, &segments));
        assert!(
            w < 0.05 && w > 1e-4,
            "d {d}: bf16 oracle vs the formula {w}"
        );
        let f32_bits = run(scalar, Operands::F32, &qkv, &mut scratch);
        assert_ne!(
            bits(&f32_bits),
            bits(&oracle),
            "d {d}: the f32 variant's bits"
        );
        if simd {
            for block_rows in [1, 3, 4, 9, 64, 200] {
                let plan = Plan {
                    path: AttnPath::Avx512,
                    block_rows,
                    planted: Planted::default(),
                };
                // A fresh scratch: the oracle's packed tiles would hide a value the SIMD packing
                // does not write.
                let got = run(plan, Operands::Bf16, &qkv, &mut SegmentScratch::default());
                for r in 0..rows {
                    assert_eq!(
                        bits(&got[r * hidden..][..hidden]),
                        bits(&oracle[r * hidden..][..hidden]),
                        "bf16, d {d}, block {block_rows}: row {r} differs from the oracle"
                    );
                }
            }
        }
        // Control: one key element moved by 16 bf16 steps (about 6%) changes the bits of its
        // segment (one step can vanish in every row's rounded p: it did at d 96).
        let at = 100 * 3 * hidden + hidden + 3;
        qkv[at] = half::bf16::from_bits(half::bf16::from_f32(qkv[at]).to_bits() + 16).to_f32();
        let path = if simd {
            AttnPath::Avx512
        } else {
            AttnPath::Scalar
        };
        let planted = run(Plan { path, ..scalar }, Operands::Bf16, &qkv, &mut scratch);
        assert_ne!(
            bits(&planted),
            bits(&oracle),
            "d {d}: a changed key went unseen"
        );
    }
}

/// The tower's shape: one image of 784 patches (12 whole key tiles and one of 16 keys; 12 query
/// blocks of 64 rows and one of 16), beside segments whose last tiles hold 26, 36 and 56 keys (2,
/// 3 and 4 vectors of 16, 4 and 7 of 8), 2 heads of 64: every SIMD path gives the oracle's bits
/// for f32 and bf16 operands. Control: the partial last tiles read one key short (an off-by-one
/// mask) are caught on every path.
#[test]
fn partial_tiles_and_blocks_give_the_oracle_bits() {
    let pool = pool();
    let lens = [784, 90, 100, 120];
    let rows: usize = lens.iter().sum();
    let segments = segments_of(&lens);
    let (heads, d) = (2, 64);
    let hidden = heads * d;
    let qkv = values(rows * 3 * hidden, 11, 2.0);
    let run = |plan: Plan, operands: Operands| {
        let mut out = vec![f32::NAN; rows * hidden];
        let mut scratch = SegmentScratch::default();
        pool.install(|| {
            attend_planned(
                &qkv,
                heads,
                d,
                &segments,
                operands,
                &mut scratch,
                &mut out,
                plan,
            )
        });
        out
    };
    let plan = |path| Plan {
        path,
        block_rows: 64,
        planted: Planted::default(),
    };
    for (operands, paths) in [
        (Operands::F32, &[AttnPath::Avx512, AttnPath::Avx2][..]),
        (Operands::Bf16, &[AttnPath::Avx512][..]),
    ] {
        let oracle = run(plan(AttnPath::Scalar), operands);
        for &path in paths {
            if !path.is_available() || !operands.has_simd() {
                eprintln!("this CPU lacks {path} for {operands:?} operands: skipped");
                continue;
            }
            let got = run(plan(path), operands);
            for r in 0..rows {
                assert_eq!(
                    bits(&got[r * hidden..][..hidden]),
                    bits(&oracle[r * hidden..][..hidden]),
                    "{operands:?}, {path}: row {r} differs from the oracle"
                );
            }
            let short = Plan {
                planted: Planted {
                    short_last_tile: true,
                    ..Planted::default()
                },
                ..plan(path)
            };
            let got = run(short, operands);
            let mut start = 0;
            for &len in &lens {
                let seg = start * hidden..(start + len) * hidden;
                assert_ne!(
                    bits(&got[seg.clone()]),
                    bits(&oracle[seg]),
                    "{operands:?}, {path}: a segment of {len} missing its last key went unseen"
                );
                start += len;
            }
        }
    }
}

/// `|got − 2^t| / 2^t`.
fn rel_to_pow2(got: f32, t: f64) -> f64 {
    (got as f64 - t.exp2()).abs() / t.exp2()
}

/// The worst [`rel_to_pow2`] of `pow2` over the exponents a softmax meets: −126 ..= 0.5 on a
/// dense grid (1/1024 apart, a little wider as |t| grows).
fn worst_on_the_grid(pow2: impl Fn(f32) -> f32) -> f64 {
    let mut worst = 0f64;
    let mut t = -126.0f32;
    while t <= 0.5 {
        worst = worst.max(rel_to_pow2(pow2(t), t as f64));
        t += 1.0 / 1024.0 + t.abs() * 1e-6;
    }
    worst
}

/// `oracle::pow2` is `2^t` within 2e-7 relative (about 1.7 ulp) over the exponents a softmax
/// meets (−126 ..= 0.5, a dense grid and every tenth), and a normal power of 2 below −126 (`2^−126`
/// times `2^f`'s polynomial at 0). Control: an exponent 2^−20 off (an error of 6.6e-7) is out of
/// the bound.
#[test]
fn pow2_is_two_to_the_power() {
    let mut worst = worst_on_the_grid(oracle::pow2);
    for i in 0..=1265 {
        let t = -126.0 + 0.1 * i as f32;
        worst = worst.max(rel_to_pow2(oracle::pow2(t), t as f64));
    }
    assert!(worst < 2e-7, "pow2: worst relative error {worst:e}");
    assert_eq!(oracle::pow2(-300.0), oracle::pow2(-126.0));
    assert!(oracle::pow2(f32::NAN).is_nan());
    let off = rel_to_pow2(oracle::pow2(-3.25 + 1.0 / (1 << 20) as f32), -3.25);
    assert!(off > 2e-7, "a shifted exponent went unseen ({off:e})");
}

/// The bf16 variant's shorter polynomial: `pow2_by(&P2_BF16, t)` is `2^t` within 1.02e-4 relative
/// over the exponents a softmax meets (−126 ..= 0.5), a twentieth of a bf16 p's rounding. Control:
/// the polynomial at `t + 2^−12` is out of the bound.
#[test]
fn the_bf16_pow2_is_two_to_the_power() {
    use super::bf16::P2_BF16;
    let worst = worst_on_the_grid(|t| oracle::pow2_by(&P2_BF16, t));
    assert!(worst < 1.02e-4, "bf16 pow2: worst relative error {worst:e}");
    let off = rel_to_pow2(oracle::pow2_by(&P2_BF16, -3.25 + 1.0 / 4096.0), -3.25);
    assert!(off > 1.02e-4, "a shifted exponent went unseen ({off:e})");
}
