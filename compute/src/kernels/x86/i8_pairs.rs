//! i8 against many activation rows on AVX2: `vpmaddwd` on codes widened to i16.
//!
//! Why not `vpmaddubsw`: it multiplies an unsigned byte by a signed one, so i8 x i8 needs the sign
//! trick (`maddubs(|w|, sign(a, w))`), a `vpsignb` per product vector besides the `vpmaddubsw` and
//! the widening `vpmaddwd` — three vector operations (and an add) per 32 multiply-adds, where a
//! `vpmaddwd` on i16 codes does 16 in one (and an add). On Zen 3, against `vpmaddubsw` + `vpmaddwd`
//! without the sign, the sign trick measured about 0.8x the multiply-adds per second and `vpmaddwd`
//! on i16 codes 1.1-1.3x.
//!
//! Layout: the task's weight rows are widened once per call into panels of 8 rows, `[pair t][row
//! c][2 x i16]` (pair t = codes 2t and 2t + 1; an odd or short K is padded with zero codes, which add
//! nothing), so one 32-byte load is the pair t of 8 weight rows and lanes are weight rows: no
//! horizontal sums. Each block of activation rows is widened to i16 rows once; a tile of
//! [`ROWS`] rows x [`PANELS`] panels broadcasts each row's pair t (a 32-bit load) against the
//! panels' vectors. K runs in chunks of [`K_CHUNK`] codes so that the tile's weights (12 KB) stay
//! in L1 while every row tile of the block passes over them; the i32 accumulators are kept in a
//! scratch between chunks.
//!
//! Exactness: i16 x i16 products of codes in -128..127 summed in pairs in i32 (`vpmaddwd`), then
//! added in i32: the exact dot (at most K * 128 * 128, far below 2^31 for any K the packs allow),
//! whatever the order. The finish is `finish_i8` lane-wise: `(acc as f32 * s_a) * s_w`.

use super::{panel_rows, transpose8};
use crate::kernels::row_blocks::{row_blocks, INT_BLOCK_BYTES};
use crate::kernels::{Activations, PANEL};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Activation rows of a tile.
const ROWS: usize = 3;
/// Weight panels (of 8 rows) of a tile: `ROWS * PANELS` accumulators + `PANELS` weight vectors +
/// one broadcast fill the 16 `ymm` registers.
const PANELS: usize = 3;
// The narrower tiles of a short last group are spelled out for 2 and 1 panels.
const _: () = assert!(PANELS == 3);
/// Codes of K per chunk: a tile's weights are `PANELS * 8 * K_CHUNK * 2` bytes (12 KB).
const K_CHUNK: usize = 256;
/// Codes widened at a time (one 16-byte load).
const WIDEN: usize = 16;

