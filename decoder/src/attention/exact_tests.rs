//! Every build of the kernels (head dim 128, 64 and any other) gives the portable path's bits, for
//! caches of f32 and bf16, through the decoder's parallel split ([`attend_rows_parallel`]): contexts
//! that are no multiple of the slot blocks, one row and several row blocks, groups of 1 to 3 query
//! heads per KV head. Controls: a row reading one slot more, and the lanes of a dot summed in
//! another order, are caught.

use super::*;
use crate::kv::{KvElem, KvStore};
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
    let kv_dim = shape.kv_dim();
    let mut store = KvStore {
        k: vec![vec![T::from_f32(f32::NAN); cap * kv_dim]],
        v: vec![vec![T::from_f32(f32::NAN); cap * kv_dim]],
        capacity: cap,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
    };
    let mut rnd = random(seed);
    for s in 0..filled {
        let k: Vec<f32> = (0..kv_dim).map(|_| 3.0 * rnd()).collect();
        let v: Vec<f32> = (0..kv_dim).map(|_| rnd()).collect();
        store.write(0, s, &k, &v);
    }
    store
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|f| f.to_bits()).collect()
}

/// The portable path over `rows` rows after `start` slots, every head.
fn portable<T: KvElem>(
    shape: AttnShape,
    cache: KvHeads<'_, T>,
    start: usize,
    rows: usize,
    q: &[f32],
) -> Vec<f32> {
    let mut out = vec![f32::NAN; q.len()];
    let mut scores = vec![0f32; rows * shape.group() * (start + rows)];
    let block = Block {
        g0: 0,
        first_slots: start + 1,
        rows,
    };
    attend(shape, block, q, cache, &mut out, &mut scores);
    out
}

fn check<T: KvElem>(pool: &rayon::ThreadPool, d: usize, heads: usize, kv_heads: usize) {
    let shape = AttnShape {
        heads,
        kv_heads,
        head_dim: d,
    };
    for start in [0, 1, 7, 8, 9, 33, 100] {
        for rows in [1, 3, 8, 19, 2 * ATTN_ROW_BLOCK + 5] {
            let seed = (d * 1000 + start * 10 + rows) as u32;
            let store = random_store::<T>(shape, start + rows + 3, start + rows, seed);
            let cache = store.layer(0);
            let mut rnd = random(seed ^ 0x5555);
            let q: Vec<f32> = (0..rows * shape.q_dim()).map(|_| 2.0 * rnd()).collect();
            let want = portable(shape, cache, start, rows, &q);
            assert!(want.iter().all(|x| x.is_finite()));
            let mut got = vec![f32::NAN; q.len()];
            attend_rows_parallel(pool, shape, cache, start, rows, &q, &mut got);
            let what = format!(
                "{} cache, d {d}, {heads}/{kv_heads} heads, start {start}, {rows} rows",
                std::any::type_name::<T>()
            );
            assert_eq!(bits(&got), bits(&want), "{what}");
            // Control: every row reading one slot more gives other bits.
            let over = portable(shape, store.layer(0), start + 1, rows, &q);
            assert_ne!(bits(&over), bits(&want), "control: {what}");
        }
    }
}

#[test]
fn every_head_dim_build_gives_the_portable_bits_in_every_row_block() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    // 128 and 64 have their own builds; 72 (9 column blocks: tiles of 2 + 2 + 2 + 2 + 1 for the
    // bf16 cache's 4 outputs, 4 + 4 + 1 for 2 or 1) and 80 (10 blocks) and 20 (a tail past the
    // 8-lane blocks) run the any-head-dim build. Groups of 2, 3 and 1 (so bf16 runs 4-output
    // value tiles and 8-query score tiles with a pair, a single output or nothing left over).
    for (d, heads, kv_heads) in [
        (128, 16, 8),
        (128, 6, 2),
        (64, 8, 4),
        (64, 3, 1),
        (72, 4, 2),
        (80, 6, 2),
        (20, 4, 4),
    ] {
        check::<f32>(&pool, d, heads, kv_heads);
        check::<bf16>(&pool, d, heads, kv_heads);
    }
}

/// One row and head in the documented order, with the 8 lane sums of every dot added in `lanes`
/// order (0..7 is the documented one).
fn one_row_lane_order(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    slots: usize,
    d: usize,
    lanes: [usize; 8],
) -> Vec<f32> {
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores: Vec<f32> = (0..slots)
        .map(|s| {
            let mut acc = [0f32; 8];
            for (e, &x) in q.iter().enumerate() {
                acc[e % 8] += x * k[s * d + e];
            }
            let mut sum = acc[lanes[0]];
            for &l in &lanes[1..] {
                sum += acc[l];
            }
            sum * scale
        })
        .collect();
    softmax(&mut scores);
    let mut out = vec![0f32; d];
    for (s, &p) in scores.iter().enumerate() {
        for (o, &x) in out.iter_mut().zip(&v[s * d..(s + 1) * d]) {
            *o += p * x;
        }
    }
    out
}

/// Control: the check sees the order of a dot's lane sums (the reversed order gives other bits).
#[test]
fn a_dot_summed_in_another_lane_order_is_caught() {
    let shape = AttnShape {
        heads: 1,
        kv_heads: 1,
        head_dim: 128,
    };
    let slots = 41;
    let store = random_store::<f32>(shape, slots, slots, 7);
    let mut rnd = random(8);
    let q: Vec<f32> = (0..128).map(|_| 2.0 * rnd()).collect();
    let mut got = vec![f32::NAN; 128];
    attend_heads(shape, 0, slots, &q, store.layer(0), &mut got);
    let (k, v) = (&store.k[0][..slots * 128], &store.v[0][..slots * 128]);
    let in_order = one_row_lane_order(&q, k, v, slots, 128, [0, 1, 2, 3, 4, 5, 6, 7]);
    let reversed = one_row_lane_order(&q, k, v, slots, 128, [7, 6, 5, 4, 3, 2, 1, 0]);
    assert_eq!(bits(&got), bits(&in_order));
    assert_ne!(bits(&got), bits(&reversed));
}
