//! q4, a few activation rows (several decode streams in one forward, or a verified draft window):
//! each panel of 16 weight rows is read from memory once for all rows. A panel that is two whole
//! pack panels (every 16-row panel of a weight but a short last one) is read straight from the
//! pack: each group pair of its 16 rows is transposed in registers so that lanes are weight rows
//! (`PanelLanes::pair_rows16`), split into nibbles, and every row takes its dots from those
//! registers (`few_pairs_direct`). Other panels are unpacked into the packed-panel layout of
//! `q4_packed.rs` (per group and 4-code chunk, the rows' bytes side by side), 8 groups at a time
//! (8 rows' 32-byte pairs transposed in registers), and every row runs the packed tiles over it
//! while it is in L1 (`zmm` on VNNI; two `ymm` halves, with the tuned 4-row tile, on AVX2).
//!
//! Bits: per output the arithmetic of the GEMV and of the oracle, in the same order — exact group
//! dots, then `sum + (dot as f32) * scale` (multiply, then add) per group ascending in the output's
//! own lane, then `sum * s_a` (`finish_q4`). So a row's results beside other rows equal its results
//! alone.

use super::q4_packed::{q4_pack_panel, PanelLanes, MAX_LANES, Q4_TILE_ROWS};
use super::q4_rows::{scales8x8, Q4PanelRows};
use super::{copy_live, map_n, panel_rows, transpose8, GEMV_PREFETCH_MIN};
use crate::kernels::{q4_halves, Activations, Q4Codes, FEW_MAX_ROWS, PANEL};
use half::bf16;
use packs::quant::Q4_GROUP;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Groups per step of the fast unpacking: one block of the GEMV's scale transpose (`scales8x8`).
const BLOCK_GROUPS: usize = 8;

thread_local! {
    /// One packed panel (codes, scales) of the few-row kernel.
    static FEW_PANEL: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
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

/// Where one half (8 weight rows) of a packed panel goes: lanes `8 * half..` of a panel `lanes`
/// wide, codes `wp` (`groups * 32 * lanes` bytes) and scales `sp` (`groups * lanes`).
struct PanelHalf<'a> {
    lanes: usize,
    half: usize,
    wp: &'a mut [u8],
    sp: &'a mut [f32],
}

/// Unpacks block b (groups `8 b..8 b + 8`) of 8 weight rows into one half of a packed panel, a
/// group pair at a time: the 8 rows' 32-byte pairs transposed (chunk t of every row side by side; t < 4
/// the pair's first group), then split into low nibbles (chunks 0..4: even elements) and high
/// nibbles (chunks 4..8: odd elements) — `q4_pack_panel`'s layout. `whole` says the rows are one
/// whole panel of the pack (row c's pairs at `start[0] + 32 c`, 256 bytes apart): one address per
/// pair. `pf` is where to prefetch (codes, scales) as the GEMV does.
///
/// # Safety
/// The CPU must support AVX2; the pairs `4 b..4 b + 4` of every row of `w` must be inside its
/// codes (read unchecked), and every `s[c]` must hold `8 b + 8` scales; `to.half < to.lanes / 8`
/// and `to.wp`, `to.sp` must hold a panel of at least `8 b + 8` groups (written unchecked); a
/// prefetch never faults.
#[inline(always)]
unsafe fn unpack_pairs(
    w: &Q4PanelRows<'_>,
    whole: bool,
    s: [&[bf16]; PANEL],
    b: usize,
    pf: (usize, usize),
    to: PanelHalf<'_>,
) {
    let (lanes, half) = (to.lanes, to.half);
    let (wp, sp) = (to.wp.as_mut_ptr(), to.sp.as_mut_ptr());
    // SAFETY: AVX2, which the caller guarantees. Pair `pair < 4 b + 4` of each row and the scales
    // `g0..g0 + 8` of each `s[c]` are inside by this function's contract; group g < `8 b + 8`
    // writes bytes `g * 32 * lanes + 4 * lanes * j + 32 * half + 32 <= (g + 1) * 32 * lanes` of `wp`
    // (j < 8, half < lanes / 8) and floats `g * lanes + 8 * half + 8 <= (g + 1) * lanes` of `sp`,
    // inside a panel of `8 b + 8` groups.
    unsafe {
        {
            let g0 = BLOCK_GROUPS * b;
            let scale = scales8x8(map_n(s, |sc| sc.as_ptr().add(g0)));
            for (i, v) in scale.into_iter().enumerate() {
                _mm256_storeu_ps(sp.add((g0 + i) * lanes + PANEL * half), v);
            }
            for p in 0..BLOCK_GROUPS / 2 {
                // The GEMV's prefetch, same distance and order: this block's 1 KB of codes and
                // 128 bytes of scales, a panel ahead in address order.
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
                for (t, v) in transpose8(rows).into_iter().enumerate() {
                    let (lo, hi) = split_nibbles(_mm256_castps_si256(v));
                    let g = 2 * pair + t / 4;
                    let at = wp.add(g * 32 * lanes + 4 * lanes * (t % 4) + 32 * half);
                    _mm256_storeu_si256(at as *mut __m256i, lo);
                    _mm256_storeu_si256(at.add(16 * lanes) as *mut __m256i, hi);
                }
            }
        }
    }
}

