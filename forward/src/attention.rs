//! Causal grouped-query attention over the KV cache, softmax in f32.

use crate::kv::KvElem;
#[cfg(target_arch = "x86_64")]
use half::bf16;
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
    attend_heads(shape, g, slots, q, k_cache, v_cache, out)
}

/// Attention for the query heads of the adjacent KV heads `g0 ..`, for one query row that reads slots
/// `0..slots`: `q` and `out` span those KV heads' query heads (`n * group * head_dim` for n KV heads).
///
/// Each slot's K and V values of all n heads are one contiguous run of the cache row, read once for
/// all their query heads. Per head the arithmetic is fixed — 8-lane dots, a sequential max and sum,
/// `exp` from libm, the output accumulated slot by slot — whatever n, and the AVX2 build does the same
/// operations in the same order, so every split and build gives the same bits.
pub fn attend_heads<T: KvElem>(
    shape: AttnShape,
    g0: usize,
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
            unsafe { attend_avx2(shape, g0, slots, q, k_cache, v_cache, out, scores) };
            return;
        }
        attend(shape, g0, slots, q, k_cache, v_cache, out, scores);
    });
}

/// KV heads per parallel task when `rows` query rows are attended on `threads` threads: whole cache
/// rows (every KV head: one contiguous read per slot) once the rows alone give every thread a task;
/// for fewer rows, the largest run of adjacent heads (a divisor of the KV heads) that still does.
pub fn kv_heads_per_task(shape: AttnShape, rows: usize, threads: usize) -> usize {
    let kv = shape.kv_heads.max(1);
    let splits = threads.div_ceil(rows.max(1)).clamp(1, kv);
    (1..=kv)
        .rev()
        .find(|&n| kv.is_multiple_of(n) && kv / n >= splits)
        .unwrap_or(1)
}

/// [`attend`] with explicit 8-lane AVX2 loops for f32 and bf16 caches (the same lanes, multiplies,
/// adds and orders as the portable loops) and software prefetch: a KV head's rows sit one cache row
/// (`kv_dim` values) apart, a new page every slot, where the hardware prefetchers stop.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2<T: KvElem>(
    shape: AttnShape,
    g0: usize,
    slots: usize,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
    scores: &mut [f32],
) {
    use simd::{cast, Bf16Lanes, F32Lanes};
    if let (Some(k), Some(v)) = (cast::<T, f32>(k_cache), cast::<T, f32>(v_cache)) {
        simd::attend::<F32Lanes>(shape, g0, slots, q, k, v, out, scores)
    } else if let (Some(k), Some(v)) = (cast::<T, bf16>(k_cache), cast::<T, bf16>(v_cache)) {
        simd::attend::<Bf16Lanes>(shape, g0, slots, q, k, v, out, scores)
    } else {
        attend(shape, g0, slots, q, k_cache, v_cache, out, scores)
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::AttnShape;
    use half::bf16;
    use std::any::TypeId;
    use std::arch::x86_64::*;

    /// Slots ahead whose K and V rows are prefetched.
    const PREFETCH_SLOTS: usize = 8;

    /// `s` as a slice of `U` when `T` is `U`.
    pub fn cast<T: 'static, U: 'static>(s: &[T]) -> Option<&[U]> {
        (TypeId::of::<T>() == TypeId::of::<U>()).then(|| {
            // SAFETY: T and U are the same type, so the layout and length carry over.
            unsafe { std::slice::from_raw_parts(s.as_ptr() as *const U, s.len()) }
        })
    }

    /// A cache element type read 8 at a time as f32.
    pub trait Lanes {
        type Elem: Copy;
        unsafe fn load8(p: *const Self::Elem) -> __m256;
        fn widen(x: Self::Elem) -> f32;
    }

    pub struct F32Lanes;
    impl Lanes for F32Lanes {
        type Elem = f32;
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        fn widen(x: f32) -> f32 {
            x
        }
    }

    /// bf16 widens by a 16-bit shift (exact; a NaN keeps its payload, where `half` would also set
    /// the quiet bit — a cache holding NaN gives NaN either way).
    pub struct Bf16Lanes;
    impl Lanes for Bf16Lanes {
        type Elem = bf16;
        #[inline(always)]
        unsafe fn load8(p: *const bf16) -> __m256 {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
        #[inline(always)]
        fn widen(x: bf16) -> f32 {
            x.to_f32()
        }
    }

    #[inline(always)]
    unsafe fn prefetch_run<E>(row: *const E, bytes: usize) {
        for line in (0..bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>((row as *const i8).wrapping_add(line));
        }
    }

    /// `super::dot`: lane i accumulates elements i, i+8, ..., the lanes summed in order, then the tail.
    #[inline(always)]
    unsafe fn dot<L: Lanes>(q: &[f32], k: &[L::Elem]) -> f32 {
        let blocks = q.len() / 8;
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            let qv = _mm256_loadu_ps(q.as_ptr().add(8 * b));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(qv, L::load8(k.as_ptr().add(8 * b))));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut sum: f32 = lanes.iter().sum();
        for j in 8 * blocks..q.len() {
            sum += q[j] * L::widen(k[j]);
        }
        sum
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attend<L: Lanes>(
        shape: AttnShape,
        g0: usize,
        slots: usize,
        q: &[f32],
        k_cache: &[L::Elem],
        v_cache: &[L::Elem],
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        let d = shape.head_dim;
        let kv_dim = shape.kv_dim();
        let r = shape.group();
        // The KV heads' values of one slot: a contiguous run of the cache row.
        let run = q.len() / r;
        let run_bytes = run * std::mem::size_of::<L::Elem>();
        let scale = 1.0 / (d as f32).sqrt();
        for s in 0..slots {
            if s + PREFETCH_SLOTS < slots {
                let ahead = (s + PREFETCH_SLOTS) * kv_dim + g0 * d;
                prefetch_run(k_cache.as_ptr().add(ahead), run_bytes);
            }
            let k_run = &k_cache[s * kv_dim + g0 * d..s * kv_dim + g0 * d + run];
            for (h, qh) in q.chunks_exact(d).enumerate() {
                let k = &k_run[(h / r) * d..(h / r + 1) * d];
                scores[h * slots + s] = dot::<L>(qh, k) * scale;
            }
        }
        super::softmax_rows(scores, slots);
        out.fill(0.0);
        let blocks = d / 8;
        for s in 0..slots {
            // V is prefetched here, not beside K: a task's V rows need not fit in L2.
            if s + PREFETCH_SLOTS < slots {
                let ahead = (s + PREFETCH_SLOTS) * kv_dim + g0 * d;
                prefetch_run(v_cache.as_ptr().add(ahead), run_bytes);
            }
            let v_run = &v_cache[s * kv_dim + g0 * d..s * kv_dim + g0 * d + run];
            for (h, oh) in out.chunks_exact_mut(d).enumerate() {
                let v = &v_run[(h / r) * d..(h / r + 1) * d];
                let w = scores[h * slots + s];
                let wv = _mm256_set1_ps(w);
                for b in 0..blocks {
                    let o = oh.as_mut_ptr().add(8 * b);
                    let x = L::load8(v.as_ptr().add(8 * b));
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(wv, x)));
                }
                for j in 8 * blocks..d {
                    oh[j] += w * L::widen(v[j]);
                }
            }
        }
    }
}

