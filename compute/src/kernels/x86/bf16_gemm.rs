//! bf16 products on AVX-512 BF16 (`kernels/bf16_gemm.rs` gives the arithmetic and its oracle):
//! tiles of 4 activation rows x 4 weight rows, one `zmm` accumulator per output, one `vdpbf16ps`
//! per output and block of 32 elements; the 16 accumulators of a tile summed together by the
//! halving tree ([`sum16`]).
//!
//! Per block a tile loads 4 activation vectors (from L2: the row block) and 4 weight vectors (from
//! L1: the panel of 4 weight rows, reused by every row of the block) for 16 `vdpbf16ps`. Weights
//! are read row-major from the pack: no repacking.

use super::{copy_live, panel_rows};
use crate::kernels::bf16_dot::x86::{dpbf16_zmm, to_bf16_zmm};
use crate::kernels::bf16_gemm::{Bf16Rows, BF16_BLOCK};
use crate::kernels::row_blocks::{row_blocks, BF16_BLOCK_BYTES};
use half::bf16;
use std::arch::x86_64::*;

/// Activation rows per tile.
const TILE_ROWS: usize = 4;
/// Weight rows per tile.
const TILE_COLS: usize = 4;

/// `dst[..src.len()]` = `src` rounded to bf16 (`vcvtne2ps2bf16`), the rest of `dst` zeros.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and BF16; `dst` must be at least as long as `src`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn round_row_bf16(src: &[f32], dst: &mut [bf16]) {
    debug_assert!(dst.len() >= src.len());
    let n = src.len();
    let full = n / BF16_BLOCK;
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    for b in 0..full {
        let at = b * BF16_BLOCK;
        // SAFETY: the CPU features, which the caller guarantees; `at + 32 <= n <= dst.len()`.
        unsafe {
            let c = to_bf16_zmm(_mm512_loadu_ps(s.add(at)), _mm512_loadu_ps(s.add(at + 16)));
            _mm512_storeu_si512(d.add(at).cast(), c);
        }
    }
    let at = full * BF16_BLOCK;
    let rem = n - at;
    if rem > 0 {
        let lo = (1u32 << rem.min(16)) - 1;
        let hi = (1u32 << rem.saturating_sub(16)) - 1;
        let out = (dst.len() - at).min(BF16_BLOCK);
        let out_mask = if out == BF16_BLOCK {
            u32::MAX
        } else {
            (1u32 << out) - 1
        };
        // SAFETY: the CPU features, which the caller guarantees; the masked loads touch only the
        // `rem` values left in `src`, the masked store only the `out` values left in `dst` (masked
        // elements are not accessed).
        unsafe {
            let c = to_bf16_zmm(
                _mm512_maskz_loadu_ps(lo as __mmask16, s.add(at)),
                _mm512_maskz_loadu_ps(hi as __mmask16, s.add(at + 16)),
            );
            _mm512_mask_storeu_epi16(d.add(at).cast(), out_mask, c);
        }
    }
    let done = n.div_ceil(BF16_BLOCK) * BF16_BLOCK;
    if dst.len() > done {
        dst[done..].fill(bf16::ZERO);
    }
}

/// bf16 products of the weight rows `w` (`out[0].len()` rows of `k`, row-major) against the first
/// `out.len()` prepared rows: `out[r][j]`.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and BF16; `w` must hold `out[0].len()` rows of `k`
/// values and `rows` at least `out.len()` rows prepared for this `k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn bf16_products_avx512(
    w: &[bf16],
    k: usize,
    rows: &Bf16Rows,
    out: &mut [&mut [f32]],
) {
    let (m, nb) = (out.len(), out[0].len());
    assert!(w.len() >= nb * k && rows.rows() >= m && rows.k() == k);
    let (full, tail) = (k / BF16_BLOCK, k % BF16_BLOCK);
    let tail_mask = ((1u64 << tail) - 1) as u32;
    let a = |r: usize| rows.row(r).as_ptr();
    // Row blocks outermost: a block's rows stay in L2 while every panel passes over them.
    for rb in row_blocks(m, 2 * rows.stride(), BF16_BLOCK_BYTES, TILE_ROWS) {
        for j0 in (0..nb).step_by(TILE_COLS) {
            let js = panel_rows::<TILE_COLS>(j0, nb);
            let wp: [*const bf16; TILE_COLS] = std::array::from_fn(|c| w[js[c] * k..].as_ptr());
            let live = (nb - j0).min(TILE_COLS);
            let mut r = rb.start;
            while r < rb.end {
                let left = (rb.end - r).min(TILE_ROWS);
                let (t, o) = (tail_mask, &mut out[r..r + left]);
                // SAFETY: the CPU features, which the caller guarantees; each weight pointer
                // starts a row of `k` values of `w`, each activation pointer a prepared row of
                // `full` (+1 with a tail) whole blocks (`Bf16Rows` pads rows to whole blocks).
                unsafe {
                    match left {
                        4 => put(
                            o,
                            j0,
                            live,
                            tile::<4>([a(r), a(r + 1), a(r + 2), a(r + 3)], wp, full, t),
                        ),
                        3 => put(
                            o,
                            j0,
                            live,
                            tile::<3>([a(r), a(r + 1), a(r + 2)], wp, full, t),
                        ),
                        2 => put(o, j0, live, tile::<2>([a(r), a(r + 1)], wp, full, t)),
                        _ => put(o, j0, live, tile::<1>([a(r)], wp, full, t)),
                    }
                }
                r += left;
            }
        }
    }
}

