//! The tower's 2-D rotary (transformers' axial `Qwen3VLVisionRotaryEmbedding`): `head_dim / 4`
//! frequencies `1 / θ^(2j / (head_dim/2))`; the first half of a head's rotary angles take the
//! patch's row, the second half its column; cos/sin are then duplicated over the full head, which
//! is rotate-half pairing (j with j + head_dim/2) on `head_dim / 2` angles — `compute::ops::rope`'s rule.

pub use compute::ops::rope::rotate_half;

/// `head_dim / 4` inverse frequencies (`compute::ops::rope::inv_freq` over a `head_dim / 2` space).
pub fn inv_freq(theta: f64, head_dim: usize) -> Vec<f32> {
    compute::ops::rope::inv_freq(theta, head_dim / 2)
}

/// cos and sin (`head_dim / 2` each) of a patch at `(row, col)`: `[row·f, col·f]`.
pub fn cos_sin(inv_freq: &[f32], (row, col): (usize, usize), cos: &mut [f32], sin: &mut [f32]) {
    let q = inv_freq.len();
    for (j, &f) in inv_freq.iter().enumerate() {
        for (slot, pos) in [(j, row), (j + q, col)] {
            let a = pos as f32 * f;
            cos[slot] = a.cos();
            sin[slot] = a.sin();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_then_columns() {
        let f = inv_freq(10_000.0, 16);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 0.1).abs() < 1e-7, "{f:?}"); // 1 / 10000^(2/8)
        let (mut c, mut s) = (vec![0.0; 8], vec![0.0; 8]);
        cos_sin(&f, (3, 5), &mut c, &mut s);
        assert_eq!(s[0], 3.0f32.sin());
        assert_eq!(s[4], 5.0f32.sin());
        // Control: swapping row and column moves the angles.
        let (mut c2, mut s2) = (vec![0.0; 8], vec![0.0; 8]);
        cos_sin(&f, (5, 3), &mut c2, &mut s2);
        assert_ne!(s, s2);
        assert_ne!(c, c2);
    }
}
