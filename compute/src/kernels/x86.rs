//! AVX2 and AVX-512 VNNI kernels.
//!
//! Every kernel has one generic body (`#[inline(always)]`) parameterised by a [`Dot`] primitive — the
//! AVX2 `vpmaddubsw` + `vpmaddwd` pair or VNNI `vpdpbusd` — and is instantiated inside a
//! `#[target_feature]` entry point, so each instantiation is compiled for its instruction set. Tests
//! also instantiate the VNNI bodies with an exact AVX2 emulation of `vpdpbusd` (`EmuVnniDot`, and
//! for the 512-bit kernels of `wide.rs` two 256-bit halves), which runs every line of the VNNI path
//! except the instructions themselves on an AVX2-only machine.
//!
//! Exactness (the `packs::quant` arithmetic, see `kernels/mod.rs`):
//! - AVX2 i8 against 4 or more rows multiplies codes widened to i16 (`vpmaddwd`, exact; see
//!   `x86/i8_pairs.rs`). Against fewer rows it uses the sign trick `maddubs(|w|, sign(a, w))`:
//!   `|w| <= 128` as an unsigned byte (even for a -128 weight byte) and `|a| <= 127` (activation
//!   codes are clamped to ±127), so each i16 pair sum is at most 2 * 128 * 127 = 32512 < 32767:
//!   `vpmaddubsw` never saturates.
//! - VNNI i8 multiplies `w + 128` (unsigned) by `a` and subtracts `128 * Σa`; no step saturates.
//! - q4 multiplies the nibble plus 8 (0..=15, unsigned) by `a` and subtracts `8 * Σa` per group. On AVX2
//!   the i16 pair sums are at most 2 * 15 * 127 = 3810, and the packed kernel adds eight of them per
//!   lane (30480 < 32767) before widening.
//! - Group sums are exact i32; the per-output f32 chain (`sum + acc as f32 * scale`, multiply then add,
//!   groups ascending) runs lane-wise on vectors whose lanes are outputs.

// Index loops mirror the lane layouts (row r, weight row c, group g) across several arrays.
#![allow(clippy::needless_range_loop)]

use super::activations::SIMD_BYTES;
use super::row_blocks::{row_blocks, F32_BLOCK_BYTES, INT_BLOCK_BYTES};
use super::{q4_halves, Activations, Q4Codes, WeightBlock, PANEL};
use half::bf16;
use packs::quant::{self, Q4_GROUP};
use std::arch::x86_64::*;
use std::cell::RefCell;

pub(crate) mod i8_pairs;
mod wide;

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

/// Rows at which q4 switches from the per-row kernel to the packed-panel kernel.
const Q4_PACKED_MIN_ROWS: usize = 4;
/// Activation rows per packed q4 tile.
const Q4_TILE_ROWS: usize = 4;
/// Most weight rows the packed q4 kernel unpacks at once (256 x K bytes; a host task's whole chunk).
const Q4_PACKED_ROWS: usize = 256;
/// How far ahead (bytes of weight codes, in address order) the q4 and i8 GEMVs prefetch at least;
/// they prefetch one whole panel of 8 rows ahead (`PANEL * K / 2` bytes for q4, `PANEL * K` for
/// i8) when that is more. (Measured on q4 with row-major codes,
/// when a panel's 8 rows were 8 streams the hardware prefetcher followed poorly: one thread went
/// from ~10.5 to ~16-17 GB/s out of DRAM at K = 2048, and the down projection from ~8.2 to ~6.9 ms
/// per token against a fixed 8 KB distance. The pack's panel layout now makes each whole panel one
/// address-ordered stream, which the prefetch runs ahead of.)
const GEMV_PREFETCH_MIN: usize = 8192;
/// Weight rows per f32/bf16 tile.
const F_TILE: usize = 4;