/// Softmax of each head's `slots` scores in place, in f32: each score becomes
/// `exp(score - max) * (1 / sum)`, the max and the sum taken in slot order.
fn softmax_rows(scores: &mut [f32], slots: usize) {
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
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend<T: KvElem>(
    shape: AttnShape,
    g0: usize,
    slots: usize,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
    scores: &mut [f32],
) {
    let d = shape.head_dim;
    let kv_dim = shape.kv_dim();
    let r = shape.group();
    let run = q.len() / r;
    let scale = 1.0 / (d as f32).sqrt();
    // Scores of every head, one pass over K.
    for s in 0..slots {
        let k_run = &k_cache[s * kv_dim + g0 * d..s * kv_dim + g0 * d + run];
        for (h, qh) in q.chunks_exact(d).enumerate() {
            scores[h * slots + s] = dot(qh, &k_run[(h / r) * d..(h / r + 1) * d]) * scale;
        }
    }
    softmax_rows(scores, slots);
    // Weighted values of every head, one pass over V.
    out.fill(0.0);
    for s in 0..slots {
        let v_run = &v_cache[s * kv_dim + g0 * d..s * kv_dim + g0 * d + run];
        for (h, oh) in out.chunks_exact_mut(d).enumerate() {
            let w = scores[h * slots + s];
            for (o, &x) in oh.iter_mut().zip(&v_run[(h / r) * d..(h / r + 1) * d]) {
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
            heads: 8,
            kv_heads: 4,
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
        let q: Vec<f32> = (0..shape.q_dim()).map(|_| 2.0 * rnd()).collect();
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for used in [1, 2, slots] {
            let mut want = vec![0f32; shape.q_dim()];
            for (g, (qs, o)) in q
                .chunks_exact(span)
                .zip(want.chunks_exact_mut(span))
                .enumerate()
            {
                attend_one_head_at_a_time(shape, g, used, qs, &k, &v, o);
            }
            // Every split of the KV heads into runs, dispatched and portable.
            for per_task in [1, 2, 4] {
                let mut got = vec![f32::NAN; shape.q_dim()];
                let mut portable = vec![f32::NAN; shape.q_dim()];
                for (t, (qs, (o, p))) in q
                    .chunks_exact(span * per_task)
                    .zip(
                        got.chunks_exact_mut(span * per_task)
                            .zip(portable.chunks_exact_mut(span * per_task)),
                    )
                    .enumerate()
                {
                    attend_heads(shape, t * per_task, used, qs, &k, &v, o);
                    let mut scores = vec![0f32; shape.group() * per_task * used];
                    attend(shape, t * per_task, used, qs, &k, &v, p, &mut scores);
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{per_task} heads per task, slots {used}"
                );
                assert_eq!(
                    bits(&portable),
                    bits(&want),
                    "portable, {per_task} per task, slots {used}"
                );
            }
            let mut one = vec![f32::NAN; span];
            attend_group(shape, 3, used, &q[3 * span..], &k, &v, &mut one);
            assert_eq!(
                bits(&one),
                bits(&want[3 * span..]),
                "attend_group, slots {used}"
            );
        }
    }

    #[test]
    fn decode_rows_split_over_the_threads_and_prefill_rows_stay_whole() {
        let shape = AttnShape {
            heads: 16,
            kv_heads: 8,
            head_dim: 128,
        };
        assert_eq!(kv_heads_per_task(shape, 1, 2), 4);
        assert_eq!(kv_heads_per_task(shape, 1, 1), 8);
        assert_eq!(kv_heads_per_task(shape, 2, 2), 8);
        assert_eq!(kv_heads_per_task(shape, 512, 2), 8);
        assert_eq!(kv_heads_per_task(shape, 1, 3), 2);
        assert_eq!(kv_heads_per_task(shape, 1, 64), 1);
        for rows in [1, 2, 3, 7, 100] {
            for threads in 1..10 {
                let n = kv_heads_per_task(shape, rows, threads);
                assert!(
                    8 % n == 0 && rows * (8 / n) >= threads.min(8 * rows),
                    "{rows} {threads}"
                );
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
