//! RMSNorm as transformers computes it: mean of squares and rsqrt in f32, then times the weight.

/// `out = x * rsqrt(mean(x^2) + eps) * w`, in place over one row.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v = g * (*v * scale);
    }
}

/// `out = x * rsqrt(mean(x^2) + eps) * w` into `out`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = g * (v * scale);
    }
}

fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for &v in tail {
        sum += v * v;
    }
    1.0 / (sum / x.len() as f32 + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_row_is_unchanged_by_unit_weight() {
        let mut x = vec![1.0, -1.0, 1.0, -1.0];
        rmsnorm_inplace(&mut x, &[1.0; 4], 0.0);
        assert_eq!(x, vec![1.0, -1.0, 1.0, -1.0]);
        let mut y = vec![2.0, -2.0, 2.0, -2.0];
        rmsnorm_inplace(&mut y, &[1.0, 2.0, 1.0, 1.0], 0.0);
        assert_eq!(y, vec![1.0, -2.0, 1.0, -1.0]);
    }
}
