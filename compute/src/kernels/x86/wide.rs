//! 16-lane panels for many activation rows (prefill). For q4, the packed-panel kernel of
//! `q4_packed.rs` with panels of 16 weight rows: on AVX2 as two `ymm` halves ([`YmmPair`]), each
//! broadcast of 4 activation codes feeding a `vpmaddubsw` per half (8-row panels spent one broadcast
//! per product); on AVX-512 VNNI one `vpdpbusd` on a `zmm` register per 4 codes of all 16 rows. For
//! i8 on VNNI, the 4 x 2 register tiles of `i8_tiles.rs` taking 64 codes a step.
//!
//! Why 512 bits on VNNI: on the Zen 5 cores of Strix Point laptops, 128- and 256-bit integer vector
//! operations issue at half the rate per clock of Zen 4's while 512-bit ones keep Zen 4's rate
//! (David Huang's measurements), so a 512-bit `vpdpbusd` does twice the multiply-adds per cycle of
//! a 256-bit one there (not measured by this project: no Zen 5 at hand).
//!
//! The q4 tile is `q4_packed.rs`'s one packed-panel tile over [`PanelLanes`] (AVX2 has a tuned 4-row
//! form with the same operations per output); the i8 tiles are written over [`Lanes16`]. In the
//! tests the VNNI vectors are two `ymm` halves with `vpdpbusd` emulated in AVX2 (`EmuZmm`), so
//! every line but the `zmm` intrinsics runs on AVX2 machines against the oracles.

use super::q4_few::split_nibbles;
use super::q4_packed::{
    chunk, direct_group_regs, q4_packed_tile, PanelLanes, MAX_LANES, Q4_TILE_ROWS,
};
use crate::kernels::activations::SIMD_BYTES;
use crate::kernels::q4_halves;
use packs::quant::Q4_GROUP;
use std::arch::asm;
use std::arch::x86_64::*;

/// Weight rows of a wide panel.
const WIDE: usize = MAX_LANES;

/// A 16-lane vector: the packed q4 panel's operations ([`PanelLanes`]) and those of the i8 tiles.
/// Its methods need the CPU to support *`Self`'s features* ([`PanelLanes`]): AVX-512 F and VNNI for
/// [`Zmm`], AVX2 for the two-`ymm` emulation.
pub(crate) trait Lanes16: PanelLanes {
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn zero_i() -> Self::I;
    /// 64 bytes.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; `p` must point to 64 readable bytes.
    unsafe fn load_i(p: *const u8) -> Self::I;
    /// `vpdpbusd`: per lane, `acc` plus the 4 products of `u`'s unsigned and `s`'s signed bytes.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn dpbusd(acc: Self::I, u: Self::I, s: Self::I) -> Self::I;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn xor_i(a: Self::I, b: Self::I) -> Self::I;
    /// The sum of the 16 lanes.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn hsum_i(a: Self::I) -> i32;
}

/// The `zmm` registers (AVX-512 F + VNNI; the caller's entry point enables them).
pub(crate) struct Zmm;

