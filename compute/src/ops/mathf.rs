//! `exp` for the decoder's softmax and SiLU, 8 lanes at a time on AVX2 and one at a time anywhere,
//! with the same operations in the same order so every build gives the same bits.
//!
//! The method is Cephes' `expf`: clamp to the finite range, `n = floor(x·log2(e) + 1/2)`,
//! `r = x − n·C1 − n·C2` (ln 2 split in two), a degree-5 polynomial for `e^r`, times `2^n` built in the
//! exponent bits. Multiplies and adds are separate (never fused). Within 2 ulp of the true value over
//! the range (tested against f64); below `MIN_ARG` the result is the smallest normal, not 0, and above
//! `MAX_ARG` the largest power the clamp allows, not infinity — both far below anything a softmax weight
//! or a SiLU gate can resolve.

/// Largest argument: `ln(2^127 · (2 − 2^−23))` rounded down, so `2^n` stays finite.
const MAX_ARG: f32 = 88.376_26;
/// Smallest argument: `ln(2^−126)`, so `2^n` stays normal.
const MIN_ARG: f32 = -87.336_55;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `e^x` (see the module comment); NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(MIN_ARG, MAX_ARG);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * C1;
    let r = r - n * C2;
    let z = r * r;
    let mut y = P[0];
    for &p in &P[1..] {
        y = y * r + p;
    }
    let y = y * z + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The sum of 8 lane sums in the crate's fixed order: lane 0, then lanes 1 to 7 added one by one.
/// Every 8-lane sum of the decoder (softmax denominators, attention dots) ends this way; the SIMD
/// paths store their lanes and call this, so they give the portable bits.
#[inline(always)]
pub fn sum_lanes(lanes: &[f32; 8]) -> f32 {
    let mut sum = lanes[0];
    for &l in &lanes[1..] {
        sum += l;
    }
    sum
}

/// `1 / (1 + e^−x)` (Qwen3.5's β, attention gate and shared-expert gate).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `x / (1 + e^−x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `gate[i] = silu(gate[i]) · up[i]` (the MLP's gated activation).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "silu_mul: gate and up differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::Isa::Avx2.is_available() {
        // SAFETY: the CPU reported AVX2 and FMA; `gate` and `up` are equally long (asserted).
        unsafe { simd::silu_mul_avx2(gate, up) };
        return;
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// The largest element that is not NaN (`-inf` for none), as [`f32::max`] folds it: NaN elements are
/// skipped. Taken as 8 lane maxima (`if x > m { x } else { m }`, lane i over elements i, i+8, ...),
/// combined lane 0 to 7, then the elements past the last multiple of 8: `vmaxps` does the same
/// comparison, so every build gives the same bits (the sign of a zero maximum included).
pub fn max(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::Isa::Avx2.is_available() {
        // SAFETY: the CPU reported AVX2 and FMA (the function asks nothing else).
        return unsafe { simd::max_avx2(x) };
    }
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = greater(v, *l);
        }
    }
    max_tail(&lanes, chunks.remainder())
}