/// R activation rows against groups `g0..g0 + count` of a packed panel (`wg`, `sg`: those groups'
/// codes and scales), continuing the rows' sums: per output lane, `sum + (dot - corr) as f32 *
/// scale` per group ascending — [`q4_packed_tile`]'s operations, over a part of K.
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
                let dot = V::group_dot(w, ar.add(even), ar.add(odd));
                let dot = V::sub_i(dot, V::set1_i(*corr[r].as_ptr().add(g)));
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

/// A 16-row panel whose halves are two whole pack panels, read straight from the pack: each group
/// pair of the 16 rows is transposed in registers ([`PanelLanes::pair_rows16`]) and split into its
/// nibbles, and every activation row takes its dots from those registers — no packed copy stored
/// and loaded again. The packed copy cost about 1.5 GEMVs (15 us per 256 weight rows of K = 2048
/// on one VNNI thread against the GEMV's 10.3), which made 4 rows cost 2.5 GEMVs. Same operations
/// per output as [`few_tile`] (exact group dots, then `sum + (dot - corr) as f32 * scale` per group
/// ascending; the exact `dot - corr` taken as the dot started at `-corr`), so the same bits. An
/// unpaired last group is left to the caller.
///
/// # Safety
/// The CPU must support `V`'s features (`V::LANES` = 16). `base[h]` must point to the first pair of
/// a whole pack panel of 8 rows with at least `2 * pairs` groups (row c's pair p at
/// `base[h] + 256 p + 32 c`); `sp` must hold the panel's scales as f32 for groups `0..2 * pairs`
/// (`g * 16 + lane`); every row of `a` and `corr` as [`few_tile`] requires for `groups` groups; `sum`
/// holds at least `a.len()` vectors; a prefetch never faults.
#[inline(always)]
unsafe fn few_pairs_direct<V: PanelLanes>(
    base: [*const u8; 2],
    sp: *const f32,
    (pairs, groups): (usize, usize),
    pf: [usize; 2],
    a: &[&[i8]],
    corr: &[&[i32]],
    sum: &mut [V::F],
) {
    let rows = a.len();
    // SAFETY: `V`'s features, which the caller guarantees; pair p < `pairs` of both halves and the
    // scales of its groups are inside by this function's contract, as are the codes and sums of
    // every row's groups below `groups`.
    unsafe {
        for p in 0..pairs {
            // The GEMV's prefetch per half: this pair's 256 bytes, the panel's distance ahead.
            for &at in &pf {
                for i in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>((at + 256 * p + 64 * i) as *const i8);
                }
            }
            let t = V::pair_rows16(base[0].add(256 * p), base[1].add(256 * p));
            for gi in 0..2 {
                let g = 2 * p + gi;
                let mut ch = [t[0]; 8];
                for j in 0..4 {
                    (ch[j], ch[4 + j]) = V::nibbles(t[4 * gi + j]);
                }
                let scale = V::load_f(sp.add(g * V::LANES));
                let (even, odd) = q4_halves(g, groups);
                for r in 0..rows {
                    let ar = a[r].as_ptr();
                    let from = -*corr[r].as_ptr().add(g);
                    let dot = V::group_dot_regs(&ch, from, ar.add(even), ar.add(odd));
                    sum[r] = V::add_f(sum[r], V::mul_f(V::cvt(dot), scale));
                }
            }
        }
    }
}

