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

/// Rows normalized in lockstep by [`layer_norm_rows`].
const LOCKSTEP: usize = 8;

/// [`layer_norm`] on every row of `x` (rows as wide as `w`) into `out`, with the same bits row by
/// row: each row's f64 sums still add its elements in order, but [`LOCKSTEP`] rows' sums advance
/// together, so 8 independent add chains hide the f64 add's latency (one chain per row kept a
/// 2B tower's 48 norms of 784 rows at ~30 ms of its 140 ms outside GEMMs and attention).
pub fn layer_norm_rows(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let width = w.len();
    assert!(width > 0 && b.len() == width && x.len() == out.len() && x.len().is_multiple_of(width));
    let block = LOCKSTEP * width;
    let mut xs = x.chunks_exact(block);
    let mut outs = out.chunks_exact_mut(block);
    for (xb, ob) in (&mut xs).zip(&mut outs) {
        let rows: [&[f32]; LOCKSTEP] = std::array::from_fn(|r| &xb[r * width..][..width]);
        let mut sum = [0f64; LOCKSTEP];
        for k in 0..width {
            for (s, row) in sum.iter_mut().zip(&rows) {
                *s += row[k] as f64;
            }
        }
        let mean = sum.map(|s| s / width as f64);
        let mut sq = [0f64; LOCKSTEP];
        for k in 0..width {
            for ((s, row), &m) in sq.iter_mut().zip(&rows).zip(&mean) {
                let d = row[k] as f64 - m;
                *s += d * d;
            }
        }
        for ((o, row), (&m, &q)) in ob
            .chunks_exact_mut(width)
            .zip(&rows)
            .zip(mean.iter().zip(&sq))
        {
            let var = q / width as f64;
            let rstd = (1.0 / (var + eps as f64).sqrt()) as f32;
            let mean = m as f32;
            for (((o, &v), &w), &b) in o.iter_mut().zip(*row).zip(w).zip(b) {
                *o = (v - mean) * rstd * w + b;
            }
        }
    }
    for (r, o) in xs
        .remainder()
        .chunks_exact(width)
        .zip(outs.into_remainder().chunks_exact_mut(width))
    {
        layer_norm(r, w, b, eps, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from 1e-3 to 5e9, so f64 sums of them round and their order matters.
    fn mixed(i: usize) -> f32 {
        ((i * 7919 % 1013) as f32 - 506.0) * 10f32.powi((i % 6) as i32 * 2 - 3)
    }

    #[test]
    fn rows_in_lockstep_give_each_rows_bits() {
        let width = 67;
        for rows in [1, 7, 8, 9, 19] {
            let x: Vec<f32> = (0..rows * width).map(mixed).collect();
            let w: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 * 0.01).collect();
            let b: Vec<f32> = (0..width).map(|i| i as f32 * -0.003).collect();
            let mut got = vec![0.0; x.len()];
            layer_norm_rows(&x, &w, &b, 1e-6, &mut got);
            for (r, (xr, g)) in x.chunks(width).zip(got.chunks(width)).enumerate() {
                let mut want = vec![0.0; width];
                layer_norm(xr, &w, &b, 1e-6, &mut want);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(g), bits(&want), "{rows} rows, row {r}");
            }
        }
        // Control: the data tells summation orders apart (the rows summed backwards give other
        // means), so equal bits above mean the same order.
        let x: Vec<f32> = (0..67).map(mixed).collect();
        let forward = x.iter().map(|&v| v as f64).sum::<f64>();
        let backward = x.iter().rev().map(|&v| v as f64).sum::<f64>();
        assert_ne!(forward, backward);
    }

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
