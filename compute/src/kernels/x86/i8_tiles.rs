//! i8: register tiles of R activation rows x C weight rows over the whole K. Few rows: one weight
//! row at a time (each thread streams its rows front to back); many rows: tiles of 4 activation
//! rows x [`Dot::I8_MANY_COLS`] weight rows (4 x 4 on VNNI, `wide.rs`), or on AVX2 the i16 kernel
//! of `i8_pairs.rs`.

use super::{hsum_epi32, i8_pairs, map_n, panel_rows, Dot, GEMV_PREFETCH_MIN};
use crate::kernels::activations::SIMD_BYTES;
use crate::kernels::row_blocks::{row_blocks, INT_BLOCK_BYTES};
use crate::kernels::{Activations, PANEL};
use packs::quant;
use std::arch::x86_64::*;

/// The exact i8 dots of R rows by C weight rows; element `r * C + c`. `a` and `w` rows hold `k` codes;
/// `offsets[r]` is row r's code sum over the SIMD part of K.
///
/// # Safety
/// The CPU must support `D`'s features; every row of `a` and `w` must hold at least `k` codes (the
/// SIMD loop reads the first `k - k % 32` unchecked).
#[inline(always)]
pub(super) unsafe fn i8_tile<D: Dot, const R: usize, const C: usize>(
    a: [&[i8]; R],
    w: [&[i8]; C],
    k: usize,
    offsets: [i32; R],
) -> [[i32; C]; R] {
    let steps = k / SIMD_BYTES;
    // SAFETY: `D`'s features, which the caller guarantees; each load reads codes `off..off + 32`
    // with `off + 32 <= k`, inside every row by this function's contract.
    let acc = unsafe {
        let mut acc = [[_mm256_setzero_si256(); C]; R];
        for s in 0..steps {
            let off = s * SIMD_BYTES;
            for c in 0..C {
                let wv = _mm256_loadu_si256(w[c].as_ptr().add(off) as *const __m256i);
                let wu = D::i8_weight(wv);
                for r in 0..R {
                    let av = _mm256_loadu_si256(a[r].as_ptr().add(off) as *const __m256i);
                    acc[r][c] = D::i8_dot(acc[r][c], wu, wv, av);
                }
            }
        }
        acc
    };
    let tail = steps * SIMD_BYTES;
    let mut sums = [[0i32; C]; R];
    for r in 0..R {
        for c in 0..C {
            // SAFETY: `D`'s features include AVX2.
            let mut v = unsafe { hsum_epi32(acc[r][c]) } - D::I8_OFFSET * offsets[r];
            for j in tail..k {
                v += a[r][j] as i32 * w[c][j] as i32;
            }
            sums[r][c] = v;
        }
    }
    sums
}

