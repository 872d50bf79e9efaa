//! Every path gives [`oracle::attend_row`]'s bits for every row of a causal block, for f32 and
//! bf16 caches; the oracle is softmax attention; controls: a skipped key tile and a mask one key
//! off are caught.

use super::*;
use crate::attention::PackedKv;

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|f| f.to_bits()).collect()
}

fn values(n: usize, seed: u32, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            amp * ((s >> 8) as f32 / (1 << 23) as f32 - 1.0)
        })
        .collect()
}

/// One KV head's first `len` slots packed for the oracle (K tiles transposed, V rows padded).
fn packed(k: &[f32], v: &[f32], d: usize, len: usize) -> (Vec<f32>, Vec<f32>) {
    let dp = padded_dim(d);
    let mut kt = vec![0f32; len.div_ceil(KEY_TILE) * d * KEY_TILE];
    let mut vp = vec![0f32; len * dp];
    for j in 0..len {
        for c in 0..d {
            kt[(j / KEY_TILE) * d * KEY_TILE + c * KEY_TILE + j % KEY_TILE] = k[j * d + c];
            vp[j * dp + c] = v[j * d + c];
        }
    }
    (kt, vp)
}

/// Every row of the block, through the oracle over its own keys (`k`, `v` already widened).
fn oracle_rows(d: usize, heads: usize, first: usize, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let shape = HeadShape::new(d);
    let span = heads * d;
    let positions = q.len() / span;
    let mut out = vec![f32::NAN; q.len()];
    for i in 0..positions {
        let len = first + i;
        let (kt, vp) = packed(k, v, d, len);
        let kv = PackedKv {
            kt: &kt,
            v: &vp,
            len,
        };
        for h in 0..heads {
            let at = i * span + h * d;
            oracle::attend_row(shape, &q[at..at + d], kv, &mut out[at..at + d]);
        }
    }
    out
}

/// Row-major keys (`d` values a slot) as tiles of `KEY_TILE` slots, each transposed: slot j's
/// value c at `(j / KEY_TILE)·d·KEY_TILE + c·KEY_TILE + (j + shift) % KEY_TILE` (`shift` 1: a
/// planted layout one slot off), the rest `fill`.
fn to_tiles<T: Copy>(k: &[T], d: usize, shift: usize, fill: T) -> Vec<T> {
    let slots = k.len() / d;
    let mut tiles = vec![fill; slots.div_ceil(KEY_TILE) * KEY_TILE * d];
    for j in 0..slots {
        for c in 0..d {
            let col = (j % KEY_TILE + shift) % KEY_TILE;
            tiles[(j / KEY_TILE) * d * KEY_TILE + c * KEY_TILE + col] = k[j * d + c];
        }
    }
    tiles
}

#[allow(clippy::too_many_arguments)]
fn run<T: CacheValue>(
    path: AttnPath,
    d: usize,
    heads: usize,
    first: usize,
    q: &[f32],
    keys: Keys<'_, T>,
    v: &[T],
    planted: Planted,
    scratch: &mut CausalScratch,
) -> Vec<f32> {
    let span = heads * d;
    let mut out = vec![f32::NAN; q.len()];
    let block = CausalBlock {
        q,
        q_stride: span,
        out: &mut out,
        out_stride: span,
        positions: q.len() / span,
        heads,
        first_len: first,
    };
    attend_causal_on(path, HeadShape::new(d), keys, v, block, scratch, planted);
    out
}

const BLOCKS: [(usize, usize); 10] = [
    (1, 1),
    (1, 9),
    (5, 7),
    (64, 1),
    (65, 1),
    (63, 3),
    (100, 70),
    (1, 150),
    (130, 1),
    (129, 64),
];

