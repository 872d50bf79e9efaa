//! Full (non-causal) attention of every row over the rows of its own segment (one frame of one
//! image: transformers' `cu_seqlens`), every head, `softmax(q·kᵀ · d^−½) · v` with an f32 softmax
//! (`forward::mathf`'s max and shifted exp sum).
//!
//! K and V are first laid out head-major (each head's rows contiguous), and each task takes a block
//! of `ROW_BLOCK` query rows of one head, so every K and V row read is shared by the block's rows
//! (a 2B tower frame has up to thousands of rows; reading K per query row was memory bound).

use std::sync::Mutex;

use forward::mathf;
use rayon::prelude::*;

/// Query rows one task takes (they share each K/V row read).
pub const ROW_BLOCK: usize = 16;

/// Buffers sized once per encode: head-major K, V and output, and one score block per thread.
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

/// The 8-accumulator dot product (vectorizes; the order is fixed, so every build gives the same bits).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut sum = mathf::sum_lanes(&lanes);
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        sum += x * y;
    }
    sum
}

/// `out[r, head·d..]` for every row `r` of the packed `qkv` rows (`[rows, 3·heads·d]`: q, k, v):
/// attention over the rows of the segment (`(first row, rows)`, ascending, covering all rows)
/// holding `r`. Runs on the current pool; `scratch` must be reserved for these sizes.
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
    let (kh, vh, oh) = (
        &mut kh[..rows * hidden],
        &mut vh[..rows * hidden],
        &mut oh[..rows * hidden],
    );
    // Head-major K and V: head h's rows at [h·rows·d ..].
    kh.par_chunks_mut(rows * d)
        .zip(vh.par_chunks_mut(rows * d))
        .enumerate()
        .for_each(|(h, (kh, vh))| {
            for r in 0..rows {
                let row = &qkv[r * 3 * hidden..(r + 1) * 3 * hidden];
                kh[r * d..(r + 1) * d].copy_from_slice(&row[hidden + h * d..hidden + (h + 1) * d]);
                vh[r * d..(r + 1) * d]
                    .copy_from_slice(&row[2 * hidden + h * d..2 * hidden + (h + 1) * d]);
            }
        });
    let (kh, vh) = (&*kh, &*vh);
    let scores = &*scores;
    oh.par_chunks_mut(rows * d)
        .enumerate()
        .for_each(|(h, ohh)| {
            let (kh, vh) = (
                &kh[h * rows * d..(h + 1) * rows * d],
                &vh[h * rows * d..(h + 1) * rows * d],
            );
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
                        let n_run = run_end - r;
                        let s = &mut s[..n_run * len];
                        let keys = &kh[start * d..(start + len) * d];
                        for (j, kj) in keys.chunks_exact(d).enumerate() {
                            for i in 0..n_run {
                                let q = &qkv[(r + i) * 3 * hidden + h * d..][..d];
                                s[i * len + j] = dot(q, kj) * scale;
                            }
                        }
                        for si in s.chunks_exact_mut(len) {
                            let m = mathf::max(si);
                            let inv = 1.0 / mathf::exp_shifted_sum(si, m);
                            for p in si.iter_mut() {
                                *p *= inv;
                            }
                        }
                        let orun = &mut o[(r - first) * d..(run_end - first) * d];
                        orun.fill(0.0);
                        let values = &vh[start * d..(start + len) * d];
                        for (j, vj) in values.chunks_exact(d).enumerate() {
                            for (i, oi) in orun.chunks_exact_mut(d).enumerate() {
                                let p = s[i * len + j];
                                for (a, &v) in oi.iter_mut().zip(vj) {
                                    *a += p * v;
                                }
                            }
                        }
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
}
