//! Causal grouped-query attention over the KV cache, softmax in f32.

use crate::kv::KvElem;
use std::cell::RefCell;

/// Geometry of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    /// Query heads served by each KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

thread_local! {
    // Per-thread score buffer, grown to the longest context seen: no allocation per step.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attention for the query heads of one KV head `g`, for one query row that reads slots `0..slots`.
///
/// `q` holds the row's `group` query heads for this KV head (`group * head_dim`), `out` the same span of
/// the output. KV head g serves query heads g*r .. g*r + r - 1, so the caller passes contiguous spans.
pub fn attend_group<T: KvElem>(
    shape: AttnShape,
    g: usize,
    slots: usize,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let kv_dim = shape.kv_dim();
    let scale = 1.0 / (d as f32).sqrt();
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        if scores.len() < slots {
            scores.resize(slots, 0.0);
        }
        let scores = &mut scores[..slots];
        for (qh, oh) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mut max = f32::NEG_INFINITY;
            for (s, score) in scores.iter_mut().enumerate() {
                let k = &k_cache[s * kv_dim + g * d..s * kv_dim + (g + 1) * d];
                let v = dot(qh, k) * scale;
                *score = v;
                max = max.max(v);
            }
            let mut sum = 0.0f32;
            for score in scores.iter_mut() {
                let e = (*score - max).exp();
                *score = e;
                sum += e;
            }
            let inv = 1.0 / sum;
            oh.fill(0.0);
            for (s, &p) in scores.iter().enumerate() {
                let w = p * inv;
                let v = &v_cache[s * kv_dim + g * d..s * kv_dim + (g + 1) * d];
                for (o, &x) in oh.iter_mut().zip(v) {
                    *o += w * x.to_f32();
                }
            }
        }
    });
}

#[inline]
fn dot<T: KvElem>(q: &[f32], k: &[T]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut qc = q.chunks_exact(8);
    let mut kc = k.chunks_exact(8);
    for (a, b) in (&mut qc).zip(&mut kc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i].to_f32();
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (a, b) in qc.remainder().iter().zip(kc.remainder()) {
        sum += a * b.to_f32();
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slot_returns_its_value_and_gqa_picks_the_right_kv_head() {
        let shape = AttnShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 2,
        };
        // Two slots; kv head 0 has v = (1,1) then (3,3); kv head 1 has v = (10,10) then (30,30).
        let k = vec![0.0f32; 2 * 4];
        let v = vec![1.0f32, 1.0, 10.0, 10.0, 3.0, 3.0, 30.0, 30.0];
        let q = vec![0.5f32; 4];
        let mut out = vec![0.0f32; 4];
        attend_group(shape, 1, 1, &q, &k, &v, &mut out);
        assert_eq!(out, vec![10.0; 4]);
        // Equal scores over two slots: the mean of the group's values.
        attend_group(shape, 0, 2, &q, &k, &v, &mut out);
        assert_eq!(out, vec![2.0; 4]);
        // Control: reading kv head 1 for group 0 gives another answer.
        attend_group(shape, 1, 2, &q, &k, &v, &mut out);
        assert_eq!(out, vec![20.0; 4]);
    }
}
