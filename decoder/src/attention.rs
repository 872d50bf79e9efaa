//! Causal grouped-query attention over the KV cache, softmax in f32.

use crate::kv::{KvElem, KvHeads};
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

/// Slots whose K rows one score block reads (a lane each in the SIMD path).
const SLOT_BLOCK: usize = 8;
/// Slots whose V rows one output pass keeps hot in L1 (`32 x 128` f32 = 16 KB).
const V_SLOT_BLOCK: usize = 32;

/// Attention for the query heads of the adjacent KV heads `g0 ..`, for one query row that reads slots
/// `0..slots`: `q` and `out` span those KV heads' query heads (`n * group * head_dim` for n KV heads).
pub fn attend_heads<T: KvElem>(
    shape: AttnShape,
    g0: usize,
    slots: usize,
    q: &[f32],
    kv: KvHeads<'_, T>,
    out: &mut [f32],
) {
    attend_causal(shape, g0, slots, 1, q, kv, out)
}

/// Attention for `rows` consecutive query rows over the query heads of the adjacent KV heads `g0 ..`:
/// row i reads slots `0..first_slots + i` (causal). `q` and `out` hold the rows one after another,
/// each spanning those KV heads' query heads (`n * group * head_dim` for n KV heads). The rows share
/// each block of K and V read into the cache.
///
/// Per query head and row the arithmetic is fixed, whatever the split, the rows and the build:
/// - score of slot s: `dot(q, k_s) * (1 / sqrt(d))`, the dot as [`dot`] orders it;
/// - softmax: the max, `exp(score - max)` ([`compute::ops::mathf`]), their sum, each times `1 / sum`;
/// - output element j: `0 + p_0 v_0[j] + p_1 v_1[j] + ...` in slot order (multiply, then add).
///
/// The AVX2 path computes 8 slots' dots at once and keeps blocks of outputs in registers, with the
/// same operations in the same order per value, so every build gives the same bits.
pub fn attend_causal<T: KvElem>(
    shape: AttnShape,
    g0: usize,
    first_slots: usize,
    rows: usize,
    q: &[f32],
    kv: KvHeads<'_, T>,
    out: &mut [f32],
) {
    if rows == 0 {
        return;
    }
    let group_span = (shape.group() * shape.head_dim).max(1);
    assert!(
        first_slots >= 1
            && kv.head_dim == shape.head_dim
            && q.len() == out.len()
            && q.len().is_multiple_of(rows)
            && (q.len() / rows).is_multiple_of(group_span),
        "attend_causal: {rows} rows, first row reads {first_slots} slots, q {} and out {} values \
         (rows of whole KV-head groups of {group_span}), cache head dim {} for shape head dim {}",
        q.len(),
        out.len(),
        kv.head_dim,
        shape.head_dim
    );
    let block = Block {
        g0,
        first_slots,
        rows,
    };
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        let need = rows * shape.group() * block.max_slots();
        if scores.len() < need {
            scores.resize(need, 0.0);
        }
        let scores = &mut scores[..need];
        #[cfg(target_arch = "x86_64")]
        if compute::kernels::Isa::Avx2.is_available() {
            // SAFETY: the CPU reported AVX2 and FMA; `kv.head_dim == shape.head_dim` and the
            // q/out lengths were asserted above, and `KvHeads::k_head`/`v_head` bound the slots.
            unsafe { attend_avx2(shape, block, q, kv, out, scores) };
            return;
        }
        attend(shape, block, q, kv, out, scores);
    });
}

/// The rows and heads one call attends (see [`attend_causal`]).
#[derive(Clone, Copy, Debug)]
struct Block {
    g0: usize,
    first_slots: usize,
    rows: usize,
}

impl Block {
    /// Slots the last row reads.
    fn max_slots(&self) -> usize {
        self.first_slots + self.rows - 1
    }
    /// Slots row i reads.
    fn slots(&self, i: usize) -> usize {
        self.first_slots + i
    }
}

/// KV heads per parallel task when `rows` query rows are attended on `threads` threads: every KV
/// head of a row in one task once the rows alone give every thread a task; for fewer rows, the
/// largest run of adjacent heads (a divisor of the KV heads) that still does.
pub fn kv_heads_per_task(shape: AttnShape, rows: usize, threads: usize) -> usize {
    let kv = shape.kv_heads.max(1);
    let splits = threads.div_ceil(rows.max(1)).clamp(1, kv);
    (1..=kv)
        .rev()
        .find(|&n| kv.is_multiple_of(n) && kv / n >= splits)
        .unwrap_or(1)
}

