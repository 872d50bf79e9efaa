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
/// Each cached K and V row is read once for all the group's heads. Per head the arithmetic is fixed:
/// 8-lane dots, a sequential max and sum, `exp` from libm, the output accumulated slot by slot — the
/// AVX2 build compiles the same loops, so both give the same bits.
pub fn attend_group<T: KvElem>(
    shape: AttnShape,
    g: usize,
    slots: usize,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
) {
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        let heads = q.len() / shape.head_dim.max(1);
        if scores.len() < heads * slots {
            scores.resize(heads * slots, 0.0);
        }
        let scores = &mut scores[..heads * slots];
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::Isa::Avx2.is_available() {
            // SAFETY: the CPU reported AVX2 and FMA.
            unsafe { attend_avx2(shape, g, slots, q, k_cache, v_cache, out, scores) };
            return;
        }
        attend(shape, g, slots, q, k_cache, v_cache, out, scores);
    });
}

/// [`attend`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2<T: KvElem>(
    shape: AttnShape,
    g: usize,
    slots: usize,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
    scores: &mut [f32],
) {
    attend(shape, g, slots, q, k_cache, v_cache, out, scores)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend<T: KvElem>(
    shape: AttnShape,
    g: usize,
    slots: usize,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
    scores: &mut [f32],
) {
    let d = shape.head_dim;
    let kv_dim = shape.kv_dim();
    let scale = 1.0 / (d as f32).sqrt();
    // Scores of every head, one pass over K.
    for s in 0..slots {
        let k = &k_cache[s * kv_dim + g * d..s * kv_dim + (g + 1) * d];
        for (h, qh) in q.chunks_exact(d).enumerate() {
            scores[h * slots + s] = dot(qh, k) * scale;
        }
    }
    // Softmax per head, in f32; each score becomes its weight `exp(score - max) * (1 / sum)`.
    for head in scores.chunks_exact_mut(slots.max(1)) {
        let mut max = f32::NEG_INFINITY;
        for &v in head.iter() {
            max = max.max(v);
        }
        let mut sum = 0.0f32;
        for score in head.iter_mut() {
            let e = (*score - max).exp();
            *score = e;
            sum += e;
        }
        let inv = 1.0 / sum;
        for p in head.iter_mut() {
            *p *= inv;
        }
    }
    // Weighted values of every head, one pass over V.
    out.fill(0.0);
    for s in 0..slots {
        let v = &v_cache[s * kv_dim + g * d..s * kv_dim + (g + 1) * d];
        for (h, oh) in out.chunks_exact_mut(d).enumerate() {
            let w = scores[h * slots + s];
            for (o, &x) in oh.iter_mut().zip(v) {
                *o += w * x.to_f32();
            }
        }
    }
}

#[inline(always)]
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
    use half::bf16;

    /// The attention as first written: one head at a time over the whole cache.
    fn attend_one_head_at_a_time<T: KvElem>(
        shape: AttnShape,
        g: usize,
        slots: usize,
        q: &[f32],
        k_cache: &[T],
        v_cache: &[T],
        out: &mut [f32],
    ) {
        let (d, kv_dim) = (shape.head_dim, shape.kv_dim());
        let scale = 1.0 / (d as f32).sqrt();
        let mut scores = vec![0f32; slots];
        for (qh, oh) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mut max = f32::NEG_INFINITY;
            for (s, score) in scores.iter_mut().enumerate() {
                let v = dot(qh, &k_cache[s * kv_dim + g * d..s * kv_dim + (g + 1) * d]) * scale;
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
    }

    fn check<T: KvElem>(convert: fn(f32) -> T) {
        let shape = AttnShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 20,
        };
        let slots = 37;
        let mut seed = 9u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 23) as f32 - 1.0
        };
        let k: Vec<T> = (0..slots * shape.kv_dim())
            .map(|_| convert(3.0 * rnd()))
            .collect();
        let v: Vec<T> = (0..slots * shape.kv_dim())
            .map(|_| convert(rnd()))
            .collect();
        let span = shape.group() * shape.head_dim;
        let q: Vec<f32> = (0..span).map(|_| 2.0 * rnd()).collect();
        for g in 0..shape.kv_heads {
            for used in [1, 2, slots] {
                let mut want = vec![0f32; span];
                attend_one_head_at_a_time(shape, g, used, &q, &k, &v, &mut want);
                let mut got = vec![f32::NAN; span];
                attend_group(shape, g, used, &q, &k, &v, &mut got);
                let mut portable = vec![f32::NAN; span];
                let mut scores = vec![0f32; shape.group() * used];
                attend(shape, g, used, &q, &k, &v, &mut portable, &mut scores);
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "g {g} slots {used}");
                assert_eq!(bits(&portable), bits(&want), "portable g {g} slots {used}");
            }
        }
    }

    #[test]
    fn every_build_gives_the_one_head_at_a_time_bits() {
        check::<f32>(|x| x);
        check::<bf16>(bf16::from_f32);
    }

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