#[derive(Default)]
struct Scratch {
    /// Widened weight panels of the task.
    weights: Vec<i16>,
    /// Widened activation rows of a block.
    acts: Vec<i16>,
    /// i32 accumulators of a block's rows x a tile's panels between K chunks.
    acc: Vec<__m256i>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// K padded to whole widening steps (zero codes beyond `k`).
fn padded(k: usize) -> usize {
    k.div_ceil(WIDEN) * WIDEN
}

/// The i8 outputs of every activation row of `acts` against the weight rows `codes` (`nb` rows of
/// `k` codes, scales `scales`), written to `out[row][weight row]`.
///
/// # Safety
/// The CPU must support AVX2. (Every access to the arguments is checked; the unchecked ones stay
/// inside the scratch buffers sized here.)
#[inline(always)]
pub(super) unsafe fn i8_block_pairs(
    codes: &[i8],
    scales: &[f32],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    // `Kernels::gemm_block` returns before any kernel for no rows or no weight rows.
    let (rows, nb) = (out.len(), out[0].len());
    let kp = padded(k);
    let panel_len = kp * PANEL; // i16 per widened panel
    let panels = nb.div_ceil(PANEL);
    // The buffers leave the thread-local while the kernel runs: no SIMD code inside a closure
    // (closures do not inherit the entry point's target features).
    let mut s = SCRATCH.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    s.weights.resize(panels * panel_len, 0);
    for p in 0..panels {
        let js = panel_rows::<PANEL>(p * PANEL, nb);
        // SAFETY: AVX2, which the caller guarantees; the panel's slice is `padded(k) * PANEL`.
        unsafe {
            widen_panel(
                codes,
                k,
                js,
                &mut s.weights[p * panel_len..(p + 1) * panel_len],
            )
        };
    }
    for rb in row_blocks(rows, 2 * kp, INT_BLOCK_BYTES, ROWS) {
        let n = rb.len();
        s.acts.resize(n * kp, 0);
        for (i, r) in rb.clone().enumerate() {
            // SAFETY: AVX2, which the caller guarantees; the row's slice is `kp`, a multiple of 16.
            unsafe { widen_row(acts.codes(r), &mut s.acts[i * kp..(i + 1) * kp]) };
        }
        // SAFETY: AVX2, which the caller guarantees (a register-only intrinsic).
        s.acc.resize(n * PANELS, unsafe { _mm256_setzero_si256() });
        for p0 in (0..panels).step_by(PANELS) {
            // A short last group of panels runs a narrower tile (repeating a panel instead cost
            // the most common tasks, 16 panels, an eighth of their work).
            let live_panels = (panels - p0).min(PANELS);
            #[cfg(test)]
            let live_panels = live_panels
                - usize::from(
                    test_hooks::is(test_hooks::Fault::ShortTileNarrowed) && live_panels < PANELS,
                );
            let ps: [usize; PANELS] = std::array::from_fn(|c| (p0 + c).min(panels - 1));
            // SAFETY: as above.
            s.acc.fill(unsafe { _mm256_setzero_si256() });
            for k0 in (0..kp).step_by(K_CHUNK) {
                let pairs = (kp - k0).min(K_CHUNK) / 2;
                #[cfg(test)]
                let pairs = pairs
                    - usize::from(
                        test_hooks::is(test_hooks::Fault::LastPairDropped) && k0 + K_CHUNK >= kp,
                    );
                // SAFETY: `ps[c] < panels` and `k0 < kp`: inside `s.weights` (`panels * panel_len`).
                let w: [*const i16; PANELS] = std::array::from_fn(|c| unsafe {
                    s.weights.as_ptr().add(ps[c] * panel_len + k0 * PANEL)
                });
                // The next chunk's weights (the next K chunk of these panels, or the first of the
                // next group), prefetched a share per row tile: without it the first row tile of
                // every chunk waited on them from L3 (a task's widened panels outgrow L2).
                let next: Option<([usize; PANELS], usize)> = if k0 + K_CHUNK < kp {
                    Some((ps, k0 + K_CHUNK))
                } else if p0 + PANELS < panels {
                    Some((
                        std::array::from_fn(|c| (p0 + PANELS + c).min(panels - 1)),
                        0,
                    ))
                } else {
                    None
                };
                let tiles = n.div_ceil(ROWS);
                for r0 in (0..n).step_by(ROWS) {
                    if let Some((nps, nk0)) = next {
                        let lines = (kp - nk0).min(K_CHUNK) * PANEL * 2 / 64;
                        let t = r0 / ROWS;
                        let (from, to) = (t * lines / tiles, (t + 1) * lines / tiles);
                        for &np in &nps {
                            // SAFETY: `np < panels` and `nk0 < kp`: inside `s.weights`, and so are
                            // the lines of the next chunk prefetched (a prefetch never faults).
                            unsafe {
                                let base = s.weights.as_ptr().add(np * panel_len + nk0 * PANEL)
                                    as *const i8;
                                for line in from..to {
                                    _mm_prefetch::<_MM_HINT_T0>(base.add(64 * line));
                                }
                            }
                        }
                    }
                    // A short last tile repeats its last row.
                    let rs: [usize; ROWS] = std::array::from_fn(|i| (r0 + i).min(n - 1));
                    // SAFETY: `rs[i] < n` and `k0 < kp`: inside `s.acts` (`n * kp`).
                    let a: [*const i16; ROWS] =
                        std::array::from_fn(|i| unsafe { s.acts.as_ptr().add(rs[i] * kp + k0) });
                    // SAFETY: `r < n`: inside `s.acc` (`n * PANELS`).
                    let acc = rs.map(|r| unsafe { s.acc.as_mut_ptr().add(r * PANELS) });
                    // SAFETY: AVX2, which the caller guarantees. From `k0`, each activation row
                    // has `kp - k0 >= 2 * pairs` codes left in `s.acts` and each panel
                    // `(kp - k0) * PANEL >= 2 * PANEL * pairs` in `s.weights`; each `acc[i]` starts
                    // the `PANELS >= P` accumulators of row `rs[i]`, aligned (`s.acc` is a
                    // `Vec<__m256i>`).
                    unsafe {
                        match live_panels {
                            PANELS => tile::<PANELS>(a, w, pairs, acc),
                            2 => tile::<2>(a, [w[0], w[1]], pairs, acc),
                            1 => tile::<1>(a, [w[0]], pairs, acc),
                            _ => {}
                        }
                    }
                }
            }
            for i in 0..n {
                let r = rb.start + i;
                // SAFETY: AVX2, which the caller guarantees (a register-only intrinsic).
                let sa = unsafe { _mm256_set1_ps(acts.scale(r)) };
                for c in 0..PANELS {
                    let p = p0 + c;
                    if p >= panels {
                        break;
                    }
                    let (j0, live) = (p * PANEL, (nb - p * PANEL).min(PANEL));
                    #[cfg(test)]
                    let live = live
                        - usize::from(
                            test_hooks::is(test_hooks::Fault::LastRowUnstored) && p + 1 == panels,
                        );
                    let mut sw = [0f32; PANEL];
                    sw[..live].copy_from_slice(&scales[j0..j0 + live]);
                    // SAFETY: AVX2, which the caller guarantees; the load reads the 8 floats of
                    // `sw`.
                    let v = unsafe {
                        let v = _mm256_cvtepi32_ps(s.acc[i * PANELS + c]);
                        _mm256_mul_ps(_mm256_mul_ps(v, sa), _mm256_loadu_ps(sw.as_ptr()))
                    };
                    let mut done = [0f32; PANEL];
                    // SAFETY: AVX, which the caller guarantees; the store writes the 8 floats of
                    // `done`.
                    unsafe { _mm256_storeu_ps(done.as_mut_ptr(), v) };
                    out[r][j0..j0 + live].copy_from_slice(&done[..live]);
                }
            }
        }
    }
    SCRATCH.with(|cell| *cell.borrow_mut() = s);
}

/// `ROWS` widened activation rows against `P` widened panels over `pairs` code pairs, added to
/// the accumulators at `acc[i][c]` (row i, panel c). Marked not to inline: inside the block loop
/// LLVM turned the stepped row pointers back into clamped row indices times the row length,
/// recomputed every step (15 integer operations per 9 `vpmaddwd`). The release profile's single
/// codegen unit inlines it anyway, recomputation included, yet measured no slower than the build
/// that kept it apart: the loop appears bound by its multiplies (inferred, not measured apart).
///
/// # Safety
/// The CPU must support AVX2. Every `a[i]` must point to `2 * pairs` readable i16 codes (`pairs`
/// code pairs of a row), every `w[c]` to `2 * PANEL * pairs` (`pairs` pairs of a panel), and every
/// `acc[i]` to `P` readable and writable accumulators, aligned.
#[target_feature(enable = "avx2")]
#[inline(never)]
unsafe fn tile<const P: usize>(
    a: [*const i16; ROWS],
    w: [*const i16; P],
    pairs: usize,
    acc: [*mut __m256i; ROWS],
) {
    let mut sums = [[_mm256_setzero_si256(); P]; ROWS];
    for i in 0..ROWS {
        for c in 0..P {
            // SAFETY: accumulator c < P of `acc[i]`, valid and aligned by this function's contract.
            sums[i][c] = unsafe { *acc[i].add(c) };
        }
    }
    // Pointers stepped in the loop (indexing from the row starts made LLVM recompute each row's
    // address per step, 5 integer operations a row).
    let (mut a, mut w) = (a, w);
    for _ in 0..pairs {
        let mut wv = [_mm256_setzero_si256(); P];
        for c in 0..P {
            // SAFETY: step t < pairs reads the i16 `2 * PANEL * t..2 * PANEL * (t + 1)` of panel c,
            // inside by this function's contract.
            unsafe {
                wv[c] = _mm256_loadu_si256(w[c] as *const __m256i);
                w[c] = w[c].add(2 * PANEL);
            }
        }
        for i in 0..ROWS {
            // SAFETY: step t < pairs reads the i16 `2t` and `2t + 1` of row i, inside by this
            // function's contract.
            let b = unsafe { _mm256_set1_epi32((a[i] as *const i32).read_unaligned()) };
            // SAFETY: at most one past the row's last pair read.
            a[i] = unsafe { a[i].add(2) };
            for c in 0..P {
                sums[i][c] = _mm256_add_epi32(sums[i][c], _mm256_madd_epi16(wv[c], b));
            }
        }
    }
    for i in 0..ROWS {
        for c in 0..P {
            // SAFETY: as for the reads of the accumulators above.
            unsafe { *acc[i].add(c) = sums[i][c] };
        }
    }
}

/// 16 codes from `src[at..]` (zeros past its end) widened to i16.
///
/// # Safety
/// The CPU must support AVX2. (The load is checked against `src.len()`.)
#[inline(always)]
unsafe fn widen16(src: &[i8], at: usize) -> __m256i {
    if at + WIDEN <= src.len() {
        // SAFETY: AVX2, which the caller guarantees; the 16 codes from `at` are inside `src`.
        unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(src.as_ptr().add(at) as *const __m128i)) }
    } else {
        let mut tail = [0i8; WIDEN];
        let live = src.len().saturating_sub(at);
        tail[..live].copy_from_slice(&src[at..at + live]);
        // SAFETY: AVX2, which the caller guarantees; the load reads the 16 codes of `tail`.
        unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(tail.as_ptr() as *const __m128i)) }
    }
}

