//! The three position planes of a prompt, by transformers' `get_rope_index` (Qwen3-VL): text runs
//! count on from the running position on all planes; an image of merged grid (t, gh, gw) starting
//! at position p gets t = p + frame, h = p + row, w = p + col; the running position then moves on
//! by max(gh, gw) — the image's max position + 1, not its token count.

/// One image's place in the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSpan {
    /// First image-pad row.
    pub first_row: usize,
    /// Patch grid (t, h, w) before merging.
    pub grid: [usize; 3],
}

impl ImageSpan {
    pub fn tokens(&self, merge: usize) -> usize {
        self.grid[0] * self.grid[1] * self.grid[2] / (merge * merge)
    }
}

/// Deliberate mistakes for controls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RopeAblation {
    /// Continue after an image from its token count instead of its max position + 1.
    pub advance_by_token_count: bool,
}

/// Planes (plane-major: t for every row, then h, then w) and the rope delta
/// (max position + 1 - rows) of a prompt of `rows` rows with `images` (ascending, not overlapping).
pub fn position_planes(
    rows: usize,
    images: &[ImageSpan],
    merge: usize,
    ablation: RopeAblation,
) -> (Vec<i64>, i64) {
    let mut planes = vec![0i64; 3 * rows];
    let mut pos: i64 = 0;
    let mut row = 0;
    let mut put = |row: usize, t: i64, h: i64, w: i64| {
        planes[row] = t;
        planes[rows + row] = h;
        planes[2 * rows + row] = w;
    };
    for img in images.iter().chain(std::iter::once(&ImageSpan {
        first_row: rows,
        grid: [0, 0, 0],
    })) {
        while row < img.first_row.min(rows) {
            put(row, pos, pos, pos);
            pos += 1;
            row += 1;
        }
        if img.first_row >= rows {
            break;
        }
        let (gt, gh, gw) = (img.grid[0], img.grid[1] / merge, img.grid[2] / merge);
        for f in 0..gt {
            for r in 0..gh {
                for c in 0..gw {
                    put(row, pos + f as i64, pos + r as i64, pos + c as i64);
                    row += 1;
                }
            }
        }
        pos += if ablation.advance_by_token_count {
            (gt * gh * gw) as i64
        } else {
            gh.max(gw) as i64
        };
    }
    let max = planes.iter().copied().max().unwrap_or(-1);
    (planes, max + 1 - rows as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_only_is_plain_counting() {
        let (p, d) = position_planes(4, &[], 2, RopeAblation::default());
        assert_eq!(p, vec![0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(d, 0);
    }

    #[test]
    fn an_image_counts_rows_and_columns_then_text_continues_from_its_max_plus_one() {
        // 2 text rows, a 4x6-patch image (2x3 merged = 6 rows), 1 text row.
        let img = ImageSpan {
            first_row: 2,
            grid: [1, 4, 6],
        };
        let (p, d) = position_planes(9, &[img], 2, RopeAblation::default());
        let t = &p[0..9];
        let h = &p[9..18];
        let w = &p[18..27];
        assert_eq!(t, &[0, 1, 2, 2, 2, 2, 2, 2, 5]);
        assert_eq!(h, &[0, 1, 2, 2, 2, 3, 3, 3, 5]);
        assert_eq!(w, &[0, 1, 2, 3, 4, 2, 3, 4, 5]);
        assert_eq!(d, 6 - 9);
        // Control: continuing from the token count (6) moves the last row to 8.
        let (bad, _) = position_planes(
            9,
            &[img],
            2,
            RopeAblation {
                advance_by_token_count: true,
            },
        );
        assert_eq!(bad[8], 8);
    }
}
