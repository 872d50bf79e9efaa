//! q4 against up to 16 activation rows (the GEMV, several decode streams in one forward, or a
//! verified draft window): each panel of 16 weight rows is read from memory once for all rows. A
//! whole pack panel (chunk-major: per group and chunk, the 16 rows' 4 bytes side by side,
//! `packs::quant::Q4_PANEL`) is read straight from the pack — each group's 4 chunk vectors are one
//! 64-byte load each ([`PanelLanes::group_codes16`]), split into nibbles, and every activation row
//! takes its dots from those registers (`panel_direct`). Rows past a weight's last whole panel,
//! and a block that does not begin one, are unpacked into the packed-panel layout of
//! `q4_packed.rs` first (`q4_pack_panel`, then the packed tiles).
//!
//! Bits: per output the arithmetic of the oracle, in the same order — exact group dots, then
//! `sum + (dot as f32) * scale` (multiply, then add) per group ascending in the output's own lane,
//! then `sum * s_a` (`finish_q4`). So a row's results beside other rows equal its results alone,
//! and one row's are the GEMV's.

use super::q4_packed::{panel_scales, q4_pack_panel, PanelLanes, MAX_LANES, Q4_TILE_ROWS};
use super::{copy_live, panel_rows, GEMV_PREFETCH_L2, GEMV_PREFETCH_MIN};
use crate::kernels::{q4_halves, Activations, Q4Codes, FEW_MAX_ROWS, PANEL};
use half::bf16;
use packs::quant::{Q4_CHUNK, Q4_CHUNKS, Q4_GROUP, Q4_PANEL};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Bytes of one group of a whole pack panel: its 4 chunks of 16 rows' 4 bytes.
const PANEL_GROUP_BYTES: usize = Q4_PANEL * Q4_GROUP / 2;

thread_local! {
    /// One panel's scales as f32 (`g * 16 + lane`), and a packed panel (codes, scales) for the
    /// rows that are not a whole pack panel.
    static FEW_PANEL: RefCell<(Vec<f32>, Vec<u8>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// A register's q4 bytes as their unsigned nibbles (`code + 8`, as stored): (low nibbles, high
/// nibbles).
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
pub(super) unsafe fn split_nibbles(v: __m256i) -> (__m256i, __m256i) {
    // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(v, mask),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
        )
    }
}

/// R activation rows against groups `g0..g0 + count` of a packed panel (`wg`, `sg`: those groups'
/// codes and scales), continuing the rows' sums: per output lane, `sum + (dot - corr) as f32 *
/// scale` per group ascending — [`q4_packed_tile`](super::q4_packed::q4_packed_tile)'s
/// operations, over a part of K.
///
/// # Safety
/// The CPU must support `V`'s features. Read unchecked: `count * 32 * V::LANES` bytes at `wg`,
/// `count * V::LANES` floats at `sg`, the codes of groups `g0..g0 + count` of every `a[r]`
/// (`Q4Groups` layout of `groups` groups) and those groups' sums of every `corr[r]`.
#[inline(always)]
unsafe fn few_tile<V: PanelLanes, const R: usize>(
    (wg, sg): (*const u8, *const f32),
    a: [&[i8]; R],
    corr: [&[i32]; R],
    (g0, count, groups): (usize, usize, usize),
    sum: &mut [V::F],
) {
    // SAFETY: `V`'s features, which the caller guarantees; every read is inside by this function's
    // contract (`q4_halves` puts both halves of a group below `groups` inside the row).
    unsafe {
        let mut acc = [V::zero_f(); R];
        acc.copy_from_slice(&sum[..R]);
        for i in 0..count {
            let g = g0 + i;
            let scale = V::load_f(sg.add(i * V::LANES));
            let w = wg.add(i * 32 * V::LANES);
            let (even, odd) = q4_halves(g, groups);
            for r in 0..R {
                let ar = a[r].as_ptr();
                let from = (*corr[r].as_ptr().add(g)).wrapping_neg();
                let dot = V::group_dot(w, from, ar.add(even), ar.add(odd));
                acc[r] = V::add_f(acc[r], V::mul_f(V::cvt(dot), scale));
            }
        }
        sum[..R].copy_from_slice(&acc);
    }
}