/// The q4 weight rows of a block against 2..=[`FEW_MAX_ROWS`] activation rows (K at least 8 groups),
/// packed panels of `V::LANES` weight rows unpacked one at a time: `out[r][j]`, finished with
/// `finish_q4`, bit for bit the GEMV's.
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
    let blocks = groups / BLOCK_GROUPS;
    let (rows, nb) = (out.len(), out[0].len());
    let lanes = V::LANES;
    assert!(
        rows <= FEW_MAX_ROWS && blocks > 0 && lanes <= MAX_LANES && lanes.is_multiple_of(PANEL),
        "q4 few-row kernel: {rows} rows, K {k}"
    );
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
    let (pb, ps) = (groups * 32 * lanes, groups * lanes);
    // The buffers leave the thread-local while the kernel runs: no SIMD code inside a closure.
    let (mut wp, mut sp) = FEW_PANEL.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    wp.resize(pb, 0);
    sp.resize(ps, 0.0);
    // A whole packed panel ahead (the GEMV's distance is one 8-row panel; here the second half of a
    // 16-row panel is read right after the first, so one 8-row panel ahead would be no distance).
    let dist = GEMV_PREFETCH_MIN.max(lanes * k / 2);
    let a: [&[i8]; FEW_MAX_ROWS] = std::array::from_fn(|r| acts.codes(src(r.min(rows - 1))));
    let corr: [&[i32]; FEW_MAX_ROWS] = std::array::from_fn(|r| acts.sums(src(r.min(rows - 1))));
    let halves = lanes / PANEL;
    for j0 in (0..nb).step_by(lanes) {
        // Per half of the panel (8 rows; a short last panel repeats its last row, its lanes are
        // dropped below): where its codes are, whether they are one whole pack panel, its scales
        // and where to prefetch (the GEMV's addresses: these rows' start plus the distance).
        let parts: [_; MAX_LANES / PANEL] = std::array::from_fn(|half| {
            let js = panel_rows::<PANEL>((j0 + PANEL * half).min(nb - 1), nb);
            let w = Q4PanelRows::new(codes, js);
            let whole = (0..PANEL)
                .all(|c| w.step[c] == PANEL * Q4_GROUP && w.start[c] == w.start[0] + c * Q4_GROUP);
            let s = map_n(js, |j| &scales[j * groups..(j + 1) * groups]);
            let pf = (
                codes.all().as_ptr() as usize + codes.row_start(js[0]) + dist,
                scales.as_ptr() as usize + js[0] * groups * 2 + dist / 8,
            );
            (js, w, whole, s, pf)
        });
        // SAFETY: AVX, which `V`'s features include (a register-only intrinsic).
        let mut sum = [unsafe { V::zero_f() }; FEW_MAX_ROWS];
        if halves == 2 && parts[0].2 && parts[1].2 {
            // Both halves are whole pack panels: the pairs straight from the pack, then an
            // unpaired last group (odd K / 32) through the packed copy.
            for (half, &(_, _, _, s, _)) in parts.iter().enumerate() {
                for b in 0..blocks {
                    let g0 = BLOCK_GROUPS * b;
                    // SAFETY: AVX2 (in `V`'s features); each `s[c]` holds `groups >= g0 + 8`
                    // scales, and the stores write floats `(g0 + i) * 16 + 8 half..+8` of `sp`,
                    // which holds `groups * 16`.
                    unsafe {
                        let scale = scales8x8(map_n(s, |sc| sc.as_ptr().add(g0)));
                        for (i, v) in scale.into_iter().enumerate() {
                            _mm256_storeu_ps(
                                sp.as_mut_ptr().add((g0 + i) * lanes + PANEL * half),
                                v,
                            );
                        }
                    }
                }
                for g in BLOCK_GROUPS * blocks..groups {
                    for c in 0..PANEL {
                        sp[g * lanes + PANEL * half + c] = s[c][g].to_f32();
                    }
                }
            }
            let base = map_n([0, 1], |h| {
                let w = &parts[h].1;
                // SAFETY: a whole panel's first pair starts at `start[0]` inside the codes.
                unsafe { w.base.add(w.start[0]) }
            });
            let pf = [parts[0].4 .0, parts[1].4 .0];
            // SAFETY: `V`'s features, which the caller guarantees; both halves are whole pack
            // panels of rows with `groups` groups, so their pairs `0..groups / 2` are at
            // `base[h] + 256 p + 32 c`; `sp` holds every group's scales (filled above); the rows'
            // codes and sums were asserted above.
            unsafe {
                few_pairs_direct::<V>(
                    base,
                    sp.as_ptr(),
                    (groups / 2, groups),
                    pf,
                    &a[..rows],
                    &corr[..rows],
                    &mut sum,
                )
            };
            if groups % 2 == 1 {
                let g0 = groups - 1;
                for (half, &(js, ..)) in parts.iter().enumerate() {
                    // SAFETY: AVX2 (in `V`'s features); `half < lanes / 8` and `wp`, `sp` are a
                    // panel of `groups` groups.
                    unsafe {
                        q4_pack_panel(codes, scales, (k, g0), js, (lanes, half), &mut wp, &mut sp)
                    };
                }
                let at = (wp[g0 * 32 * lanes..].as_ptr(), sp[g0 * lanes..].as_ptr());
                // SAFETY: as the tiles below: `at` is group `g0` of the packed panel.
                unsafe { few_tiles::<V>(at, &a[..rows], &corr[..rows], (g0, 1, groups), &mut sum) };
            }
        } else {
            // Blocks of 8 groups, then the groups past the last multiple of 8 (and a whole panel's
            // unpaired last one, from its own offset): each unpacked, then every row passes over it
            // while it is in L1.
            for b in 0..=blocks {
                let g0 = BLOCK_GROUPS * b;
                let count = BLOCK_GROUPS.min(groups - g0);
                if count == 0 {
                    break;
                }
                for (half, &(js, ref w, whole, s, pf)) in parts.iter().enumerate().take(halves) {
                    if b < blocks {
                        let to = PanelHalf {
                            lanes,
                            half,
                            wp: &mut wp,
                            sp: &mut sp,
                        };
                        // SAFETY: `V`'s features include AVX2. The rows `js` are below `out[0].len()`,
                        // so rows of `codes` with `groups > 8 b` groups, whose pairs `4 b..4 b + 4` are
                        // inside; each `s[c]` holds `groups` scales; `half < lanes / 8`, and `wp`, `sp`
                        // hold a panel of `groups` groups (resized above).
                        unsafe { unpack_pairs(w, whole, s, b, pf, to) };
                    } else {
                        // SAFETY: AVX2 (in `V`'s features); `half < lanes / 8` and `wp`, `sp` are a
                        // panel of `groups` groups.
                        unsafe {
                            q4_pack_panel(
                                codes,
                                scales,
                                (k, g0),
                                js,
                                (lanes, half),
                                &mut wp,
                                &mut sp,
                            )
                        };
                    }
                }
                let at = (wp[g0 * 32 * lanes..].as_ptr(), sp[g0 * lanes..].as_ptr());
                // SAFETY: `V`'s features, which the caller guarantees; `at` is groups
                // `g0..g0 + count` of a packed panel of `groups` groups; the activation rows hold
                // `k >= 32 * groups` codes and `groups` sums (asserted above).
                unsafe {
                    few_tiles::<V>(at, &a[..rows], &corr[..rows], (g0, count, groups), &mut sum)
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
    FEW_PANEL.with(|cell| *cell.borrow_mut() = (wp, sp));
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