/// The integer dot primitive of an instruction set. Every method accumulates, per 32-bit lane, the
/// products of that lane's 4 bytes.
pub(crate) trait Dot {
    /// Subtracted per i8 output as `I8_OFFSET * Σa` (the unsigned offset of the weights).
    const I8_OFFSET: i32;
    /// Weight rows of the i8 tiles for many activation rows: 2 (16 `ymm` registers), or 4 where
    /// [`Dot::i8_tile_many`] runs on 32 `zmm` registers (16 accumulators; each 64-byte activation
    /// load then feeds 4 `vpdpbusd`, halving the loads from L2 per product).
    const I8_MANY_COLS: usize = 2;
    /// Whether the f32 tiles of a row block take 2 activation rows at a time (16 accumulators:
    /// `ymm0`-`ymm31` under AVX-512 VL), so each weight load serves both; else 1 (16 `ymm`).
    const F32_PAIRS: bool = false;
    /// Whether many activation rows take the i16 `vpmaddwd` kernel ([`i8_pairs`]) instead of the
    /// register tiles of [`Dot::i8_tile_many`].
    const I8_PAIRS: bool = false;
    /// The unsigned operand made from i8 weight bytes.
    unsafe fn i8_weight(w: __m256i) -> __m256i;
    /// `acc + a · w` per lane, given the weights `w` and their unsigned form `wu`.
    unsafe fn i8_dot(acc: __m256i, wu: __m256i, w: __m256i, a: __m256i) -> __m256i;
    /// The dots (before the `8 * Σa` correction) of one pair of q4 groups against 8 weight rows:
    /// `[first group, second group]`, lane c = weight row c. `w[c]` points at row c's 32 bytes of the
    /// pair; `a_even` and `a_odd` are the pair's 64 activation codes (`Q4Groups` layout).
    unsafe fn u4_rows8(w: [*const u8; PANEL], a_even: __m256i, a_odd: __m256i) -> [__m256i; 2];
    /// [`i8_tile`] for [`I8_TILE_ROWS`] or more activation rows, unless the instruction set has a
    /// wider form.
    #[inline(always)]
    unsafe fn i8_tile_many<const R: usize, const C: usize>(
        a: [&[i8]; R],
        w: [&[i8]; C],
        k: usize,
        offsets: [i32; R],
    ) -> [[i32; C]; R]
    where
        Self: Sized,
    {
        i8_tile::<Self, R, C>(a, w, k, offsets)
    }
    /// q4 against [`Q4_PACKED_MIN_ROWS`] or more activation rows, K at least one group: packed
    /// panels ([`q4_block_packed`]) on the instruction set's widest [`PanelLanes`].
    unsafe fn q4_block_many(
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
    #[inline(always)]
    unsafe fn i8_weight(w: __m256i) -> __m256i {
        _mm256_abs_epi8(w)
    }
    #[inline(always)]
    unsafe fn i8_dot(acc: __m256i, wu: __m256i, w: __m256i, a: __m256i) -> __m256i {
        let pairs = _mm256_maddubs_epi16(wu, _mm256_sign_epi8(a, w));
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn u4_rows8(w: [*const u8; PANEL], a_even: __m256i, a_odd: __m256i) -> [__m256i; 2] {
        // Per row, i16 lanes of at most 2 * 2 * 15 * 127 = 7620 (8 per group: the first group in the
        // low 128 bits, the second in the high); two folds reach 4 * 7620 = 30480, then `vpmaddwd`
        // widens the last pairs. Rows fold as (0, 2) and (1, 3) so the lanes come out in row order.
        // (No closures here: they would not inherit the entry point's target features.)
        let mut v = [_mm256_setzero_si256(); PANEL];
        for c in 0..PANEL {
            v[c] = u4_pair_i16(w[c], a_even, a_odd);
        }
        let ones = _mm256_set1_epi16(1);
        let lo = fold_epi32_i16(fold_epi32_i16(v[0], v[2]), fold_epi32_i16(v[1], v[3]));
        let hi = fold_epi32_i16(fold_epi32_i16(v[4], v[6]), fold_epi32_i16(v[5], v[7]));
        let lo = _mm256_madd_epi16(lo, ones);
        let hi = _mm256_madd_epi16(hi, ones);
        [
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        ]
    }
    #[inline(always)]
    unsafe fn q4_block_many(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    ) {
        q4_block_packed::<wide::YmmPair<wide::Maddubs16>>(codes, scales, k, acts, out)
    }
}

/// One row's products for a pair of q4 groups as i16 lanes (pair sums of `vpmaddubsw`, even and odd
/// elements added): the first group's 8 lanes in the low 128 bits, the second's in the high.
#[inline(always)]
unsafe fn u4_pair_i16(p: *const u8, a_even: __m256i, a_odd: __m256i) -> __m256i {
    let (lo, hi) = split_q4_pair(p);
    _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, a_even),
        _mm256_maddubs_epi16(hi, a_odd),
    )
}

/// Per 128 bits: the 32-bit lanes `[x0 + x2, y0 + y2, x1 + x3, y1 + y3]` (added as i16 pairs).
#[inline(always)]
unsafe fn fold_epi32_i16(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi16(_mm256_unpacklo_epi32(x, y), _mm256_unpackhi_epi32(x, y))
}

/// Per 128 bits, i32 lanes: `[x0 + x2, y0 + y2, x1 + x3, y1 + y3]`.
#[inline(always)]
unsafe fn fold_epi32_i32(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi32(x, y), _mm256_unpackhi_epi32(x, y))
}

/// Per 128 bits, i32 lanes: `[x0 + x2, x1 + x3, y0 + y2, y1 + y3]`.
#[inline(always)]
unsafe fn fold_epi64_lanes(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y))
}

/// The bf16 scales of 8 groups of 8 weight rows (`s[c]` points at row c's first) as f32, transposed:
/// vector g holds group g, lane c = row c.
#[inline(always)]
unsafe fn scales8x8(s: [*const bf16; PANEL]) -> [__m256; 8] {
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

/// Two q4 groups' 32 bytes as unsigned `nibble ^ 8` values: (low nibbles = even elements of both
/// groups, high nibbles = odd elements) — the `Q4Groups` pair order.
#[inline(always)]
unsafe fn split_q4_pair(p: *const u8) -> (__m256i, __m256i) {
    let w = _mm256_xor_si256(
        _mm256_loadu_si256(p as *const __m256i),
        _mm256_set1_epi8(0x88u8 as i8),
    );
    let mask = _mm256_set1_epi8(0x0F);
    (
        _mm256_and_si256(w, mask),
        _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask),
    )
}

/// Activation chunk j (4 codes) of a packed-panel group, as an i32 to broadcast.
#[inline(always)]
unsafe fn chunk(even: *const i8, odd: *const i8, j: usize) -> i32 {
    let p = if j < 4 {
        even.add(4 * j)
    } else {
        odd.add(4 * (j - 4))
    };
    (p as *const i32).read_unaligned()
}

/// AVX-512 VNNI: `vpdpbusd` (u8 x i8, 4 products per i32 lane, accumulated, no saturation), 256-bit
/// for the GEMVs and 512-bit (`wide`) for many rows. One implementation for the real instructions
/// ([`VnniDot`]) and, in the tests, their exact AVX2 emulation ([`EmuVnniDot`]), so the tests run the
/// very bodies the VNNI entry point compiles.
pub(crate) struct Vnni<P>(std::marker::PhantomData<P>);

/// The real instructions.
pub(crate) struct RealVnni;
pub(crate) type VnniDot = Vnni<RealVnni>;

