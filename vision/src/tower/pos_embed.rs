//! The learned position embeddings: a `side × side` table resampled bilinearly to each image's grid
//! with aligned corners, as transformers' `get_vision_interpolation_indices_and_weights`
//! (mode "bilinear", align_corners True) followed by the weighted sum of the four table rows — the
//! same f32 arithmetic in the same order.

/// The two taps on one axis and their weights, for target index `index` of an axis of `size`
/// positions resampled from `side` table positions.
pub fn axis_taps(
    index: usize,
    size: usize,
    side: usize,
    align_corners: bool,
) -> ([usize; 2], [f32; 2]) {
    let idx = index as f32;
    let src = if align_corners {
        // linspace(0, side − 1, size)[index] in closed form (size 1 maps to 0).
        idx * (side - 1) as f32 / (size.max(2) - 1) as f32
    } else {
        // Half-pixel centres (a control: llama.cpp's old reading).
        (idx + 0.5) * side as f32 / size as f32 - 0.5
    };
    let floor = src.floor();
    let last = side as i64 - 1;
    let tap = |o: i64| (floor as i64 + o).clamp(0, last) as usize;
    let frac = src - floor;
    let weight = |o: f32| (1.0 - (frac - o).abs()).max(0.0);
    ([tap(0), tap(1)], [weight(0.0), weight(1.0)])
}

/// Adds the interpolated position embedding of the patch at `(row, col)` of an `h × w` grid to
/// `x` (one row of `hidden`), from `table` (`side * side` rows of `hidden`).
#[allow(clippy::too_many_arguments)]
pub fn add_pos_embed(
    x: &mut [f32],
    table: &[f32],
    side: usize,
    (row, col): (usize, usize),
    (h, w): (usize, usize),
    align_corners: bool,
    acc: &mut [f32],
) {
    let hidden = x.len();
    let (h_taps, h_weights) = axis_taps(row, h, side, align_corners);
    let (w_taps, w_weights) = axis_taps(col, w, side, align_corners);
    acc.fill(0.0);
    for (ht, hw) in h_taps.into_iter().zip(h_weights) {
        for (wt, ww) in w_taps.into_iter().zip(w_weights) {
            let weight = hw * ww;
            let e = &table[(ht * side + wt) * hidden..][..hidden];
            for (a, &v) in acc.iter_mut().zip(e) {
                *a += v * weight;
            }
        }
    }
    for (v, a) in x.iter_mut().zip(acc.iter()) {
        *v += a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_corners_hit_the_table_ends() {
        // 6-row table to 4 positions: src = 0, 5/3, 10/3, 5.
        assert_eq!(axis_taps(0, 4, 6, true), ([0, 1], [1.0, 0.0]));
        assert_eq!(axis_taps(3, 4, 6, true), ([5, 5], [1.0, 0.0]));
        let (taps, w) = axis_taps(1, 4, 6, true);
        assert_eq!(taps, [1, 2]);
        assert!((w[0] - 1.0 / 3.0).abs() < 1e-6 && (w[1] - 2.0 / 3.0).abs() < 1e-6);
        // One position reads row 0.
        assert_eq!(axis_taps(0, 1, 6, true), ([0, 1], [1.0, 0.0]));
        // Control: half-pixel centres do not reach the ends.
        let (taps, w) = axis_taps(0, 4, 6, false);
        assert_eq!(taps, [0, 1]);
        assert!((w[0] - 0.75).abs() < 1e-6 && (w[1] - 0.25).abs() < 1e-6);
    }
}
