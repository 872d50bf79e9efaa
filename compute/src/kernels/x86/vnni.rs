//! AVX-512 VNNI's [`Dot`]: `vpdpbusd` on 256-bit vectors for the GEMVs and 512-bit (`wide.rs`) for
//! many rows, over a [`Dpbusd`] flavour — the real instruction, or in the tests its exact AVX2
//! emulation, so the tests run the very bodies the VNNI entry point compiles.

use super::q4_few::{q4_block_few, q4_block_few_from};
use super::q4_packed::q4_block_packed;
use super::{wide, Dot};
use crate::kernels::{Activations, Q4Codes, FEW_MAX_ROWS};
use half::bf16;
use std::arch::x86_64::*;

/// AVX-512 VNNI: `vpdpbusd` (u8 x i8, 4 products per i32 lane, accumulated, no saturation), 256-bit
/// for the GEMVs and 512-bit (`wide`) for many rows. One implementation for the real instructions
/// ([`VnniDot`]) and, in the tests, their exact AVX2 emulation (`EmuVnniDot`), so the tests run the
/// very bodies the VNNI entry point compiles. Its features ([`Dot`]) are AVX2 and `P`'s.
pub(crate) struct Vnni<P>(std::marker::PhantomData<P>);

/// Most rows the VNNI q4 kernel for many rows runs as chunks of the few-row kernel; more take the
/// packed-panel tiles. At K = 2048 the chunks were faster up to 128 rows (32 rows 104 against
/// 125-159 us per 256 weight rows), but at K = 6144 a block's 768 KB of codes leave L2 between
/// chunks and the packed tiles won from 64 rows on: 32 is where both held (PERF.md, "Few-row q4
/// straight from the pack").
pub(crate) const Q4_FEW_CHUNKED_MAX_ROWS: usize = 32;

/// The real instructions.
pub(crate) struct RealVnni;
pub(crate) type VnniDot = Vnni<RealVnni>;

/// `vpdpbusd` at 256 bits and the 16-lane vector of a VNNI flavour (a trait, not a closure:
/// closures do not inherit target features).
///
/// *`Self`'s features*, which its methods and those of `Self::Wide` need: AVX-512 F, VL and VNNI
/// for [`RealVnni`]; AVX2 for the emulation.
pub(crate) trait Dpbusd {
    type Wide: wide::Lanes16;
    /// `acc` plus, per 32-bit lane, the 4 products of `u`'s unsigned and `s`'s signed bytes.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

impl Dpbusd for RealVnni {
    type Wide = wide::Zmm;
    /// # Safety
    /// The CPU must support AVX-512 VNNI and VL.
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: a register-only AVX-512 VNNI + VL intrinsic; the caller guarantees both.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

impl<P: Dpbusd> Dot for Vnni<P> {
    const I8_OFFSET: i32 = 128;
    const I8_MANY_COLS: usize = 4;
    const I8_FEW_COLS: usize = 4;
    const F32_PAIRS: bool = true;
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn i8_weight(w: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
        unsafe { _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN)) }
    }
    /// # Safety
    /// The CPU must support `P`'s features.
    #[inline(always)]
    unsafe fn i8_dot(acc: __m256i, wu: __m256i, _w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the caller guarantees `P`'s features.
        unsafe { P::dpbusd(acc, wu, a) }
    }
    /// # Safety
    /// The CPU must support AVX2 and `P`'s features; the rows `0..out.len()` of `acts` must hold at
    /// least `k` codes.
    #[inline(always)]
    unsafe fn q4_block_many(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    ) {
        if out.len() > Q4_FEW_CHUNKED_MAX_ROWS {
            // SAFETY: `P`'s features cover `P::Wide`'s; the rows of `acts` as this function
            // requires.
            return unsafe { q4_block_packed::<P::Wide>(codes, scales, k, acts, out) };
        }
        // Up to 32 rows as row chunks of the few-row kernel, as even as they go: its 16-row panels
        // come straight from the pack (the block's weights stay in L2 between chunks). Same bits:
        // both kernels are the GEMV's.
        let rows = out.len();
        let per = rows.div_ceil(rows.div_ceil(FEW_MAX_ROWS));
        for (i, chunk) in out.chunks_mut(per).enumerate() {
            // SAFETY: `P`'s features cover `P::Wide`'s; K has at least 8 groups (checked above);
            // the chunk's rows `i * per..` of `acts` hold `k` codes, as this function requires.
            unsafe { q4_block_few_from::<P::Wide>(codes, scales, k, (acts, i * per), chunk) };
        }
    }
    /// # Safety
    /// The CPU must support AVX2 and `P`'s features; the block and the activations as
    /// [`Dot::q4_block_few`] says.
    #[inline(always)]
    unsafe fn q4_block_few(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    ) {
        // SAFETY: `P`'s features cover `P::Wide`'s; the block and the activations as this function
        // requires.
        unsafe { q4_block_few::<P::Wide>(codes, scales, k, acts, out) }
    }
    /// # Safety
    /// The CPU must support `P`'s features; every row of `a` and `w` must hold at least `k` codes.
    #[inline(always)]
    unsafe fn i8_tile_many<const R: usize, const C: usize>(
        a: [&[i8]; R],
        w: [&[i8]; C],
        k: usize,
        offsets: [i32; R],
        pf: usize,
    ) -> [[i32; C]; R] {
        // SAFETY: `P`'s features cover `P::Wide`'s; the rows as this function requires.
        unsafe { wide::i8_tile16::<P::Wide, R, C>(a, w, k, offsets, pf) }
    }
}

/// `vpdpbusd` emulated exactly in AVX2 (bytes widened to i16, `vpmaddwd` on the even and the odd
/// bytes): runs the VNNI bodies on machines without AVX-512.
#[cfg(test)]
pub(crate) struct EmulatedVnni;
#[cfg(test)]
pub(crate) type EmuVnniDot = Vnni<EmulatedVnni>;

#[cfg(test)]
impl Dpbusd for EmulatedVnni {
    type Wide = wide::EmuZmm;
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2, all `dpbusd_emulated` needs.
        unsafe { dpbusd_emulated(acc, u, s) }
    }
}

/// `_mm256_dpbusd_epi32(acc, u, s)` in AVX2, exactly.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(test)]
#[inline(always)]
pub(super) unsafe fn dpbusd_emulated(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
    unsafe {
        let u_even = _mm256_and_si256(u, _mm256_set1_epi16(0x00FF));
        let u_odd = _mm256_srli_epi16(u, 8);
        let s_even = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8);
        let s_odd = _mm256_srai_epi16(s, 8);
        let even = _mm256_madd_epi16(u_even, s_even);
        let odd = _mm256_madd_epi16(u_odd, s_odd);
        _mm256_add_epi32(acc, _mm256_add_epi32(even, odd))
    }
}
