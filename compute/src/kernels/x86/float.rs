//! f32 and bf16: tiles of one row x F_TILE weight rows, in `scalar::dot_f32`'s order; and the
//! conversions between bf16 and f32.

use super::{copy_live, map_n, panel_rows, Dot};
use crate::kernels::row_blocks::{row_blocks, F32_BLOCK_BYTES};
use half::bf16;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows per f32/bf16 tile.
const F_TILE: usize = 4;

/// A weight element the f32 tiles read: f32 itself or bf16 widened (exactly). Its methods need the
/// CPU to support AVX2.
pub(super) trait Widen: Sized {
    /// Whether the GEMV prefetches the next tile's rows: bf16 does (measured faster with it); f32
    /// showed no gain, so it leaves its stream to the hardware prefetcher.
    const GEMV_PREFETCH: bool;
    /// 8 elements as f32.
    ///
    /// # Safety
    /// The CPU must support AVX2; `p` must point to 8 readable elements.
    unsafe fn load8(p: *const Self) -> __m256;
    /// A panel's `F_TILE` rows of `k` values as f32: the rows themselves (f32), or widened into
    /// `scratch` (bf16) once for every activation row of a block.
    ///
    /// # Safety
    /// The CPU must support AVX2. (Row lengths are checked.)
    unsafe fn panel<'a>(
        rows: [&'a [Self]; F_TILE],
        k: usize,
        scratch: &'a mut Vec<f32>,
    ) -> [&'a [f32]; F_TILE];
}

impl Widen for f32 {
    const GEMV_PREFETCH: bool = false;
    /// # Safety
    /// The CPU must support AVX; `p` must point to 8 readable floats.
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: AVX and the 8 floats at `p`, as this function requires of its caller.
        unsafe { _mm256_loadu_ps(p) }
    }
    /// # Safety
    /// None beyond the trait's: this form returns `rows` as they are.
    #[inline(always)]
    unsafe fn panel<'a>(
        rows: [&'a [f32]; F_TILE],
        _k: usize,
        _scratch: &'a mut Vec<f32>,
    ) -> [&'a [f32]; F_TILE] {
        rows
    }
}

impl Widen for bf16 {
    const GEMV_PREFETCH: bool = true;
    /// # Safety
    /// The CPU must support AVX2; `p` must point to 8 readable bf16 values.
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        // SAFETY: `bf16x8_to_ps`'s contract is this one.
        unsafe { bf16x8_to_ps(p) }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn panel<'a>(
        rows: [&'a [bf16]; F_TILE],
        k: usize,
        scratch: &'a mut Vec<f32>,
    ) -> [&'a [f32]; F_TILE] {
        scratch.resize(F_TILE * k, 0.0);
        let k8 = k - k % 8;
        for (row, dst) in rows.iter().zip(scratch.chunks_exact_mut(k)) {
            assert!(row.len() >= k);
            for i in (0..k8).step_by(8) {
                // SAFETY: AVX2, which the caller guarantees; i + 8 <= k <= both lengths.
                unsafe {
                    _mm256_storeu_ps(dst.as_mut_ptr().add(i), bf16x8_to_ps(row.as_ptr().add(i)))
                };
            }
            for (d, v) in dst[k8..].iter_mut().zip(&row[k8..k]) {
                *d = v.to_f32();
            }
        }
        let mut it = scratch.chunks_exact(k);
        std::array::from_fn(|_| it.next().expect("F_TILE rows"))
    }
}