/// Query rows one prefill attention task takes: they share each K/V block read (`bench attention
/// --rows` measures it).
pub const ATTN_ROW_BLOCK: usize = 16;

/// Attention for `rows` query rows of every head on `pool`'s threads, as the decoder's prefill and
/// decode run it: row i reads slots `0..start_slot + i + 1` of `cache` (written beforehand); `q` and
/// `out` hold `rows` rows of `shape.q_dim()` values. Many rows: tasks of [`ATTN_ROW_BLOCK`] rows,
/// every head; few rows: tasks of adjacent KV heads of one row ([`kv_heads_per_task`]). Every split
/// gives the same bits ([`attend_causal`]).
pub fn attend_rows_parallel<T: KvElem>(
    pool: &rayon::ThreadPool,
    shape: AttnShape,
    cache: KvHeads<'_, T>,
    start_slot: usize,
    rows: usize,
    q: &[f32],
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let q_dim = shape.q_dim();
    let per_task = kv_heads_per_task(shape, rows, pool.current_num_threads());
    pool.install(|| {
        if per_task == shape.kv_heads {
            // Enough rows for every thread: tasks of one KV head and a block of rows (sharing
            // each K/V read), KV head after KV head, so that a thread's next task reads the K/V
            // its last one left in cache (every head of a long prompt's layer is more than L3).
            let span = shape.group() * shape.head_dim;
            let blocks = rows.div_ceil(ATTN_ROW_BLOCK);
            let parts: Vec<Vec<f32>> = (0..shape.kv_heads * blocks)
                .into_par_iter()
                .map(|t| {
                    let (g, b) = (t / blocks, t % blocks);
                    let r0 = b * ATTN_ROW_BLOCK;
                    let n = ATTN_ROW_BLOCK.min(rows - r0);
                    let mut qs = Vec::with_capacity(n * span);
                    for i in r0..r0 + n {
                        qs.extend_from_slice(&q[i * q_dim + g * span..][..span]);
                    }
                    let mut o = vec![0f32; n * span];
                    attend_causal(shape, g, start_slot + r0 + 1, n, &qs, cache, &mut o);
                    o
                })
                .collect();
            out[..rows * q_dim]
                .par_chunks_mut(q_dim)
                .enumerate()
                .for_each(|(i, row)| {
                    let (b, at) = (i / ATTN_ROW_BLOCK, (i % ATTN_ROW_BLOCK) * span);
                    for (g, o) in row.chunks_exact_mut(span).enumerate() {
                        o.copy_from_slice(&parts[g * blocks + b][at..at + span]);
                    }
                });
        } else {
            // Few rows: each task takes adjacent KV heads of one row (`bench attention` measures
            // the splits).
            let span = per_task * shape.group() * shape.head_dim;
            let tasks_per_row = shape.kv_heads / per_task;
            out[..rows * q_dim]
                .par_chunks_mut(span)
                .enumerate()
                .for_each(|(t, out)| {
                    let (r, g0) = (t / tasks_per_row, (t % tasks_per_row) * per_task);
                    let qs = &q[r * q_dim + g0 * span / per_task..][..span];
                    attend_heads(shape, g0, start_slot + r + 1, qs, cache, out);
                });
        }
    });
}

/// [`attend`] with explicit 8-lane AVX2 loops for f32 and bf16 caches.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and `kv.head_dim` must equal `shape.head_dim`: the loops step
/// K and V rows by `shape.head_dim` inside the slices `k_head`/`v_head` check with `kv.head_dim`
/// ([`simd::attend`]). (The lengths of `q`, `out` and `scores` are asserted.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2<T: KvElem>(
    shape: AttnShape,
    block: Block,
    q: &[f32],
    kv: KvHeads<'_, T>,
    out: &mut [f32],
    scores: &mut [f32],
) {
    use simd::{cast, Bf16Lanes, F32Lanes};
    if let Some(c) = cast::<T, f32>(kv) {
        simd::attend::<F32Lanes>(shape, block, q, c, out, scores)
    } else if let Some(c) = cast::<T, bf16>(kv) {
        simd::attend::<Bf16Lanes>(shape, block, q, c, out, scores)
    } else {
        attend(shape, block, q, kv, out, scores)
    }
}

