//! Causal grouped-query attention over the KV cache, softmax in f32, on
//! [`compute::attention::causal`]: the tiled online-softmax kernel the vision tower runs, with
//! key tiles at absolute cache slots, so a row's bits are fixed by its query and the slots it
//! reads, whatever rows, sequences or threads share the call.

use crate::kv::{KvElem, KvHeads};
use compute::attention::causal::{CacheValue, CausalBlock, CausalScratch, Keys};
use compute::attention::HeadShape;
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
    // Per-thread running state and packed tile, grown to the largest block seen: no allocation
    // per step.
    static SCRATCH: RefCell<CausalScratch> = RefCell::new(CausalScratch::default());
}

/// Attention for the query heads of the adjacent KV heads `g0 ..`, for one query row that reads slots
/// `0..slots`: `q` and `out` span those KV heads' query heads (`n * group * head_dim` for n KV heads).
pub fn attend_heads<T: KvElem + CacheValue>(
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
/// each spanning those KV heads' query heads (`n * group * head_dim` for n KV heads). The rows and
/// the group's query heads share each tile of K and V read from the cache.
///
/// Per query head and row the arithmetic is [`compute::attention`]'s (its module docs): scores
/// `fma`-summed over the head dim times `head_dim^−½`, an online softmax over tiles of
/// [`compute::attention::KEY_TILE`] slots at absolute slot positions, `p · V` fused, one division
/// at the end; a bf16 cache's values widened exactly. Every path this CPU runs gives the same bits.
pub fn attend_causal<T: KvElem + CacheValue>(
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
    let d = shape.head_dim;
    let group_span = (shape.group() * d).max(1);
    assert!(
        first_slots >= 1
            && kv.head_dim == d
            && q.len() == out.len()
            && q.len().is_multiple_of(rows)
            && (q.len() / rows).is_multiple_of(group_span),
        "attend_causal: {rows} rows, first row reads {first_slots} slots, q {} and out {} values \
         (rows of whole KV-head groups of {group_span}), cache head dim {} for shape head dim {d}",
        q.len(),
        out.len(),
        kv.head_dim,
    );
    let row_span = q.len() / rows;
    for n in 0..row_span / group_span {
        let at = n * group_span;
        let (q, out) = ((&q[at..], row_span), (&mut out[at..], row_span));
        attend_group(shape, g0 + n, first_slots, rows, q, out, kv);
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
pub fn attend_rows_parallel<T: KvElem + CacheValue>(
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
                    let qs = &q[r0 * q_dim + g * span..(r0 + n - 1) * q_dim + (g + 1) * span];
                    let mut o = vec![0f32; n * span];
                    let first = start_slot + r0 + 1;
                    attend_group(shape, g, first, n, (qs, q_dim), (&mut o, span), cache);
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

/// [`attend_causal`] for one KV head's group: `rows` rows whose group queries start `q_stride`
/// apart in `q` and whose outputs go `out_stride` apart in `out`.
fn attend_group<T: KvElem + CacheValue>(
    shape: AttnShape,
    g: usize,
    first_slots: usize,
    rows: usize,
    (q, q_stride): (&[f32], usize),
    (out, out_stride): (&mut [f32], usize),
    kv: KvHeads<'_, T>,
) {
    assert!(
        kv.head_dim == shape.head_dim,
        "attend_group: cache head dim {} for shape head dim {}",
        kv.head_dim,
        shape.head_dim
    );
    let block = CausalBlock {
        q,
        q_stride,
        out,
        out_stride,
        positions: rows,
        heads: shape.group(),
        first_len: first_slots,
    };
    let last = block.last_len();
    let (k, v) = (Keys::Tiles(kv.k_tiles(g, last)), kv.v_head(g, last));
    let head = HeadShape::new(shape.head_dim);
    SCRATCH.with(|cell| {
        compute::attention::causal::attend_causal(head, k, v, block, &mut cell.borrow_mut())
    });
}

#[cfg(test)]
mod exact_tests;

/// Softmax of one slice in place, in f32: each value becomes `exp(x - max) * (1 / sum)`, with
/// [`compute::ops::mathf`]'s exp and its order of the sum (the MoE router's).
pub(crate) fn softmax(scores: &mut [f32]) {
    let max = compute::ops::mathf::max(scores);
    let inv = 1.0 / compute::ops::mathf::exp_shifted_sum(scores, max);
    for p in scores.iter_mut() {
        *p *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head-major store (capacity `cap`, one layer) holding row-major `k_rows`/`v_rows`
    /// (`[slot][kv_head][d]`); unwritten slots NaN.
    pub(super) fn store_of<T: KvElem>(
        shape: AttnShape,
        cap: usize,
        k_rows: &[f32],
        v_rows: &[f32],
    ) -> crate::kv::KvStore<T> {
        let kv_dim = shape.kv_dim();
        let nan = T::from_f32(f32::NAN);
        let mut store = crate::kv::filled_store(1, cap, shape.kv_heads, shape.head_dim, nan);
        for s in 0..k_rows.len() / kv_dim {
            let row = s * kv_dim..(s + 1) * kv_dim;
            store.write(0, s, &k_rows[row.clone()], &v_rows[row]);
        }
        store
    }

    /// A cache whose head dim is not the shape's is refused before the kernel reads it.
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

    /// Control: reading another KV head for a group (the row-major index on the head-major
    /// cache) gives other outputs.
    #[test]
    fn a_wrong_head_read_is_caught() {
        let shape = AttnShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let k: Vec<f32> = (0..3 * 16).map(|i| (i % 5) as f32 - 2.0).collect();
        let v: Vec<f32> = (0..3 * 16).map(|i| (i % 7) as f32).collect();
        let store = store_of::<f32>(shape, 3, &k, &v);
        let q: Vec<f32> = (0..16).map(|i| 0.25 * (i % 3) as f32).collect();
        let mut head1 = vec![0f32; 16];
        attend_heads(shape, 1, 3, &q, store.layer(0), &mut head1);
        let mut head0 = vec![0f32; 16];
        attend_heads(shape, 0, 3, &q, store.layer(0), &mut head0);
        assert_ne!(head0, head1, "head 0 must not read like head 1");
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
        let store = store_of::<f32>(shape, 2, &k, &v);
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