/// One activation row's codes as i16 (`dst` is the padded length).
///
/// # Safety
/// The CPU must support AVX2; `dst.len()` must be a multiple of 16 (the stores are unchecked).
#[inline(always)]
unsafe fn widen_row(src: &[i8], dst: &mut [i16]) {
    for at in (0..dst.len()).step_by(WIDEN) {
        // SAFETY: AVX2, which the caller guarantees; the store writes `dst[at..at + 16]`, inside as
        // `dst.len()` is a multiple of 16.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(at) as *mut __m256i, widen16(src, at)) };
    }
}

/// The weight rows `js` (8, of `k` codes each) as one widened panel: `dst[(t * 8 + c) * 2 ..][..2]`
/// is row c's codes 2t and 2t + 1.
///
/// # Safety
/// The CPU must support AVX2; `dst.len()` must be at least `padded(k) * PANEL` (the stores are
/// unchecked; the rows of `codes` are sliced with checks).
#[inline(always)]
unsafe fn widen_panel(codes: &[i8], k: usize, js: [usize; PANEL], dst: &mut [i16]) {
    debug_assert_eq!(dst.len(), padded(k) * PANEL);
    for at in (0..padded(k)).step_by(WIDEN) {
        // Row c's 8 pairs from `at` as the 8 i32 lanes of vector c; transposed, vector t holds pair
        // `at / 2 + t` of the 8 rows.
        // SAFETY: AVX2, which the caller guarantees (all `widen16` needs).
        let rows: [__m256; PANEL] = std::array::from_fn(|c| unsafe {
            _mm256_castsi256_ps(widen16(&codes[js[c] * k..(js[c] + 1) * k], at))
        });
        #[cfg(test)]
        let rows = if test_hooks::is(test_hooks::Fault::PairHalvesSwapped) {
            // SAFETY: AVX2, which the caller guarantees (register-only intrinsics).
            rows.map(|v| unsafe {
                _mm256_castsi256_ps(_mm256_shufflehi_epi16::<0xB1>(
                    _mm256_shufflelo_epi16::<0xB1>(_mm256_castps_si256(v)),
                ))
            })
        } else {
            rows
        };
        // SAFETY: AVX2, which the caller guarantees; the store for t < 8 writes the 16 i16 from
        // `(at / 2 + t) * 16`, ending at most at `(at + 16) * 8 <= padded(k) * PANEL <= dst.len()`
        // by this function's contract.
        unsafe {
            for (t, v) in transpose8(rows).into_iter().enumerate() {
                let p = dst.as_mut_ptr().add((at / 2 + t) * 2 * PANEL);
                _mm256_storeu_si256(p as *mut __m256i, _mm256_castps_si256(v));
            }
        }
    }
}

/// Test-only planted mistakes of this kernel (controls for the oracle comparisons).
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::cell::Cell;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Fault {
        /// The last K chunk runs one code pair short.
        LastPairDropped,
        /// The two codes of every widened weight pair trade places.
        PairHalvesSwapped,
        /// The last weight row of the last panel is never stored.
        LastRowUnstored,
        /// A short last group of panels runs a tile one panel narrower.
        ShortTileNarrowed,
    }

    thread_local! {
        static FAULT: Cell<Option<Fault>> = const { Cell::new(None) };
    }

    /// `fault` on this thread until the guard drops.
    pub(crate) fn plant(fault: Fault) -> Guard {
        FAULT.with(|c| c.set(Some(fault)));
        Guard
    }

    pub(crate) struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            FAULT.with(|c| c.set(None));
        }
    }

    pub(super) fn is(fault: Fault) -> bool {
        FAULT.with(|c| c.get()) == Some(fault)
    }
}