#[cfg(target_arch = "x86_64")]
mod simd;

#[cfg(test)]
mod exact_tests;

/// Softmax of one head's scores in place, in f32: each score becomes `exp(score - max) * (1 / sum)`,
/// with [`compute::ops::mathf`]'s exp and its order of the sum.
pub(crate) fn softmax(scores: &mut [f32]) {
    let max = compute::ops::mathf::max(scores);
    let inv = 1.0 / compute::ops::mathf::exp_shifted_sum(scores, max);
    for p in scores.iter_mut() {
        *p *= inv;
    }
}

/// The portable path: one row and query head at a time, in the order [`attend_causal`] fixes.
fn attend<T: KvElem>(
    shape: AttnShape,
    b: Block,
    q: &[f32],
    kv: KvHeads<'_, T>,
    out: &mut [f32],
    scores: &mut [f32],
) {
    let d = shape.head_dim;
    let r = shape.group();
    let scale = 1.0 / (d as f32).sqrt();
    let span = q.len() / b.rows;
    for (i, (qi, oi)) in q
        .chunks_exact(span)
        .zip(out.chunks_exact_mut(span))
        .enumerate()
    {
        let slots = b.slots(i);
        let scores = &mut scores[..slots];
        for (h, (qh, oh)) in qi.chunks_exact(d).zip(oi.chunks_exact_mut(d)).enumerate() {
            let k = kv.k_head(b.g0 + h / r, slots);
            for (score, ks) in scores.iter_mut().zip(k.chunks_exact(d)) {
                *score = dot(qh, ks) * scale;
            }
            softmax(scores);
            let v = kv.v_head(b.g0 + h / r, slots);
            oh.fill(0.0);
            for (&w, vs) in scores.iter().zip(v.chunks_exact(d)) {
                for (o, &x) in oh.iter_mut().zip(vs) {
                    *o += w * x.to_f32();
                }
            }
        }
    }
}

