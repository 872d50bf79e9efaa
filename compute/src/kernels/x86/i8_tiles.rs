//! i8: register tiles of R activation rows x C weight rows over the whole K. Few rows: one weight
//! row at a time (each thread streams its rows front to back); many rows: tiles of 4 activation
//! rows x [`Dot::I8_MANY_COLS`] weight rows (4 x 4 on VNNI, `wide.rs`), or on AVX2 the i16 kernel
//! of `i8_pairs.rs`.

use super::{hsum_epi32, i8_pairs, map_n, panel_rows, Dot, GEMV_PREFETCH_L2, GEMV_PREFETCH_MIN};
use crate::kernels::activations::SIMD_BYTES;
use crate::kernels::row_blocks::{row_blocks, INT_BLOCK_BYTES};
use crate::kernels::{Activations, FEW_MAX_ROWS, PANEL};
use packs::quant;
use std::arch::x86_64::*;

/// The exact i8 dots of R rows by C weight rows; element `r * C + c`. `a` and `w` rows hold `k` codes;
/// `offsets[r]` is row r's code sum over the SIMD part of K. With a nonzero `pf`, every 64 bytes of
/// the weight rows prefetch the C lines at `pf + (s / 2 * C + i) * 64` (step s; the few-row
/// kernel's tiles ahead, in address order).
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
    pf: usize,
) -> [[i32; C]; R] {
    let steps = k / SIMD_BYTES;
    // SAFETY: `D`'s features, which the caller guarantees; each load reads codes `off..off + 32`
    // with `off + 32 <= k`, inside every row by this function's contract; a prefetch never faults.
    let acc = unsafe {
        let mut acc = [[_mm256_setzero_si256(); C]; R];
        for s in 0..steps {
            let off = s * SIMD_BYTES;
            if pf != 0 && s % 2 == 0 {
                for i in 0..C {
                    _mm_prefetch::<_MM_HINT_T0>((pf + (s / 2 * C + i) * 64) as *const i8);
                }
            }
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
/// of the row; a prefetch never faults, even past the weight), and into L2 the line
/// [`GEMV_PREFETCH_L2`] past `off`. The same sum as `i8_tile::<D, 1, 1>` (integer adds, in any order
/// the same). The L1 prefetch measured 6-9% less time per i8 decode token; the L2 one took the
/// decode GEMVs of a token from 83-84% to 88-90% of the read probe (`bench gemm --kinds i8 --rows
/// 1`, 57.6 / 59.1 -> 54.3 / 55.5 ms, alternated).
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
            _mm_prefetch::<_MM_HINT_T1>(wp.wrapping_add(GEMV_PREFETCH_L2 + off));
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
    if (I8_FEW_MIN_ROWS..=FEW_MAX_ROWS).contains(&rows) {
        // SAFETY: `D`'s features and the rows of `acts`, as this function requires.
        return unsafe {
            match D::I8_FEW_COLS {
                4 => i8_block_few::<D, 4>(codes, scales, k, acts, out),
                _ => i8_block_few::<D, 2>(codes, scales, k, acts, out),
            }
        };
    }
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

/// Rows from which i8 takes the few-row kernel ([`i8_block_few`], up to [`FEW_MAX_ROWS`]); fewer
/// take the GEMV.
pub(crate) const I8_FEW_MIN_ROWS: usize = 2;
/// Activation rows per pass of the few-row kernel over a tile of weight rows.
const I8_FEW_PASS: usize = 4;
/// Longest rows (codes) whose tiles the few-row kernel prefetches: prefetching saves about a third
/// at 2 KB rows and costs 6-10% at 6 KB rows, where the hardware prefetcher follows the longer
/// rows alone (PERF.md, "Few-row kernels").
const I8_FEW_PREFETCH_MAX_K: usize = 4096;

/// [`i8_block`] for 2..=[`FEW_MAX_ROWS`] rows (several decode streams): tiles of C weight rows,
/// each read from memory once, while passes of up to [`I8_FEW_PASS`] activation rows take their
/// dots over the whole K (the later passes find the tile's codes in L1). A short last pass is a
/// narrower tile, not a repeated row. The dots are exact integers, so the bits are the GEMV's.
///
/// # Safety
/// As [`i8_block`].
#[inline(always)]
unsafe fn i8_block_few<D: Dot, const C: usize>(
    codes: &[i8],
    scales: &[f32],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let (rows, nb) = (out.len(), out[0].len());
    let wrow = |j: usize| &codes[j * k..(j + 1) * k];
    // Rows of at most `I8_FEW_PREFETCH_MAX_K` codes: the first pass over a tile prefetches the
    // tiles at least `GEMV_PREFETCH_MIN` bytes ahead, in address order (a tile's rows are
    // consecutive).
    let ahead = GEMV_PREFETCH_MIN.div_ceil(C * k.max(1)).max(1) * C;
    let prefetch = k <= I8_FEW_PREFETCH_MAX_K;
    for j0 in (0..nb).step_by(C) {
        let js = panel_rows::<C>(j0, nb);
        let live = (nb - j0).min(C);
        let w = map_n(js, wrow);
        let mut r = 0;
        while r < rows {
            let n = (rows - r).min(I8_FEW_PASS);
            let pf = if r == 0 && prefetch {
                codes.as_ptr() as usize + (j0 + ahead) * k
            } else {
                0
            };
            let pass = FewPass {
                r0: r,
                j0,
                live,
                pf,
            };
            // SAFETY: `D`'s features, which the caller guarantees; the weight rows are `k` codes
            // each (`wrow`), the activation rows `r..r + n` (below `rows`) at least `k` by this
            // function's contract.
            unsafe {
                match n {
                    1 => i8_few_pass::<D, 1, C>(acts, w, k, pass, scales, out),
                    2 => i8_few_pass::<D, 2, C>(acts, w, k, pass, scales, out),
                    3 => i8_few_pass::<D, 3, C>(acts, w, k, pass, scales, out),
                    _ => i8_few_pass::<D, 4, C>(acts, w, k, pass, scales, out),
                }
            }
            r += n;
        }
    }
}

/// Where one pass of [`i8_block_few`] works: activation rows from `r0`, the tile's weight rows
/// `j0..j0 + live` (live ones), and its prefetch address (0: none).
#[derive(Clone, Copy)]
struct FewPass {
    r0: usize,
    j0: usize,
    live: usize,
    pf: usize,
}

/// One pass of [`i8_block_few`]: activation rows `r0..r0 + R` against the tile `w`, finished into
/// `out`.
///
/// # Safety
/// The CPU must support `D`'s features; the rows `r0..r0 + R` of `acts` and every row of `w` must
/// hold at least `k` codes.
#[inline(always)]
unsafe fn i8_few_pass<D: Dot, const R: usize, const C: usize>(
    acts: &Activations,
    w: [&[i8]; C],
    k: usize,
    pass: FewPass,
    scales: &[f32],
    out: &mut [&mut [f32]],
) {
    #[cfg(test)]
    let row_step = super::few_test_hooks::row_step();
    #[cfg(not(test))]
    let row_step = 1;
    let rows = out.len();
    let src = |i: usize| ((pass.r0 + i) * row_step) % rows;
    let mut a = [acts.codes(pass.r0); R];
    let mut offsets = [0i32; R];
    for i in 0..R {
        a[i] = acts.codes(src(i));
        offsets[i] = acts.sums(src(i))[0];
    }
    // SAFETY: `D`'s features and the rows' lengths, as this function requires.
    let acc = unsafe { D::i8_tile_many::<R, C>(a, w, k, offsets, pass.pf) };
    for (i, accs) in acc.iter().enumerate() {
        let r = pass.r0 + i;
        for c in 0..pass.live {
            let j = pass.j0 + c;
            out[r][j] = quant::finish_i8(accs[c], acts.scale(src(i)), scales[j]);
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
                        0,
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
