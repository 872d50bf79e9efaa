//! The segment mask: every row attends all rows of its own segment (one image of the vision
//! tower: transformers' `cu_seqlens`), every head.
//!
//! K and V are first packed per head (K transposed in key tiles, V in rows padded to
//! [`COLUMN_PAD`](super::COLUMN_PAD)); then each task takes a block of [`BLOCK_ROWS`] query rows of
//! one segment and one head, and walks the segment's key tiles (`attend_block`). A block reads
//! its head's K and V once from memory; its rows share every tile from L1. A task takes one head,
//! not all: 784 rows make 13 blocks, which left one of 2 threads idle for a block's time.

use super::{
    attend_block, padded_dim, AttnPath, BlockState, HeadShape, PackedKv, Planted, QueryBlock,
    KEY_TILE,
};
use rayon::prelude::*;
use std::cell::RefCell;

/// Query rows one task takes (they share each key tile read).
pub const BLOCK_ROWS: usize = 64;

/// Packed K and V of every head, sized to the largest call seen (no allocation per layer).
#[derive(Default)]
pub struct SegmentScratch {
    kt: Vec<f32>,
    v: Vec<f32>,
    oh: Vec<f32>,
}

thread_local! {
    static STATE: RefCell<BlockState> = RefCell::new(BlockState::default());
}

/// How a call walks the work (the tests run other block sizes, paths and planted mistakes and
/// expect the bits the row's arithmetic fixes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub path: AttnPath,
    pub block_rows: usize,
    pub planted: Planted,
}

impl Plan {
    fn for_this_cpu() -> Plan {
        Plan {
            path: AttnPath::best(),
            block_rows: BLOCK_ROWS,
            planted: Planted::default(),
        }
    }
}

/// `out[r, h·d..]` for every row r of `qkv` (`[rows, 3·heads·d]`: q, k, v of every head) and head
/// h: attention over the rows of the segment (`(first row, rows)`, ascending, covering every
/// row) holding r, with the arithmetic of the module docs of `attention`. Runs on the current
/// rayon pool.
pub fn attend_segments(
    qkv: &[f32],
    heads: usize,
    d: usize,
    segments: &[(usize, usize)],
    scratch: &mut SegmentScratch,
    out: &mut [f32],
) {
    attend_planned(qkv, heads, d, segments, scratch, out, Plan::for_this_cpu())
}

pub(crate) fn attend_planned(
    qkv: &[f32],
    heads: usize,
    d: usize,
    segments: &[(usize, usize)],
    scratch: &mut SegmentScratch,
    out: &mut [f32],
    plan: Plan,
) {
    let hidden = heads * d;
    let rows = out.len() / hidden.max(1);
    assert!(
        qkv.len() == rows * 3 * hidden && out.len() == rows * hidden,
        "attend_segments: qkv {} and out {} values for {heads} heads of {d}",
        qkv.len(),
        out.len()
    );
    let mut at = 0;
    for &(start, len) in segments {
        assert!(
            start == at && len > 0,
            "attend_segments: segments {segments:?} do not cover {rows} rows in order"
        );
        at += len;
    }
    assert_eq!(
        at, rows,
        "attend_segments: segments {segments:?} for {rows} rows"
    );
    let dp = padded_dim(d);
    let shape = HeadShape::new(d);
    // Per head: every segment's key tiles one after another, then the values of every row.
    let tile_floats = d * KEY_TILE;
    let tiles_before: Vec<usize> = segments
        .iter()
        .scan(0, |n, &(_, len)| {
            *n += len.div_ceil(KEY_TILE);
            Some(*n - len.div_ceil(KEY_TILE))
        })
        .collect();
    let tiles: usize = segments.iter().map(|s| s.1.div_ceil(KEY_TILE)).sum();
    let (kt_head, v_head) = (tiles * tile_floats, rows * dp);
    let SegmentScratch { kt, v, oh } = scratch;
    for (buf, n) in [
        (&mut *kt, heads * kt_head),
        (&mut *v, heads * v_head),
        (&mut *oh, rows * hidden),
    ] {
        if buf.len() < n {
            buf.resize(n, 0.0);
        }
    }
    let (kt, v) = (&mut kt[..heads * kt_head], &mut v[..heads * v_head]);
    kt.par_chunks_mut(kt_head.max(1))
        .zip(v.par_chunks_mut(v_head.max(1)))
        .enumerate()
        .for_each(|(h, (kt, v))| {
            let element =
                |r: usize, part: usize| &qkv[r * 3 * hidden + part * hidden + h * d..][..d];
            for (&(start, len), &before) in segments.iter().zip(&tiles_before) {
                let seg = &mut kt[before * tile_floats..][..len.div_ceil(KEY_TILE) * tile_floats];
                for (t, tile) in seg.chunks_exact_mut(tile_floats).enumerate() {
                    let w = (len - t * KEY_TILE).min(KEY_TILE);
                    for j in 0..KEY_TILE {
                        if j < w {
                            for (c, &x) in element(start + t * KEY_TILE + j, 1).iter().enumerate() {
                                tile[c * KEY_TILE + j] = x;
                            }
                        } else {
                            for c in 0..d {
                                tile[c * KEY_TILE + j] = 0.0;
                            }
                        }
                    }
                }
            }
            for (r, row) in v.chunks_exact_mut(dp).enumerate() {
                row[..d].copy_from_slice(element(r, 2));
                row[d..].fill(0.0);
            }
        });
    let (kt, v) = (&*kt, &*v);
    // Tasks: a head and a block of query rows, none across a segment's end, head after head (a
    // thread's next task reads the K/V its last one left in cache); each writes its rows of the
    // head-major outputs `oh[h][r]`.
    let step = plan.block_rows.max(1);
    let blocks: Vec<(usize, usize, usize)> = segments
        .iter()
        .enumerate()
        .flat_map(|(s, &(start, len))| {
            (start..start + len)
                .step_by(step)
                .map(move |r0| (s, r0, (r0 + step).min(start + len)))
        })
        .collect();
    let oh = &mut oh[..heads * rows * d];
    let mut rest = &mut *oh;
    let mut tasks = Vec::with_capacity(heads * blocks.len());
    for h in 0..heads {
        for &(s, r0, r1) in &blocks {
            let (o, tail) = std::mem::take(&mut rest).split_at_mut((r1 - r0) * d);
            tasks.push((h, s, r0, r1, o));
            rest = tail;
        }
    }
    tasks.into_par_iter().for_each(|(h, s, r0, r1, out)| {
        let (start, len) = segments[s];
        let kv = PackedKv {
            kt: &kt[h * kt_head + tiles_before[s] * tile_floats..]
                [..len.div_ceil(KEY_TILE) * tile_floats],
            v: &v[h * v_head + start * dp..][..len * dp],
            len,
        };
        let block = QueryBlock {
            q: &qkv[r0 * 3 * hidden + h * d..(r1 - 1) * 3 * hidden + h * d + d],
            q_stride: 3 * hidden,
            rows: r1 - r0,
            out,
            out_stride: d,
        };
        STATE.with(|state| {
            attend_block(
                plan.path,
                shape,
                kv,
                block,
                &mut state.borrow_mut(),
                plan.planted,
            )
        });
    });
    // Back to rows: out[r, h·d..] = oh[h, r].
    let oh = &*oh;
    out.par_chunks_mut(hidden).enumerate().for_each(|(r, o)| {
        for (h, oc) in o.chunks_exact_mut(d).enumerate() {
            oc.copy_from_slice(&oh[(h * rows + r) * d..][..d]);
        }
    });
}