/// `vpdpbusd` at 256 bits and the 16-lane vector of a VNNI flavour (a trait, not a closure:
/// closures do not inherit target features).
pub(crate) trait Dpbusd {
    type Wide: wide::Lanes16;
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

impl Dpbusd for RealVnni {
    type Wide = wide::Zmm;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

impl<P: Dpbusd> Dot for Vnni<P> {
    const I8_OFFSET: i32 = 128;
    const I8_MANY_COLS: usize = 4;
    const F32_PAIRS: bool = true;
    #[inline(always)]
    unsafe fn i8_weight(w: __m256i) -> __m256i {
        _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN))
    }
    #[inline(always)]
    unsafe fn i8_dot(acc: __m256i, wu: __m256i, _w: __m256i, a: __m256i) -> __m256i {
        P::dpbusd(acc, wu, a)
    }
    #[inline(always)]
    unsafe fn u4_rows8(w: [*const u8; PANEL], a_even: __m256i, a_odd: __m256i) -> [__m256i; 2] {
        vnni_rows8::<P>(w, a_even, a_odd)
    }
    #[inline(always)]
    unsafe fn q4_block_many(
        codes: Q4Codes<'_>,
        scales: &[bf16],
        k: usize,
        acts: &Activations,
        out: &mut [&mut [f32]],
    ) {
        q4_block_packed::<P::Wide>(codes, scales, k, acts, out)
    }
    #[inline(always)]
    unsafe fn i8_tile_many<const R: usize, const C: usize>(
        a: [&[i8]; R],
        w: [&[i8]; C],
        k: usize,
        offsets: [i32; R],
    ) -> [[i32; C]; R] {
        wide::i8_tile16::<P::Wide, R, C>(a, w, k, offsets)
    }
}

/// `u4_rows8` over a `vpdpbusd`: per row, i32 lanes (4 per group and 128 bits), then two folds
/// (32-bit, then 64-bit lanes) leave row order.
#[inline(always)]
unsafe fn vnni_rows8<P: Dpbusd>(
    w: [*const u8; PANEL],
    a_even: __m256i,
    a_odd: __m256i,
) -> [__m256i; 2] {
    let mut v = [_mm256_setzero_si256(); PANEL];
    for c in 0..PANEL {
        let (lo, hi) = split_q4_pair(w[c]);
        v[c] = P::dpbusd(P::dpbusd(_mm256_setzero_si256(), lo, a_even), hi, a_odd);
    }
    let lo = fold_epi64_lanes(fold_epi32_i32(v[0], v[1]), fold_epi32_i32(v[2], v[3]));
    let hi = fold_epi64_lanes(fold_epi32_i32(v[4], v[5]), fold_epi32_i32(v[6], v[7]));
    [
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    ]
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
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        dpbusd_emulated(acc, u, s)
    }
}

#[cfg(test)]
#[inline(always)]
unsafe fn dpbusd_emulated(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let u_even = _mm256_and_si256(u, _mm256_set1_epi16(0x00FF));
    let u_odd = _mm256_srli_epi16(u, 8);
    let s_even = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8);
    let s_odd = _mm256_srai_epi16(s, 8);
    let even = _mm256_madd_epi16(u_even, s_even);
    let odd = _mm256_madd_epi16(u_odd, s_odd);
    _mm256_add_epi32(acc, _mm256_add_epi32(even, odd))
}

// ---------------------------------------------------------------------------------------------
// Entry points: one per instruction set, each the generic body compiled with that set's features.

/// # Safety
/// The CPU must support AVX2 and FMA; `block`, `x` and `acts` must match `k` and `out`
/// (checked by `Kernels::gemm_block`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm_block_avx2(
    block: &WeightBlock<'_>,
    k: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    gemm_block_generic::<Avx2Dot>(block, k, x, acts, out)
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
    gemm_block_generic::<VnniDot>(block, k, x, acts, out)
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
    gemm_block_generic::<EmuVnniDot>(block, k, x, acts, out)
}

