//! q4, few rows: each row against a panel of 8 weight rows, one pair of groups of all 8 rows at a
//! time, reduced across the rows so that lanes are weight rows (no transpose, no product buffer).

use super::{map_n, panel_rows, Dot, GEMV_PREFETCH_MIN};
use crate::kernels::{q4_halves, Activations, Q4Codes, PANEL};
use half::bf16;
use packs::quant::{self, Q4_GROUP};
use std::arch::x86_64::*;

/// Two q4 groups' 32 bytes as their unsigned nibbles, `code + 8` (the pack stores codes offset
/// binary): (low nibbles = even elements of both groups, high nibbles = odd elements) — the
/// `Q4Groups` pair order.
///
/// # Safety
/// The CPU must support AVX2; `p` must point to 32 readable bytes.
#[inline(always)]
pub(super) unsafe fn split_q4_pair(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: AVX2, which the caller guarantees; the load reads the 32 bytes at `p`, readable by
    // this function's contract.
    unsafe {
        let w = _mm256_loadu_si256(p as *const __m256i);
        let mask = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(w, mask),
            _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask),
        )
    }
}

/// The bf16 scales of 8 groups of 8 weight rows (`s[c]` points at row c's first) as f32, transposed:
/// vector g holds group g, lane c = row c.
///
/// # Safety
/// The CPU must support AVX2; every `s[c]` must point to 8 readable bf16 values.
#[inline(always)]
pub(super) unsafe fn scales8x8(s: [*const bf16; PANEL]) -> [__m256; 8] {
    // SAFETY: AVX2, which the caller guarantees; each load reads 8 bf16 values (16 bytes) at an
    // `s[c]`, readable by this function's contract.
    unsafe {
        // Rows c and c + 4 share a register (low and high 128 bits).
        let mut r = [_mm256_setzero_si256(); 4];
        for c in 0..4 {
            r[c] = _mm256_loadu2_m128i(s[c + 4] as *const __m128i, s[c] as *const __m128i);
        }
        let a_lo = _mm256_unpacklo_epi16(r[0], r[1]);
        let a_hi = _mm256_unpackhi_epi16(r[0], r[1]);
        let b_lo = _mm256_unpacklo_epi16(r[2], r[3]);
        let b_hi = _mm256_unpackhi_epi16(r[2], r[3]);
        // Groups (0, 1), (2, 3), (4, 5), (6, 7): four rows of each per 128 bits.
        let q = [
            _mm256_unpacklo_epi32(a_lo, b_lo),
            _mm256_unpackhi_epi32(a_lo, b_lo),
            _mm256_unpacklo_epi32(a_hi, b_hi),
            _mm256_unpackhi_epi32(a_hi, b_hi),
        ];
        // bf16 to f32: the 16 bits become the high half of a 32-bit lane.
        let z = _mm256_setzero_si256();
        let mut out = [_mm256_setzero_ps(); 8];
        for (i, &qi) in q.iter().enumerate() {
            out[2 * i] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, qi));
            out[2 * i + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, qi));
        }
        out
    }
}

/// The scaled group sums (before `finish_q4`) of one activation row against 8 weight rows. Lanes
/// are weight rows throughout: each pair of groups is reduced across the 8 rows, so every output's
/// f32 chain runs in its own lane, groups ascending.
///
/// # Safety
/// The CPU must support `D`'s features. Read unchecked: `32 * groups` codes of `a`, `groups` sums of
/// `corr` and scales of every `s[c]`, and the first `groups` groups of every row of `w`, which must
/// therefore be rows of `w.codes` (its weight's K at least `32 * groups`).
#[inline(always)]
unsafe fn q4_row_panel<D: Dot>(
    a: &[i8],
    corr: &[i32],
    w: Q4PanelRows<'_>,
    s: [&[bf16]; PANEL],
    groups: usize,
    pf: (usize, usize),
) -> [f32; PANEL] {
    debug_assert_eq!(Q4_GROUP, 32);
    let blocks = groups / 8;
    let ap = a.as_ptr();
    let cp = corr.as_ptr();
    // SAFETY: `D`'s features, which the caller guarantees (they include AVX2). Every group read
    // here is below `8 * blocks <= groups`: the scales `g0..g0 + 8` of each `s[c]`, the codes
    // `32 * g..32 * g + 64` of `a`, the sums `g` and `g + 1` of `corr` and the pair `g / 2` of each
    // row of `w`, all inside by this function's contract; a prefetch never faults.
    let sum = unsafe {
        let mut sum = _mm256_setzero_ps();
        for b in 0..blocks {
            let g0 = 8 * b;
            let mut sp = [std::ptr::null::<bf16>(); PANEL];
            for c in 0..PANEL {
                sp[c] = s[c].as_ptr().add(g0);
            }
            let scale = scales8x8(sp);
            for p in 0..4 {
                let g = g0 + 2 * p;
                let a_even = _mm256_loadu_si256(ap.add(g * Q4_GROUP) as *const __m256i);
                let a_odd = _mm256_loadu_si256(ap.add(g * Q4_GROUP + 32) as *const __m256i);
                let mut wp = [std::ptr::null::<u8>(); PANEL];
                for c in 0..PANEL {
                    wp[c] = w.base.add(w.start[c] + (g / 2) * w.step[c]);
                }
                // A block of the panel is 1 KB of codes and 128 bytes of scales: fetch the same
                // amount `pf` ahead in address order (a prefetch never faults, even past the weight).
                for i in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>((pf.0 + b * 1024 + p * 256 + 64 * i) as *const i8);
                }
                if p < 2 {
                    _mm_prefetch::<_MM_HINT_T0>((pf.1 + b * 128 + p * 64) as *const i8);
                }
                let d = D::u4_rows8(wp, a_even, a_odd);
                for i in 0..2 {
                    let dots = _mm256_sub_epi32(d[i], _mm256_set1_epi32(*cp.add(g + i)));
                    let prod = _mm256_mul_ps(_mm256_cvtepi32_ps(dots), scale[2 * p + i]);
                    sum = _mm256_add_ps(sum, prod);
                }
            }
        }
        sum
    };
    let mut sums = [0f32; PANEL];
    // SAFETY: AVX, which the caller guarantees; the store writes the 8 floats of `sums`.
    unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), sum) };
    // Groups past the last multiple of 8 (only for K not a multiple of 256), still in order.
    for g in 8 * blocks..groups {
        let (even, odd) = q4_halves(g, groups);
        for c in 0..PANEL {
            let wg = w.codes.group(w.rows[c], g);
            let acc = q4_group_dot_scalar(&a[even..even + 16], &a[odd..odd + 16], wg);
            sums[c] += acc as f32 * s[c][g].to_f32();
        }
    }
    sums
}