impl PanelLanes for Zmm {
    const LANES: usize = MAX_LANES;
    type I = __m512i;
    type F = __m512;
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_setzero_ps() }
    }
    /// # Safety
    /// The CPU must support AVX-512 F; `p` must point to 16 readable floats.
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m512 {
        // SAFETY: AVX-512 F and the 16 floats at `p`, as this function requires of its caller.
        unsafe { _mm512_loadu_ps(p) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn set1_i(x: i32) -> __m512i {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_set1_epi32(x) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn set1_f(x: f32) -> __m512 {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_set1_ps(x) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn sub_i(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_sub_epi32(a, b) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_mul_ps(a, b) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_add_ps(a, b) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F; `p` must point to 16 writable floats.
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m512) {
        // SAFETY: AVX-512 F and the 16 floats at `p`, as this function requires of its caller.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F and VNNI; `wg` must point to 512 readable bytes, `even` and
    /// `odd` to 16 readable codes each.
    #[inline(always)]
    unsafe fn group_dot(wg: *const u8, from: i32, even: *const i8, odd: *const i8) -> Self::I {
        // SAFETY: `vnni_group_dot`'s contract is this one.
        unsafe { vnni_group_dot::<Self>(wg, from, even, odd) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F; `p` must point to 256 readable bytes.
    #[inline(always)]
    unsafe fn group_codes16(p: *const u8) -> [__m512i; 4] {
        // SAFETY: AVX-512 F, which the caller guarantees; load t reads bytes `64 t..64 t + 64` at
        // `p`, inside its 256 by this function's contract.
        // (A loop, not `array::from_fn`: closures do not inherit the entry point's target features.)
        unsafe {
            let mut v = [_mm512_setzero_si512(); 4];
            for (t, vt) in v.iter_mut().enumerate() {
                *vt = _mm512_loadu_si512(p.add(64 * t) as *const _);
            }
            v
        }
    }
    /// # Safety
    /// The CPU must support AVX-512 F and BW.
    #[inline(always)]
    unsafe fn nibbles(x: __m512i) -> (__m512i, __m512i) {
        // SAFETY: register-only AVX-512 F/BW intrinsics; the caller guarantees them.
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            (
                _mm512_and_si512(x, mask),
                _mm512_and_si512(_mm512_srli_epi16::<4>(x), mask),
            )
        }
    }
    /// # Safety
    /// The CPU must support AVX-512 F and VNNI; `even` and `odd` must point to 16 readable codes
    /// each.
    #[inline(always)]
    unsafe fn group_dot_regs(
        w: &[__m512i; 8],
        from: i32,
        even: *const i8,
        odd: *const i8,
    ) -> __m512i {
        // SAFETY: `vnni_group_dot_regs`'s contract is this one.
        unsafe { vnni_group_dot_regs::<Self>(w, from, even, odd) }
    }
}

impl Lanes16 for Zmm {
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_setzero_si512() }
    }
    /// # Safety
    /// The CPU must support AVX-512 F; `p` must point to 64 readable bytes.
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> __m512i {
        // SAFETY: AVX-512 F and the 64 bytes at `p`, as this function requires of its caller.
        unsafe { _mm512_loadu_si512(p as *const _) }
    }
    /// # Safety
    /// The CPU must support AVX-512 VNNI.
    #[inline(always)]
    unsafe fn dpbusd(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: a register-only AVX-512 VNNI intrinsic; the caller guarantees AVX-512 VNNI.
        unsafe { _mm512_dpbusd_epi32(acc, u, s) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_add_epi32(a, b) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn xor_i(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: a register-only AVX-512 F intrinsic; the caller guarantees AVX-512 F.
        unsafe { _mm512_xor_si512(a, b) }
    }
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    unsafe fn hsum_i(a: __m512i) -> i32 {
        // SAFETY: register-only AVX-512 F intrinsics; the caller guarantees AVX-512 F.
        unsafe { _mm512_reduce_add_epi32(a) }
    }
}

/// How a [`YmmPair`] takes the dot of one q4 group of a packed panel. Its methods need the CPU to
/// support AVX2.
pub(crate) trait PairGroupDot: Sized {
    /// Whether the 4-row tile is [`maddubs16_tile4`] (else the generic `q4_packed_tile`), and a
    /// whole pack panel's group is [`maddubs16_direct_group`] (else the generic form).
    const ASM_TILE4: bool = false;
    /// [`PanelLanes::group_dot`] on the two halves.
    ///
    /// # Safety
    /// The CPU must support AVX2; `wg` must point to 512 readable bytes, `even` and `odd` to 16
    /// readable codes each.
    unsafe fn group_dot(wg: *const u8, even: *const i8, odd: *const i8) -> [__m256i; 2];
    /// [`PanelLanes::group_dot_regs`] on the two halves.
    ///
    /// # Safety
    /// The CPU must support AVX2; `even` and `odd` must point to 16 readable codes each.
    unsafe fn group_dot_regs(
        w: &[[__m256i; 2]; 8],
        from: i32,
        even: *const i8,
        odd: *const i8,
    ) -> [__m256i; 2];
}

/// Two `ymm` halves (lanes 0..8, 8..16) as one 16-lane panel vector, with the group dot of `G`:
/// [`Maddubs16`] (the AVX2 q4 kernel for many rows), or in the tests `vpdpbusd` emulated exactly
/// (`EmuZmm`: the wide VNNI body on AVX2). Its features are AVX2.
pub(crate) struct YmmPair<G>(std::marker::PhantomData<G>);

/// `vpmaddubsw` per chunk for both halves from one broadcast of the chunk's 4 activation codes,
/// summed in i16 (at most 8 x 3810 = 30480 < 32767, see `x86/mod.rs`), then one `vpmaddwd` per
/// half. A panel of 16 weight rows makes each broadcast serve two products (8-row panels: one).
pub(crate) struct Maddubs16;

impl PairGroupDot for Maddubs16 {
    const ASM_TILE4: bool = true;
    /// # Safety
    /// The CPU must support AVX2; `wg` must point to 512 readable bytes, `even` and `odd` to 16
    /// readable codes each.
    #[inline(always)]
    unsafe fn group_dot(wg: *const u8, even: *const i8, odd: *const i8) -> [__m256i; 2] {
        // SAFETY: AVX2, which the caller guarantees; chunk j < 8 reads the weight bytes
        // `4 * WIDE * j..4 * WIDE * (j + 1)` of the group's `32 * WIDE = 512`, readable by this
        // function's contract, as are the codes `group_dot_regs` reads.
        unsafe {
            let mut w = [[_mm256_setzero_si256(); 2]; 8];
            for (j, wj) in w.iter_mut().enumerate() {
                for (h, v) in wj.iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(wg.add(4 * WIDE * j + 32 * h) as *const __m256i);
                }
            }
            Self::group_dot_regs(&w, 0, even, odd)
        }
    }
    /// # Safety
    /// The CPU must support AVX2; `even` and `odd` must point to 16 readable codes each.
    #[inline(always)]
    unsafe fn group_dot_regs(
        w: &[[__m256i; 2]; 8],
        from: i32,
        even: *const i8,
        odd: *const i8,
    ) -> [__m256i; 2] {
        // SAFETY: AVX2, which the caller guarantees; chunk j < 8 reads 4 of the 16 codes of `even`
        // or `odd`, readable by this function's contract.
        unsafe {
            let mut acc16 = [_mm256_setzero_si256(); 2];
            for (j, wj) in w.iter().enumerate() {
                let aj = _mm256_set1_epi32(chunk(even, odd, j));
                for h in 0..2 {
                    acc16[h] = _mm256_add_epi16(acc16[h], _mm256_maddubs_epi16(wj[h], aj));
                }
            }
            let (ones, from) = (_mm256_set1_epi16(1), _mm256_set1_epi32(from));
            [
                _mm256_add_epi32(from, _mm256_madd_epi16(acc16[0], ones)),
                _mm256_add_epi32(from, _mm256_madd_epi16(acc16[1], ones)),
            ]
        }
    }
}

/// One chunk (4 codes) of a q4 group for [`maddubs16_tile4`]: the chunk's 64 bytes of weights
/// (two halves of 8 rows) at `{wg} + $w`, and each of the 4 rows' 4 codes at `$r + $o`, broadcast
/// and multiplied with both halves, summed into that row's two i16 accumulators.
macro_rules! q4_chunk {
    ($w:literal, $r0:literal, $r1:literal, $r2:literal, $r3:literal, $o:literal) => {
        concat!(
            "vmovdqu {w0}, ymmword ptr [{wg} + ",
            $w,
            "]\n",
            "vmovdqu {w1}, ymmword ptr [{wg} + ",
            $w,
            " + 32]\n",
            "vpbroadcastd {b}, dword ptr [",
            $r0,
            " + ",
            $o,
            "]\n",
            "vpmaddubsw {t}, {w0}, {b}\n",
            "vpaddw {a00}, {a00}, {t}\n",
            "vpmaddubsw {t}, {w1}, {b}\n",
            "vpaddw {a01}, {a01}, {t}\n",
            "vpbroadcastd {b}, dword ptr [",
            $r1,
            " + ",
            $o,
            "]\n",
            "vpmaddubsw {t}, {w0}, {b}\n",
            "vpaddw {a10}, {a10}, {t}\n",
            "vpmaddubsw {t}, {w1}, {b}\n",
            "vpaddw {a11}, {a11}, {t}\n",
            "vpbroadcastd {b}, dword ptr [",
            $r2,
            " + ",
            $o,
            "]\n",
            "vpmaddubsw {t}, {w0}, {b}\n",
            "vpaddw {a20}, {a20}, {t}\n",
            "vpmaddubsw {t}, {w1}, {b}\n",
            "vpaddw {a21}, {a21}, {t}\n",
            "vpbroadcastd {b}, dword ptr [",
            $r3,
            " + ",
            $o,
            "]\n",
            "vpmaddubsw {t}, {w0}, {b}\n",
            "vpaddw {a30}, {a30}, {t}\n",
            "vpmaddubsw {t}, {w1}, {b}\n",
            "vpaddw {a31}, {a31}, {t}\n",
        )
    };
}

/// [`PanelLanes::tile4`] of [`YmmPair<Maddubs16>`]: per group, each chunk's two halves of weights
/// are loaded once and each of the 4 rows broadcasts its 4 codes against both, into 8 i16
/// accumulators (13 of the 16 `ymm` registers). Then, per output, the generic tile's operations in
/// its order (`vpmaddwd` by ones, minus the correction, to f32, times the scale, added to the sum;
/// at the end times the row's scale): the same bits. The chunks are inline assembly because LLVM,
/// free to regroup the i16 sums, hoisted a group's products ahead of their adds and spilled weight
/// vectors to the stack every group (seen in the disassembly of every intrinsics form tried).
///
/// `wp` and `sp` are a packed 16-lane panel of `groups` groups, `a` and `corr` rows in the
/// `Q4Groups` layout with their group corrections.
///
/// # Safety
/// The CPU must support AVX2. (The lengths the unchecked reads rely on are asserted.)
#[target_feature(enable = "avx2")]
#[inline(never)]
unsafe fn maddubs16_tile4(
    wp: &[u8],
    sp: &[f32],
    a: [&[i8]; Q4_TILE_ROWS],
    corr: [&[i32]; Q4_TILE_ROWS],
    a_scale: [f32; Q4_TILE_ROWS],
    groups: usize,
) -> [[f32; MAX_LANES]; Q4_TILE_ROWS] {
    assert!(wp.len() >= groups * 32 * WIDE && sp.len() >= groups * WIDE);
    let mut sum = [[_mm256_setzero_ps(); 2]; Q4_TILE_ROWS];
    let ones = _mm256_set1_epi16(1);
    for g in 0..groups {
        let (even, odd) = q4_halves(g, groups);
        for r in 0..Q4_TILE_ROWS {
            // Both halves of the group's codes lie inside the row (`q4_halves`).
            assert!(odd + Q4_GROUP / 2 <= a[r].len() && even + Q4_GROUP / 2 <= a[r].len());
        }
        // SAFETY: `even` and `odd` are inside every row (asserted above).
        let e = a.map(|r| unsafe { r.as_ptr().add(even) });
        // SAFETY: as above.
        let o = a.map(|r| unsafe { r.as_ptr().add(odd) });
        let mut acc = [[_mm256_setzero_si256(); 2]; Q4_TILE_ROWS];
        // SAFETY: AVX2 (the entry point's feature); the weights read are the group's 32 * 16 bytes
        // (asserted above via `wp.len()`), the codes the 16 even and 16 odd ones of each row
        // (asserted above); no stack, no flags kept.
        unsafe {
            asm!(
                q4_chunk!("0", "{e0}", "{e1}", "{e2}", "{e3}", "0"),
                q4_chunk!("64", "{e0}", "{e1}", "{e2}", "{e3}", "4"),
                q4_chunk!("128", "{e0}", "{e1}", "{e2}", "{e3}", "8"),
                q4_chunk!("192", "{e0}", "{e1}", "{e2}", "{e3}", "12"),
                q4_chunk!("256", "{o0}", "{o1}", "{o2}", "{o3}", "0"),
                q4_chunk!("320", "{o0}", "{o1}", "{o2}", "{o3}", "4"),
                q4_chunk!("384", "{o0}", "{o1}", "{o2}", "{o3}", "8"),
                q4_chunk!("448", "{o0}", "{o1}", "{o2}", "{o3}", "12"),
                wg = in(reg) wp.as_ptr().add(g * 32 * WIDE),
                e0 = in(reg) e[0], e1 = in(reg) e[1], e2 = in(reg) e[2], e3 = in(reg) e[3],
                o0 = in(reg) o[0], o1 = in(reg) o[1], o2 = in(reg) o[2], o3 = in(reg) o[3],
                a00 = inout(ymm_reg) acc[0][0], a01 = inout(ymm_reg) acc[0][1],
                a10 = inout(ymm_reg) acc[1][0], a11 = inout(ymm_reg) acc[1][1],
                a20 = inout(ymm_reg) acc[2][0], a21 = inout(ymm_reg) acc[2][1],
                a30 = inout(ymm_reg) acc[3][0], a31 = inout(ymm_reg) acc[3][1],
                w0 = out(ymm_reg) _, w1 = out(ymm_reg) _, b = out(ymm_reg) _, t = out(ymm_reg) _,
                options(nostack, readonly, preserves_flags),
            )
        };
        // SAFETY: the floats `g * 16..(g + 1) * 16` of `sp`, inside (asserted above).
        let scale = unsafe {
            [
                _mm256_loadu_ps(sp.as_ptr().add(g * WIDE)),
                _mm256_loadu_ps(sp.as_ptr().add(g * WIDE + 8)),
            ]
        };
        for r in 0..Q4_TILE_ROWS {
            let c = _mm256_set1_epi32(corr[r][g]);
            for h in 0..2 {
                let v = _mm256_sub_epi32(_mm256_madd_epi16(acc[r][h], ones), c);
                sum[r][h] =
                    _mm256_add_ps(sum[r][h], _mm256_mul_ps(_mm256_cvtepi32_ps(v), scale[h]));
            }
        }
    }
    let mut done = [[0f32; MAX_LANES]; Q4_TILE_ROWS];
    for r in 0..Q4_TILE_ROWS {
        let sa = _mm256_set1_ps(a_scale[r]);
        for h in 0..2 {
            // SAFETY: the floats `8 * h..8 * h + 8` of the row's 16.
            unsafe {
                _mm256_storeu_ps(
                    done[r].as_mut_ptr().add(8 * h),
                    _mm256_mul_ps(sum[r][h], sa),
                )
            };
        }
    }
    done
}

/// Activation rows per pass of [`maddubs16_direct_group`]: 8 i16 accumulators, 4 nibble vectors
/// and 2 broadcasts fill 14 of the 16 `ymm` registers.
const DIRECT_ROWS: usize = 4;

/// [`PanelLanes::direct_group`] on AVX2 for R <= [`DIRECT_ROWS`] rows, chunk by chunk: each of the
/// group's 4 chunk vectors (two `ymm` halves) is split into nibbles, and every row broadcasts its
/// even and odd 4 codes of that chunk against them into its two i16 accumulators (8 products a
/// lane: at most 8 x 3810 = 30480 < 32767, see `x86/mod.rs`). The generic form keeps all 8 nibble
/// vectors live, 16 `ymm` registers on their own, and spilled. Then per output the generic
/// operations: `vpmaddwd` by ones, minus the correction, to f32, times the scale, added to the sum
/// (exact integers, then the same float steps: the same bits).
///
/// # Safety
/// The CPU must support AVX2; `p` must point to 256 readable bytes; `a`, `corr` and `sum` must
/// hold at least R rows, each row of `a` and `corr` the codes and sum of group `g` of `groups`.
#[inline(always)]
unsafe fn maddubs16_direct_group<const R: usize>(
    p: *const u8,
    scale: [__m256; 2],
    (g, groups): (usize, usize),
    a: &[&[i8]],
    corr: &[&[i32]],
    sum: &mut [[__m256; 2]],
) {
    // SAFETY: AVX2, which the caller guarantees; chunk t's halves read bytes `64 t..64 t + 64` at
    // `p`, inside its 256; each row's 4 even and 4 odd codes of chunk t lie inside its group
    // (`q4_halves`), and its sum `g` inside `corr[r]`, all by this function's contract.
    unsafe {
        let (even, odd) = q4_halves(g, groups);
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for t in 0..4 {
            let mut lo = [_mm256_setzero_si256(); 2];
            let mut hi = [_mm256_setzero_si256(); 2];
            for h in 0..2 {
                let v = _mm256_loadu_si256(p.add(64 * t + 32 * h) as *const __m256i);
                (lo[h], hi[h]) = split_nibbles(v);
            }
            for r in 0..R {
                let ar = a[r].as_ptr();
                let be = _mm256_set1_epi32((ar.add(even + 4 * t) as *const i32).read_unaligned());
                let bo = _mm256_set1_epi32((ar.add(odd + 4 * t) as *const i32).read_unaligned());
                for h in 0..2 {
                    let pair = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo[h], be),
                        _mm256_maddubs_epi16(hi[h], bo),
                    );
                    acc[r][h] = _mm256_add_epi16(acc[r][h], pair);
                }
            }
        }
        let ones = _mm256_set1_epi16(1);
        for r in 0..R {
            let c = _mm256_set1_epi32(*corr[r].as_ptr().add(g));
            for h in 0..2 {
                let v = _mm256_sub_epi32(_mm256_madd_epi16(acc[r][h], ones), c);
                sum[r][h] =
                    _mm256_add_ps(sum[r][h], _mm256_mul_ps(_mm256_cvtepi32_ps(v), scale[h]));
            }
        }
    }
}

/// `vpdpbusd` emulated exactly on the two halves (tests).
#[cfg(test)]
pub(crate) struct EmuDpbusd;

#[cfg(test)]
impl PairGroupDot for EmuDpbusd {
    /// # Safety
    /// The CPU must support AVX2; `wg` must point to 512 readable bytes, `even` and `odd` to 16
    /// readable codes each.
    #[inline(always)]
    unsafe fn group_dot(wg: *const u8, even: *const i8, odd: *const i8) -> [__m256i; 2] {
        // SAFETY: `vnni_group_dot`'s contract, for `EmuZmm` (AVX2), is this one.
        unsafe { vnni_group_dot::<EmuZmm>(wg, 0, even, odd) }
    }
    /// # Safety
    /// The CPU must support AVX2; `even` and `odd` must point to 16 readable codes each.
    #[inline(always)]
    unsafe fn group_dot_regs(
        w: &[[__m256i; 2]; 8],
        from: i32,
        even: *const i8,
        odd: *const i8,
    ) -> [__m256i; 2] {
        // SAFETY: `vnni_group_dot_regs`'s contract, for `EmuZmm` (AVX2), is this one.
        unsafe { vnni_group_dot_regs::<EmuZmm>(w, from, even, odd) }
    }
}

#[cfg(test)]
pub(crate) type EmuZmm = YmmPair<EmuDpbusd>;

impl<G: PairGroupDot> PanelLanes for YmmPair<G> {
    const LANES: usize = MAX_LANES;
    type I = [__m256i; 2];
    type F = [__m256; 2];
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn zero_f() -> Self::F {
        // SAFETY: a register-only AVX intrinsic; the caller guarantees AVX2.
        unsafe { [_mm256_setzero_ps(); 2] }
    }
    /// # Safety
    /// The CPU must support AVX2; `p` must point to 16 readable floats.
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> Self::F {
        // SAFETY: AVX2 and the 16 floats at `p`, as this function requires of its caller.
        unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn set1_i(x: i32) -> Self::I {
        // SAFETY: a register-only AVX intrinsic; the caller guarantees AVX2.
        unsafe { [_mm256_set1_epi32(x); 2] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn set1_f(x: f32) -> Self::F {
        // SAFETY: a register-only AVX intrinsic; the caller guarantees AVX2.
        unsafe { [_mm256_set1_ps(x); 2] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn sub_i(a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
        unsafe { [_mm256_sub_epi32(a[0], b[0]), _mm256_sub_epi32(a[1], b[1])] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn cvt(a: Self::I) -> Self::F {
        // SAFETY: register-only AVX intrinsics; the caller guarantees AVX2.
        unsafe { [_mm256_cvtepi32_ps(a[0]), _mm256_cvtepi32_ps(a[1])] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F {
        // SAFETY: register-only AVX intrinsics; the caller guarantees AVX2.
        unsafe { [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F {
        // SAFETY: register-only AVX intrinsics; the caller guarantees AVX2.
        unsafe { [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])] }
    }
    /// # Safety
    /// The CPU must support AVX2; `p` must point to 16 writable floats.
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: Self::F) {
        // SAFETY: AVX2 and the 16 floats at `p`, as this function requires of its caller.
        unsafe {
            _mm256_storeu_ps(p, v[0]);
            _mm256_storeu_ps(p.add(8), v[1]);
        }
    }
    /// # Safety
    /// The CPU must support AVX2; `wg` must point to 512 readable bytes, `even` and `odd` to 16
    /// readable codes each.
    #[inline(always)]
    unsafe fn group_dot(wg: *const u8, from: i32, even: *const i8, odd: *const i8) -> Self::I {
        // SAFETY: `G::group_dot`'s contract is this one; `sub_i` and `set1_i` are register-only.
        unsafe {
            Self::sub_i(
                G::group_dot(wg, even, odd),
                Self::set1_i(from.wrapping_neg()),
            )
        }
    }
    /// # Safety
    /// The CPU must support AVX2; `p` must point to 256 readable bytes.
    #[inline(always)]
    unsafe fn group_codes16(p: *const u8) -> [Self::I; 4] {
        // SAFETY: AVX2, which the caller guarantees; chunk t's halves read bytes
        // `64 t..64 t + 64` at `p`, inside its 256 by this function's contract.
        unsafe {
            let mut v = [[_mm256_setzero_si256(); 2]; 4];
            for (t, vt) in v.iter_mut().enumerate() {
                for (h, vh) in vt.iter_mut().enumerate() {
                    *vh = _mm256_loadu_si256(p.add(64 * t + 32 * h) as *const __m256i);
                }
            }
            v
        }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn nibbles(x: Self::I) -> (Self::I, Self::I) {
        // SAFETY: the caller guarantees AVX2, all `split_nibbles` needs.
        unsafe {
            let ((l0, h0), (l1, h1)) = (split_nibbles(x[0]), split_nibbles(x[1]));
            ([l0, l1], [h0, h1])
        }
    }
    /// # Safety
    /// The CPU must support AVX2; `even` and `odd` must point to 16 readable codes each.
    #[inline(always)]
    unsafe fn group_dot_regs(
        w: &[Self::I; 8],
        from: i32,
        even: *const i8,
        odd: *const i8,
    ) -> Self::I {
        // SAFETY: `G::group_dot_regs`'s contract is this one.
        unsafe { G::group_dot_regs(w, from, even, odd) }
    }
    /// # Safety
    /// As [`PanelLanes::direct_group`]: AVX2, and the lengths it reads unchecked.
    #[inline(always)]
    unsafe fn direct_group(
        p: *const u8,
        scale: Self::F,
        span: (usize, usize),
        a: &[&[i8]],
        corr: &[&[i32]],
        sum: &mut [Self::F],
    ) {
        // SAFETY: AVX2 and the reads, as this function requires of its caller.
        unsafe {
            if !G::ASM_TILE4 {
                return direct_group_regs::<Self>(p, scale, span, a, corr, sum);
            }
            let mut r = 0;
            while r < a.len() {
                let n = (a.len() - r).min(DIRECT_ROWS);
                let (ar, cr, sr) = (&a[r..], &corr[r..], &mut sum[r..]);
                match n {
                    1 => maddubs16_direct_group::<1>(p, scale, span, ar, cr, sr),
                    2 => maddubs16_direct_group::<2>(p, scale, span, ar, cr, sr),
                    3 => maddubs16_direct_group::<3>(p, scale, span, ar, cr, sr),
                    _ => maddubs16_direct_group::<4>(p, scale, span, ar, cr, sr),
                }
                r += n;
            }
        }
    }
    /// # Safety
    /// As [`q4_packed_tile`]: AVX2, and the lengths it reads unchecked.
    #[inline(always)]
    unsafe fn tile4(
        wp: &[u8],
        sp: &[f32],
        a: [&[i8]; Q4_TILE_ROWS],
        corr: [&[i32]; Q4_TILE_ROWS],
        a_scale: [f32; Q4_TILE_ROWS],
        groups: usize,
    ) -> [[f32; MAX_LANES]; Q4_TILE_ROWS] {
        // SAFETY: AVX2, which the caller guarantees (all `maddubs16_tile4` needs); for the generic
        // tile, its contract is this one.
        unsafe {
            if G::ASM_TILE4 {
                maddubs16_tile4(wp, sp, a, corr, a_scale, groups)
            } else {
                q4_packed_tile::<Self, Q4_TILE_ROWS>(wp, sp, a, corr, a_scale, groups)
            }
        }
    }
}

#[cfg(test)]
impl Lanes16 for EmuZmm {
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn zero_i() -> Self::I {
        // SAFETY: a register-only AVX intrinsic; the caller guarantees AVX2.
        unsafe { [_mm256_setzero_si256(); 2] }
    }
    /// # Safety
    /// The CPU must support AVX2; `p` must point to 64 readable bytes.
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> Self::I {
        // SAFETY: AVX2 and the 64 bytes at `p`, as this function requires of its caller.
        unsafe {
            [
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_loadu_si256(p.add(32) as *const __m256i),
            ]
        }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn dpbusd(acc: Self::I, u: Self::I, s: Self::I) -> Self::I {
        // SAFETY: the caller guarantees AVX2, all `dpbusd_emulated` needs.
        unsafe {
            [
                super::vnni::dpbusd_emulated(acc[0], u[0], s[0]),
                super::vnni::dpbusd_emulated(acc[1], u[1], s[1]),
            ]
        }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
        unsafe { [_mm256_add_epi32(a[0], b[0]), _mm256_add_epi32(a[1], b[1])] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn xor_i(a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
        unsafe { [_mm256_xor_si256(a[0], b[0]), _mm256_xor_si256(a[1], b[1])] }
    }
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn hsum_i(a: Self::I) -> i32 {
        // SAFETY: the caller guarantees AVX2, all `hsum_epi32` needs.
        unsafe { super::hsum_epi32(a[0]) + super::hsum_epi32(a[1]) }
    }
}

/// [`PanelLanes::group_dot`] on a 16-lane VNNI vector: the even and odd chunks in two
/// accumulators so that consecutive `vpdpbusd` do not wait on each other (integer sums: the split
/// changes no value).
///
/// # Safety
/// The CPU must support `V`'s features; `wg` must point to 512 readable bytes, `even` and `odd` to
/// 16 readable codes each.
#[inline(always)]
unsafe fn vnni_group_dot<V: Lanes16>(
    wg: *const u8,
    from: i32,
    even: *const i8,
    odd: *const i8,
) -> V::I {
    // SAFETY: `V`'s features, which the caller guarantees; chunk j < 8 reads the weight bytes
    // `4 * WIDE * j..4 * WIDE * (j + 1)` of the group's `32 * WIDE = 512` and 4 of the 16 codes of
    // `even` or `odd`, all readable by this function's contract.
    unsafe {
        // One chain from `from`: the kernels' tiles run 4 activation rows side by side, so 4
        // chains hide `vpdpbusd`'s latency, and no add of two accumulators nor subtraction of the
        // offset follows each group.
        let mut acc = V::set1_i(from);
        for j in 0..8 {
            let w = V::load_i(wg.add(4 * WIDE * j));
            acc = V::dpbusd(acc, w, V::set1_i(chunk(even, odd, j)));
        }
        acc
    }
}

/// [`vnni_group_dot`] with the group's 8 chunks in registers, plus `from`: the same two
/// accumulators, the first starting at `from`.
///
/// # Safety
/// The CPU must support `V`'s features; `even` and `odd` must point to 16 readable codes each.
#[inline(always)]
unsafe fn vnni_group_dot_regs<V: Lanes16>(
    w: &[V::I; 8],
    from: i32,
    even: *const i8,
    odd: *const i8,
) -> V::I {
    // SAFETY: `V`'s features, which the caller guarantees; chunk j < 8 reads 4 of the 16 codes of
    // `even` or `odd`, readable by this function's contract.
    unsafe {
        let mut acc = [V::set1_i(from), V::zero_i()];
        for (j, &wj) in w.iter().enumerate() {
            acc[j % 2] = V::dpbusd(acc[j % 2], wj, V::set1_i(chunk(even, odd, j)));
        }
        V::add_i(acc[0], acc[1])
    }
}

/// Codes per step of the wide i8 tiles.
const WIDE_BYTES: usize = 64;

/// [`i8_tile`](super::i8_tiles::i8_tile) for the VNNI offset form on 64 codes a step: the exact
/// i8 dots of R activation rows by C weight rows, element `[r][c]`. `offsets[r]` is row r's code
/// sum over the 32-code SIMD part of K (`Activations`); the offset form here covers the 64-code
/// steps only, so the codes of a last 32-code step come off it and join the scalar tail. With a nonzero
/// `pf`, step s prefetches the C lines at `pf + (s * C + i) * 64` (the few-row kernel's tiles
/// ahead, in address order).
///
/// # Safety
/// The CPU must support `V`'s features; every row of `a` and `w` must hold at least `k` codes (the
/// 64-code steps read the first `k - k % 64` unchecked).
#[inline(always)]
pub(super) unsafe fn i8_tile16<V: Lanes16, const R: usize, const C: usize>(
    a: [&[i8]; R],
    w: [&[i8]; C],
    k: usize,
    offsets: [i32; R],
    pf: usize,
) -> [[i32; C]; R] {
    let steps = k / WIDE_BYTES;
    // SAFETY: `V`'s features, which the caller guarantees; each load reads codes `off..off + 64`
    // with `off + 64 <= k`, inside every row by this function's contract; a prefetch never faults.
    let acc = unsafe {
        // `w ^ 0x80` is `w + 128` as an unsigned byte.
        let flip = V::set1_i(0x8080_8080u32 as i32);
        let mut acc = [[V::zero_i(); C]; R];
        for s in 0..steps {
            let off = s * WIDE_BYTES;
            if pf != 0 {
                for i in 0..C {
                    _mm_prefetch::<_MM_HINT_T0>((pf + (s * C + i) * WIDE_BYTES) as *const i8);
                }
            }
            for c in 0..C {
                let wu = V::xor_i(V::load_i(w[c].as_ptr().add(off) as *const u8), flip);
                for r in 0..R {
                    let av = V::load_i(a[r].as_ptr().add(off) as *const u8);
                    acc[r][c] = V::dpbusd(acc[r][c], wu, av);
                }
            }
        }
        acc
    };
    let wide_end = steps * WIDE_BYTES;
    let simd_end = k - k % SIMD_BYTES;
    let mut sums = [[0i32; C]; R];
    for r in 0..R {
        let past: i32 = a[r][wide_end..simd_end].iter().map(|&x| x as i32).sum();
        let covered = offsets[r] - past;
        for c in 0..C {
            // SAFETY: `V`'s features, which the caller guarantees.
            let mut v = unsafe { V::hsum_i(acc[r][c]) } - 128 * covered;
            for j in wide_end..k {
                v += a[r][j] as i32 * w[c][j] as i32;
            }
            sums[r][c] = v;
        }
    }
    sums
}
