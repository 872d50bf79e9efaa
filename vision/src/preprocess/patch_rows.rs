//! Resized RGB -> transformers' `pixel_values` rows: rescale, normalize, the frame repeated to the
//! temporal patch, rows in the 2x2 merge order.
//!
//! Arithmetic as transformers' PIL path: `rescale` is `uint8.astype(float64) * rescale_factor` then cast
//! to float32; `normalize` is `(x - mean) / std` in float32 with mean and std cast to float32. Every value
//! depends only on (channel, uint8 level), so one 3 x 256 table holds them all.

use packs::semantics::ImagePreprocess;

use super::RgbImage;

/// The float32 value of each (channel, uint8 level), as transformers computes it.
pub fn level_table(cfg: &ImagePreprocess) -> [[f32; 256]; 3] {
    let mut table = [[0f32; 256]; 3];
    for (c, row) in table.iter_mut().enumerate() {
        for (level, out) in row.iter_mut().enumerate() {
            let mut x = if cfg.do_rescale {
                (level as f64 * cfg.rescale_factor) as f32
            } else {
                level as f32
            };
            if cfg.do_normalize {
                x = (x - cfg.image_mean[c] as f32) / cfg.image_std[c] as f32;
            }
            *out = x;
        }
    }
    table
}

/// Rows `[grid_h * grid_w, 3 * temporal * patch * patch]` and the grid `(1, grid_h, grid_w)`.
///
/// transformers' `patchify`: the image viewed as (C, gh/m, m, P, gw/m, m, P), permuted to
/// (gh/m, gw/m, m, m, C, P, P) with the frame broadcast to T after C. So the rows run over merge blocks
/// (bh, bw) and within each over (mh, mw): row `((bh * gw/m + bw) * m + mh) * m + mw` holds patch
/// (gy, gx) = (bh*m + mh, bw*m + mw), its values indexed `c*T*P*P + t*P*P + y*P + x`.
/// The caller guarantees both sides are multiples of patch * merge.
pub fn patch_rows(image: &RgbImage, cfg: &ImagePreprocess) -> (Vec<f32>, [usize; 3]) {
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let (grid_h, grid_w) = (image.height / p, image.width / p);
    let row_len = 3 * t * p * p;
    let table = level_table(cfg);
    let mut values = Vec::with_capacity(grid_h * grid_w * row_len);
    for bh in 0..grid_h / m {
        for bw in 0..grid_w / m {
            for mh in 0..m {
                for mw in 0..m {
                    let (y0, x0) = ((bh * m + mh) * p, (bw * m + mw) * p);
                    for (c, levels) in table.iter().enumerate() {
                        let start = values.len();
                        for y in y0..y0 + p {
                            let line = &image.data
                                [(y * image.width + x0) * 3..(y * image.width + x0 + p) * 3];
                            values.extend(line.chunks_exact(3).map(|px| levels[px[c] as usize]));
                        }
                        // The same frame for every temporal slot.
                        for _ in 1..t {
                            values.extend_from_within(start..start + p * p);
                        }
                    }
                }
            }
        }
    }
    (values, [1, grid_h, grid_w])
}
