//! q4, a few activation rows (several decode streams in one forward, or a verified draft window):
//! each panel of 8 weight rows is read from memory once, 8 groups at a time, unpacked once into
//! vectors whose lanes are the 8 weight rows (one vector per 4-code chunk of a group), and every
//! activation row then broadcasts its 4 codes at a time against those vectors. The per-row work is
//! 8 dot instructions and 4 f32 operations per group and panel, against the GEMV's nibble split and
//! cross-row reduction per row (`q4_rows.rs`), which the unpacking here pays once for all rows.
//!
//! Bits: per output the same arithmetic as the GEMV, in the same order — exact group dots, then
//! `sum + (dot as f32) * scale` (multiply, then add) per group ascending in the output's own lane,
//! the groups past the last multiple of 8 in scalar code in order, then `finish_q4`. So a row's
//! results beside other rows equal its results alone.

use super::q4_rows::{q4_group_dot_scalar, scales8x8, Q4PanelRows};
use super::{map_n, panel_rows, transpose8, Dot, GEMV_PREFETCH_MIN};
use crate::kernels::{q4_halves, Activations, Q4Codes, FEW_MAX_ROWS, PANEL};
use half::bf16;
use packs::quant::{self, Q4_GROUP};
use std::arch::x86_64::*;

/// Groups unpacked at once: one block of the GEMV's scale transpose (`scales8x8`); 8 groups of 8
/// rows are 64 vectors (2 KB), which stay in L1 while every activation row passes over them.
const BLOCK_GROUPS: usize = 8;

/// A register's bytes as unsigned `nibble ^ 8` values: (low nibbles, high nibbles).
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn split_nibbles(v: __m256i) -> (__m256i, __m256i) {
    // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
    unsafe {
        let w = _mm256_xor_si256(v, _mm256_set1_epi8(0x88u8 as i8));
        let mask = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(w, mask),
            _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask),
        )
    }
}

/// One block of [`BLOCK_GROUPS`] groups of 8 weight rows, unpacked: `lanes[g][j]` is group g's
/// chunk j with lane c = weight row c's 4 bytes of it as `nibble ^ 8` values — chunks 0..4 the low
/// nibbles (even elements `4j..4j + 4`), chunks 4..8 the high nibbles (odd elements
/// `4(j - 4)..`), matching the `Q4Groups` activation halves.
///
/// `whole` says the 8 rows are one whole panel of the pack (row c's pairs at `start[0] + 32 c`,
/// a step of 256 bytes): one address per pair instead of 8.
///
/// # Safety
/// The CPU must support AVX2; the block's pairs `4 b..4 b + 4` must be inside every row of `w`
/// (read unchecked); a prefetch never faults.
#[inline(always)]
unsafe fn unpack_block(
    w: &Q4PanelRows<'_>,
    whole: bool,
    b: usize,
    pf: (usize, usize),
    lanes: &mut [[__m256i; 8]; BLOCK_GROUPS],
) {
    // SAFETY: AVX2, which the caller guarantees; each load reads one row's 32-byte pair `4 b + p`,
    // inside by this function's contract (in a whole panel row c's pair is at `start[0] + 32 c`
    // plus 256 per pair).
    unsafe {
        for p in 0..BLOCK_GROUPS / 2 {
            // The GEMV's prefetch, same distance and order: this block's 1 KB of codes and 128
            // bytes of scales, a panel ahead in address order.
            for i in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>((pf.0 + b * 1024 + p * 256 + 64 * i) as *const i8);
            }
            if p < 2 {
                _mm_prefetch::<_MM_HINT_T0>((pf.1 + b * 128 + p * 64) as *const i8);
            }
            let pair = BLOCK_GROUPS / 2 * b + p;
            let mut rows = [_mm256_setzero_ps(); PANEL];
            if whole {
                let at = w.base.add(w.start[0] + pair * PANEL * Q4_GROUP) as *const f32;
                for c in 0..PANEL {
                    rows[c] = _mm256_loadu_ps(at.add(8 * c));
                }
            } else {
                for c in 0..PANEL {
                    let at = w.base.add(w.start[c] + pair * w.step[c]);
                    rows[c] = _mm256_loadu_ps(at as *const f32);
                }
            }
            // Chunk t (4 bytes) of the 8 rows side by side: t < 4 the pair's first group, else
            // its second.
            for (t, v) in transpose8(rows).into_iter().enumerate() {
                let (lo, hi) = split_nibbles(_mm256_castps_si256(v));
                let g = 2 * p + t / 4;
                lanes[g][t % 4] = lo;
                lanes[g][4 + t % 4] = hi;
            }
        }
    }
}

