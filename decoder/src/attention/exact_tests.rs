//! The decoder's split of the rows and heads over the threads ([`attend_rows_parallel`]) gives,
//! for every row and query head, [`compute::attention::oracle::attend_row`]'s bits over the slots
//! the row reads, for caches of f32 and bf16: contexts that are no multiple of the key tiles, one
//! row (decode), a few (draft windows) and several row blocks (prefill), groups of 1 to 3 query
//! heads per KV head, 1 to 3 threads. So a prompt's rows get the same bits batched or stepwise.
//! Controls: a row reading one slot more, and a row reading its KV head's neighbour, are caught.

use super::tests::store_of;
use super::*;
use crate::kv::KvStore;
use compute::attention::{oracle, padded_dim, PackedKv, KEY_TILE};
use half::bf16;

fn random(seed: u32) -> impl FnMut() -> f32 {
    let mut seed = seed;
    move || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / (1 << 23) as f32 - 1.0
    }
}

/// One layer of `cap` slots, the first `filled` written with random K (±3) and V (±1), the rest NaN
/// (so a read past the causal end shows).
fn random_store<T: KvElem>(shape: AttnShape, cap: usize, filled: usize, seed: u32) -> KvStore<T> {
    let mut rnd = random(seed);
    let k: Vec<f32> = (0..filled * shape.kv_dim()).map(|_| 3.0 * rnd()).collect();
    let v: Vec<f32> = (0..filled * shape.kv_dim()).map(|_| rnd()).collect();
    store_of(shape, cap, &k, &v)
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|f| f.to_bits()).collect()
}

/// Every row (row i reads slots `0 .. start + 1 + i`) and query head through the oracle, query
/// head h reading KV head `h / group + shift` (`shift` 1: a control reading the neighbour).
fn oracle_rows<T: KvElem>(
    shape: AttnShape,
    cache: KvHeads<'_, T>,
    start: usize,
    q: &[f32],
    shift: usize,
) -> Vec<f32> {
    let (d, q_dim) = (shape.head_dim, shape.q_dim());
    let dp = padded_dim(d);
    let head = HeadShape::new(d);
    let mut out = vec![f32::NAN; q.len()];
    for (i, (qi, oi)) in q
        .chunks_exact(q_dim)
        .zip(out.chunks_exact_mut(q_dim))
        .enumerate()
    {
        let len = start + 1 + i;
        for (h, (qh, oh)) in qi.chunks_exact(d).zip(oi.chunks_exact_mut(d)).enumerate() {
            let g = (h / shape.group() + shift) % shape.kv_heads;
            let (k, v) = (cache.k_rows(g, len), cache.v_head(g, len));
            let mut kt = vec![0f32; len.div_ceil(KEY_TILE) * d * KEY_TILE];
            let mut vp = vec![0f32; len * dp];
            for j in 0..len {
                for c in 0..d {
                    kt[(j / KEY_TILE) * d * KEY_TILE + c * KEY_TILE + j % KEY_TILE] =
                        k[j * d + c].to_f32();
                    vp[j * dp + c] = v[j * d + c].to_f32();
                }
            }
            let kv = PackedKv {
                kt: &kt,
                v: &vp,
                len,
            };
            oracle::attend_row(head, qh, kv, oh);
        }
    }
    out
}

fn check<T: KvElem + CacheValue>(
    pools: &[rayon::ThreadPool],
    d: usize,
    heads: usize,
    kv_heads: usize,
) {
    let shape = AttnShape {
        heads,
        kv_heads,
        head_dim: d,
    };
    for start in [0, 1, 7, 63, 64, 100] {
        for rows in [1, 3, 19, 2 * ATTN_ROW_BLOCK + 5] {
            let seed = (d * 1000 + start * 10 + rows) as u32;
            let store = random_store::<T>(shape, start + rows + 3, start + rows, seed);
            let cache = store.layer(0);
            let mut rnd = random(seed ^ 0x5555);
            let q: Vec<f32> = (0..rows * shape.q_dim()).map(|_| 2.0 * rnd()).collect();
            let want = oracle_rows(shape, cache, start, &q, 0);
            assert!(want.iter().all(|x| x.is_finite()));
            let what = format!(
                "{} cache, d {d}, {heads}/{kv_heads} heads, start {start}, {rows} rows",
                std::any::type_name::<T>()
            );
            for pool in pools {
                let mut got = vec![f32::NAN; q.len()];
                attend_rows_parallel(pool, shape, cache, start, rows, &q, &mut got);
                let threads = pool.current_num_threads();
                assert_eq!(bits(&got), bits(&want), "{what}, {threads} threads");
            }
            // Control: every row reading one slot more gives other bits.
            let mut over = vec![f32::NAN; q.len()];
            attend_rows_parallel(&pools[0], shape, cache, start + 1, rows, &q, &mut over);
            assert_ne!(bits(&over), bits(&want), "control (one slot more): {what}");
            if kv_heads > 1 {
                let neighbour = oracle_rows(shape, cache, start, &q, 1);
                assert_ne!(bits(&neighbour), bits(&want), "control (neighbour): {what}");
            }
        }
    }
}

fn pools() -> Vec<rayon::ThreadPool> {
    (1..=3)
        .map(|n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect()
}

#[test]
fn every_split_gives_the_oracle_bits_for_every_row() {
    let pools = pools();
    // 128 (the 2B's and Qwen3.5's head dim), 64, and 72 and 20 (padded value columns); groups
    // of 2, 3 and 1.
    for (d, heads, kv_heads) in [
        (128, 16, 8),
        (128, 6, 2),
        (64, 3, 1),
        (72, 4, 2),
        (20, 4, 4),
    ] {
        check::<f32>(&pools, d, heads, kv_heads);
        check::<bf16>(&pools, d, heads, kv_heads);
    }
}

/// A prompt's rows attended together (a prefill) and one after another (decode steps) give the
/// same bits; control: the stepwise rows reading one slot more differ.
#[test]
fn prefill_rows_give_the_decode_steps_bits() {
    let pools = pools();
    let shape = AttnShape {
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
    };
    let rows = 150;
    let store = random_store::<f32>(shape, rows + 1, rows, 3);
    let cache = store.layer(0);
    let mut rnd = random(4);
    let q: Vec<f32> = (0..rows * shape.q_dim()).map(|_| rnd()).collect();
    let mut prefill = vec![f32::NAN; q.len()];
    attend_rows_parallel(&pools[1], shape, cache, 0, rows, &q, &mut prefill);
    let q_dim = shape.q_dim();
    for late in [0, 1] {
        let mut steps = vec![f32::NAN; q.len()];
        for i in 0..rows - late {
            let (qi, oi) = (&q[i * q_dim..][..q_dim], &mut steps[i * q_dim..][..q_dim]);
            attend_rows_parallel(&pools[1], shape, cache, i + late, 1, qi, oi);
        }
        let n = (rows - late) * q_dim;
        if late == 0 {
            assert_eq!(bits(&steps[..n]), bits(&prefill[..n]));
        } else {
            assert_ne!(bits(&steps[..n]), bits(&prefill[..n]), "control");
        }
    }
}
