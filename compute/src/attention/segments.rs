//! The segment mask: every row attends all rows of its own segment (one image of the vision
//! tower: transformers' `cu_seqlens`), every head.
//!
//! K and V are first packed per head (K transposed in key tiles, V in rows padded to
//! [`COLUMN_PAD`](super::COLUMN_PAD)); then each task takes a block of [`BLOCK_ROWS`] query rows of
//! one segment and one head, and walks the segment's key tiles (`attend_block`). A block reads
//! its head's K and V once from memory; its rows share every tile from L1. A task takes one head,
//! not all: 784 rows make 13 blocks, which left one of 2 threads idle for a block's time.

use super::bf16::{pack_tile, tile_sizes, PackedKvBf16};
use super::{
    attend_block, attend_block_bf16, padded_dim, AttnPath, BlockState, HeadShape, Operands,
    PackedKv, Planted, QueryBlock, KEY_TILE,
};
use half::bf16;
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
    kb: Vec<bf16>,
    vb: Vec<bf16>,
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
/// row) holding r, with the arithmetic of the module docs of `attention` (f32 operands) or of
/// `attention::bf16` (bf16 operands, d even). Runs on the current rayon pool.
pub fn attend_segments(
    qkv: &[f32],
    heads: usize,
    d: usize,
    segments: &[(usize, usize)],
    operands: Operands,
    scratch: &mut SegmentScratch,
    out: &mut [f32],
) {
    let plan = Plan::for_this_cpu();
    attend_planned(qkv, heads, d, segments, operands, scratch, out, plan)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_planned(
    qkv: &[f32],
    heads: usize,
    d: usize,
    segments: &[(usize, usize)],
    operands: Operands,
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
    let element =
        |r: usize, part: usize, h: usize| &qkv[r * 3 * hidden + part * hidden + h * d..][..d];
    let (kt_head, v_head) = match operands {
        Operands::F32 => (tiles * tile_floats, rows * dp),
        Operands::Bf16 => (tiles * tile_sizes(d).0, tiles * tile_sizes(d).1),
    };
    let SegmentScratch { kt, v, oh, kb, vb } = scratch;
    if oh.len() < rows * hidden {
        oh.resize(rows * hidden, 0.0);
    }
    let (f32_sizes, bf16_sizes) = match operands {
        Operands::F32 => ((kt_head, v_head), (0, 0)),
        Operands::Bf16 => ((0, 0), (kt_head, v_head)),
    };
    for (buf, n) in [(&mut *kt, f32_sizes.0), (&mut *v, f32_sizes.1)] {
        if buf.len() < heads * n {
            buf.resize(heads * n, 0.0);
        }
    }
    for (buf, n) in [(&mut *kb, bf16_sizes.0), (&mut *vb, bf16_sizes.1)] {
        if buf.len() < heads * n {
            buf.resize(heads * n, bf16::ZERO);
        }
    }
    let (kt, v) = (
        &mut kt[..heads * f32_sizes.0],
        &mut v[..heads * f32_sizes.1],
    );
    let (kb, vb) = (
        &mut kb[..heads * bf16_sizes.0],
        &mut vb[..heads * bf16_sizes.1],
    );
    let simd = plan.path != AttnPath::Scalar && AttnPath::Avx2.is_available();
    match operands {
        Operands::F32 => kt
            .par_chunks_mut(kt_head.max(1))
            .zip(v.par_chunks_mut(v_head.max(1)))
            .enumerate()
            .for_each(|(h, (kt, v))| {
                for (&(start, len), &before) in segments.iter().zip(&tiles_before) {
                    let seg =
                        &mut kt[before * tile_floats..][..len.div_ceil(KEY_TILE) * tile_floats];
                    for (t, tile) in seg.chunks_exact_mut(tile_floats).enumerate() {
                        let w = (len - t * KEY_TILE).min(KEY_TILE);
                        let at = (start + t * KEY_TILE) * 3 * hidden + hidden + h * d;
                        let keys = &qkv[at..][..(w - 1) * 3 * hidden + d];
                        pack_key_tile(keys, (d, 3 * hidden), w, tile, simd);
                    }
                }
                for (r, row) in v.chunks_exact_mut(dp).enumerate() {
                    row[..d].copy_from_slice(element(r, 2, h));
                    row[d..].fill(0.0);
                }
            }),
        Operands::Bf16 => kb
            .par_chunks_mut(kt_head.max(1))
            .zip(vb.par_chunks_mut(v_head.max(1)))
            .enumerate()
            .for_each(|(h, (kb, vb))| {
                let (kt_tile, v_tile) = tile_sizes(d);
                for (&(start, len), &before) in segments.iter().zip(&tiles_before) {
                    for t in 0..len.div_ceil(KEY_TILE) {
                        let w = (len - t * KEY_TILE).min(KEY_TILE);
                        let at = (start + t * KEY_TILE) * 3 * hidden + hidden + h * d;
                        let n = (w - 1) * 3 * hidden + d;
                        let (keys, values) = (&qkv[at..][..n], &qkv[at + hidden..][..n]);
                        let kt = &mut kb[(before + t) * kt_tile..][..kt_tile];
                        let vt = &mut vb[(before + t) * v_tile..][..v_tile];
                        pack_tile((keys, values), (d, 3 * hidden), w, (kt, vt), simd);
                    }
                }
            }),
    }
    let (kt, v, kb, vb) = (&*kt, &*v, &*kb, &*vb);
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
        let block = QueryBlock {
            q: &qkv[r0 * 3 * hidden + h * d..(r1 - 1) * 3 * hidden + h * d + d],
            q_stride: 3 * hidden,
            rows: r1 - r0,
            out,
            out_stride: d,
        };
        let tiles = len.div_ceil(KEY_TILE);
        STATE.with(|state| {
            let state = &mut state.borrow_mut();
            match operands {
                Operands::F32 => {
                    let kv = PackedKv {
                        kt: &kt[h * kt_head + tiles_before[s] * tile_floats..]
                            [..tiles * tile_floats],
                        v: &v[h * v_head + start * dp..][..len * dp],
                        len,
                    };
                    attend_block(plan.path, shape, kv, block, state, plan.planted)
                }
                Operands::Bf16 => {
                    let (kt_tile, v_tile) = tile_sizes(d);
                    let kv = PackedKvBf16 {
                        kt: &kb[h * kt_head + tiles_before[s] * kt_tile..][..tiles * kt_tile],
                        v: &vb[h * v_head + tiles_before[s] * v_tile..][..tiles * v_tile],
                        len,
                    };
                    attend_block_bf16(plan.path, shape, kv, block, state, plan.planted)
                }
            }
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

/// `w` keys of `d` values, `stride` values apart in `keys`, into `kt` (`[d][KEY_TILE]`, key j in
/// column j; the columns past `w` zero): 8 x 8 blocks transposed in ymm registers when `simd` (the
/// CPU runs AVX2), where one value at a time, a store every 256 bytes, took about 5% of the tower's
/// f32 attention (PERF.md, "bf16 K/V read in registers"). A copy: the same floats either way.
fn pack_key_tile(keys: &[f32], (d, stride): (usize, usize), w: usize, kt: &mut [f32], simd: bool) {
    assert!(
        (1..=KEY_TILE).contains(&w)
            && keys.len() >= (w - 1) * stride + d
            && kt.len() >= d * KEY_TILE,
        "pack_key_tile: {w} keys of {d}, {stride} apart, from {} values into {}",
        keys.len(),
        kt.len()
    );
    for col in kt[..d * KEY_TILE].chunks_exact_mut(KEY_TILE) {
        col[w..].fill(0.0);
    }
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the caller's `simd` says the CPU has AVX2; keys hold w rows of d values
        // `stride` apart and kt d x KEY_TILE floats, 1 <= w <= KEY_TILE (asserted).
        unsafe { super::x86::transpose_keys_f32(keys, (d, stride), w, kt) };
        return;
    }
    let _ = simd;
    for j in 0..w {
        for (c, &x) in keys[j * stride..][..d].iter().enumerate() {
            kt[c * KEY_TILE + j] = x;
        }
    }
}