/// Activation rows whose dots run interleaved (independent chains for the out-of-order core).
const ROWS_AT_ONCE: usize = 4;

/// One unpacked block of groups of a panel: [`unpack_block`]'s vectors, the groups' scales (vector
/// i is group `g0 + i`, lane c = weight row c), and the weight's group count.
struct Block<'a> {
    lanes: &'a [[__m256i; 8]; BLOCK_GROUPS],
    scale: &'a [__m256; 8],
    g0: usize,
    groups: usize,
}

/// Activation rows `r0..r0 + R` against one unpacked block, continuing their f32 sums: per output
/// lane `sum + (dot - corr) as f32 * scale`, groups ascending.
///
/// # Safety
/// The CPU must support `D`'s features; every row of `a` must hold `32 * groups` codes and every row
/// of `corr` `groups` sums (`q4_halves` puts both halves of a group below `groups` inside), with
/// `g0 + 8 <= groups`; `r0 + R <= FEW_MAX_ROWS`.
#[inline(always)]
unsafe fn block_rows<D: Dot, const R: usize>(
    block: &Block<'_>,
    a: &[&[i8]; FEW_MAX_ROWS],
    corr: &[&[i32]; FEW_MAX_ROWS],
    r0: usize,
    sum: &mut [__m256; FEW_MAX_ROWS],
) {
    // SAFETY: `D`'s features, which the caller guarantees; the codes and sums read are inside the
    // rows, as this function requires.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for r in 0..R {
            acc[r] = sum[r0 + r];
        }
        for (i, group) in block.lanes.iter().enumerate() {
            let g = block.g0 + i;
            let (even, odd) = q4_halves(g, block.groups);
            let mut e = [std::ptr::null::<i8>(); R];
            let mut o = [std::ptr::null::<i8>(); R];
            for r in 0..R {
                e[r] = a[r0 + r].as_ptr().add(even);
                o[r] = a[r0 + r].as_ptr().add(odd);
            }
            let d = D::u4_group_lanes::<R>(group, e, o);
            for r in 0..R {
                let c = _mm256_set1_epi32(*corr[r0 + r].as_ptr().add(g));
                let dots = _mm256_cvtepi32_ps(_mm256_sub_epi32(d[r], c));
                acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(dots, block.scale[i]));
            }
        }
        for r in 0..R {
            sum[r0 + r] = acc[r];
        }
    }
}

