//! LayerNorm over one row, as `torch.nn.LayerNorm`: `(x − mean) / sqrt(var + eps) · w + b` with the
//! biased variance. Mean and variance are summed in f64 (two passes), so the row's statistics are
//! exact to f32 whatever its length; the output is one f32 expression per element.

/// `out = LayerNorm(x) · w + b`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len();
    debug_assert!(w.len() == n && b.len() == n && out.len() == n);
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = x
        .iter()
        .map(|&v| {
            let d = v as f64 - mean;
            d * d
        })
        .sum::<f64>()
        / n as f64;
    let rstd = (1.0 / (var + eps as f64).sqrt()) as f32;
    let mean = mean as f32;
    for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = (v - mean) * rstd * w + b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_then_scales_and_shifts() {
        let x = [1.0f32, 2.0, 3.0, 6.0];
        let mut out = [0.0; 4];
        layer_norm(&x, &[1.0; 4], &[0.0; 4], 0.0, &mut out);
        // mean 3, biased variance 3.5
        let s = 3.5f64.sqrt();
        let want = [-2.0 / s, -1.0 / s, 0.0, 3.0 / s];
        for (o, w) in out.iter().zip(want) {
            assert!((*o as f64 - w).abs() < 1e-6, "{out:?}");
        }
        layer_norm(&x, &[2.0; 4], &[0.5; 4], 0.0, &mut out);
        assert!((out[2] - 0.5).abs() < 1e-6 && (out[3] as f64 - (6.0 / s + 0.5)).abs() < 1e-5);
        // Control: the unbiased variance (n − 1) gives a visibly different row.
        let unbiased = (14.0f64 / 3.0).sqrt();
        assert!((out[3] as f64 - (6.0 / unbiased + 0.5)).abs() > 1e-2);
    }
}
