//! AVX2 and AVX-512 VNNI kernels.
//!
//! Every kernel has one generic body (`#[inline(always)]`) parameterised by a [`Dot`] primitive — the
//! AVX2 `vpmaddubsw` + `vpmaddwd` pair or VNNI `vpdpbusd` — and is instantiated inside a
//! `#[target_feature]` entry point, so each instantiation is compiled for its instruction set. Tests
//! also instantiate the VNNI bodies with an exact AVX2 emulation of `vpdpbusd` (`EmuVnniDot`, and
//! for the 512-bit kernels of `wide.rs` two 256-bit halves), which runs every line of the VNNI path
//! except the instructions themselves on an AVX2-only machine.
//!
//! The files: this one holds feature detection, the [`Dot`] trait with its AVX2 form, the entry
//! points and the lane helpers the kernels share; `vnni.rs` the VNNI [`Dot`] (and its emulation);
//! `i8_tiles.rs` the i8 register tiles, GEMV and few-row kernel; `i8_pairs.rs` the AVX2 i8 kernel
//! for many rows; `q4_few.rs` the q4 kernel for 1..=16 rows (the GEMV, several decode streams, a
//! draft window: each 16-row pack panel read once, straight from the pack, for all rows); `q4_packed.rs` the
//! packed-panel q4 kernel for many rows; `wide.rs` the 16-lane panels; `float.rs` the f32/bf16 tiles and the bf16 conversion; `bf16_gemm.rs` bf16 products on
//! AVX-512 BF16 (`kernels/bf16_gemm.rs`);
//! `activations.rs` the activation rows' preparation (quantization, q4 group layout and sums, the
//! bit copy).
//!
//! Exactness (the `packs::quant` arithmetic, see `kernels/mod.rs`):
//! - AVX2 i8 against 4 or more rows multiplies codes widened to i16 (`vpmaddwd`, exact; see
//!   `x86/i8_pairs.rs`). Against fewer rows it uses the sign trick `maddubs(|w|, sign(a, w))`:
//!   `|w| <= 128` as an unsigned byte (even for a -128 weight byte) and `|a| <= 127` (activation
//!   codes are clamped to ±127), so each i16 pair sum is at most 2 * 128 * 127 = 32512 < 32767:
//!   `vpmaddubsw` never saturates.
//! - VNNI i8 multiplies `w + 128` (unsigned) by `a` and subtracts `128 * Σa`; no step saturates.
//! - q4 multiplies the stored nibble, code + 8 (0..=15, unsigned: the pack's offset binary), by `a`
//!   and subtracts `8 * Σa` per group. On AVX2 the i16 pair sums are at most 2 * 15 * 127 = 3810,
//!   and the packed kernel adds eight of them per lane (30480 < 32767) before widening.
//! - Group sums are exact i32; the per-output f32 chain (`sum + acc as f32 * scale`, multiply then add,
//!   groups ascending) runs lane-wise on vectors whose lanes are outputs.

// Index loops mirror the lane layouts (row r, weight row c, group g) across several arrays.
#![allow(clippy::needless_range_loop)]

use super::{Activations, Q4Codes, WeightBlock, FEW_MAX_ROWS};
use half::bf16;
use packs::quant::Q4_GROUP;
use std::arch::x86_64::*;

mod activations;
mod bf16_gemm;
mod float;
pub(crate) mod i8_pairs;
mod i8_tiles;
mod q4_few;
mod q4_packed;
mod vnni;
mod wide;

pub(super) use activations::{copy_u32_avx2, q4_groups_row_avx2, quantize_row_avx2};
pub(crate) use bf16_gemm::{bf16_products_avx512, round_row_bf16};
pub use float::bf16x8_to_ps;
pub(crate) use float::f32_to_bf16_avx2;
#[cfg(test)]
pub(crate) use q4_few::test_hooks as few_test_hooks;
#[cfg(test)]
pub(crate) use vnni::EmuVnniDot;
pub(crate) use vnni::VnniDot;
#[cfg(test)]
pub(crate) use vnni::Q4_FEW_CHUNKED_MAX_ROWS;