/// Every activation row against groups `g0..g0 + count` of a packed panel, in tiles of up to
/// [`Q4_TILE_ROWS`] rows ([`few_tile`]), continuing `sum[r]`.
///
/// # Safety
/// As [`few_tile`], for every row of `a` and `corr`; `sum` holds at least `a.len()` vectors.
#[inline(always)]
unsafe fn few_tiles<V: PanelLanes>(
    at: (*const u8, *const f32),
    a: &[&[i8]],
    corr: &[&[i32]],
    span: (usize, usize, usize),
    sum: &mut [V::F],
) {
    let rows = a.len();
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(Q4_TILE_ROWS);
        let (ar, cr, sr) = (&a[r..], &corr[r..], &mut sum[r..]);
        // SAFETY: `few_tile`'s contract, which the caller guarantees for every row.
        unsafe {
            match n {
                1 => few_tile::<V, 1>(at, [ar[0]], [cr[0]], span, sr),
                2 => few_tile::<V, 2>(at, [ar[0], ar[1]], [cr[0], cr[1]], span, sr),
                3 => few_tile::<V, 3>(at, [ar[0], ar[1], ar[2]], [cr[0], cr[1], cr[2]], span, sr),
                _ => few_tile::<V, 4>(
                    at,
                    [ar[0], ar[1], ar[2], ar[3]],
                    [cr[0], cr[1], cr[2], cr[3]],
                    span,
                    sr,
                ),
            }
        }
        r += n;
    }
}

/// A whole pack panel of 16 weight rows against every activation row, read straight from the
/// pack: per group, its 4 chunk vectors (lanes = weight rows) split into nibbles, and every row
/// takes its dots from those registers ([`PanelLanes::direct_group`]) — no packed copy stored and
/// loaded again, no transpose. Same operations per output as [`few_tile`] (exact group dots, then
/// `sum + (dot - corr) as f32 * scale` per group ascending), so the same bits.
///
/// # Safety
/// The CPU must support `V`'s features (`V::LANES` = 16). `base` must point to a whole pack panel
/// of `groups` groups (group g's chunk t at `base + 256 g + 64 t`); `sp` must hold the panel's
/// scales as f32 (`g * 16 + lane`, `groups * 16` floats); every row of `a` and `corr` as
/// [`few_tile`] requires for `groups` groups; `sum` holds at least `a.len()` vectors. The codes
/// ahead of the panel and the bf16 scales at `next_scales` (the next panel's) are prefetched; a
/// prefetch never faults.
#[inline(always)]
unsafe fn panel_direct<V: PanelLanes>(
    base: *const u8,
    sp: *const f32,
    groups: usize,
    next_scales: usize,
    a: &[&[i8]],
    corr: &[&[i32]],
    sum: &mut [V::F],
) {
    let rows = a.len();
    // SAFETY: `V`'s features, which the caller guarantees; group g < `groups` of the panel and its
    // scales are inside by this function's contract, as are the codes and sums of every row's
    // groups below `groups`.
    unsafe {
        for g in 0..groups {
            // This group's 256 bytes of codes at both distances ahead in address order, and every
            // other group a line of the next panel's scales (16 rows' scales are 32 bytes a group).
            for i in 0..PANEL_GROUP_BYTES / 64 {
                let line = PANEL_GROUP_BYTES * g + 64 * i;
                _mm_prefetch::<_MM_HINT_T0>(
                    base.wrapping_add(GEMV_PREFETCH_MIN + line) as *const i8
                );
                _mm_prefetch::<_MM_HINT_T1>(base.wrapping_add(GEMV_PREFETCH_L2 + line) as *const i8);
            }
            if g % 2 == 0 {
                _mm_prefetch::<_MM_HINT_T0>((next_scales + 32 * g) as *const i8);
            }
            let scale = V::load_f(sp.add(g * V::LANES));
            let p = base.add(PANEL_GROUP_BYTES * g);
            V::direct_group(p, scale, (g, groups), a, corr, &mut sum[..rows]);
        }
    }
}

/// The q4 weight rows of a block against 1..=[`FEW_MAX_ROWS`] activation rows (K at least one
/// group), a panel of `V::LANES` weight rows at a time: `out[r][j]`, finished with `finish_q4`.
///
/// # Safety
/// The CPU must support `V`'s features. `codes` must be a block for K = `k` with at least
/// `out[0].len()` rows (their codes are read unchecked); the rows `0..out.len()` of `acts` must
/// hold at least `k` codes and `k / 32` group sums (`Q4Groups`).
#[inline(always)]
pub(super) unsafe fn q4_block_few<V: PanelLanes>(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    // SAFETY: this function's contract is `q4_block_few_from`'s with `row0` = 0.
    unsafe { q4_block_few_from::<V>(codes, scales, k, (acts, 0), out) }
}

