//! Full (non-causal) attention of every row over the rows of its own segment (one frame of one
//! image: transformers' `cu_seqlens`), every head, `softmax(q·kᵀ · d^−½) · v` with an f32 softmax
//! (`compute::ops::mathf`'s max and shifted exp sum).
//!
//! K (transposed, in tiles of 16 keys) and V are first laid out per head, and each task takes a
//! block of `ROW_BLOCK` query rows of one head. The block walks its segment's keys a `KEY_TILE` at
//! a time, once for the scores and once for `p · V`: the tile's K and V (16 KB each at d = 64) stay
//! in L1 while every row of the block uses them, so a large frame's K and V (2 MB a head at 8160
//! rows, more than L2) are read from memory once per block, not once per 4 rows. The scores of the
//! block (`[ROW_BLOCK, segment]`) sit in a per-thread buffer between the passes (the softmax needs
//! a whole row), and the outputs carry their sums from one key tile to the next. Scores and
//! `p · V` are register tiles of 4 rows x 16 keys (or value columns), vectorized across the keys,
//! so no dot product ends in a horizontal sum.

use std::sync::Mutex;

use compute::ops::mathf;
use rayon::prelude::*;

/// Query rows one task takes (they share each key tile read).
pub const ROW_BLOCK: usize = 32;

/// Keys one pass over the block takes (a multiple of `TILE_COLS`): at d = 64 their K and V are
/// 16 KB each, inside L1 beside the block's query rows.
pub const KEY_TILE: usize = 64;

/// Buffers sized once per encode: per head K (transposed in key tiles), V and output, and one
/// score block per thread.
#[derive(Default)]
pub struct AttnScratch {
    kh: Vec<f32>,
    vh: Vec<f32>,
    oh: Vec<f32>,
    scores: Vec<Mutex<Vec<f32>>>,
}

impl AttnScratch {
    /// Room for `rows` rows of `hidden`, segments up to `max_seg` rows, `threads` threads.
    pub fn reserve(&mut self, rows: usize, hidden: usize, max_seg: usize, threads: usize) {
        for v in [&mut self.kh, &mut self.vh, &mut self.oh] {
            if v.len() < rows * hidden {
                v.resize(rows * hidden, 0.0);
            }
        }
        if self.scores.len() < threads {
            self.scores.resize_with(threads, || Mutex::new(Vec::new()));
        }
        for s in &mut self.scores {
            let s = s.get_mut().unwrap_or_else(|e| e.into_inner());
            if s.len() < ROW_BLOCK * max_seg {
                s.resize(ROW_BLOCK * max_seg, 0.0);
            }
        }
    }
}

/// Query rows and keys (or value columns) of one register tile: 4 x 16 f32 accumulators.
const TILE_ROWS: usize = 4;
const TILE_COLS: usize = 16;

/// How [`attend`] walks the work: the block sizes and the build of the inner loops (tests run
/// other sizes and the portable build and expect the same bits).
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Query rows a task (at most `ROW_BLOCK`: the score buffers' size).
    row_block: usize,
    /// Keys a pass (a multiple of `TILE_COLS`).
    key_tile: usize,
    /// The AVX2 build of the inner loops (else the portable one).
    avx2: bool,
    /// A planted mistake for the tests' controls: `p · V` skips this key tile.
    #[cfg(test)]
    skip_key_tile: Option<usize>,
}

impl Plan {
    /// The sizes above, and the AVX2 build where the CPU has it.
    fn for_this_cpu() -> Plan {
        Plan {
            row_block: ROW_BLOCK,
            key_tile: KEY_TILE,
            avx2: compute::kernels::Isa::Avx2.is_available(),
            #[cfg(test)]
            skip_key_tile: None,
        }
    }
}

/// `out[r, head·d..]` for every row `r` of the packed `qkv` rows (`[rows, 3·heads·d]`: q, k, v):
/// attention over the rows of the segment (`(first row, rows)`, ascending, covering all rows)
/// holding `r`. Runs on the current pool; `scratch` must be reserved for these sizes.
///
/// Each score is `(Σ_c q_c·k_c) · d^−½` summed over c in order, and each output `Σ_j p_j·v_j` over
/// the segment's keys in order, whatever the tile, block or CPU computes it (the AVX2 build runs
/// the same code with wider vectors, unfused multiply then add): every build gives the same bits.
pub fn attend(
    qkv: &[f32],
    heads: usize,
    d: usize,
    segments: &[(usize, usize)],
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attend_planned(qkv, heads, d, segments, scratch, out, Plan::for_this_cpu());
}