thread_local! {
    static F32_PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Rows from which bf16 panels are widened once into a buffer; fewer rows (the GEMVs, bound by
/// memory) widen as they load.
const F_WIDEN_MIN_ROWS: usize = 4;

/// R activation rows x `F_TILE` weight rows in `scalar::dot_f32`'s order per output: element
/// `[r][c]`. Each weight load serves all R rows. With `pf_ahead` > 0 (the GEMV, which streams each
/// weight once) every 64 bytes of each weight row prefetch the line `pf_ahead` bytes further on.
///
/// # Safety
/// The CPU must support AVX2; every row of `x` and `w` must hold at least `k` values (the SIMD loop
/// reads the first `k - k % 16` unchecked).
#[inline(always)]
unsafe fn f32_tile<T: Widen + Into<f32> + Copy, const R: usize>(
    x: [&[f32]; R],
    w: [&[T]; F_TILE],
    k: usize,
    pf_ahead: usize,
) -> [[f32; F_TILE]; R] {
    let blocks = k / 16;
    let block_bytes = 16 * std::mem::size_of::<T>();
    // SAFETY: AVX2, which the caller guarantees; each block reads values `16 * b..16 * b + 16` of
    // every row with `16 * b + 16 <= k`, inside the rows by this function's contract; a prefetch
    // never faults.
    let (lo, hi) = unsafe {
        let mut lo = [[_mm256_setzero_ps(); F_TILE]; R];
        let mut hi = [[_mm256_setzero_ps(); F_TILE]; R];
        for b in 0..blocks {
            if pf_ahead > 0 && (b * block_bytes).is_multiple_of(64) {
                for row in w {
                    let at = row.as_ptr().add(16 * b) as usize + pf_ahead;
                    _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
                }
            }
            let mut xl = [_mm256_setzero_ps(); R];
            let mut xh = [_mm256_setzero_ps(); R];
            for r in 0..R {
                xl[r] = _mm256_loadu_ps(x[r].as_ptr().add(16 * b));
                xh[r] = _mm256_loadu_ps(x[r].as_ptr().add(16 * b + 8));
            }
            for c in 0..F_TILE {
                let p = w[c].as_ptr().add(16 * b);
                let (wl, wh) = (T::load8(p), T::load8(p.add(8)));
                for r in 0..R {
                    lo[r][c] = _mm256_add_ps(lo[r][c], _mm256_mul_ps(xl[r], wl));
                    hi[r][c] = _mm256_add_ps(hi[r][c], _mm256_mul_ps(xh[r], wh));
                }
            }
        }
        (lo, hi)
    };
    let mut sums = [[0f32; F_TILE]; R];
    for r in 0..R {
        for c in 0..F_TILE {
            let mut lanes = [0f32; 16];
            // SAFETY: AVX, which the caller guarantees; the stores write the 16 floats of `lanes`.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), lo[r][c]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi[r][c]);
            }
            let mut sum = 0f32;
            for v in lanes {
                sum += v;
            }
            for j in 16 * blocks..k {
                sum += x[r][j] * w[c][j].into();
            }
            sums[r][c] = sum;
        }
    }
    sums
}

/// f32 or bf16 weight rows `w` (`k` values each, one per column of `out`) against the f32 rows of
/// `x` (`out.len()` rows of `k`): `out[r][j]`.
///
/// # Safety
/// The CPU must support `D`'s features. (Every row is sliced with checks.)
#[inline(always)]
pub(super) unsafe fn f32_block<D: Dot, T: Widen + Into<f32> + Copy>(
    w: &[T],
    k: usize,
    x: &[f32],
    out: &mut [&mut [f32]],
) {
    let (rows, nb) = (out.len(), out[0].len());
    let xr = |r: usize| &x[r * k..(r + 1) * k];
    if rows < F_WIDEN_MIN_ROWS {
        for j0 in (0..nb).step_by(F_TILE) {
            let js = panel_rows::<F_TILE>(j0, nb);
            let wr = map_n(js, |j| &w[j * k..(j + 1) * k]);
            let live = (nb - j0).min(F_TILE);
            // A tile's rows are one address range (row-major): fetch the next tile's.
            let ahead = if T::GEMV_PREFETCH {
                F_TILE * k * std::mem::size_of::<T>()
            } else {
                0
            };
            for (r, o) in out.iter_mut().enumerate() {
                // SAFETY: `D`'s features include AVX2; every row is `k` values (sliced above).
                let [sums] = unsafe { f32_tile([xr(r)], wr, k, ahead) };
                copy_live(&mut o[j0..], &sums, F_TILE, live);
            }
        }
        return;
    }
    // Outside the thread-local while the kernel runs (no SIMD code inside a closure).
    let mut scratch = F32_PANEL.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // Row blocks outermost: a block's rows stay in L2 while every panel passes over them, and a
    // bf16 panel is widened once per block, not once per row.
    for rb in row_blocks(rows, 4 * k, F32_BLOCK_BYTES, 1) {
        for j0 in (0..nb).step_by(F_TILE) {
            let js = panel_rows::<F_TILE>(j0, nb);
            // SAFETY: `D`'s features include AVX2.
            let wr = unsafe { T::panel(map_n(js, |j| &w[j * k..(j + 1) * k]), k, &mut scratch) };
            let live = (nb - j0).min(F_TILE);
            let mut r = rb.start;
            if D::F32_PAIRS {
                while r + 2 <= rb.end {
                    // SAFETY: `D`'s features include AVX2; every row is `k` values (`xr` slices
                    // `x`, `panel` gives the `k`-value rows it was given or widened).
                    let sums = unsafe { f32_tile([xr(r), xr(r + 1)], wr, k, 0) };
                    for (i, s) in sums.iter().enumerate() {
                        copy_live(&mut out[r + i][j0..], s, F_TILE, live);
                    }
                    r += 2;
                }
            }
            while r < rb.end {
                // SAFETY: as for the pairs above.
                let [sums] = unsafe { f32_tile([xr(r)], wr, k, 0) };
                copy_live(&mut out[r][j0..], &sums, F_TILE, live);
                r += 1;
            }
        }
    }
    F32_PANEL.with(|cell| *cell.borrow_mut() = scratch);
}

/// 8 bf16 values widened to f32 (exact).
///
/// # Safety
/// The CPU must support AVX2, and `p` must point to 8 readable bf16 values.
#[inline(always)]
pub unsafe fn bf16x8_to_ps(p: *const bf16) -> __m256 {
    // SAFETY: AVX2 and the 8 values (16 bytes) at `p`, as this function requires of its caller.
    unsafe {
        let h = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
}

/// `half::bf16::from_f32` on every element (round to nearest, ties to even; a NaN keeps the high
/// half of its payload with the quiet bit set), 8 at a time.
///
/// # Safety
/// The CPU must support AVX2; `dst` must be at least as long as `src` (the stores of whole steps of
/// 8 are unchecked; the caller asserts equal lengths).
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn f32_to_bf16_avx2(dst: &mut [bf16], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    let n = src.len() / 8 * 8;
    let abs_mask = _mm256_set1_epi32(0x7FFF_FFFF);
    let inf = _mm256_set1_epi32(0x7F80_0000);
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n <= src.len().
        let x = unsafe { _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i) };
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(
            _mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)),
            lsb,
        ));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x40));
        let nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
        let h = _mm256_blendv_epi8(rounded, quiet, nan);
        // 16-bit values in 32-bit lanes: pack within each 128-bit half, then put the halves' low
        // quadwords side by side.
        let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(h, h));
        // SAFETY: i + 8 <= n <= src.len() <= dst.len() by this function's contract.
        unsafe {
            _mm_storeu_si128(
                dst.as_mut_ptr().add(i) as *mut __m128i,
                _mm256_castsi256_si128(packed),
            )
        };
    }
    for (d, &x) in dst[n..].iter_mut().zip(&src[n..]) {
        *d = bf16::from_f32(x);
    }
}
