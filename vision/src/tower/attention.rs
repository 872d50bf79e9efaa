//! Full (non-causal) attention of every row over the rows of its own segment (one frame of one
//! image: transformers' `cu_seqlens`), every head, `softmax(q·kᵀ · d^−½) · v` with an f32 softmax
//! (`forward::mathf`'s max and shifted exp sum).
//!
//! K (transposed) and V are first laid out per head, and each task takes a block of `ROW_BLOCK` query
//! rows of one head, so every K and V row read is shared by the block's rows (a 2B tower frame has
//! up to thousands of rows; reading K per query row was memory bound). Scores and `p · V` are
//! register tiles of 4 rows x 16 keys (or value columns), vectorized across the keys, so no dot
//! product ends in a horizontal sum.

use std::sync::Mutex;

use forward::mathf;
use rayon::prelude::*;

/// Query rows one task takes (they share each K/V row read).
pub const ROW_BLOCK: usize = 16;

/// Buffers sized once per encode: per head K (transposed), V and output, and one score block per
/// thread.
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

/// `out[r, head·d..]` for every row `r` of the packed `qkv` rows (`[rows, 3·heads·d]`: q, k, v):
/// attention over the rows of the segment (`(first row, rows)`, ascending, covering all rows)
/// holding `r`. Runs on the current pool; `scratch` must be reserved for these sizes.
///
/// Each score is `(Σ_c q_c·k_c) · d^−½` summed over c in order, and each output `Σ_j p_j·v_j` over
/// the segment's keys in order, whatever the tile or CPU computes it (the AVX2 build runs the same
/// code with wider vectors, unfused multiply then add): every build gives the same bits.
pub fn attend(
    qkv: &[f32],
    heads: usize,
    d: usize,
    segments: &[(usize, usize)],
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let hidden = heads * d;
    let rows = out.len() / hidden;
    let scale = (d as f32).powf(-0.5);
    let AttnScratch { kh, vh, oh, scores } = scratch;
    let (kt, vh, oh) = (
        &mut kh[..rows * hidden],
        &mut vh[..rows * hidden],
        &mut oh[..rows * hidden],
    );
    // Head h: K transposed (`kt[h][c][r]`: a key tile is 16 consecutive floats of one column) and
    // V head-major (`vh[h][r][c]`).
    kt.par_chunks_mut(rows * d)
        .zip(vh.par_chunks_mut(rows * d))
        .enumerate()
        .for_each(|(h, (kt, vh))| {
            for r in 0..rows {
                let row = &qkv[r * 3 * hidden..(r + 1) * 3 * hidden];
                let k = &row[hidden + h * d..hidden + (h + 1) * d];
                for (c, &kc) in k.iter().enumerate() {
                    kt[c * rows + r] = kc;
                }
                vh[r * d..(r + 1) * d]
                    .copy_from_slice(&row[2 * hidden + h * d..2 * hidden + (h + 1) * d]);
            }
        });
    let (kt, vh) = (&*kt, &*vh);
    let scores = &*scores;
    let avx2 = gemm::kernels::Isa::Avx2.is_available();
    oh.par_chunks_mut(rows * d)
        .enumerate()
        .for_each(|(h, ohh)| {
            let head = Head {
                qkv,
                hidden,
                h,
                d,
                rows,
                scale,
                kt: &kt[h * rows * d..(h + 1) * rows * d],
                vh: &vh[h * rows * d..(h + 1) * rows * d],
            };
            ohh.par_chunks_mut(ROW_BLOCK * d)
                .enumerate()
                .for_each(|(b, o)| {
                    let slot = rayon::current_thread_index().unwrap_or(0) % scores.len();
                    let mut s = scores[slot].lock().unwrap_or_else(|e| e.into_inner());
                    let first = b * ROW_BLOCK;
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
                        if avx2 {
                            // SAFETY: the CPU reported AVX2 and FMA.
                            unsafe { head.run_avx2(r, run_end, (start, len), s, orun) };
                            r = run_end;
                            continue;
                        }
                        let _ = avx2;
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
    rows: usize,
    scale: f32,
    /// `[d][rows]`.
    kt: &'a [f32],
    /// `[rows][d]`.
    vh: &'a [f32],
}

impl Head<'_> {
    /// Query row `r`'s `d` values for this head.
    fn q(&self, r: usize) -> &[f32] {
        &self.qkv[r * 3 * self.hidden + self.h * self.d..][..self.d]
    }

    /// [`Head::run`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
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

    /// Rows `r0..r1` (all in the segment `(start, len)`): scores into `s` (`[r1 − r0, len]`),
    /// softmax, then `p · V` into `o` (`[r1 − r0, d]`).
    #[inline(always)]
    fn run(
        &self,
        r0: usize,
        r1: usize,
        (start, len): (usize, usize),
        s: &mut [f32],
        o: &mut [f32],
    ) {
        let mut i = r0;
        while i < r1 {
            let n = (r1 - i).min(TILE_ROWS);
            let at = (i - r0) * len;
            let s = &mut s[at..at + n * len];
            match n {
                4 => self.scores::<4>(i, start, len, s),
                3 => self.scores::<3>(i, start, len, s),
                2 => self.scores::<2>(i, start, len, s),
                _ => self.scores::<1>(i, start, len, s),
            }
            i += n;
        }
        for si in s.chunks_exact_mut(len) {
            let m = mathf::max(si);
            let inv = 1.0 / mathf::exp_shifted_sum(si, m);
            for p in si.iter_mut() {
                *p *= inv;
            }
        }
        let d = self.d;
        let values = &self.vh[start * d..(start + len) * d];
        for (pi, oi) in s.chunks(TILE_ROWS * len).zip(o.chunks_mut(TILE_ROWS * d)) {
            match pi.len() / len {
                4 => pv::<4>(pi, values, len, d, oi),
                3 => pv::<3>(pi, values, len, d, oi),
                2 => pv::<2>(pi, values, len, d, oi),
                _ => pv::<1>(pi, values, len, d, oi),
            }
        }
    }

    /// Scores of query rows `i..i + R` against keys `start..start + len`, into `s` (`[R, len]`),
    /// 16 keys a tile.
    // `c` walks the columns of R query rows and the rows of `kt` together.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn scores<const R: usize>(&self, i: usize, start: usize, len: usize, s: &mut [f32]) {
        let (d, rows) = (self.d, self.rows);
        let q: [&[f32]; R] = std::array::from_fn(|ri| self.q(i + ri));
        let mut j = 0;
        while j + TILE_COLS <= len {
            let mut acc = [[0f32; TILE_COLS]; R];
            for c in 0..d {
                let k: &[f32; TILE_COLS] = self.kt[c * rows + start + j..][..TILE_COLS]
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
        for jt in j..len {
            for ri in 0..R {
                let mut a = 0f32;
                for c in 0..d {
                    a += q[ri][c] * self.kt[c * rows + start + jt];
                }
                s[ri * len + jt] = a * self.scale;
            }
        }
    }
}

/// `o[ri] = Σ_j p[ri, j] · v_j` for `R` rows (`p`: `[R, len]`, `values`: `[len, d]`, `o`:
/// `[R, d]`), 16 columns a tile.
#[inline(always)]
fn pv<const R: usize>(p: &[f32], values: &[f32], len: usize, d: usize, o: &mut [f32]) {
    let mut c = 0;
    while c + TILE_COLS <= d {
        let mut acc = [[0f32; TILE_COLS]; R];
        for (j, v) in values.chunks_exact(d).enumerate() {
            let v: &[f32; TILE_COLS] = v[c..c + TILE_COLS].try_into().expect("a tile of values");
            for ri in 0..R {
                let pj = p[ri * len + j];
                for (a, &vv) in acc[ri].iter_mut().zip(v) {
                    *a += pj * vv;
                }
            }
        }
        for ri in 0..R {
            o[ri * d + c..][..TILE_COLS].copy_from_slice(&acc[ri]);
        }
        c += TILE_COLS;
    }
    for ct in c..d {
        for ri in 0..R {
            let mut a = 0f32;
            for (j, v) in values.chunks_exact(d).enumerate() {
                a += p[ri * len + j] * v[ct];
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

        // The portable build, run directly on head 1's rows 3..37 (a run of 34: tiles of 4 and 2).
        let mut kt = vec![0f32; rows * d];
        let mut vh = vec![0f32; rows * d];
        for r in 0..rows {
            for c in 0..d {
                kt[c * rows + r] = qkv[r * 3 * hidden + hidden + d + c];
                vh[r * d + c] = qkv[r * 3 * hidden + 2 * hidden + d + c];
            }
        }
        let head = Head {
            qkv: &qkv,
            hidden,
            h: 1,
            d,
            rows,
            scale: (d as f32).powf(-0.5),
            kt: &kt,
            vh: &vh,
        };
        let mut s = vec![0f32; 34 * 37];
        let mut o = vec![0f32; 34 * d];
        head.run(3, 37, (0, 37), &mut s, &mut o);
        for (i, r) in (3..37).enumerate() {
            assert_eq!(
                o[i * d..(i + 1) * d],
                out[r * hidden + d..r * hidden + 2 * d],
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
}