use float::f32_block;
#[cfg(test)]
pub(crate) use i8_tiles::I8_FEW_MIN_ROWS;
use i8_tiles::{i8_block, i8_tile};
use q4_few::q4_block_few;
use q4_packed::q4_block_packed;

pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

pub(super) fn has_avx512_vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// How far ahead (bytes of weight codes, in address order) the GEMVs prefetch. The i8 GEMV
/// prefetches one whole panel ahead (8 rows, `PANEL * K` bytes) when that is more: each panel is
/// one address-ordered stream for the prefetch to run ahead of, and a panel ahead measured well
/// faster than a fixed 8 KB (the q4 GEMV, when its codes were still row-major). The q4 kernels of
/// 16-row chunk-major panels prefetch exactly this far (`q4_few.rs`).
const GEMV_PREFETCH_MIN: usize = 8192;

/// How far ahead (bytes of weight codes, in address order) the q4 few-row kernel and the i8 GEMV
/// also prefetch into L2 (`prefetcht1`), beside their L1 prefetch ([`GEMV_PREFETCH_MIN`]).
/// Without it the weight stream and the arithmetic barely overlapped (the arithmetic alone runs
/// at ~40 GB/s a thread from L2, DRAM gives ~17): a token's decode GEMVs ran at 74-80% of the
/// read probe, with it 81-88% (PERF.md); 32 KB measured alike, 128 KB worse. An L1 prefetch this
/// far ahead would evict lines before their use (32 KB L1).
const GEMV_PREFETCH_L2: usize = 65536;

/// The integer dot primitive of an instruction set. Every method accumulates, per 32-bit lane, the
/// products of that lane's 4 bytes.
///
/// Every method needs the CPU to support the implementing type's instructions (*`Self`'s
/// features*: AVX2 for [`Avx2Dot`] and the emulated VNNI, AVX2 and AVX-512 F/BW/VL/VNNI for
/// [`VnniDot`]); the kernels call them only inside a `#[target_feature]` entry point that enables
/// those. Pointer and length requirements are given per method.
pub(crate) trait Dot {
    /// Subtracted per i8 output as `I8_OFFSET * Σa` (the unsigned offset of the weights).
    const I8_OFFSET: i32;
    /// Weight rows of the i8 tiles for many activation rows: 2 (16 `ymm` registers), or 4 where
    /// [`Dot::i8_tile_many`] runs on 32 `zmm` registers (16 accumulators; each 64-byte activation
    /// load then feeds 4 `vpdpbusd`, halving the loads from L2 per product).
    const I8_MANY_COLS: usize = 2;
    /// Weight rows per tile of the i8 few-row kernel (`i8_tiles.rs`): 2 (16 `ymm` registers), or 4
    /// where [`Dot::i8_tile_many`] runs on 32 `zmm` registers.
    const I8_FEW_COLS: usize = 2;
    /// Whether the f32 tiles of a row block take 2 activation rows at a time (16 accumulators:
    /// `ymm0`-`ymm31` under AVX-512 VL), so each weight load serves both; else 1 (16 `ymm`).
    const F32_PAIRS: bool = false;
    /// Whether many activation rows take the i16 `vpmaddwd` kernel ([`i8_pairs`]) instead of the
    /// register tiles of [`Dot::i8_tile_many`].
    const I8_PAIRS: bool = false;
    /// The unsigned operand made from i8 weight bytes.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn i8_weight(w: __m256i) -> __m256i;
    /// `acc + a · w` per lane, given the weights `w` and their unsigned form `wu`.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn i8_dot(acc: __m256i, wu: __m256i, w: __m256i, a: __m256i) -> __m256i;
    /// [`i8_tile`] for several activation rows (prefetching the line `pf` bytes on per 64 bytes of
    /// each weight row when `pf` > 0), unless the instruction set has a wider form.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; every row of `a` and `w` must hold at least `k`
    /// codes.
    #[inline(always)]
    unsafe fn i8_tile_many<const R: usize, const C: usize>(
        a: [&[i8]; R],
        w: [&[i8]; C],
        k: usize,
        offsets: [i32; R],
        pf: usize,
    ) -> [[i32; C]; R]
    where
        Self: Sized,
    {
        // SAFETY: `i8_tile`'s contract is this one.
        unsafe { i8_tile::<Self, R, C>(a, w, k, offsets, pf) }
    }
    /// q4 against more than [`FEW_MAX_ROWS`] activation rows, K at least one group: packed
    /// panels ([`q4_block_packed`]) on the instruction set's widest
    /// [`PanelLanes`](q4_packed::PanelLanes).
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; the rows `0..out.len()` of `acts` must hold at least
    /// `k` codes.
    unsafe fn q4_block_many(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    );
    /// q4 against 1..=[`FEW_MAX_ROWS`] activation rows, K at least one group: [`q4_block_few`] on
    /// the instruction set's widest [`PanelLanes`](q4_packed::PanelLanes).
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; `codes` must be a block for K = `k` with at least
    /// `out[0].len()` rows; the rows `0..out.len()` of `acts` must hold at least `k` codes and
    /// `k / 32` group sums.
    unsafe fn q4_block_few(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    );
}