/// [`q4_block_few`] for the activation rows `row0..row0 + out.len()` of `acts`.
///
/// # Safety
/// As [`q4_block_few`], for those rows of `acts`.
#[inline(always)]
pub(super) unsafe fn q4_block_few_from<V: PanelLanes>(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    (acts, row0): (&Activations, usize),
    out: &mut [&mut [f32]],
) {
    let groups = k / Q4_GROUP;
    let (rows, nb) = (out.len(), out[0].len());
    let lanes = V::LANES;
    assert!(
        (1..=FEW_MAX_ROWS).contains(&rows) && groups > 0 && lanes == Q4_PANEL,
        "q4 few-row kernel: {rows} rows, K {k}"
    );
    debug_assert_eq!(Q4_CHUNK * lanes * Q4_CHUNKS, PANEL_GROUP_BYTES);
    #[cfg(test)]
    let row_step = test_hooks::row_step();
    #[cfg(not(test))]
    let row_step = 1;
    // Output row r reads activation row `src(r)` (r itself but for the tests' planted mistake).
    let src = |r: usize| row0 + (r * row_step) % rows;
    for r in 0..rows {
        // The tiles read these unchecked.
        assert!(acts.codes(src(r)).len() >= k && acts.sums(src(r)).len() >= groups);
    }
    // The buffers leave the thread-local while the kernel runs: no SIMD code inside a closure.
    let (mut ss, mut wp, mut sp) = FEW_PANEL.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    ss.resize(groups * lanes, 0.0);
    // Fixed distances ahead in the panels' address order (`panel_direct`): into L1 a whole 16-row
    // panel ahead (16 KB at K 2048, 48 KB at K 6144) decoded about 15% slower than 8 KB (46.6 /
    // 51.2 against 40.3 / 44.7 ms/token), and 2-12 KB all measured alike (PERF.md, "Chunk-major
    // q4 panels"); further on into L2 ([`GEMV_PREFETCH_L2`]).
    let a: [&[i8]; FEW_MAX_ROWS] = std::array::from_fn(|r| acts.codes(src(r.min(rows - 1))));
    let corr: [&[i32]; FEW_MAX_ROWS] = std::array::from_fn(|r| acts.sums(src(r.min(rows - 1))));
    for j0 in (0..nb).step_by(lanes) {
        // SAFETY: AVX, which `V`'s features include (a register-only intrinsic).
        let mut sum = [unsafe { V::zero_f() }; FEW_MAX_ROWS];
        match codes.panel_at(j0).filter(|_| j0 + lanes <= nb) {
            Some(at) => {
                let next_scales = scales.as_ptr() as usize + (j0 + lanes) * groups * 2;
                // SAFETY: `V`'s features include AVX2; the rows `j0..j0 + 16` are below
                // `out[0].len()`, rows of the block with `groups` scales each, and `ss` holds
                // `groups * 16` floats (resized above). The panel at `at` is a whole pack panel
                // of `groups` groups inside the codes (`panel_at`); the rows' codes and sums were
                // asserted above.
                unsafe {
                    panel_scales(scales, j0, groups, &mut ss);
                    panel_direct::<V>(
                        codes.all().as_ptr().add(at),
                        ss.as_ptr(),
                        groups,
                        next_scales,
                        &a[..rows],
                        &corr[..rows],
                        &mut sum,
                    );
                }
            }
            None => {
                // Not a whole pack panel (a short last panel repeats its last row; its lanes are
                // dropped below): unpacked, then every row passes over it.
                wp.resize(groups * 32 * lanes, 0);
                sp.resize(groups * lanes, 0.0);
                for half in 0..lanes / PANEL {
                    let js = panel_rows::<PANEL>((j0 + PANEL * half).min(nb - 1), nb);
                    // SAFETY: AVX2 (in `V`'s features); `half < lanes / 8` and `wp`, `sp` are a
                    // panel of `groups` groups.
                    unsafe {
                        q4_pack_panel(codes, scales, (k, 0), js, (lanes, half), &mut wp, &mut sp)
                    };
                }
                let at = (wp.as_ptr(), sp.as_ptr());
                // SAFETY: `V`'s features, which the caller guarantees; `at` is a packed panel of
                // `groups` groups; the activation rows hold `k >= 32 * groups` codes and `groups`
                // sums (asserted above).
                unsafe {
                    few_tiles::<V>(at, &a[..rows], &corr[..rows], (0, groups, groups), &mut sum)
                };
            }
        }
        let live = (nb - j0).min(lanes);
        for (r, o) in out.iter_mut().enumerate() {
            let mut done = [0f32; MAX_LANES];
            // SAFETY: `V`'s features; the store writes `LANES <= MAX_LANES` floats of `done`.
            unsafe {
                V::store_f(
                    done.as_mut_ptr(),
                    V::mul_f(sum[r], V::set1_f(acts.scale(src(r)))),
                )
            };
            copy_live(&mut o[j0..], &done, lanes, live);
        }
    }
    FEW_PANEL.with(|cell| *cell.borrow_mut() = (ss, wp, sp));
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