fn attend_planned(
    qkv: &[f32],
    heads: usize,
    d: usize,
    segments: &[(usize, usize)],
    scratch: &mut AttnScratch,
    out: &mut [f32],
    plan: Plan,
) {
    assert!(plan.row_block >= 1 && plan.row_block <= ROW_BLOCK);
    assert!(plan.key_tile >= TILE_COLS && plan.key_tile.is_multiple_of(TILE_COLS));
    let hidden = heads * d;
    let rows = out.len() / hidden;
    let scale = (d as f32).powf(-0.5);
    let AttnScratch { kh, vh, oh, scores } = scratch;
    let (kt, vh, oh) = (
        &mut kh[..rows * hidden],
        &mut vh[..rows * hidden],
        &mut oh[..rows * hidden],
    );
    // Head h: V head-major (`vh[h][r][c]`) and K transposed per tile of 16 keys from its
    // segment's start: the tile's `[d][16]` floats are contiguous (`[d][w]` for a last tile of w
    // keys), at the tile's first key times d, so a segment's keys take `kt[h][start·d..]` as V does.
    kt.par_chunks_mut(rows * d)
        .zip(vh.par_chunks_mut(rows * d))
        .enumerate()
        .for_each(|(h, (kt, vh))| {
            let key = |r: usize| &qkv[r * 3 * hidden + hidden + h * d..][..d];
            for &(start, len) in segments {
                let kseg = &mut kt[start * d..(start + len) * d];
                for (t, tile) in kseg.chunks_mut(TILE_COLS * d).enumerate() {
                    let w = tile.len() / d;
                    for k in 0..w {
                        for (c, &kc) in key(start + t * TILE_COLS + k).iter().enumerate() {
                            tile[c * w + k] = kc;
                        }
                    }
                }
            }
            for r in 0..rows {
                vh[r * d..(r + 1) * d]
                    .copy_from_slice(&qkv[r * 3 * hidden + 2 * hidden + h * d..][..d]);
            }
        });
    let (kt, vh) = (&*kt, &*vh);
    let scores = &*scores;
    oh.par_chunks_mut(rows * d)
        .enumerate()
        .for_each(|(h, ohh)| {
            let head = Head {
                qkv,
                hidden,
                h,
                d,
                scale,
                kt: &kt[h * rows * d..(h + 1) * rows * d],
                vh: &vh[h * rows * d..(h + 1) * rows * d],
                plan,
            };
            ohh.par_chunks_mut(plan.row_block * d)
                .enumerate()
                .for_each(|(b, o)| {
                    let slot = rayon::current_thread_index().unwrap_or(0) % scores.len();
                    let mut s = scores[slot].lock().unwrap_or_else(|e| e.into_inner());
                    let first = b * plan.row_block;
                    let mut r = first;
                    let end = first + o.len() / d;
                    // Runs of the block's rows that share a segment.
                    while r < end {
                        let seg = segments.partition_point(|&(st, len)| st + len <= r);
                        let (start, len) = segments[seg];
                        let run_end = end.min(start + len);
                        let orun = &mut o[(r - first) * d..(run_end - first) * d];
                        let s = &mut s[..(run_end - r) * len];
                        #[cfg(target_arch = "x86_64")]
                        if plan.avx2 {
                            // SAFETY: the plan asks for AVX2 only where the CPU reported AVX2
                            // and FMA (`Plan::for_this_cpu`; the tests take `avx2` from it).
                            unsafe { head.run_avx2(r, run_end, (start, len), s, orun) };
                            r = run_end;
                            continue;
                        }
                        head.run(r, run_end, (start, len), s, orun);
                        r = run_end;
                    }
                });
        });
    // Back to row-major heads: out[r, h·d..] = oh[h, r].
    let oh = &*oh;
    out.par_chunks_mut(hidden).enumerate().for_each(|(r, o)| {
        for h in 0..heads {
            o[h * d..(h + 1) * d].copy_from_slice(&oh[(h * rows + r) * d..(h * rows + r + 1) * d]);
        }
    });
}