/// [`i8_tile`] for one activation row and one weight row, prefetching the weight stream: at each
/// 64 bytes `off` of the row it fetches the line at address `pf + off` (the caller's distance ahead
/// of the row; a prefetch never faults, even past the weight). The same sum as
/// `i8_tile::<D, 1, 1>` (integer adds, in any order the same). The prefetch measured 6-9% less time
/// per i8 decode token.
///
/// # Safety
/// The CPU must support `D`'s features. (The row lengths are asserted; `pf` may be any address.)
#[inline(always)]
unsafe fn i8_row_dot<D: Dot>(a: &[i8], w: &[i8], k: usize, offset: i32, pf: usize) -> i32 {
    // The unchecked loads below read `k` codes of each row.
    assert!(
        a.len() >= k && w.len() >= k,
        "i8 GEMV: a row is shorter than K"
    );
    let steps = k / SIMD_BYTES;
    let (ap, wp) = (a.as_ptr(), w.as_ptr());
    // SAFETY: `D`'s features, which the caller guarantees; every load reads 32 codes at `off` with
    // `off + 32 <= steps * 32 <= k`, inside both rows (asserted above); a prefetch never faults.
    unsafe {
        // Two steps (one cache line) per iteration into two named accumulators: indexed by `s % 2`,
        // LLVM kept them on the stack, a load and a store per step (seen in `perf annotate`).
        let (mut acc0, mut acc1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let mut off = 0;
        while off + 2 * SIMD_BYTES <= steps * SIMD_BYTES {
            _mm_prefetch::<_MM_HINT_T0>((pf + off) as *const i8);
            // The loads: `off + 64 <= k` and both rows hold `k` codes.
            let w0 = _mm256_loadu_si256(wp.add(off) as *const __m256i);
            let w1 = _mm256_loadu_si256(wp.add(off + SIMD_BYTES) as *const __m256i);
            let a0 = _mm256_loadu_si256(ap.add(off) as *const __m256i);
            let a1 = _mm256_loadu_si256(ap.add(off + SIMD_BYTES) as *const __m256i);
            acc0 = D::i8_dot(acc0, D::i8_weight(w0), w0, a0);
            acc1 = D::i8_dot(acc1, D::i8_weight(w1), w1, a1);
            off += 2 * SIMD_BYTES;
        }
        if off < steps * SIMD_BYTES {
            let w0 = _mm256_loadu_si256(wp.add(off) as *const __m256i);
            let a0 = _mm256_loadu_si256(ap.add(off) as *const __m256i);
            acc0 = D::i8_dot(acc0, D::i8_weight(w0), w0, a0);
        }
        let mut v = hsum_epi32(_mm256_add_epi32(acc0, acc1)) - D::I8_OFFSET * offset;
        for j in steps * SIMD_BYTES..k {
            v += a[j] as i32 * w[j] as i32;
        }
        v
    }
}

/// Rows at which i8 switches from one weight row at a time to 4 x 2 tiles.
pub(super) const I8_TILE_ROWS: usize = 4;

/// Weight rows `codes` (`k` codes each, one per column of `out`) against the activation rows of
/// `acts`: `out[r][j]`, finished with `finish_i8`.
///
/// # Safety
/// The CPU must support `D`'s features; the rows `0..out.len()` of `acts` must hold at least `k`
/// codes (the register tiles read them unchecked).
#[inline(always)]
pub(super) unsafe fn i8_block<D: Dot>(
    codes: &[i8],
    scales: &[f32],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let (rows, nb) = (out.len(), out[0].len());
    let wrow = |j: usize| &codes[j * k..(j + 1) * k];
    let offset = |r: usize| acts.sums(r)[0];
    if rows < I8_TILE_ROWS {
        let dist = GEMV_PREFETCH_MIN.max(PANEL * k);
        for j in 0..nb {
            let pf = codes.as_ptr() as usize + j * k + dist;
            for (r, o) in out.iter_mut().enumerate() {
                // SAFETY: `D`'s features, which the caller guarantees.
                let acc = unsafe { i8_row_dot::<D>(acts.codes(r), wrow(j), k, offset(r), pf) };
                o[j] = quant::finish_i8(acc, acts.scale(r), scales[j]);
            }
        }
        return;
    }
    if D::I8_PAIRS {
        // SAFETY: `D`'s features, which the caller guarantees, include AVX2.
        return unsafe { i8_pairs::i8_block_pairs(codes, scales, k, acts, out) };
    }
    // SAFETY: `D`'s features and the rows of `acts`, as this function requires.
    unsafe {
        if D::I8_MANY_COLS == 4 {
            i8_block_tiles::<D, 4>(codes, scales, k, acts, out)
        } else {
            i8_block_tiles::<D, 2>(codes, scales, k, acts, out)
        }
    }
}

/// [`i8_block`] for [`I8_TILE_ROWS`] or more rows: tiles of 4 activation rows x C weight rows.
///
/// # Safety
/// As [`i8_block`].
#[inline(always)]
unsafe fn i8_block_tiles<D: Dot, const C: usize>(
    codes: &[i8],
    scales: &[f32],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let (rows, nb) = (out.len(), out[0].len());
    let wrow = |j: usize| &codes[j * k..(j + 1) * k];
    let offset = |r: usize| acts.sums(r)[0];
    // Row blocks outermost: a block's codes stay in L2 while every weight tile passes over them.
    for rb in row_blocks(rows, k, INT_BLOCK_BYTES, I8_TILE_ROWS) {
        for j0 in (0..nb).step_by(C) {
            // A short last tile repeats its last weight row.
            let js = panel_rows::<C>(j0, nb);
            let live = (nb - j0).min(C);
            let mut r = rb.start;
            while r < rb.end {
                // A short last tile repeats its last row.
                let rs: [usize; I8_TILE_ROWS] = std::array::from_fn(|i| (r + i).min(rb.end - 1));
                // SAFETY: `D`'s features, which the caller guarantees; the weight rows are `k`
                // codes each (`wrow`), the activation rows (all below `rows`) at least `k` by
                // this function's contract.
                let acc = unsafe {
                    D::i8_tile_many::<I8_TILE_ROWS, C>(
                        map_n(rs, |rr| acts.codes(rr)),
                        map_n(js, wrow),
                        k,
                        map_n(rs, offset),
                    )
                };
                for (i, accs) in acc.iter().enumerate().take(rb.end - r) {
                    for c in 0..live {
                        let j = j0 + c;
                        out[r + i][j] = quant::finish_i8(accs[c], acts.scale(r + i), scales[j]);
                    }
                }
                r += I8_TILE_ROWS;
            }
        }
    }
}
