//! The tower's two GELUs: the blocks' MLP uses the tanh form (`gelu_pytorch_tanh`), the mergers
//! the exact erf form (`nn.GELU()`). Ports that use tanh in the mergers are off by up to ~1e-3 per
//! value; the merger tests' control shows the references catch it.

/// `0.5 x (1 + tanh(u))` with `u = sqrt(2/π) (x + 0.044715 x³)`, in f32, computed as the equal
/// `x / (1 + e^(−2u))` with `compute::ops::mathf::exp` (within 2 ulp): branch-free, so the AVX2 build
/// runs 8 lanes at once (libm's `tanhf` was a fifth of a 2B tower's time), and without the
/// cancellation of `1 + tanh(u)` for negative x. Within a few ulp of torch's values (tested).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + compute::ops::mathf::exp(-2.0 * inner))
}

/// `0.5 x (1 + erf(x / √2))`.
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    let xd = x as f64;
    (0.5 * xd * (1.0 + erf(xd * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// `erf(x)` within 1.2e-7 of the true value everywhere (Numerical Recipes' Chebyshev fit of
/// `erfc`, fractional error < 1.2e-7), evaluated in f64: below an f32 ulp of the GELU's result.
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 {
        1.0 - erfc
    } else {
        erfc - 1.0
    }
}

/// `gelu_tanh` on every element (the same operations on every build, so the same bits).
pub fn gelu_tanh_inplace(x: &mut [f32]) {
    bias_gelu_tanh_inplace(x, None);
}

/// `x = gelu_tanh(x + bias)` on every element (`bias` as long as `x`, when given): the linear's
/// bias and the MLP's GELU in one pass over its output, the bits of adding the bias first. Runs
/// 16 lanes on AVX-512, 8 on AVX2 (the same operations on every build, so the same bits).
pub fn bias_gelu_tanh_inplace(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        assert_eq!(b.len(), x.len(), "the bias must cover the row");
    }
    #[cfg(target_arch = "x86_64")]
    {
        if compute::kernels::Isa::Avx512Vnni.is_available() {
            // SAFETY: the CPU reported AVX-512 F (with BW, VL, VNNI), AVX2 and FMA, all the
            // function enables.
            unsafe { bias_gelu_tanh_avx512(x, bias) };
            return;
        }
        if compute::kernels::Isa::Avx2.is_available() {
            // SAFETY: the CPU reported AVX2 and FMA (the function asks nothing else).
            unsafe { bias_gelu_tanh_avx2(x, bias) };
            return;
        }
    }
    bias_gelu_tanh_portable(x, bias);
}

/// [`bias_gelu_tanh_inplace`]'s arithmetic, inlined into each build below (vectorized there).
#[inline(always)]
fn bias_gelu_tanh_portable(x: &mut [f32], bias: Option<&[f32]>) {
    match bias {
        Some(b) => {
            for (v, &b) in x.iter_mut().zip(b) {
                *v = gelu_tanh(*v + b);
            }
        }
        None => {
            for v in x {
                *v = gelu_tanh(*v);
            }
        }
    }
}

/// [`bias_gelu_tanh_portable`] compiled for AVX2 (8 lanes).
///
/// # Safety
/// The CPU must support AVX2 and FMA. (Only `x` and `bias` are touched, through iterators.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn bias_gelu_tanh_avx2(x: &mut [f32], bias: Option<&[f32]>) {
    bias_gelu_tanh_portable(x, bias);
}

/// [`bias_gelu_tanh_portable`] compiled for AVX-512 (16 lanes).
///
/// # Safety
/// The CPU must support AVX-512 F, AVX2 and FMA. (Only `x` and `bias` are touched, through
/// iterators.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn bias_gelu_tanh_avx512(x: &mut [f32], bias: Option<&[f32]>) {
    bias_gelu_tanh_portable(x, bias);
}

/// `gelu_erf` on every element.
pub fn gelu_erf_inplace(x: &mut [f32]) {
    for v in x {
        *v = gelu_erf(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(-1.5) (Abramowitz & Stegun table 7.1).
        for (x, want) in [
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (2.0, 0.995_322_265_0),
            (-1.5, -0.966_105_146_5),
            (0.0, 0.0),
        ] {
            assert!((erf(x) - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
        }
    }

    #[test]
    fn the_two_gelus_differ_where_the_tests_need_them_to() {
        // Values torch gives (F.gelu(x) and F.gelu(x, approximate="tanh"), f32).
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-6);
        assert!((gelu_erf(-2.0) - -0.045_500_26).abs() < 1e-6);
        assert!((gelu_tanh(-2.0) - -0.045_402_3).abs() < 1e-6);
        // Control: the forms are apart by far more than the tolerance the tower tests use.
        assert!((gelu_erf(1.0) - gelu_tanh(1.0)).abs() > 1e-4);
    }

    /// Over [-12, 12]: within 1e-6 (relative above 1) of the exact value in f64 (f32's rounding of
    /// `u` bounds any f32 form to about that), within 1e-6 of torch's f32 form
    /// `0.5 x (1 + tanh(u))` (the old body, whose `1 + tanh` cancels for negative x), and the
    /// vectorized build's bits equal the scalar's.
    #[test]
    fn the_sigmoid_form_is_the_tanh_gelu() {
        let xs: Vec<f32> = (-24_000..=24_000).map(|i| i as f32 * 5e-4).collect();
        for &x in &xs {
            let xd = x as f64;
            let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd);
            let want = xd / (1.0 + (-2.0 * u).exp());
            let got = gelu_tanh(x) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "x = {x}: {got} vs {want}"
            );
            let inner = 0.797_884_6f32 * (x + 0.044_715 * x * x * x);
            let torch = 0.5 * x * (1.0 + inner.tanh());
            assert!(
                (got - torch as f64).abs() < 1e-6,
                "x = {x}: {got} vs torch {torch}"
            );
        }
        let mut v = xs.clone();
        gelu_tanh_inplace(&mut v);
        for (x, g) in xs.iter().zip(&v) {
            assert_eq!(g.to_bits(), gelu_tanh(*x).to_bits(), "x = {x}");
        }
        // With a bias: the bits of adding it first, on every build this CPU runs.
        let bias: Vec<f32> = (0..xs.len()).map(|i| (i % 7) as f32 * 0.37 - 1.1).collect();
        let want: Vec<u32> = xs
            .iter()
            .zip(&bias)
            .map(|(x, b)| gelu_tanh(x + b).to_bits())
            .collect();
        let mut v = xs.clone();
        bias_gelu_tanh_inplace(&mut v, Some(&bias));
        assert_eq!(v.iter().map(|g| g.to_bits()).collect::<Vec<_>>(), want);
        #[cfg(target_arch = "x86_64")]
        if compute::kernels::Isa::Avx2.is_available() {
            let mut v = xs.clone();
            // SAFETY: the CPU reported AVX2 and FMA.
            unsafe { bias_gelu_tanh_avx2(&mut v, Some(&bias)) };
            assert_eq!(v.iter().map(|g| g.to_bits()).collect::<Vec<_>>(), want);
        }
        // Control: the bias added after the GELU is another result.
        let mut after = xs.clone();
        gelu_tanh_inplace(&mut after);
        assert!(after
            .iter()
            .zip(&bias)
            .map(|(g, b)| (g + b).to_bits())
            .ne(want.iter().copied()));
        // Control: the erf GELU is not within that bound.
        let x = 1.5f32;
        assert!((gelu_erf(x) - gelu_tanh(x)).abs() > 1e-4);
    }
}
