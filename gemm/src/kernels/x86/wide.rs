//! 16-lane (512-bit) VNNI kernels for many activation rows (prefill): for q4 the packed-panel
//! kernel of `x86.rs` with panels of 16 weight rows, one `vpdpbusd` on a `zmm` register per 4 codes
//! of all 16 rows; for i8 the 4 x 2 register tiles of `x86.rs` taking 64 codes a step.
//!
//! Why 512 bits: on the Zen 5 cores of Strix Point laptops, 128- and 256-bit integer vector
//! operations issue at half the rate per clock of Zen 4's while 512-bit ones keep Zen 4's rate
//! (David Huang's measurements), so a 512-bit `vpdpbusd` does twice the multiply-adds per cycle of
//! a 256-bit one there. Not measured here: this machine has no AVX-512.
//!
//! The q4 tile is `x86.rs`'s one packed-panel tile over [`PanelLanes`]; the i8 tiles are written
//! over [`Lanes16`]. Both vectors are the real `zmm` registers, or (in tests) two `ymm` halves with
//! `vpdpbusd` emulated in AVX2, so every line but the `zmm` intrinsics runs on AVX2 machines
//! against the oracles.

use super::{chunk, PanelLanes, MAX_LANES};
use crate::kernels::activations::SIMD_BYTES;
use std::arch::x86_64::*;

/// Weight rows of a wide panel.
const WIDE: usize = MAX_LANES;

/// A 16-lane vector: the packed q4 panel's operations ([`PanelLanes`]) and those of the i8 tiles.
pub(crate) trait Lanes16: PanelLanes {
    unsafe fn zero_i() -> Self::I;
    /// 64 bytes.
    unsafe fn load_i(p: *const u8) -> Self::I;
    /// `vpdpbusd`: per lane, `acc` plus the 4 products of `u`'s unsigned and `s`'s signed bytes.
    unsafe fn dpbusd(acc: Self::I, u: Self::I, s: Self::I) -> Self::I;
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn xor_i(a: Self::I, b: Self::I) -> Self::I;
    /// The sum of the 16 lanes.
    unsafe fn hsum_i(a: Self::I) -> i32;
}

/// The `zmm` registers (AVX-512 F + VNNI; the caller's entry point enables them).
pub(crate) struct Zmm;

impl PanelLanes for Zmm {
    const LANES: usize = MAX_LANES;
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn set1_i(x: i32) -> __m512i {
        _mm512_set1_epi32(x)
    }
    #[inline(always)]
    unsafe fn set1_f(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn sub_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn group_dot(wg: *const u8, even: *const i8, odd: *const i8) -> Self::I {
        vnni_group_dot::<Self>(wg, even, odd)
    }
}

impl Lanes16 for Zmm {
    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const _)
    }
    #[inline(always)]
    unsafe fn dpbusd(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, u, s)
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn xor_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_xor_si512(a, b)
    }
    #[inline(always)]
    unsafe fn hsum_i(a: __m512i) -> i32 {
        _mm512_reduce_add_epi32(a)
    }
}

/// Two `ymm` halves (lanes 0..8, 8..16) with `vpdpbusd` emulated exactly: the wide body on AVX2.
#[cfg(test)]
pub(crate) struct EmuZmm;