fn check_paths<T: CacheValue>(narrow: fn(f32) -> T, label: &str) {
    let mut scratch = CausalScratch::default();
    let mut simd_ran = false;
    for (d, heads) in [(128, 2), (64, 1), (20, 3), (72, 2)] {
        let cap = 200;
        // Slots past the last a block reads are NaN: a read past the mask shows.
        let kf = values(cap * d, d as u32, 3.0);
        let vf = values(cap * d, 7 + d as u32, 1.0);
        let (kc, vc): (Vec<T>, Vec<T>) = (
            kf.iter().map(|&x| narrow(x)).collect(),
            vf.iter().map(|&x| narrow(x)).collect(),
        );
        let kw: Vec<f32> = kc.iter().map(|x| x.widen()).collect();
        let vw: Vec<f32> = vc.iter().map(|x| x.widen()).collect();
        for (first, positions) in BLOCKS {
            let keys = first + positions - 1;
            let mut k = kc.clone();
            let mut v = vc.clone();
            k.truncate((keys + 3) * d);
            v.truncate((keys + 3) * d);
            for x in k[keys * d..].iter_mut().chain(v[keys * d..].iter_mut()) {
                *x = narrow(f32::NAN);
            }
            let q = values(positions * heads * d, (first * 31 + positions) as u32, 2.0);
            let want = oracle_rows(d, heads, first, &q, &kw, &vw);
            assert!(want.iter().all(|x| x.is_finite()), "{label} d {d}");
            for path in AttnPath::ALL {
                if !path.is_available() {
                    eprintln!("this CPU lacks {path}: its causal test is skipped");
                    continue;
                }
                simd_ran |= path != AttnPath::Scalar;
                let got = run(
                    path,
                    d,
                    heads,
                    first,
                    &q,
                    Keys::RowMajor(&k),
                    &v,
                    Planted::default(),
                    &mut scratch,
                );
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{label} {path}, d {d}, {heads} heads: first {first}, {positions} positions"
                );
                // The same keys stored as the cache stores them (tiles, transposed; the slots
                // past the last tile's keys NaN): the same bits, read in place when d is a
                // multiple of COLUMN_PAD (128, 64), packed per tile otherwise (20, 72).
                // Controls: tiles built one slot off (slot j's values in column j + 1), and
                // the values read one slot late, do not give them.
                for (shift, v_late, same) in [(0, 0, true), (1, 0, false), (0, 1, false)] {
                    let tiles = to_tiles(&k[..keys * d], d, shift, narrow(f32::NAN));
                    // The late values are finite: only their order differs.
                    let vs = if v_late == 0 { &v[..] } else { &vc[d..] };
                    let got = run(
                        path,
                        d,
                        heads,
                        first,
                        &q,
                        Keys::Tiles(&tiles),
                        vs,
                        Planted::default(),
                        &mut scratch,
                    );
                    assert_eq!(
                        bits(&got) == bits(&want),
                        same,
                        "{label} {path}, d {d}: tiled keys shifted by {shift}, values {v_late} late"
                    );
                }
                if keys > KEY_TILE {
                    // Control: a skipped key tile.
                    let planted = Planted {
                        skip_tile: Some(1),
                        ..Planted::default()
                    };
                    let rows = Keys::RowMajor(&k);
                    let skipped = run(path, d, heads, first, &q, rows, &v, planted, &mut scratch);
                    assert_ne!(bits(&skipped), bits(&want), "{label} {path}: skipped tile");
                }
                // Control: the mask one key late (each position reading its successor too).
                if k.len() >= (keys + 1) * d {
                    let mut k1 = kc[..(keys + 1) * d].to_vec();
                    let v1 = vc[..(keys + 1) * d].to_vec();
                    k1.truncate((keys + 1) * d);
                    let late = run(
                        path,
                        d,
                        heads,
                        first + 1,
                        &q,
                        Keys::RowMajor(&k1),
                        &v1,
                        Planted::default(),
                        &mut scratch,
                    );
                    assert_ne!(
                        bits(&late),
                        bits(&want),
                        "{label} {path}: mask one key late"
                    );
                }
            }
        }
    }
    if !simd_ran {
        eprintln!("no SIMD attention path on this CPU: the oracle stands alone");
    }
}

#[test]
fn every_path_gives_the_oracle_bits_for_an_f32_cache() {
    check_paths::<f32>(|x| x, "f32");
}

#[test]
fn every_path_gives_the_oracle_bits_for_a_bf16_cache() {
    check_paths::<bf16>(bf16::from_f32, "bf16");
}

/// The oracle is softmax attention (f64 reference within 1e-5), causal and grouped: head h of
/// position i reads slots 0 ..= first − 1 + i only.
#[test]
fn the_oracle_is_causal_softmax_attention() {
    let (d, heads, first, positions) = (16, 2, 3, 70);
    let keys = first + positions - 1;
    let k = values(keys * d, 1, 2.0);
    let v = values(keys * d, 2, 1.0);
    let q = values(positions * heads * d, 3, 1.0);
    let got = oracle_rows(d, heads, first, &q, &k, &v);
    let scale = (d as f64).powf(-0.5);
    let mut worst = 0f64;
    for i in 0..positions {
        for h in 0..heads {
            let qh = &q[(i * heads + h) * d..][..d];
            let len = first + i;
            let s: Vec<f64> = (0..len)
                .map(|j| {
                    (0..d)
                        .map(|c| qh[c] as f64 * k[j * d + c] as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for c in 0..d {
                let want: f64 = (0..len).map(|j| e[j] * v[j * d + c] as f64).sum::<f64>() / sum;
                worst = worst.max((got[(i * heads + h) * d + c] as f64 - want).abs());
            }
        }
    }
    assert!(worst < 1e-5, "oracle vs the formula: {worst}");
}