/// Lane i accumulates elements i, i+8, ... (multiply, then add); lanes 0..7 are added in order
/// (starting from lane 0); then the elements past the last multiple of 8, in order.
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
    let mut sum = compute::ops::mathf::sum_lanes(&acc);
    for (a, b) in qc.remainder().iter().zip(kc.remainder()) {
        sum += a * b.to_f32();
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// The attention as first written: one head at a time, every value in the documented order,
    /// reading a row-major `[slot][kv_head][d]` cache (the layout is the test's, not the decoder's).
    fn attend_one_head_at_a_time<T: KvElem>(
        shape: AttnShape,
        g: usize,
        slots: usize,
        q: &[f32],
        k_rows: &[T],
        v_rows: &[T],
        out: &mut [f32],
    ) {
        let (d, kv_dim) = (shape.head_dim, shape.kv_dim());
        let scale = 1.0 / (d as f32).sqrt();
        let mut scores = vec![0f32; slots];
        for (qh, oh) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mut max = f32::NEG_INFINITY;
            for (s, score) in scores.iter_mut().enumerate() {
                let v = dot(qh, &k_rows[s * kv_dim + g * d..s * kv_dim + (g + 1) * d]) * scale;
                *score = v;
                max = max.max(v);
            }
            let inv = 1.0 / compute::ops::mathf::exp_shifted_sum(&mut scores, max);
            oh.fill(0.0);
            for (s, &p) in scores.iter().enumerate() {
                let w = p * inv;
                let v = &v_rows[s * kv_dim + g * d..s * kv_dim + (g + 1) * d];
                for (o, &x) in oh.iter_mut().zip(v) {
                    *o += w * x.to_f32();
                }
            }
        }
    }

    /// A head-major store (capacity `cap`, one layer) holding row-major `k_rows`/`v_rows`.
    fn store_of<T: KvElem>(
        shape: AttnShape,
        cap: usize,
        k_rows: &[T],
        v_rows: &[T],
    ) -> crate::kv::KvStore<T> {
        let kv_dim = shape.kv_dim();
        let mut store = crate::kv::KvStore {
            k: vec![vec![T::from_f32(f32::NAN); cap * kv_dim]],
            v: vec![vec![T::from_f32(f32::NAN); cap * kv_dim]],
            capacity: cap,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
        };
        let widen = |x: &[T]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
        for s in 0..k_rows.len() / kv_dim {
            let row = s * kv_dim..(s + 1) * kv_dim;
            store.write(0, s, &widen(&k_rows[row.clone()]), &widen(&v_rows[row]));
        }
        store
    }

    /// A cache whose head dim is not the shape's is refused before any SIMD load (the AVX2 path
    /// steps rows by the shape's head dim; a smaller cache head would be read past its end).
    #[test]
    #[should_panic(expected = "cache head dim 8 for shape head dim 16")]
    fn a_cache_of_another_head_dim_is_refused() {
        let cache_shape = AttnShape {
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
        };
        let store = store_of::<f32>(cache_shape, 4, &[0.5; 8], &[0.5; 8]);
        let shape = AttnShape {
            head_dim: 16,
            ..cache_shape
        };
        let q = vec![0.1f32; 2 * 16];
        let mut out = vec![0.0f32; 2 * 16];
        attend_causal(shape, 0, 1, 1, &q, store.layer(0), &mut out);
    }

    #[test]
    fn a_cache_of_the_shapes_head_dim_is_attended() {
        // Control: the same call with matching head dims runs.
        let shape = AttnShape {
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
        };
        let store = store_of::<f32>(shape, 4, &[0.5; 8], &[0.5; 8]);
        let q = vec![0.1f32; 2 * 8];
        let mut out = vec![0.0f32; 2 * 8];
        attend_causal(shape, 0, 1, 1, &q, store.layer(0), &mut out);
        assert!(out.iter().all(|&x| x == 0.5), "{out:?}");
    }

    fn check<T: KvElem>(convert: fn(f32) -> T, head_dim: usize, heads: usize) {
        let shape = AttnShape {
            heads,
            kv_heads: 4,
            head_dim,
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
        // Capacity past the filled slots: unwritten slots hold NaN, so reading one shows.
        let store = store_of(shape, slots + 5, &k, &v);
        let cache = store.layer(0);
        let span = shape.group() * shape.head_dim;
        let q: Vec<f32> = (0..shape.q_dim()).map(|_| 2.0 * rnd()).collect();
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for used in [1, 2, 7, 8, 9, 16, 33, slots] {
            let mut want = vec![0f32; shape.q_dim()];
            for (g, (qs, o)) in q
                .chunks_exact(span)
                .zip(want.chunks_exact_mut(span))
                .enumerate()
            {
                attend_one_head_at_a_time(shape, g, used, qs, &k, &v, o);
            }
            assert!(want.iter().all(|x| x.is_finite()));
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
                    attend_heads(shape, t * per_task, used, qs, cache, o);
                    let mut scores = vec![0f32; shape.group() * per_task * used];
                    let block = Block {
                        g0: t * per_task,
                        first_slots: used,
                        rows: 1,
                    };
                    attend(shape, block, qs, cache, p, &mut scores);
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "d {head_dim}, {heads} heads: {per_task} KV heads per task, slots {used}"
                );
                assert_eq!(
                    bits(&portable),
                    bits(&want),
                    "portable, d {head_dim}: {per_task} per task, slots {used}"
                );
            }
            let mut one = vec![f32::NAN; span];
            attend_heads(shape, 3, used, &q[3 * span..], cache, &mut one);
            assert_eq!(
                bits(&one),
                bits(&want[3 * span..]),
                "one KV head, slots {used}"
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
        // head_dim 128 (the 2B's), 20 (a tail past the 8-lane blocks), 36 (4 + 0 + tail column
        // blocks), 4 (no whole block); 1, 2 and 3 query heads per KV head (an odd head out).
        for (d, heads) in [(128, 8), (20, 8), (36, 12), (4, 4), (24, 8)] {
            check::<f32>(|x| x, d, heads);
            check::<bf16>(bf16::from_f32, d, heads);
        }
    }

    /// Many rows at once (causal: row i reads `first + i` slots) give each row's one-row bits, in
    /// every build and split; the control (every row reading one slot more) differs.
    #[test]
    fn causal_rows_give_the_one_row_bits() {
        for (d, heads, kv_heads) in [(128, 16, 8), (20, 6, 2), (12, 4, 4)] {
            let shape = AttnShape {
                heads,
                kv_heads,
                head_dim: d,
            };
            let cap = 45;
            let mut seed = 5u32;
            let mut rnd = || {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 8) as f32 / (1 << 23) as f32 - 1.0
            };
            let k: Vec<f32> = (0..cap * shape.kv_dim()).map(|_| 2.0 * rnd()).collect();
            let v: Vec<f32> = (0..cap * shape.kv_dim()).map(|_| rnd()).collect();
            let store = store_of(shape, cap + 3, &k, &v);
            let cache = store.layer(0);
            let q_dim = shape.q_dim();
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            for (first, rows) in [(1, 1), (1, 9), (5, 7), (8, 17), (30, 16), (3, 43)] {
                let q: Vec<f32> = (0..rows * q_dim).map(|_| rnd()).collect();
                let mut want = vec![f32::NAN; rows * q_dim];
                for (i, (qi, oi)) in q
                    .chunks_exact(q_dim)
                    .zip(want.chunks_exact_mut(q_dim))
                    .enumerate()
                {
                    attend_heads(shape, 0, first + i, qi, cache, oi);
                }
                let mut got = vec![f32::NAN; rows * q_dim];
                attend_causal(shape, 0, first, rows, &q, cache, &mut got);
                assert_eq!(bits(&got), bits(&want), "d {d}: first {first}, {rows} rows");
                // A run of KV heads, rows together, portable too.
                let per = (kv_heads / 2).max(1);
                let span = per * shape.group() * d;
                let qs: Vec<f32> = q
                    .chunks_exact(q_dim)
                    .flat_map(|r| r[span..2 * span].to_vec())
                    .collect();
                let mut run = vec![f32::NAN; rows * span];
                let mut portable = vec![f32::NAN; rows * span];
                attend_causal(shape, per, first, rows, &qs, cache, &mut run);
                let mut scores = vec![0f32; rows * shape.group() * (first + rows - 1)];
                let block = Block {
                    g0: per,
                    first_slots: first,
                    rows,
                };
                attend(shape, block, &qs, cache, &mut portable, &mut scores);
                let want_run: Vec<f32> = want
                    .chunks_exact(q_dim)
                    .flat_map(|r| r[span..2 * span].to_vec())
                    .collect();
                assert_eq!(
                    bits(&run),
                    bits(&want_run),
                    "run: d {d}, first {first}, {rows} rows"
                );
                assert_eq!(
                    bits(&portable),
                    bits(&want_run),
                    "portable run: d {d}, first {first}"
                );
                // Control: one slot more per row.
                let mut over = vec![f32::NAN; rows * q_dim];
                attend_causal(shape, 0, first + 1, rows, &q, cache, &mut over);
                assert_ne!(bits(&over), bits(&want), "control: d {d}, first {first}");
            }
        }
    }

    /// Control: the same check catches a cache read at the wrong head (the row-major index on a
    /// head-major cache) — the outputs differ.
    #[test]
    fn a_wrong_head_read_is_caught() {
        let shape = AttnShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let k: Vec<f32> = (0..3 * 16).map(|i| (i % 5) as f32 - 2.0).collect();
        let v: Vec<f32> = (0..3 * 16).map(|i| (i % 7) as f32).collect();
        let store = store_of(shape, 3, &k, &v);
        let q: Vec<f32> = (0..16).map(|i| 0.25 * (i % 3) as f32).collect();
        let mut want = vec![0f32; 16];
        attend_one_head_at_a_time(shape, 1, 3, &q, &k, &v, &mut want);
        let mut got = vec![0f32; 16];
        attend_heads(shape, 1, 3, &q, store.layer(0), &mut got);
        assert_eq!(got, want);
        attend_heads(shape, 0, 3, &q, store.layer(0), &mut got);
        assert_ne!(got, want, "head 0 must not read like head 1");
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
        let store = store_of(shape, 2, &k, &v);
        let cache = store.layer(0);
        let q = vec![0.5f32; 4];
        let mut out = vec![0.0f32; 4];
        attend_heads(shape, 1, 1, &q, cache, &mut out);
        assert_eq!(out, vec![10.0; 4]);
        // Equal scores over two slots: the mean of the group's values.
        attend_heads(shape, 0, 2, &q, cache, &mut out);
        assert_eq!(out, vec![2.0; 4]);
        // Control: reading kv head 1 for group 0 gives another answer.
        attend_heads(shape, 1, 2, &q, cache, &mut out);
        assert_eq!(out, vec![20.0; 4]);
    }
}