#[cfg(test)]
impl PanelLanes for EmuZmm {
    const LANES: usize = MAX_LANES;
    type I = [__m256i; 2];
    type F = [__m256; 2];
    #[inline(always)]
    unsafe fn zero_f() -> Self::F {
        [_mm256_setzero_ps(); 2]
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> Self::F {
        [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
    }
    #[inline(always)]
    unsafe fn set1_i(x: i32) -> Self::I {
        [_mm256_set1_epi32(x); 2]
    }
    #[inline(always)]
    unsafe fn set1_f(x: f32) -> Self::F {
        [_mm256_set1_ps(x); 2]
    }
    #[inline(always)]
    unsafe fn sub_i(a: Self::I, b: Self::I) -> Self::I {
        [_mm256_sub_epi32(a[0], b[0]), _mm256_sub_epi32(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn cvt(a: Self::I) -> Self::F {
        [_mm256_cvtepi32_ps(a[0]), _mm256_cvtepi32_ps(a[1])]
    }
    #[inline(always)]
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F {
        [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F {
        [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: Self::F) {
        _mm256_storeu_ps(p, v[0]);
        _mm256_storeu_ps(p.add(8), v[1]);
    }
    #[inline(always)]
    unsafe fn group_dot(wg: *const u8, even: *const i8, odd: *const i8) -> Self::I {
        vnni_group_dot::<Self>(wg, even, odd)
    }
}

#[cfg(test)]
impl Lanes16 for EmuZmm {
    #[inline(always)]
    unsafe fn zero_i() -> Self::I {
        [_mm256_setzero_si256(); 2]
    }
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> Self::I {
        [
            _mm256_loadu_si256(p as *const __m256i),
            _mm256_loadu_si256(p.add(32) as *const __m256i),
        ]
    }
    #[inline(always)]
    unsafe fn dpbusd(acc: Self::I, u: Self::I, s: Self::I) -> Self::I {
        [
            super::dpbusd_emulated(acc[0], u[0], s[0]),
            super::dpbusd_emulated(acc[1], u[1], s[1]),
        ]
    }
    #[inline(always)]
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I {
        [_mm256_add_epi32(a[0], b[0]), _mm256_add_epi32(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn xor_i(a: Self::I, b: Self::I) -> Self::I {
        [_mm256_xor_si256(a[0], b[0]), _mm256_xor_si256(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn hsum_i(a: Self::I) -> i32 {
        super::hsum_epi32(a[0]) + super::hsum_epi32(a[1])
    }
}

/// [`PanelLanes::group_dot`] on a 16-lane VNNI vector: the even and odd chunks in two
/// accumulators so that consecutive `vpdpbusd` do not wait on each other (integer sums: the split
/// changes no value).
#[inline(always)]
unsafe fn vnni_group_dot<V: Lanes16>(wg: *const u8, even: *const i8, odd: *const i8) -> V::I {
    let mut acc = [V::zero_i(); 2];
    for j in 0..8 {
        let w = V::load_i(wg.add(4 * WIDE * j));
        acc[j % 2] = V::dpbusd(acc[j % 2], w, V::set1_i(chunk(even, odd, j)));
    }
    V::add_i(acc[0], acc[1])
}

/// Codes per step of the wide i8 tiles.
const WIDE_BYTES: usize = 64;

/// `x86::i8_tile` for the VNNI offset form on 64 codes a step: the exact i8 dots of R activation
/// rows by C weight rows, element `[r][c]`. `offsets[r]` is row r's code sum over the 32-code SIMD
/// part of K (`Activations`); the offset form here covers the 64-code steps only, so the codes of a
/// last 32-code step come off it and join the scalar tail.
#[inline(always)]
pub(super) unsafe fn i8_tile16<V: Lanes16, const R: usize, const C: usize>(
    a: [&[i8]; R],
    w: [&[i8]; C],
    k: usize,
    offsets: [i32; R],
) -> [[i32; C]; R] {
    let steps = k / WIDE_BYTES;
    // `w ^ 0x80` is `w + 128` as an unsigned byte.
    let flip = V::set1_i(0x8080_8080u32 as i32);
    let mut acc = [[V::zero_i(); C]; R];
    for s in 0..steps {
        let off = s * WIDE_BYTES;
        for c in 0..C {
            let wu = V::xor_i(V::load_i(w[c].as_ptr().add(off) as *const u8), flip);
            for r in 0..R {
                let av = V::load_i(a[r].as_ptr().add(off) as *const u8);
                acc[r][c] = V::dpbusd(acc[r][c], wu, av);
            }
        }
    }
    let wide_end = steps * WIDE_BYTES;
    let simd_end = k - k % SIMD_BYTES;
    let mut sums = [[0i32; C]; R];
    for r in 0..R {
        let past: i32 = a[r][wide_end..simd_end].iter().map(|&x| x as i32).sum();
        let covered = offsets[r] - past;
        for c in 0..C {
            let mut v = V::hsum_i(acc[r][c]) - 128 * covered;
            for j in wide_end..k {
                v += a[r][j] as i32 * w[c][j] as i32;
            }
            sums[r][c] = v;
        }
    }
    sums
}