/// The exact dot of one group from its even and odd activation halves.
fn q4_group_dot_scalar(even: &[i8], odd: &[i8], w: &[u8]) -> i32 {
    let mut acc = 0i32;
    for ((&b, &e), &o) in w.iter().zip(even).zip(odd) {
        let (lo, hi) = quant::q4_byte_codes(b);
        acc += e as i32 * lo as i32 + o as i32 * hi as i32;
    }
    acc
}

/// 8 weight rows of a block, where their group pairs live: row c's pair p at
/// `base + start[c] + p * step[c]` (`Q4Codes::pairs`).
#[derive(Clone, Copy)]
pub(super) struct Q4PanelRows<'a> {
    pub(super) codes: Q4Codes<'a>,
    pub(super) rows: [usize; PANEL],
    pub(super) base: *const u8,
    pub(super) start: [usize; PANEL],
    pub(super) step: [usize; PANEL],
}

impl<'a> Q4PanelRows<'a> {
    #[inline(always)]
    pub(super) fn new(codes: Q4Codes<'a>, rows: [usize; PANEL]) -> Q4PanelRows<'a> {
        let pairs = map_n(rows, |j| codes.pairs(j));
        Q4PanelRows {
            codes,
            rows,
            base: codes.all().as_ptr(),
            start: map_n(pairs, |p| p.0),
            step: map_n(pairs, |p| p.1),
        }
    }
}

/// The q4 weight rows of a block against few activation rows: `out[r][j]`, finished with
/// `finish_q4`.
///
/// # Safety
/// The CPU must support `D`'s features. `codes` must be a block for K = `k` with at least
/// `out[0].len()` rows (their codes are read unchecked); the rows `0..out.len()` of `acts` must
/// hold at least `k` codes and `k / 32` group sums.
#[inline(always)]
pub(super) unsafe fn q4_block_rows<D: Dot>(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let groups = k / Q4_GROUP;
    let nb = out[0].len();
    if groups == 0 {
        for (r, o) in out.iter_mut().enumerate() {
            o.fill(quant::finish_q4(0.0, acts.scale(r)));
        }
        return;
    }
    for j0 in (0..nb).step_by(PANEL) {
        let js = panel_rows::<PANEL>(j0, nb);
        let w = Q4PanelRows::new(codes, js);
        let s = map_n(js, |j| &scales[j * groups..(j + 1) * groups]);
        // Addresses to prefetch from (codes, scales): this panel's start plus the distance (scales
        // are 1/8 of the codes' bytes).
        let dist = GEMV_PREFETCH_MIN.max(PANEL * k / 2);
        let pf = (
            codes.all().as_ptr() as usize + codes.row_start(j0) + dist,
            scales.as_ptr() as usize + j0 * groups * 2 + dist / 8,
        );
        for (r, o) in out.iter_mut().enumerate() {
            // SAFETY: `D`'s features, which the caller guarantees; the rows `js` are below
            // `out[0].len()`, so rows of `codes` with `groups` groups; each `s[c]` holds `groups`
            // scales (sliced above); the activation row its `k` codes and `groups` sums, all as this
            // function requires.
            let sums = unsafe { q4_row_panel::<D>(acts.codes(r), acts.sums(r), w, s, groups, pf) };
            for (c, &v) in sums.iter().enumerate() {
                if j0 + c < nb {
                    o[j0 + c] = quant::finish_q4(v, acts.scale(r));
                }
            }
        }
    }
}
