//! Activation rows prepared on AVX2 with the portable path's bytes (`kernels/activations.rs`):
//! quantization as `packs::quant::quantize_activation_row`, the `Q4Groups` reorder with its group
//! sums, and the copy that keeps a prepared input's bits.

use packs::quant::{self, Q4_CODE_OFFSET, Q4_GROUP};
use std::arch::x86_64::*;

/// `quantize_activation_row` in AVX2: the same max, the same f32 division, round half away from zero
/// done exactly (`t = trunc(q)`, `t ± 1` when `|q - t| >= 0.5`). Rows with a NaN, an infinite or a
/// zero scale go to the oracle itself.
///
/// # Safety
/// The CPU must support AVX2 and FMA. (The lengths are asserted equal.)
#[target_feature(enable = "avx2,fma")]
pub(in crate::kernels) unsafe fn quantize_row_avx2(x: &[f32], codes: &mut [i8]) -> f32 {
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
        // SAFETY: i + 8 <= n8 <= x.len().
        let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: the store writes the 8 floats of `lanes`.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vmax) };
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
        // SAFETY: AVX2 is enabled here (`code8` needs AVX); the loads read `x[i..i + 32]` and the
        // store writes `codes[i..i + 32]`, inside both as i + 32 <= n32 <= n (lengths asserted
        // equal above).
        unsafe {
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
/// The CPU must support AVX2 and FMA. (Only the common length of `dst` and `src` is read and
/// written; the caller asserts them equal.)
#[target_feature(enable = "avx2,fma")]
pub(in crate::kernels) unsafe fn copy_u32_avx2(dst: &mut [u32], src: &[u32]) -> bool {
    let n = src.len().min(dst.len());
    let n8 = n - n % 8;
    let mut same = _mm256_set1_epi32(-1);
    for i in (0..n8).step_by(8) {
        // SAFETY: the loads and the store cover elements `i..i + 8`, with i + 8 <= n8 <= both
        // lengths.
        unsafe {
            let v = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
            let old = _mm256_loadu_si256(dst.as_ptr().add(i) as *const __m256i);
            same = _mm256_and_si256(same, _mm256_cmpeq_epi32(v, old));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, v);
        }
    }
    let tail_same = dst[n8..n] == src[n8..n];
    dst[n8..n].copy_from_slice(&src[n8..n]);
    _mm256_movemask_epi8(same) == -1 && tail_same
}

/// The code sum of 32 i8 codes: `vpsadbw` of the codes + 128 against zero, less 32 * 128.
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn sum32_i8(v: __m256i) -> i32 {
    // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
    unsafe {
        let s = _mm256_sad_epu8(
            _mm256_xor_si256(v, _mm256_set1_epi8(i8::MIN)),
            _mm256_setzero_si256(),
        );
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi64(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si64(s) as i32 - 32 * 128
    }
}

/// One group's 32 codes as `[16 even elements | 16 odd elements]`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn even_odd32(v: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 intrinsics; the caller guarantees AVX2.
    unsafe {
        let split = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3,
            5, 7, 9, 11, 13, 15,
        );
        // Per 128 bits [evens | odds] of 16 elements; the quads (e0, o0, e1, o1) become (e0, e1,
        // o0, o1).
        _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, split))
    }
}

/// `activations::q4_groups_row_scalar` in AVX2 (same bytes and sums).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `codes.len() >= 32 * sums.len()` (the loads and stores are
/// unchecked; the caller asserts equality).
#[target_feature(enable = "avx2,fma")]
pub(in crate::kernels) unsafe fn q4_groups_row_avx2(codes: &mut [i8], sums: &mut [i32]) {
    let groups = sums.len();
    debug_assert_eq!(codes.len(), groups * Q4_GROUP);
    for g0 in (0..groups).step_by(2) {
        // SAFETY: AVX2 is enabled here (`sum32_i8`'s and `even_odd32`'s contract). The loads and
        // stores cover the codes of group g0 and, when it exists, g0 + 1: inside `codes`, which
        // holds `32 * groups` by this function's contract.
        unsafe {
            let p = codes.as_mut_ptr().add(g0 * Q4_GROUP);
            let a = _mm256_loadu_si256(p as *const __m256i);
            sums[g0] = Q4_CODE_OFFSET as i32 * sum32_i8(a);
            let a = even_odd32(a);
            if g0 + 1 < groups {
                let b = _mm256_loadu_si256(p.add(Q4_GROUP) as *const __m256i);
                sums[g0 + 1] = Q4_CODE_OFFSET as i32 * sum32_i8(b);
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
}

/// `(v / scale).round().clamp(-127.0, 127.0)` for 8 finite values, as i32 lanes.
///
/// # Safety
/// The CPU must support AVX.
#[inline(always)]
unsafe fn code8(v: __m256, scale: __m256) -> __m256i {
    // SAFETY: register-only AVX intrinsics; the caller guarantees AVX.
    unsafe {
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
}
