//! Full (non-causal) attention of every row over the rows of its own segment (one frame of one
//! image: transformers' `cu_seqlens`), every head, `softmax(q·kᵀ · d^−½) · v` with an f32 softmax
//! (`forward::mathf`'s max and shifted exp sum).

use forward::mathf;
use rayon::prelude::*;

/// The packed `qkv` rows `[rows, 3 · heads · d]` (q, then k, then v, each heads × d).
pub struct Qkv<'a> {
    pub data: &'a [f32],
    pub heads: usize,
    pub head_dim: usize,
}

impl Qkv<'_> {
    fn width(&self) -> usize {
        3 * self.heads * self.head_dim
    }
    fn part(&self, row: usize, which: usize, head: usize) -> &[f32] {
        let hidden = self.heads * self.head_dim;
        let start = row * self.width() + which * hidden + head * self.head_dim;
        &self.data[start..start + self.head_dim]
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

/// `out[r, head·d..]` for every row `r`: attention over the rows of the segment holding `r`.
/// `scores` holds one `max segment length` buffer per task (`tasks` of them); rows are split into
/// `tasks` contiguous runs, so nothing is allocated here.
pub fn attend(
    pool: &rayon::ThreadPool,
    qkv: &Qkv<'_>,
    segments: &[(usize, usize)],
    out: &mut [f32],
    scores: &mut [f32],
    tasks: usize,
) {
    let (heads, d) = (qkv.heads, qkv.head_dim);
    let hidden = heads * d;
    let rows = out.len() / hidden;
    let max_len = scores.len() / tasks;
    let per_task = rows.div_ceil(tasks).max(1);
    let scale = (d as f32).powf(-0.5);
    pool.install(|| {
        out.par_chunks_mut(per_task * hidden)
            .zip(scores.par_chunks_mut(max_len))
            .enumerate()
            .for_each(|(t, (out, scores))| {
                let first = t * per_task;
                // The segment of the first row, then forward as rows cross boundaries.
                let mut seg = segments
                    .partition_point(|&(s, len)| s + len <= first)
                    .min(segments.len() - 1);
                for (i, o) in out.chunks_exact_mut(hidden).enumerate() {
                    let r = first + i;
                    while segments[seg].0 + segments[seg].1 <= r {
                        seg += 1;
                    }
                    let (start, len) = segments[seg];
                    let s = &mut scores[..len];
                    for h in 0..heads {
                        let q = qkv.part(r, 0, h);
                        for (j, sj) in s.iter_mut().enumerate() {
                            *sj = dot(q, qkv.part(start + j, 1, h)) * scale;
                        }
                        let m = mathf::max(s);
                        let sum = mathf::exp_shifted_sum(s, m);
                        let inv = 1.0 / sum;
                        let oh = &mut o[h * d..(h + 1) * d];
                        oh.fill(0.0);
                        for (j, &p) in s.iter().enumerate() {
                            let p = p * inv;
                            for (a, &v) in oh.iter_mut().zip(qkv.part(start + j, 2, h)) {
                                *a += p * v;
                            }
                        }
                    }
                }
            });
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
        let qkv = Qkv {
            data: &data,
            heads: 1,
            head_dim: 2,
        };
        let mut out = vec![0.0; 8];
        let mut scores = vec![0.0; 2 * 4];
        attend(&pool, &qkv, &[(0, 2), (2, 2)], &mut out, &mut scores, 2);
        assert_eq!(out, vec![2.0, -2.0, 2.0, -2.0, 20.0, -20.0, 20.0, -20.0]);
        attend(&pool, &qkv, &[(0, 4)], &mut out, &mut scores, 2);
        assert_eq!(out[0], 11.0);
    }
}