/// One head's operands.
struct Head<'a> {
    qkv: &'a [f32],
    hidden: usize,
    h: usize,
    d: usize,
    scale: f32,
    /// Per segment, `[tiles of 16 keys][d][16]` (the last tile `[d][w]`), from `start·d`.
    kt: &'a [f32],
    /// `[rows][d]`.
    vh: &'a [f32],
    plan: Plan,
}

impl Head<'_> {
    /// Query row `r`'s `d` values for this head.
    fn q(&self, r: usize) -> &[f32] {
        &self.qkv[r * 3 * self.hidden + self.h * self.d..][..self.d]
    }

    /// [`Head::run`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA. (`run` indexes with checks only.)
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(
        &self,
        r0: usize,
        r1: usize,
        seg: (usize, usize),
        s: &mut [f32],
        o: &mut [f32],
    ) {
        self.run(r0, r1, seg, s, o)
    }

    /// Rows `r0..r1` (all in the segment `(start, len)`): scores into `s` (`[r1 − r0, len]`), a key
    /// tile at a time, softmax, then `p · V` into `o` (`[r1 − r0, d]`), a key tile at a time.
    #[inline(always)]
    fn run(
        &self,
        r0: usize,
        r1: usize,
        (start, len): (usize, usize),
        s: &mut [f32],
        o: &mut [f32],
    ) {
        let (d, n, step) = (self.d, r1 - r0, self.plan.key_tile);
        let keys = &self.kt[start * d..(start + len) * d];
        for j0 in (0..len).step_by(step) {
            let j1 = (j0 + step).min(len);
            for i in (0..n).step_by(TILE_ROWS) {
                let s = &mut s[i * len..];
                match (n - i).min(TILE_ROWS) {
                    4 => self.scores::<4>(r0 + i, keys, len, j0..j1, s),
                    3 => self.scores::<3>(r0 + i, keys, len, j0..j1, s),
                    2 => self.scores::<2>(r0 + i, keys, len, j0..j1, s),
                    _ => self.scores::<1>(r0 + i, keys, len, j0..j1, s),
                }
            }
        }
        for si in s.chunks_exact_mut(len) {
            let m = mathf::max(si);
            let inv = 1.0 / mathf::exp_shifted_sum(si, m);
            for p in si.iter_mut() {
                *p *= inv;
            }
        }
        let values = &self.vh[start * d..(start + len) * d];
        for (t, j0) in (0..len).step_by(step).enumerate() {
            let j1 = (j0 + step).min(len);
            #[cfg(test)]
            let j1 = if self.plan.skip_key_tile == Some(t) {
                j0
            } else {
                j1
            };
            let _ = t;
            // The first tile starts the sums at zero; later ones continue them in `o`.
            let acc = Accumulate {
                keys: j0..j1,
                fresh: j0 == 0,
            };
            for (pi, oi) in s.chunks(TILE_ROWS * len).zip(o.chunks_mut(TILE_ROWS * d)) {
                match pi.len() / len {
                    4 => pv::<4>(pi, values, len, d, &acc, oi),
                    3 => pv::<3>(pi, values, len, d, &acc, oi),
                    2 => pv::<2>(pi, values, len, d, &acc, oi),
                    _ => pv::<1>(pi, values, len, d, &acc, oi),
                }
            }
        }
    }

    /// Scores of query rows `i..i + R` against the segment's keys `tile` (`keys`: the segment's
    /// K laid out per 16-key tile), into `s` (`[R, len]`), 16 keys a register tile.
    // `c` walks the columns of R query rows and the rows of a key tile together.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn scores<const R: usize>(
        &self,
        i: usize,
        keys: &[f32],
        len: usize,
        tile: std::ops::Range<usize>,
        s: &mut [f32],
    ) {
        let d = self.d;
        let q: [&[f32]; R] = std::array::from_fn(|ri| self.q(i + ri));
        let mut j = tile.start;
        while j + TILE_COLS <= tile.end {
            let kt = &keys[j * d..(j + TILE_COLS) * d];
            let mut acc = [[0f32; TILE_COLS]; R];
            for c in 0..d {
                let k: &[f32; TILE_COLS] = kt[c * TILE_COLS..][..TILE_COLS]
                    .try_into()
                    .expect("a tile of keys");
                for ri in 0..R {
                    let qc = q[ri][c];
                    for (a, &kv) in acc[ri].iter_mut().zip(k) {
                        *a += qc * kv;
                    }
                }
            }
            for ri in 0..R {
                for (o, a) in s[ri * len + j..][..TILE_COLS].iter_mut().zip(acc[ri]) {
                    *o = a * self.scale;
                }
            }
            j += TILE_COLS;
        }
        // The segment's last keys (fewer than 16), laid out `[d][w]`.
        let w = len - j;
        for jt in j..tile.end {
            for ri in 0..R {
                let mut a = 0f32;
                for c in 0..d {
                    a += q[ri][c] * keys[j * d + c * w + jt - j];
                }
                s[ri * len + jt] = a * self.scale;
            }
        }
    }
}