/// The q4 weight rows of a block against 2..=[`FEW_MAX_ROWS`] activation rows (K at least 8
/// groups): `out[r][j]`, finished with `finish_q4`, bit for bit the GEMV's
/// ([`q4_block_rows`](super::q4_rows::q4_block_rows)).
///
/// # Safety
/// The CPU must support `D`'s features. `codes` must be a block for K = `k` with at least
/// `out[0].len()` rows (their codes are read unchecked); the rows `0..out.len()` of `acts` must
/// hold at least `k` codes and `k / 32` group sums (`Q4Groups`).
#[inline(always)]
pub(super) unsafe fn q4_block_few<D: Dot>(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let groups = k / Q4_GROUP;
    let blocks = groups / BLOCK_GROUPS;
    let (rows, nb) = (out.len(), out[0].len());
    assert!(
        rows <= FEW_MAX_ROWS && blocks > 0,
        "q4 few-row kernel: {rows} rows, K {k}"
    );
    #[cfg(test)]
    let row_step = test_hooks::row_step();
    #[cfg(not(test))]
    let row_step = 1;
    // The activation rows' codes and group sums, checked once (the loops read them unchecked).
    let a: [&[i8]; FEW_MAX_ROWS] = std::array::from_fn(|r| {
        let c = acts.codes((r * row_step) % rows);
        assert!(c.len() >= k && k >= groups * Q4_GROUP);
        c
    });
    let corr: [&[i32]; FEW_MAX_ROWS] = std::array::from_fn(|r| {
        let s = acts.sums((r * row_step) % rows);
        assert!(s.len() >= groups);
        s
    });
    // Made once: zeroing it per block was a `memset` call per 8 groups (seen in the disassembly).
    // SAFETY: AVX, which `D`'s features include (a register-only intrinsic).
    let mut lanes = [[unsafe { _mm256_setzero_si256() }; 8]; BLOCK_GROUPS];
    for j0 in (0..nb).step_by(PANEL) {
        let js = panel_rows::<PANEL>(j0, nb);
        let w = Q4PanelRows::new(codes, js);
        let whole = (0..PANEL)
            .all(|c| w.step[c] == PANEL * Q4_GROUP && w.start[c] == w.start[0] + c * Q4_GROUP);
        let s = map_n(js, |j| &scales[j * groups..(j + 1) * groups]);
        // The GEMV's prefetch addresses (codes, scales): this panel's start plus the distance.
        let dist = GEMV_PREFETCH_MIN.max(PANEL * k / 2);
        let pf = (
            codes.all().as_ptr() as usize + codes.row_start(j0) + dist,
            scales.as_ptr() as usize + j0 * groups * 2 + dist / 8,
        );
        // SAFETY: AVX, which `D`'s features include (a register-only intrinsic).
        let mut sum = [unsafe { _mm256_setzero_ps() }; FEW_MAX_ROWS];
        for b in 0..blocks {
            let g0 = BLOCK_GROUPS * b;
            // SAFETY: `D`'s features, which the caller guarantees, include AVX2. The rows `js` are
            // below `out[0].len()`, so rows of `codes` with `groups` groups: the pairs of block b
            // (below `groups / 2`) and the scales `g0..g0 + 8` of each `s[c]` (sliced to `groups`)
            // are inside. Each activation row holds `32 * groups` codes and `groups` sums (checked
            // above), and `q4_halves` puts both halves of a group g < `groups` inside them.
            unsafe {
                unpack_block(&w, whole, b, pf, &mut lanes);
                let scale = scales8x8(map_n(s, |sc| sc.as_ptr().add(g0)));
                let block = Block {
                    lanes: &lanes,
                    scale: &scale,
                    g0,
                    groups,
                };
                let mut r = 0;
                while r < rows {
                    let n = (rows - r).min(ROWS_AT_ONCE);
                    match n {
                        1 => block_rows::<D, 1>(&block, &a, &corr, r, &mut sum),
                        2 => block_rows::<D, 2>(&block, &a, &corr, r, &mut sum),
                        3 => block_rows::<D, 3>(&block, &a, &corr, r, &mut sum),
                        _ => block_rows::<D, 4>(&block, &a, &corr, r, &mut sum),
                    }
                    r += n;
                }
            }
        }
        for (r, o) in out.iter_mut().enumerate() {
            let mut sums = [0f32; PANEL];
            // SAFETY: AVX, which the caller guarantees; the store writes the 8 floats of `sums`.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), sum[r]) };
            // Groups past the last multiple of 8, in order, as the GEMV.
            for g in BLOCK_GROUPS * blocks..groups {
                let (even, odd) = q4_halves(g, groups);
                for c in 0..PANEL {
                    let wg = codes.group(js[c], g);
                    let acc = q4_group_dot_scalar(&a[r][even..even + 16], &a[r][odd..odd + 16], wg);
                    sums[c] += acc as f32 * s[c][g].to_f32();
                }
            }
            for (c, &v) in sums.iter().enumerate() {
                if j0 + c < nb {
                    o[j0 + c] = quant::finish_q4(v, acts.scale(r));
                }
            }
        }
    }
}

/// A planted mistake for the tests' controls: the few-row kernels (q4 and i8) read activation row
/// `(r * step) % rows` for output row r (a wrong row stride), which a check of every row must catch.
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::cell::Cell;

    thread_local! {
        static ROW_STEP: Cell<usize> = const { Cell::new(1) };
    }

    pub(crate) fn row_step() -> usize {
        ROW_STEP.with(|s| s.get())
    }

    /// `f` with the few-row kernels reading activation row `(r * step) % rows` for row r, on this
    /// thread.
    pub(crate) fn with_row_step<R>(step: usize, f: impl FnOnce() -> R) -> R {
        ROW_STEP.with(|s| s.set(step));
        let out = f();
        ROW_STEP.with(|s| s.set(1));
        out
    }
}