/// `a` if it is greater than `b`, else `b` (so a NaN `a` is skipped): `vmaxps`'s rule.
#[inline(always)]
fn greater(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The lane maxima combined lane 0 to 7, then the tail in order (both paths end this way).
#[inline(always)]
fn max_tail(lanes: &[f32; 8], tail: &[f32]) -> f32 {
    let mut m = lanes[0];
    for &l in &lanes[1..] {
        m = greater(l, m);
    }
    for &v in tail {
        m = greater(v, m);
    }
    m
}

/// `x[i] = e^(x[i] − m)` for every element; returns their sum, taken as 8 lane sums (lane i adds
/// elements i, i+8, ... in order), the lanes added 0 to 7, then the elements past the last multiple of
/// 8 in order.
pub fn exp_shifted_sum(x: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::Isa::Avx2.is_available() {
        // SAFETY: the CPU reported AVX2 and FMA (the function asks nothing else).
        return unsafe { simd::exp_shifted_sum_avx2(x, m) };
    }
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v = exp(*v - m);
            *l += *v;
        }
    }
    let mut sum = sum_lanes(&lanes);
    for v in chunks.into_remainder() {
        *v = exp(*v - m);
        sum += *v;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[deny(unsafe_op_in_unsafe_fn)]
pub(crate) mod simd {
    use super::*;
    use std::arch::x86_64::*;

    /// [`exp`] on 8 lanes. Meant to be inlined into code compiled with AVX2 enabled.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: register-only AVX and AVX2 intrinsics; the caller guarantees AVX2.
        unsafe {
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
            let x0 = x;
            let x = _mm256_max_ps(
                _mm256_min_ps(x, _mm256_set1_ps(MAX_ARG)),
                _mm256_set1_ps(MIN_ARG),
            );
            let n = _mm256_floor_ps(_mm256_add_ps(
                _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                _mm256_set1_ps(0.5),
            ));
            let r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(C1)));
            let r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(C2)));
            let z = _mm256_mul_ps(r, r);
            let mut y = _mm256_set1_ps(P[0]);
            for &p in &P[1..] {
                y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(p));
            }
            let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, z), r), _mm256_set1_ps(1.0));
            let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            // NaN stays NaN (the clamp turned it into a bound), as in the scalar `clamp`.
            _mm256_blendv_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(pow2)), x0, nan)
        }
    }

    /// [`super::silu_mul`] 8 lanes at a time, then the tail one at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `up` must be at least as long as `gate` (the loads of
    /// whole steps of 8 are unchecked; the caller asserts equal lengths).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
        let n = gate.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        for i in (0..n).step_by(8) {
            // SAFETY: AVX2 is enabled here (`exp8`'s contract); the loads read `gate[i..i + 8]`
            // and `up[i..i + 8]`, the store writes `gate[i..i + 8]`, with i + 8 <= n <= gate.len()
            // <= up.len() (this function's contract).
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
                _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
            }
        }
        for (g, &u) in gate[n..].iter_mut().zip(&up[n..]) {
            *g = silu(*g) * u;
        }
    }

    /// [`super::max`]: 8 lane maxima (`vmaxps` with the element first, so a NaN is skipped), then
    /// [`max_tail`].
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA. (Only `x` is read, within its length.)
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn max_avx2(x: &[f32]) -> f32 {
        let n = x.len() / 8 * 8;
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..n).step_by(8) {
            // SAFETY: the load reads `x[i..i + 8]`, i + 8 <= n <= x.len().
            m = _mm256_max_ps(unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) }, m);
        }
        let mut lanes = [0f32; 8];
        // SAFETY: the store writes the 8 floats of `lanes`.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
        max_tail(&lanes, &x[n..])
    }

    /// [`super::exp_shifted_sum`]: 8 lane sums, then [`sum_lanes`] and the tail.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA. (Only `x` is read and written, within its length.)
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted_sum_avx2(x: &mut [f32], m: f32) -> f32 {
        let n = x.len() / 8 * 8;
        let mv = _mm256_set1_ps(m);
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            // SAFETY: AVX2 is enabled here (`exp8`'s contract); the load and the store cover
            // `x[i..i + 8]`, i + 8 <= n <= x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
                _mm256_storeu_ps(p, e);
                acc = _mm256_add_ps(acc, e);
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: the store writes the 8 floats of `lanes`.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        let mut sum = sum_lanes(&lanes);
        for v in &mut x[n..] {
            *v = exp(*v - m);
            sum += *v;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        let b32 = b as f32;
        let ulp = (f32::from_bits(b32.to_bits() + 1) - b32).abs() as f64;
        (a as f64 - b).abs() / ulp
    }

    /// Within 2 ulp of the f64 exp across the range softmax and SiLU use; the control (libm's expf
    /// with its argument rounded to bf16) is far outside, so the check can fail.
    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            worst = worst.max(ulps(exp(x), (x as f64).exp()));
            x += 0.000_731;
        }
        assert!(worst <= 2.0, "worst {worst} ulp");
        let coarse = |x: f32| half::bf16::from_f32(x).to_f32().exp();
        assert!(ulps(coarse(2.5078), 2.5078f64.exp()) > 100.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-200.0) < 1.2e-38 && exp(-200.0) > 0.0);
        assert!(exp(200.0).is_finite());
        assert!(exp(f32::NAN).is_nan() && silu(f32::NAN).is_nan());
    }

    /// `max` skips NaN like `f32::max` on every path, keeps the lane rule for signed zeros and
    /// infinities, and reads the tail; the control (`vmaxps` with its operands swapped, which lets a
    /// NaN through) differs, so the check can fail.
    #[test]
    fn max_skips_nan_and_reads_every_element() {
        let scalar = |x: &[f32]| {
            let mut lanes = [f32::NEG_INFINITY; 8];
            let n = x.len() / 8 * 8;
            for (i, &v) in x[..n].iter().enumerate() {
                lanes[i % 8] = greater(v, lanes[i % 8]);
            }
            max_tail(&lanes, &x[n..])
        };
        let cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN],
            vec![f32::NAN, -3.0],
            vec![-0.0, 0.0, -0.0],
            (0..9).map(|i| -(i as f32)).collect(),
            (0..17)
                .map(|i| if i == 16 { 5.0 } else { i as f32 * 0.1 })
                .collect(),
            (0..24)
                .map(|i| {
                    if i % 5 == 0 {
                        f32::NAN
                    } else {
                        (i as f32).sin()
                    }
                })
                .collect(),
            vec![
                f32::NEG_INFINITY,
                f32::INFINITY,
                1.0,
                f32::NAN,
                2.0,
                3.0,
                4.0,
                5.0,
                6.0,
            ],
            // A NaN in lane 0 of the last block: the lane the combination starts from.
            vec![f32::NAN, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.5],
        ];
        for x in &cases {
            let want = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let got = max(x);
            assert!(!got.is_nan(), "NaN let through: {x:?}");
            assert_eq!(got, want, "{x:?}");
            assert_eq!(got.to_bits(), scalar(x).to_bits(), "paths differ on {x:?}");
        }
        assert_eq!(
            max(&[-0.0, 0.0]).to_bits(),
            (-0.0f32).to_bits(),
            "first zero kept"
        );
        // Control: the swapped rule (`m > x ? m : x`) takes a NaN element.
        let swapped = |x: &[f32]| {
            x.iter()
                .fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v })
        };
        assert!(swapped(&[f32::NAN, 1.0, f32::NAN]).is_nan());
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Every build gives the portable bits: silu_mul and the shifted exp sum on lengths around the
    /// 8-lane blocks, on values across the clamps.
    #[test]
    fn dispatched_paths_give_the_portable_bits() {
        let mut seed = 3u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 23) as f32 * 2.0 - 1.0
        };
        for len in [0, 1, 7, 8, 9, 16, 31, 100] {
            let mut g: Vec<f32> = (0..len).map(|i| 120.0 * rnd() + (i % 3) as f32).collect();
            if len == 31 {
                g[3] = f32::NAN; // in a vector block
                g[30] = f32::NAN; // in the tail
            }
            let u: Vec<f32> = (0..len).map(|_| rnd()).collect();
            let mut got = g.clone();
            silu_mul(&mut got, &u);
            let want: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            assert_eq!(bits(&got), bits(&want), "silu_mul len {len}");

            let m = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&g).to_bits(), m.to_bits(), "max len {len}");
            let mut got = g.clone();
            let sum = exp_shifted_sum(&mut got, m);
            let want: Vec<f32> = g.iter().map(|&v| exp(v - m)).collect();
            assert_eq!(bits(&got), bits(&want), "exp len {len}");
            let mut lanes = [0f32; 8];
            for (i, &e) in want[..len / 8 * 8].iter().enumerate() {
                lanes[i % 8] += e;
            }
            let mut want_sum = lanes[0];
            for &l in &lanes[1..] {
                want_sum += l;
            }
            for &e in &want[len / 8 * 8..] {
                want_sum += e;
            }
            assert!(
                sum.to_bits() == want_sum.to_bits() || (sum.is_nan() && want_sum.is_nan()),
                "sum len {len}"
            );
        }
    }
}