/// The keys one `p · V` pass adds, and whether the sums start at zero (else they continue `o`).
struct Accumulate {
    keys: std::ops::Range<usize>,
    fresh: bool,
}

/// `o[ri] (+)= Σ_j p[ri, j] · v_j` over `acc.keys` for `R` rows (`p`: `[R, len]`, `values`:
/// `[len, d]`, `o`: `[R, d]`), 16 columns a register tile.
#[inline(always)]
fn pv<const R: usize>(
    p: &[f32],
    values: &[f32],
    len: usize,
    d: usize,
    acc: &Accumulate,
    o: &mut [f32],
) {
    let keys = acc.keys.clone();
    let mut c = 0;
    while c + TILE_COLS <= d {
        let mut sum = [[0f32; TILE_COLS]; R];
        if !acc.fresh {
            for (ri, sr) in sum.iter_mut().enumerate() {
                sr.copy_from_slice(&o[ri * d + c..][..TILE_COLS]);
            }
        }
        for j in keys.clone() {
            let v: &[f32; TILE_COLS] = values[j * d + c..][..TILE_COLS]
                .try_into()
                .expect("a tile of values");
            for (ri, sr) in sum.iter_mut().enumerate() {
                let pj = p[ri * len + j];
                for (a, &vv) in sr.iter_mut().zip(v) {
                    *a += pj * vv;
                }
            }
        }
        for (ri, sr) in sum.iter().enumerate() {
            o[ri * d + c..][..TILE_COLS].copy_from_slice(sr);
        }
        c += TILE_COLS;
    }
    for ct in c..d {
        for ri in 0..R {
            let mut a = if acc.fresh { 0f32 } else { o[ri * d + ct] };
            for j in keys.clone() {
                a += p[ri * len + j] * values[j * d + ct];
            }
            o[ri * d + ct] = a;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two segments of 2 rows, one head of d = 2: each row's output is a mix of its own segment's v
    /// only; the joint segment (the control) mixes in the other's.
    #[test]
    fn rows_attend_only_within_their_segment() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // q = k = 0 -> uniform weights; v of segment 0 = 1, 3; segment 1 = 10, 30.
        let mut data = vec![0.0f32; 4 * 6];
        for (r, v) in [1.0f32, 3.0, 10.0, 30.0].into_iter().enumerate() {
            data[r * 6 + 4] = v;
            data[r * 6 + 5] = -v;
        }
        let mut out = vec![0.0; 8];
        let mut scratch = AttnScratch::default();
        scratch.reserve(4, 2, 4, 2);
        pool.install(|| attend(&data, 1, 2, &[(0, 2), (2, 2)], &mut scratch, &mut out));
        assert_eq!(out, vec![2.0, -2.0, 2.0, -2.0, 20.0, -20.0, 20.0, -20.0]);
        pool.install(|| attend(&data, 1, 2, &[(0, 4)], &mut scratch, &mut out));
        assert_eq!(out[0], 11.0);
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

    /// Tiles and their tails: d = 20 (a 16-column tile and 4 more), segments of 37 and 5 rows (key
    /// tiles and tails, row runs not a multiple of 4, blocks across a segment boundary). The
    /// result is the plain formula's within f32 rounding, and the scalar build's bits equal the
    /// dispatched one's. Control: one key off (a segment shortened by a row) is caught.
    #[test]
    fn tiles_and_tails_equal_the_plain_formula() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (heads, d, rows) = (2, 20, 42);
        let hidden = heads * d;
        let qkv: Vec<f32> = (0..rows * 3 * hidden)
            .map(|i| ((i * 7919 % 1009) as f32 / 504.5 - 1.0) * 1.5)
            .collect();
        let segments = [(0, 37), (37, 5)];
        let want = naive(&qkv, heads, d, &segments);
        let mut scratch = AttnScratch::default();
        scratch.reserve(rows, hidden, 37, 2);
        let mut out = vec![0f32; rows * hidden];
        pool.install(|| attend(&qkv, heads, d, &segments, &mut scratch, &mut out));
        let worst = out
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-5, "max |diff| {worst}");

        // The portable build gives the dispatched one's bits.
        let mut portable = vec![0f32; rows * hidden];
        let plan = Plan {
            avx2: false,
            ..Plan::for_this_cpu()
        };
        pool.install(|| {
            attend_planned(&qkv, heads, d, &segments, &mut scratch, &mut portable, plan)
        });
        for r in 0..rows {
            assert_eq!(
                portable[r * hidden..(r + 1) * hidden],
                out[r * hidden..(r + 1) * hidden],
                "row {r}: the portable and dispatched builds differ"
            );
        }

        // Control: the first segment one row short (its last key missed) moves its rows.
        let mut short = vec![0f32; rows * hidden];
        pool.install(|| {
            attend(
                &qkv,
                heads,
                d,
                &[(0, 36), (36, 6)],
                &mut scratch,
                &mut short,
            )
        });
        let moved = short[..36 * hidden]
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(moved > 1e-3, "a missing key moved nothing ({moved})");
    }

    /// Several images of different sizes in one call (segments of 37, 5, 100, 16, 67 and 1 rows:
    /// key tiles with and without a short last one, a segment shorter than a tile, query blocks
    /// across segment boundaries), d = 20 (a 16-column tile and 4 more), every row block and key
    /// tile tried, both builds: the same bits as one key tile over the whole segment (the order of
    /// the sums before blocking), within f32 rounding of the plain formula. Control: a `p · V` pass
    /// that skips one key tile is caught by both comparisons.
    #[test]
    fn key_tiles_and_row_blocks_keep_the_bits() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (heads, d) = (2, 20);
        let lens = [37, 5, 100, 16, 67, 1];
        let rows: usize = lens.iter().sum();
        let segments: Vec<(usize, usize)> = lens
            .iter()
            .scan(0, |at, &len| {
                *at += len;
                Some((*at - len, len))
            })
            .collect();
        let hidden = heads * d;
        let qkv: Vec<f32> = (0..rows * 3 * hidden)
            .map(|i| ((i * 6151 % 2003) as f32 / 1001.5 - 1.0) * 2.0)
            .collect();
        let want = naive(&qkv, heads, d, &segments);
        let mut scratch = AttnScratch::default();
        scratch.reserve(rows, hidden, 100, 2);
        let mut run = |plan: Plan| {
            let mut out = vec![0f32; rows * hidden];
            pool.install(|| {
                attend_planned(&qkv, heads, d, &segments, &mut scratch, &mut out, plan)
            });
            out
        };
        let whole = Plan {
            key_tile: 112,
            ..Plan::for_this_cpu()
        };
        let reference = run(whole);
        let worst = reference
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-5, "max |diff| {worst}");
        for avx2 in [false, whole.avx2] {
            for row_block in [1, 3, 4, 7, ROW_BLOCK] {
                for key_tile in [16, 32, 48, KEY_TILE] {
                    let plan = Plan {
                        row_block,
                        key_tile,
                        avx2,
                        ..whole
                    };
                    assert!(
                        run(plan) == reference,
                        "{plan:?}: other bits than one tile a segment"
                    );
                }
            }
        }

        // Control: skipping the second key tile of 16 (keys 16..32 of the segments longer than 16).
        let skipped = run(Plan {
            key_tile: 16,
            skip_key_tile: Some(1),
            ..whole
        });
        assert!(
            skipped != reference,
            "a skipped key tile left the bits alone"
        );
        let moved = skipped
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(moved > 1e-3, "a skipped key tile moved nothing ({moved})");
    }
}