#[inline(always)]
unsafe fn gemm_block_generic<D: Dot>(
    block: &WeightBlock<'_>,
    k: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    match *block {
        WeightBlock::F32(w) => f32_block::<D, f32>(w, k, x, out),
        WeightBlock::Bf16(w) => f32_block::<D, bf16>(w, k, x, out),
        WeightBlock::I8 { codes, scales } => i8_block::<D>(codes, scales, k, acts, out),
        WeightBlock::Q4 { codes, scales } => {
            if out.len() >= Q4_PACKED_MIN_ROWS && k >= Q4_GROUP {
                D::q4_block_many(codes, scales, k, acts, out)
            } else {
                q4_block_rows::<D>(codes, scales, k, acts, out)
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

/// One q4 group (16 bytes) as 32 unsigned values `nibble ^ 8` (= code + 8): the 16 low nibbles
/// (even elements), then the 16 high nibbles (odd elements) — the `Q4Groups` activation order.
#[inline(always)]
unsafe fn expand_q4(p: *const u8) -> __m256i {
    let b = _mm_loadu_si128(p as *const __m128i);
    let w = _mm256_xor_si256(
        _mm256_broadcastsi128_si256(b),
        _mm256_set1_epi8(0x88u8 as i8),
    );
    let w = _mm256_srlv_epi64(w, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(w, _mm256_set1_epi8(0x0F))
}

/// 8 bf16 values widened to f32 (exact).
///
/// # Safety
/// The CPU must support AVX2, and `p` must point to 8 readable bf16 values.
#[inline(always)]
pub unsafe fn bf16x8_to_ps(p: *const bf16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// `half::bf16::from_f32` on every element (round to nearest, ties to even; a NaN keeps the high
/// half of its payload with the quiet bit set), 8 at a time.
///
/// # Safety
/// The CPU must support AVX2; `dst` and `src` have the same length.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn f32_to_bf16_avx2(dst: &mut [bf16], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    let n = src.len() / 8 * 8;
    let abs_mask = _mm256_set1_epi32(0x7FFF_FFFF);
    let inf = _mm256_set1_epi32(0x7F80_0000);
    for i in (0..n).step_by(8) {
        let x = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
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
        _mm_storeu_si128(
            dst.as_mut_ptr().add(i) as *mut __m128i,
            _mm256_castsi256_si128(packed),
        );
    }
    for (d, &x) in dst[n..].iter_mut().zip(&src[n..]) {
        *d = bf16::from_f32(x);
    }
}

/// `dst[..live].copy_from_slice(&src[..live])`, where `live` is `full` (a multiple of 4, constant
/// at every caller) except in a last short tile. A whole tile moves in 128-bit loads and stores: as
/// `copy_from_slice` LLVM merged both cases into one `memcpy` call of `live` floats, per tile row
/// (1.9% of a 512-row q4 prefill's samples in `perf record`).
#[inline(always)]
unsafe fn copy_live(dst: &mut [f32], src: &[f32], full: usize, live: usize) {
    if live == full {
        assert!(full.is_multiple_of(4) && dst.len() >= full && src.len() >= full);
        for c in (0..full).step_by(4) {
            // SAFETY: c + 4 <= full <= both lengths (asserted above).
            _mm_storeu_ps(dst.as_mut_ptr().add(c), _mm_loadu_ps(src.as_ptr().add(c)));
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

/// `xs.map(f)` as a plain loop, so it inlines: `[T; N]::map`, and then `std::array::from_fn`, each
/// stayed an out-of-line call (`try_map`, `try_from_fn`) once per panel of the GEMVs, 1.4-1.5% of a
/// decode step's samples in `perf record`.
#[inline(always)]
fn map_n<T: Copy, U: Copy + Default, const N: usize>(xs: [T; N], f: impl Fn(T) -> U) -> [U; N] {
    let mut out = [U::default(); N];
    for (o, &x) in out.iter_mut().zip(&xs) {
        *o = f(x);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// i8: register tiles of R activation rows x C weight rows over the whole K. Few rows: one weight row
// at a time (each thread streams its rows front to back); many rows: 4 x 2 tiles.

/// Sum of the 8 lanes.
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The exact i8 dots of R rows by C weight rows; element `r * C + c`. `a` and `w` rows hold `k` codes;
/// `offsets[r]` is row r's code sum over the SIMD part of K.
#[inline(always)]
unsafe fn i8_tile<D: Dot, const R: usize, const C: usize>(
    a: [&[i8]; R],
    w: [&[i8]; C],
    k: usize,
    offsets: [i32; R],
) -> [[i32; C]; R] {
    let steps = k / SIMD_BYTES;
    let mut acc = [[_mm256_setzero_si256(); C]; R];
    for s in 0..steps {
        let off = s * SIMD_BYTES;
        for c in 0..C {
            let wv = _mm256_loadu_si256(w[c].as_ptr().add(off) as *const __m256i);
            let wu = D::i8_weight(wv);
            for r in 0..R {
                let av = _mm256_loadu_si256(a[r].as_ptr().add(off) as *const __m256i);
                acc[r][c] = D::i8_dot(acc[r][c], wu, wv, av);
            }
        }
    }
    let tail = steps * SIMD_BYTES;
    let mut sums = [[0i32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut v = hsum_epi32(acc[r][c]) - D::I8_OFFSET * offsets[r];
            for j in tail..k {
                v += a[r][j] as i32 * w[c][j] as i32;
            }
            sums[r][c] = v;
        }
    }
    sums
}

/// [`i8_tile`] for one activation row and one weight row, prefetching the weight stream: at each
/// 64 bytes `off` of the row it fetches the line at address `pf + off` (the caller's distance ahead
/// of the row; a prefetch never faults, even past the weight). The same sum as
/// `i8_tile::<D, 1, 1>` (integer adds, in any order the same). (Measured with `bench decode
/// --kinds i8 --ctx 0`, alternated: 6-9% less time per token with the prefetch.)
#[inline(always)]
unsafe fn i8_row_dot<D: Dot>(a: &[i8], w: &[i8], k: usize, offset: i32, pf: usize) -> i32 {
    // The unchecked loads below read `k` codes of each row.
    assert!(
        a.len() >= k && w.len() >= k,
        "i8 GEMV: a row is shorter than K"
    );
    let steps = k / SIMD_BYTES;
    let (ap, wp) = (a.as_ptr(), w.as_ptr());
    // Two steps (one cache line) per iteration into two named accumulators: indexed by `s % 2`,
    // LLVM kept them on the stack, a load and a store per step (seen in `perf annotate`).
    let (mut acc0, mut acc1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let mut off = 0;
    while off + 2 * SIMD_BYTES <= steps * SIMD_BYTES {
        _mm_prefetch::<_MM_HINT_T0>((pf + off) as *const i8);
        // The loads: `off + 64 <= k` and both rows hold `k` codes.
        let w0 = _mm256_loadu_si256(wp.add(off) as *const __m256i);
        let w1 = _mm256_loadu_si256(wp.add(off + SIMD_BYTES) as *const __m256i);
        let a0 = _mm256_loadu_si256(ap.add(off) as *const __m256i);
        let a1 = _mm256_loadu_si256(ap.add(off + SIMD_BYTES) as *const __m256i);
        acc0 = D::i8_dot(acc0, D::i8_weight(w0), w0, a0);
        acc1 = D::i8_dot(acc1, D::i8_weight(w1), w1, a1);
        off += 2 * SIMD_BYTES;
    }
    if off < steps * SIMD_BYTES {
        let w0 = _mm256_loadu_si256(wp.add(off) as *const __m256i);
        let a0 = _mm256_loadu_si256(ap.add(off) as *const __m256i);
        acc0 = D::i8_dot(acc0, D::i8_weight(w0), w0, a0);
    }
    let mut v = hsum_epi32(_mm256_add_epi32(acc0, acc1)) - D::I8_OFFSET * offset;
    for j in steps * SIMD_BYTES..k {
        v += a[j] as i32 * w[j] as i32;
    }
    v
}

/// Rows at which i8 switches from one weight row at a time to 4 x 2 tiles.
const I8_TILE_ROWS: usize = 4;

#[inline(always)]
unsafe fn i8_block<D: Dot>(
    codes: &[i8],
    scales: &[f32],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let (rows, nb) = (out.len(), out[0].len());
    let wrow = |j: usize| &codes[j * k..(j + 1) * k];
    let offset = |r: usize| acts.sums(r)[0];
    if rows < I8_TILE_ROWS {
        let dist = GEMV_PREFETCH_MIN.max(PANEL * k);
        for j in 0..nb {
            let pf = codes.as_ptr() as usize + j * k + dist;
            for (r, o) in out.iter_mut().enumerate() {
                let acc = i8_row_dot::<D>(acts.codes(r), wrow(j), k, offset(r), pf);
                o[j] = quant::finish_i8(acc, acts.scale(r), scales[j]);
            }
        }
        return;
    }
    if D::I8_PAIRS {
        return i8_pairs::i8_block_pairs(codes, scales, k, acts, out);
    }
    if D::I8_MANY_COLS == 4 {
        i8_block_tiles::<D, 4>(codes, scales, k, acts, out)
    } else {
        i8_block_tiles::<D, 2>(codes, scales, k, acts, out)
    }
}

/// [`i8_block`] for [`I8_TILE_ROWS`] or more rows: tiles of 4 activation rows x C weight rows.
#[inline(always)]
unsafe fn i8_block_tiles<D: Dot, const C: usize>(
    codes: &[i8],
    scales: &[f32],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let (rows, nb) = (out.len(), out[0].len());
    let wrow = |j: usize| &codes[j * k..(j + 1) * k];
    let offset = |r: usize| acts.sums(r)[0];
    // Row blocks outermost: a block's codes stay in L2 while every weight tile passes over them.
    for rb in row_blocks(rows, k, INT_BLOCK_BYTES, I8_TILE_ROWS) {
        for j0 in (0..nb).step_by(C) {
            // A short last tile repeats its last weight row.
            let js = panel_rows::<C>(j0, nb);
            let live = (nb - j0).min(C);
            let mut r = rb.start;
            while r < rb.end {
                // A short last tile repeats its last row.
                let rs: [usize; I8_TILE_ROWS] = std::array::from_fn(|i| (r + i).min(rb.end - 1));
                let acc = D::i8_tile_many::<I8_TILE_ROWS, C>(
                    map_n(rs, |rr| acts.codes(rr)),
                    map_n(js, wrow),
                    k,
                    map_n(rs, offset),
                );
                for (i, accs) in acc.iter().enumerate().take(rb.end - r) {
                    for c in 0..live {
                        let j = j0 + c;
                        out[r + i][j] = quant::finish_i8(accs[c], acts.scale(r + i), scales[j]);
                    }
                }
                r += I8_TILE_ROWS;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// q4, few rows: each row against a panel of 8 weight rows, one pair of groups of all 8 rows at a
// time, reduced across the rows so that lanes are weight rows (no transpose, no product buffer).

/// The scaled group sums (before `finish_q4`) of one activation row against 8 weight rows. Lanes
/// are weight rows throughout: each pair of groups is reduced across the 8 rows, so every output's
/// f32 chain runs in its own lane, groups ascending.
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
    let mut sum = _mm256_setzero_ps();
    let blocks = groups / 8;
    let ap = a.as_ptr();
    let cp = corr.as_ptr();
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
            // A block of the panel is 1 KB of codes and 128 bytes of scales: fetch the same amount
            // `pf` ahead in address order (a prefetch never faults, even past the weight).
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
    let mut sums = [0f32; PANEL];
    _mm256_storeu_ps(sums.as_mut_ptr(), sum);
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
        acc += e as i32 * (((b << 4) as i8) >> 4) as i32 + o as i32 * ((b as i8) >> 4) as i32;
    }
    acc
}

/// 8 weight rows of a block, where their group pairs live: row c's pair p at
/// `base + start[c] + p * step[c]` (`Q4Codes::pairs`).
#[derive(Clone, Copy)]
struct Q4PanelRows<'a> {
    codes: Q4Codes<'a>,
    rows: [usize; PANEL],
    base: *const u8,
    start: [usize; PANEL],
    step: [usize; PANEL],
}

impl<'a> Q4PanelRows<'a> {
    #[inline(always)]
    fn new(codes: Q4Codes<'a>, rows: [usize; PANEL]) -> Q4PanelRows<'a> {
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

#[inline(always)]
unsafe fn q4_block_rows<D: Dot>(
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
            let sums = q4_row_panel::<D>(acts.codes(r), acts.sums(r), w, s, groups, pf);
            for (c, &v) in sums.iter().enumerate() {
                if j0 + c < nb {
                    o[j0 + c] = quant::finish_q4(v, acts.scale(r));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// q4, many rows: a panel of 8 weight rows is unpacked once into [group][chunk][row][4 bytes], then
// every activation row broadcasts 4 codes at a time against it; lanes are weight rows throughout.

thread_local! {
    static Q4_PANEL: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Unpacks the 8 weight rows `js` into lanes `8 * half ..` of a packed panel `lanes` rows wide:
/// `wp` holds per group and chunk j (4 codes) the `lanes` rows' 4 bytes side by side
/// (`groups x 8 x 4 * lanes` bytes), `sp` per group the rows' scales (`groups x lanes`). The 8-lane
/// kernels use one half; the 16-lane (`wide`) ones two.
#[inline(always)]
unsafe fn q4_pack_panel(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    js: [usize; PANEL],
    (lanes, half): (usize, usize),
    wp: &mut [u8],
    sp: &mut [f32],
) {
    let groups = k / Q4_GROUP;
    debug_assert!(wp.len() >= groups * 32 * lanes && sp.len() >= groups * lanes);
    for g in 0..groups {
        let mut e = [_mm256_setzero_ps(); PANEL];
        for c in 0..PANEL {
            let p = codes.group(js[c], g).as_ptr();
            e[c] = _mm256_castsi256_ps(expand_q4(p));
        }
        // Chunk j (4 codes) of every row side by side.
        for (j, t) in transpose8(e).into_iter().enumerate() {
            let at = g * 32 * lanes + 4 * lanes * j + 32 * half;
            _mm256_storeu_ps(wp.as_mut_ptr().add(at) as *mut f32, t);
        }
        for (c, &jr) in js.iter().enumerate() {
            sp[g * lanes + PANEL * half + c] = scales[jr * groups + g].to_f32();
        }
    }
}

/// Most weight rows of a packed panel (the 512-bit kernels').
const MAX_LANES: usize = 2 * PANEL;

/// A vector of weight-row lanes a packed q4 panel is read in: 8 (`ymm`) or 16 (`zmm`, or two `ymm`
/// in the tests), packed by [`q4_pack_panel`] 8 rows at a time, and the operations of
/// [`q4_packed_tile`].
pub(crate) trait PanelLanes {
    const LANES: usize;
    /// i32 lanes.
    type I: Copy;
    /// f32 lanes.
    type F: Copy;
    unsafe fn zero_f() -> Self::F;
    unsafe fn load_f(p: *const f32) -> Self::F;
    unsafe fn set1_i(x: i32) -> Self::I;
    unsafe fn set1_f(x: f32) -> Self::F;
    unsafe fn sub_i(a: Self::I, b: Self::I) -> Self::I;
    /// i32 to f32, rounded to nearest (as `as f32`).
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn store_f(p: *mut f32, v: Self::F);
    /// One q4 group of a packed panel against one activation row: lane c is `Σ_j wg[j][c] · a_j`
    /// over the 8 chunks, where chunk j < 4 reads `even[4j..]` and chunk j >= 4 `odd[4(j-4)..]`.
    unsafe fn group_dot(wg: *const u8, even: *const i8, odd: *const i8) -> Self::I;
    /// [`q4_packed_tile`] for [`Q4_TILE_ROWS`] rows, unless the lanes have a tuned form (same
    /// operations per output, so the same bits).
    #[inline(always)]
    unsafe fn tile4(
        wp: &[u8],
        sp: &[f32],
        a: [&[i8]; Q4_TILE_ROWS],
        corr: [&[i32]; Q4_TILE_ROWS],
        a_scale: [f32; Q4_TILE_ROWS],
        groups: usize,
    ) -> [[f32; MAX_LANES]; Q4_TILE_ROWS]
    where
        Self: Sized,
    {
        q4_packed_tile::<Self, Q4_TILE_ROWS>(wp, sp, a, corr, a_scale, groups)
    }
}

/// R activation rows against a packed panel of `V::LANES` weight rows, finished (`finish_q4`):
/// `done[r][c]` for weight row c (c < `V::LANES`). Per output: exact integer group dots, then
/// `sum + acc as f32 * scale` per group in ascending order (multiply, then add), in its own lane.
#[inline(always)]
unsafe fn q4_packed_tile<V: PanelLanes, const R: usize>(
    wp: &[u8],
    sp: &[f32],
    a: [&[i8]; R],
    corr: [&[i32]; R],
    a_scale: [f32; R],
    groups: usize,
) -> [[f32; MAX_LANES]; R] {
    let mut sum = [V::zero_f(); R];
    for g in 0..groups {
        let scale = V::load_f(sp.as_ptr().add(g * V::LANES));
        let wg = wp.as_ptr().add(g * 32 * V::LANES);
        let (even, odd) = q4_halves(g, groups);
        for r in 0..R {
            let ar = a[r].as_ptr();
            let acc = V::group_dot(wg, ar.add(even), ar.add(odd));
            let acc = V::sub_i(acc, V::set1_i(corr[r][g]));
            sum[r] = V::add_f(sum[r], V::mul_f(V::cvt(acc), scale));
        }
    }
    let mut done = [[0f32; MAX_LANES]; R];
    for r in 0..R {
        V::store_f(
            done[r].as_mut_ptr(),
            V::mul_f(sum[r], V::set1_f(a_scale[r])),
        );
    }
    done
}

/// q4 weight rows against every activation row of `acts` (K at least one group), a packed panel of
/// `V::LANES` weight rows at a time: tiles of [`Q4_TILE_ROWS`] rows, then one row at a time.
#[inline(always)]
unsafe fn q4_block_packed<V: PanelLanes>(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let groups = k / Q4_GROUP;
    let (rows, nb) = (out.len(), out[0].len());
    let lanes = V::LANES;
    let (pb, ps) = (groups * 32 * lanes, groups * lanes);
    // The buffers leave the thread-local while the kernel runs: no SIMD code inside a closure
    // (closures do not inherit the entry point's target features).
    let (mut wp, mut sp) = Q4_PANEL.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // Up to Q4_PACKED_ROWS weight rows are unpacked once into consecutive panels; then each block of
    // activation rows passes over all of them.
    for c0 in (0..nb).step_by(Q4_PACKED_ROWS) {
        let panels = (nb - c0).min(Q4_PACKED_ROWS).div_ceil(lanes);
        wp.resize(panels * pb, 0);
        sp.resize(panels * ps, 0.0);
        for p in 0..panels {
            let j0 = c0 + p * lanes;
            for half in 0..lanes / PANEL {
                let js = panel_rows::<PANEL>(j0 + PANEL * half, nb);
                let (wpp, spp) = (&mut wp[p * pb..(p + 1) * pb], &mut sp[p * ps..(p + 1) * ps]);
                q4_pack_panel(codes, scales, k, js, (lanes, half), wpp, spp);
            }
        }
        for rb in row_blocks(rows, k + 4 * groups, INT_BLOCK_BYTES, Q4_TILE_ROWS) {
            for p in 0..panels {
                let j0 = c0 + p * lanes;
                let (wpp, spp) = (&wp[p * pb..(p + 1) * pb], &sp[p * ps..(p + 1) * ps]);
                let live = (nb - j0).min(lanes);
                let mut r = rb.start;
                while r + Q4_TILE_ROWS <= rb.end {
                    let rs: [usize; Q4_TILE_ROWS] = std::array::from_fn(|i| r + i);
                    let done = V::tile4(
                        wpp,
                        spp,
                        map_n(rs, |i| acts.codes(i)),
                        map_n(rs, |i| acts.sums(i)),
                        map_n(rs, |i| acts.scale(i)),
                        groups,
                    );
                    for (i, d) in done.iter().enumerate() {
                        copy_live(&mut out[r + i][j0..], d, lanes, live);
                    }
                    r += Q4_TILE_ROWS;
                }
                while r < rb.end {
                    let [d] = q4_packed_tile::<V, 1>(
                        wpp,
                        spp,
                        [acts.codes(r)],
                        [acts.sums(r)],
                        [acts.scale(r)],
                        groups,
                    );
                    copy_live(&mut out[r][j0..], &d, lanes, live);
                    r += 1;
                }
            }
        }
    }
    Q4_PANEL.with(|cell| *cell.borrow_mut() = (wp, sp));
}

// ---------------------------------------------------------------------------------------------
// f32 and bf16: tiles of one row x F_TILE weight rows, in `scalar::dot_f32`'s order.

/// A weight element the f32 tiles read: f32 itself or bf16 widened (exactly).
trait Widen: Sized {
    /// Whether the GEMV prefetches the next tile's rows. Measured (`bench gemm --rows 1`, 2
    /// threads, alternated): bf16 13-19% less time per token with it; f32 read 90-92% of the
    /// streaming rate with it in four pairs and 88-101% without: no gain shown, so f32 leaves its
    /// stream to the hardware prefetcher as before.
    const GEMV_PREFETCH: bool;
    /// 8 elements as f32.
    unsafe fn load8(p: *const Self) -> __m256;
    /// A panel's `F_TILE` rows of `k` values as f32: the rows themselves (f32), or widened into
    /// `scratch` (bf16) once for every activation row of a block.
    unsafe fn panel<'a>(
        rows: [&'a [Self]; F_TILE],
        k: usize,
        scratch: &'a mut Vec<f32>,
    ) -> [&'a [f32]; F_TILE];
}

impl Widen for f32 {
    const GEMV_PREFETCH: bool = false;
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
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
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        bf16x8_to_ps(p)
    }
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
                // SAFETY: i + 8 <= k <= both lengths.
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), bf16x8_to_ps(row.as_ptr().add(i)));
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
#[inline(always)]
unsafe fn f32_tile<T: Widen + Into<f32> + Copy, const R: usize>(
    x: [&[f32]; R],
    w: [&[T]; F_TILE],
    k: usize,
    pf_ahead: usize,
) -> [[f32; F_TILE]; R] {
    let mut lo = [[_mm256_setzero_ps(); F_TILE]; R];
    let mut hi = [[_mm256_setzero_ps(); F_TILE]; R];
    let blocks = k / 16;
    let block_bytes = 16 * std::mem::size_of::<T>();
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
    let mut sums = [[0f32; F_TILE]; R];
    for r in 0..R {
        for c in 0..F_TILE {
            let mut lanes = [0f32; 16];
            _mm256_storeu_ps(lanes.as_mut_ptr(), lo[r][c]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi[r][c]);
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

#[inline(always)]
unsafe fn f32_block<D: Dot, T: Widen + Into<f32> + Copy>(
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
                let [sums] = f32_tile([xr(r)], wr, k, ahead);
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
            let wr = T::panel(map_n(js, |j| &w[j * k..(j + 1) * k]), k, &mut scratch);
            let live = (nb - j0).min(F_TILE);
            let mut r = rb.start;
            if D::F32_PAIRS {
                while r + 2 <= rb.end {
                    let sums = f32_tile([xr(r), xr(r + 1)], wr, k, 0);
                    for (i, s) in sums.iter().enumerate() {
                        copy_live(&mut out[r + i][j0..], s, F_TILE, live);
                    }
                    r += 2;
                }
            }
            while r < rb.end {
                let [sums] = f32_tile([xr(r)], wr, k, 0);
                copy_live(&mut out[r][j0..], &sums, F_TILE, live);
                r += 1;
            }
        }
    }
    F32_PANEL.with(|cell| *cell.borrow_mut() = scratch);
}

// ---------------------------------------------------------------------------------------------
// Activation quantization with `packs::quant::quantize_activation_row`'s bytes.

/// `quantize_activation_row` in AVX2: the same max, the same f32 division, round half away from zero
/// done exactly (`t = trunc(q)`, `t ± 1` when `|q - t| >= 0.5`). Rows with a NaN, an infinite or a
/// zero scale go to the oracle itself.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_row_avx2(x: &[f32], codes: &mut [i8]) -> f32 {
    assert_eq!(
        x.len(),
        codes.len(),
        "quantize_row: x and codes differ in length"
    );
    let n = x.len();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let mut vmax = _mm256_setzero_ps();
    let mut nan = _mm256_setzero_ps();
    let n8 = n - n % 8;
    for i in (0..n8).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), vmax);
    let mut max_abs = lanes.iter().fold(0f32, |m, &v| m.max(v));
    let mut any_nan = _mm256_movemask_ps(nan) != 0;
    for &v in &x[n8..] {
        any_nan |= v.is_nan();
        max_abs = max_abs.max(v.abs());
    }
    let scale = max_abs / 127.0;
    if any_nan || scale == 0.0 || !scale.is_finite() {
        return quant::quantize_activation_row(x, codes);
    }
    let sv = _mm256_set1_ps(scale);
    let n32 = n - n % 32;
    for i in (0..n32).step_by(32) {
        let p = x.as_ptr().add(i);
        let q: [__m256i; 4] = [
            code8(_mm256_loadu_ps(p), sv),
            code8(_mm256_loadu_ps(p.add(8)), sv),
            code8(_mm256_loadu_ps(p.add(16)), sv),
            code8(_mm256_loadu_ps(p.add(24)), sv),
        ];
        let w01 = _mm256_packs_epi32(q[0], q[1]);
        let w23 = _mm256_packs_epi32(q[2], q[3]);
        let b = _mm256_packs_epi16(w01, w23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(codes.as_mut_ptr().add(i) as *mut __m256i, b);
    }
    for (c, &v) in codes[n32..].iter_mut().zip(&x[n32..]) {
        *c = (v / scale).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// `dst.copy_from_slice(src)` with 32-byte loads and stores; returns whether `dst` already held
/// `src`. (Reading `dst` too also keeps LLVM from turning the loop back into a `memcpy` call.)
///
/// # Safety
/// The CPU must support AVX2; `dst.len() == src.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn copy_u32_avx2(dst: &mut [u32], src: &[u32]) -> bool {
    let n = src.len().min(dst.len());
    let n8 = n - n % 8;
    let mut same = _mm256_set1_epi32(-1);
    for i in (0..n8).step_by(8) {
        let v = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
        let old = _mm256_loadu_si256(dst.as_ptr().add(i) as *const __m256i);
        same = _mm256_and_si256(same, _mm256_cmpeq_epi32(v, old));
        _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, v);
    }
    let tail_same = dst[n8..n] == src[n8..n];
    dst[n8..n].copy_from_slice(&src[n8..n]);
    _mm256_movemask_epi8(same) == -1 && tail_same
}

/// The code sum of 32 i8 codes: `vpsadbw` of the codes + 128 against zero, less 32 * 128.
#[inline(always)]
unsafe fn sum32_i8(v: __m256i) -> i32 {
    let s = _mm256_sad_epu8(
        _mm256_xor_si256(v, _mm256_set1_epi8(i8::MIN)),
        _mm256_setzero_si256(),
    );
    let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi64(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si64(s) as i32 - 32 * 128
}

/// One group's 32 codes as `[16 even elements | 16 odd elements]`.
#[inline(always)]
unsafe fn even_odd32(v: __m256i) -> __m256i {
    let split = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5,
        7, 9, 11, 13, 15,
    );
    // Per 128 bits [evens | odds] of 16 elements; the quads (e0, o0, e1, o1) become (e0, e1, o0, o1).
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, split))
}

/// `activations::q4_groups_row_scalar` in AVX2 (same bytes and sums).
///
/// # Safety
/// The CPU must support AVX2; `codes.len() == 32 * sums.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q4_groups_row_avx2(codes: &mut [i8], sums: &mut [i32]) {
    let groups = sums.len();
    debug_assert_eq!(codes.len(), groups * Q4_GROUP);
    for g0 in (0..groups).step_by(2) {
        let p = codes.as_mut_ptr().add(g0 * Q4_GROUP);
        let a = _mm256_loadu_si256(p as *const __m256i);
        sums[g0] = 8 * sum32_i8(a);
        let a = even_odd32(a);
        if g0 + 1 < groups {
            let b = _mm256_loadu_si256(p.add(Q4_GROUP) as *const __m256i);
            sums[g0 + 1] = 8 * sum32_i8(b);
            let b = even_odd32(b);
            // [evens of g0, evens of g0 + 1, odds of g0, odds of g0 + 1]
            _mm256_storeu_si256(p as *mut __m256i, _mm256_permute2x128_si256::<0x20>(a, b));
            _mm256_storeu_si256(
                p.add(Q4_GROUP) as *mut __m256i,
                _mm256_permute2x128_si256::<0x31>(a, b),
            );
        } else {
            // A last unpaired group: its evens, then its odds.
            _mm256_storeu_si256(p as *mut __m256i, a);
        }
    }
}

/// `(v / scale).round().clamp(-127.0, 127.0)` for 8 finite values, as i32 lanes.
#[inline(always)]
unsafe fn code8(v: __m256, scale: __m256) -> __m256i {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let q = _mm256_div_ps(v, scale);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(q);
    // q - t is exact; a fraction of at least one half moves one step away from zero.
    let frac = _mm256_and_ps(_mm256_sub_ps(q, t), abs_mask);
    let away = _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_andnot_ps(abs_mask, q));
    let bump = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)), away);
    let r = _mm256_add_ps(t, bump);
    let r = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
        _mm256_set1_ps(127.0),
    );
    _mm256_cvttps_epi32(r)
}
