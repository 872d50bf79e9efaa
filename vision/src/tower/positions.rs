//! Where every patch row sits in its image: `(row, col)` in patches, in the order the rows come
//! (the 2×2 merge-block order of transformers' processor), and which rows attend to each other.

/// The `(row, col)` of patch `i` of one frame of an `h × w` grid whose rows come in merge-block
/// order: block after block (`w / merge` blocks per block row), `merge × merge` patches per block,
/// row-major inside it — transformers' `get_vision_position_ids` and the interpolation indices.
/// With `raster`, row-major over the whole frame instead (a control: the wrong order).
pub fn patch_coord(i: usize, w: usize, merge: usize, raster: bool) -> (usize, usize) {
    if raster {
        return (i / w, i % w);
    }
    let blocks_w = w / merge;
    let in_col = i % merge;
    let in_row = (i / merge) % merge;
    let block_col = (i / (merge * merge)) % blocks_w;
    let block_row = i / (merge * merge * blocks_w);
    (block_row * merge + in_row, block_col * merge + in_col)
}

/// The coordinates of every row of the images (grids `(t, h, w)`), image after image, each frame
/// of an image repeating the same coordinates.
pub fn patch_coords(grids: &[[usize; 3]], merge: usize, raster: bool) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(grids.iter().map(|g| g[0] * g[1] * g[2]).sum());
    for &[t, h, w] in grids {
        for _ in 0..t {
            out.extend((0..h * w).map(|i| patch_coord(i, w, merge, raster)));
        }
    }
    out
}

/// Attention segments `(first row, rows)`: one per frame of every image (transformers'
/// `cu_seqlens`: a frame attends only to itself). With `joint`, one segment over all rows
/// (a control: images attending to each other).
pub fn segments(grids: &[[usize; 3]], joint: bool) -> Vec<(usize, usize)> {
    let total: usize = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
    if joint {
        return vec![(0, total)];
    }
    let mut out = Vec::new();
    let mut start = 0;
    for &[t, h, w] in grids {
        for _ in 0..t {
            out.push((start, h * w));
            start += h * w;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_order_of_a_4x6_grid() {
        // transformers: hpos.reshape(2, 2, 3, 2).transpose(1, 2).flatten() for h = 4, w = 6.
        let got: Vec<_> = (0..8).map(|i| patch_coord(i, 6, 2, false)).collect();
        assert_eq!(
            got,
            [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
        assert_eq!(patch_coord(12, 6, 2, false), (2, 0));
        assert_eq!(patch_coord(23, 6, 2, false), (3, 5));
        // Control: raster order differs from the third row on.
        assert_eq!(patch_coord(2, 6, 2, true), (0, 2));
    }

    #[test]
    fn segments_per_frame() {
        assert_eq!(
            segments(&[[1, 4, 6], [2, 2, 2]], false),
            vec![(0, 24), (24, 4), (28, 4)]
        );
        assert_eq!(segments(&[[1, 4, 6], [2, 2, 2]], true), vec![(0, 32)]);
    }
}