/// AVX2: `vpmaddubsw` (u8 x i8 pairs to i16) then `vpmaddwd` by ones (i16 pairs to i32).
pub(crate) struct Avx2Dot;

impl Dot for Avx2Dot {
    const I8_OFFSET: i32 = 0;
    const I8_PAIRS: bool = true;
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn i8_weight(w: __m256i) -> __m256i {
        // SAFETY: a register-only AVX2 intrinsic; the caller guarantees AVX2.
        unsafe { _mm256_abs_epi8(w) }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn i8_dot(acc: __m256i, wu: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
        unsafe {
            let pairs = _mm256_maddubs_epi16(wu, _mm256_sign_epi8(a, w));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    /// # Safety
    /// The CPU must support AVX2; the rows `0..out.len()` of `acts` must hold at least `k` codes.
    #[inline(always)]
    unsafe fn q4_block_many(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    ) {
        // SAFETY: `YmmPair`'s features are AVX2; the rows of `acts` as this function requires.
        unsafe { q4_block_packed::<wide::YmmPair<wide::Maddubs16>>(codes, scales, k, acts, out) }
    }
    /// # Safety
    /// The CPU must support AVX2; the block and the activations as [`Dot::q4_block_few`] says.
    #[inline(always)]
    unsafe fn q4_block_few(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    ) {
        // SAFETY: the CPU supports AVX2 (this function's contract), all `q4_block_few_avx2` needs
        // beside the block and the activations, which are as it requires.
        unsafe { q4_block_few_avx2(codes, scales, k, acts, out) }
    }
}

/// [`q4_block_few`] on AVX2, compiled apart from `gemm_block_avx2`: inlined there, it changed the
/// code LLVM made for the kernels beside it (the 8-row q4 GEMV of `xdna-vl-pack/4`, one thread,
/// K = 2048, 256 weight rows: 11.0 -> 14.5 us; `few_row_timing`).
///
/// # Safety
/// The CPU must support AVX2 and FMA; the block and the activations as [`Dot::q4_block_few`] says.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
unsafe fn q4_block_few_avx2(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    // SAFETY: `YmmPair`'s features (AVX2) are enabled here; the block and the activations as this
    // function requires.
    unsafe { q4_block_few::<wide::YmmPair<wide::Maddubs16>>(codes, scales, k, acts, out) }
}

// ---------------------------------------------------------------------------------------------
// Entry points: one per instruction set, each the generic body compiled with that set's features.

/// # Safety
/// The CPU must support AVX2 and FMA. `block` must be `WeightBlock::new(_, k, _, nb)` with `nb` the
/// length of `out[0]` (the q4 GEMV reads those rows' codes unchecked); for i8 the rows
/// `0..out.len()` of `acts` must hold at least `k` codes, for q4 be prepared in the `Q4Groups`
/// layout for K = `k` (codes and group sums). `Kernels::gemm_block` makes and checks all of this.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm_block_avx2(
    block: &WeightBlock<'_>,
    k: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    // SAFETY: `Avx2Dot`'s features are enabled here; the shapes as this function requires.
    unsafe { gemm_block_generic::<Avx2Dot>(block, k, x, acts, out) }
}

/// # Safety
/// As [`gemm_block_avx2`], and the CPU must support AVX-512 F, BW, VL and VNNI.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemm_block_vnni(
    block: &WeightBlock<'_>,
    k: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    // SAFETY: `VnniDot`'s features are enabled here; the shapes as this function requires.
    unsafe { gemm_block_generic::<VnniDot>(block, k, x, acts, out) }
}

/// The VNNI bodies with `vpdpbusd` emulated, for tests on AVX2 machines.
///
/// # Safety
/// As [`gemm_block_avx2`].
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm_block_emulated_vnni(
    block: &WeightBlock<'_>,
    k: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    // SAFETY: `EmuVnniDot`'s features (AVX2) are enabled here; the shapes as this function
    // requires.
    unsafe { gemm_block_generic::<EmuVnniDot>(block, k, x, acts, out) }
}

/// # Safety
/// The CPU must support `D`'s features; the shapes as [`gemm_block_avx2`] requires.
#[inline(always)]
unsafe fn gemm_block_generic<D: Dot>(
    block: &WeightBlock<'_>,
    k: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    // SAFETY: `D`'s features, which the caller guarantees, include AVX2; the f32 tiles read only
    // slices checked against `k`; the i8 and q4 kernels get `acts` rows of at least `k` codes (for
    // q4 with their group sums), and the q4 ones a block for this `k` with `out[0].len()` rows, as
    // this function requires.
    unsafe {
        match *block {
            WeightBlock::F32(w) => f32_block::<D, f32>(w, k, x, out),
            WeightBlock::Bf16(w) => f32_block::<D, bf16>(w, k, x, out),
            WeightBlock::I8 { codes, scales } => i8_block::<D>(codes, scales, k, acts, out),
            WeightBlock::Q4 { codes, scales } => {
                if k < Q4_GROUP {
                    // No group: every output is an empty sum.
                    for (r, o) in out.iter_mut().enumerate() {
                        o.fill(packs::quant::finish_q4(0.0, acts.scale(r)));
                    }
                } else if out.len() <= FEW_MAX_ROWS {
                    D::q4_block_few(codes, scales, k, acts, out)
                } else {
                    D::q4_block_many(codes, scales, k, acts, out)
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared vector helpers.

/// 8x8 transpose: lane c of output g is lane g of input c.
///
/// # Safety
/// The CPU must support AVX2 (callers check `Isa::Avx2.is_available()`).
#[inline(always)]
pub unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: register-only AVX intrinsics; the caller guarantees AVX2.
    unsafe {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}

/// Sum of the 8 lanes.
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// `dst[..live].copy_from_slice(&src[..live])`, where `live` is `full` (a multiple of 4, constant
/// at every caller) except in a last short tile. A whole tile moves in 128-bit loads and stores: as
/// `copy_from_slice` LLVM merged both cases into one `memcpy` call of `live` floats per tile row,
/// a measurable share of a q4 prefill.
#[inline(always)]
fn copy_live(dst: &mut [f32], src: &[f32], full: usize, live: usize) {
    if live == full {
        assert!(full.is_multiple_of(4) && dst.len() >= full && src.len() >= full);
        for c in (0..full).step_by(4) {
            // SAFETY: SSE is part of x86_64; c + 4 <= full <= both lengths (asserted above).
            unsafe { _mm_storeu_ps(dst.as_mut_ptr().add(c), _mm_loadu_ps(src.as_ptr().add(c))) };
        }
    } else {
        dst[..live].copy_from_slice(&src[..live]);
    }
}

/// Weight row indices of a panel starting at `j0`: a short last panel repeats its last row.
#[inline(always)]
fn panel_rows<const C: usize>(j0: usize, nb: usize) -> [usize; C] {
    std::array::from_fn(|c| (j0 + c).min(nb - 1))
}

/// `xs.map(f)` as a plain loop, so it inlines: `[T; N]::map` and `std::array::from_fn` each stayed
/// an out-of-line call (`try_map`, `try_from_fn`) once per panel of the GEMVs, a measurable share of
/// a decode step.
#[inline(always)]
fn map_n<T: Copy, U: Copy + Default, const N: usize>(xs: [T; N], f: impl Fn(T) -> U) -> [U; N] {
    let mut out = [U::default(); N];
    for (o, &x) in out.iter_mut().zip(&xs) {
        *o = f(x);
    }
    out
}