/// A tile's sums into its output rows `out`, columns `j0..j0 + live`.
#[inline(always)]
fn put<const R: usize>(
    out: &mut [&mut [f32]],
    j0: usize,
    live: usize,
    sums: [[f32; TILE_COLS]; R],
) {
    for (o, s) in out.iter_mut().zip(&sums) {
        copy_live(&mut o[j0..], s, TILE_COLS, live);
    }
}

/// R activation rows x `TILE_COLS` weight rows: element `[r][c]`.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and BF16; every `w[c]` must point to `32 * full +
/// popcount(tail_mask)` readable values, every `a[r]` to `32 * full` (+ 32 when `tail_mask` is not
/// 0) readable values.
#[inline(always)]
unsafe fn tile<const R: usize>(
    a: [*const bf16; R],
    w: [*const bf16; TILE_COLS],
    full: usize,
    tail_mask: u32,
) -> [[f32; TILE_COLS]; R] {
    // SAFETY: the CPU features and the readable lengths, as this function requires of its caller;
    // the tail's weight loads are masked to the values left in each row.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); TILE_COLS]; R];
        for b in 0..full {
            let at = b * BF16_BLOCK;
            let mut av = [_mm512_setzero_si512(); R];
            for r in 0..R {
                av[r] = _mm512_loadu_si512(a[r].add(at).cast());
            }
            for c in 0..TILE_COLS {
                let wv = _mm512_loadu_si512(w[c].add(at).cast());
                for r in 0..R {
                    acc[r][c] = dpbf16_zmm(acc[r][c], av[r], wv);
                }
            }
        }
        if tail_mask != 0 {
            let at = full * BF16_BLOCK;
            for c in 0..TILE_COLS {
                let wv = _mm512_maskz_loadu_epi16(tail_mask, w[c].add(at).cast());
                for r in 0..R {
                    let av = _mm512_loadu_si512(a[r].add(at).cast());
                    acc[r][c] = dpbf16_zmm(acc[r][c], av, wv);
                }
            }
        }
        let mut v = [_mm512_setzero_ps(); 16];
        for r in 0..R {
            for c in 0..TILE_COLS {
                v[TILE_COLS * r + c] = acc[r][c];
            }
        }
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), sum16(v));
        let mut sums = [[0f32; TILE_COLS]; R];
        for r in 0..R {
            for c in 0..TILE_COLS {
                sums[r][c] = lanes[4 * c + r];
            }
        }
        sums
    }
}

/// The 16 lanes of each of 16 accumulators summed by the halving tree of
/// `bf16_gemm::sum_lanes` (`s8[i] = l[i] + l[i + 8]`, then `+ 4`, `+ 2`, `+ 1`), four levels
/// for all at once: lane `4j + i` of the result is the sum of `v[4i + j]`.
///
/// # Safety
/// The CPU must support AVX-512 F.
#[inline(always)]
unsafe fn sum16(v: [__m512; 16]) -> __m512 {
    // (Loops, not closures: a closure would not inherit the caller's target features.)
    // SAFETY: register-only AVX-512 F intrinsics; the caller guarantees AVX-512 F.
    unsafe {
        // s8: [v[2p] lanes 0-7 | v[2p + 1] lanes 0-7] + [lanes 8-15 | lanes 8-15].
        let mut u = [_mm512_setzero_ps(); 8];
        for p in 0..8 {
            let (x, y) = (v[2 * p], v[2 * p + 1]);
            u[p] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
            );
        }
        // s4: quarter j for output 4q + j.
        let mut w = [_mm512_setzero_ps(); 4];
        for q in 0..4 {
            let (x, y) = (u[2 * q], u[2 * q + 1]);
            w[q] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
            );
        }
        // s2: per quarter j, [s2 of output 8m + j (2 lanes), s2 of output 8m + 4 + j (2 lanes)].
        let mut z = [_mm512_setzero_ps(); 2];
        for m in 0..2 {
            let (x, y) = (_mm512_castps_pd(w[2 * m]), _mm512_castps_pd(w[2 * m + 1]));
            z[m] = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)),
            );
        }
        // The sums: per quarter j, outputs [j, 4 + j, 8 + j, 12 + j].
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(z[0], z[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(z[0], z[1]),
        )
    }
}
