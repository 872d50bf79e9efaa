//! A component's samples to the image's size as libjpeg-turbo's default ("fancy") upsampling does it
//! (jdsample.c, selected per component by `jinit_upsampler`): triangle filters for 2h1v, 1h2v and 2h2v
//! with their alternating rounding biases and edge cases, box replication otherwise. Above the first
//! and below the last real row libjpeg's main controller repeats that row (jdmainct.c), hence the
//! clamped neighbour rows here.

use super::JpegError;

/// A decoded component: `stride`-wide rows, of which `width` x `height` are real samples
/// (libjpeg's `downsampled_width/height`).
pub struct Plane<'a> {
    pub samples: &'a [u8],
    pub stride: usize,
    pub width: usize,
    pub height: usize,
}

impl Plane<'_> {
    fn at(&self, x: usize, y: usize) -> u8 {
        self.samples[y * self.stride + x]
    }
}

/// Upsamples `plane` by `(max_h / h, max_v / v)` to `out_w` x `out_h`.
pub fn upsample(
    plane: &Plane,
    (h, v): (usize, usize),
    (max_h, max_v): (usize, usize),
    (out_w, out_h): (usize, usize),
) -> Result<Vec<u8>, JpegError> {
    let mut out = vec![0u8; out_w * out_h];
    let last_row = plane.height - 1;
    if h == max_h && v == max_v {
        for y in 0..out_h {
            for x in 0..out_w {
                out[y * out_w + x] = plane.at(x, y);
            }
        }
    } else if h * 2 == max_h && v == max_v {
        if plane.width > 2 {
            for y in 0..out_h {
                let row = h2v1_fancy(plane, y);
                out[y * out_w..(y + 1) * out_w].copy_from_slice(&row[..out_w]);
            }
        } else {
            box_upsample(plane, 2, 1, out_w, out_h, &mut out);
        }
    } else if h == max_h && v * 2 == max_v {
        for y in 0..out_h {
            let (inrow, below) = (y / 2, y % 2 == 1);
            let other = if below {
                (inrow + 1).min(last_row)
            } else {
                inrow.saturating_sub(1)
            };
            let bias = if below { 2 } else { 1 };
            for x in 0..out_w {
                let sum = plane.at(x, inrow) as u32 * 3 + plane.at(x, other) as u32;
                out[y * out_w + x] = ((sum + bias) >> 2) as u8;
            }
        }
    } else if h * 2 == max_h && v * 2 == max_v {
        if plane.width > 2 {
            for y in 0..out_h {
                let row = h2v2_fancy(plane, y);
                out[y * out_w..(y + 1) * out_w].copy_from_slice(&row[..out_w]);
            }
        } else {
            box_upsample(plane, 2, 2, out_w, out_h, &mut out);
        }
    } else if max_h % h == 0 && max_v % v == 0 {
        box_upsample(plane, max_h / h, max_v / v, out_w, out_h, &mut out);
    } else {
        return Err(JpegError::Unsupported("fractional sampling factors"));
    }
    Ok(out)
}

/// `int_upsample` / `h2v1_upsample` / `h2v2_upsample`: each sample repeated.
fn box_upsample(plane: &Plane, he: usize, ve: usize, out_w: usize, out_h: usize, out: &mut [u8]) {
    for y in 0..out_h {
        for x in 0..out_w {
            out[y * out_w + x] = plane.at(x / he, y / ve);
        }
    }
}

/// `h2v1_fancy_upsample` of row `y`: 2 * width samples.
fn h2v1_fancy(plane: &Plane, y: usize) -> Vec<u8> {
    let w = plane.width;
    let s = |x: usize| plane.at(x, y) as u32;
    let mut row = Vec::with_capacity(2 * w);
    row.push(s(0) as u8);
    row.push(((s(0) * 3 + s(1) + 2) >> 2) as u8);
    for x in 1..w - 1 {
        row.push(((s(x) * 3 + s(x - 1) + 1) >> 2) as u8);
        row.push(((s(x) * 3 + s(x + 1) + 2) >> 2) as u8);
    }
    row.push(((s(w - 1) * 3 + s(w - 2) + 1) >> 2) as u8);
    row.push(s(w - 1) as u8);
    row
}

/// `h2v2_fancy_upsample` of output row `y`: 2 * width samples.
fn h2v2_fancy(plane: &Plane, y: usize) -> Vec<u8> {
    let w = plane.width;
    let (inrow, below) = (y / 2, y % 2 == 1);
    let other = if below {
        (inrow + 1).min(plane.height - 1)
    } else {
        inrow.saturating_sub(1)
    };
    let colsum = |x: usize| plane.at(x, inrow) as u32 * 3 + plane.at(x, other) as u32;
    let mut row = Vec::with_capacity(2 * w);
    row.push(((colsum(0) * 4 + 8) >> 4) as u8);
    row.push(((colsum(0) * 3 + colsum(1) + 7) >> 4) as u8);
    for x in 1..w - 1 {
        row.push(((colsum(x) * 3 + colsum(x - 1) + 8) >> 4) as u8);
        row.push(((colsum(x) * 3 + colsum(x + 1) + 7) >> 4) as u8);
    }
    row.push(((colsum(w - 1) * 3 + colsum(w - 2) + 8) >> 4) as u8);
    row.push(((colsum(w - 1) * 4 + 7) >> 4) as u8);
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    /// jdsample.c's edge cases: the first and last output of a 2h1v row are the samples themselves,
    /// the inner ones 3:1 blends with biases 1 and 2.
    #[test]
    fn h2v1_fancy_edges_and_biases() {
        let samples = [0u8, 4, 8];
        let plane = Plane {
            samples: &samples,
            stride: 3,
            width: 3,
            height: 1,
        };
        let out = upsample(&plane, (1, 1), (2, 1), (6, 1)).unwrap();
        // x0: 0, (0*3+4+2)>>2=1, (4*3+0+1)>>2=3, (4*3+8+2)>>2=5, (8*3+4+1)>>2=7, 8
        assert_eq!(out, vec![0, 1, 3, 5, 7, 8]);
    }

    /// 2h2v at the bottom edge uses the last row itself as the row below (a repeated row), and the
    /// last column uses (4 * colsum + 7) >> 4.
    #[test]
    fn h2v2_fancy_clamps_rows() {
        let samples = [10u8, 20, 30, 40, 50, 60];
        let plane = Plane {
            samples: &samples,
            stride: 3,
            width: 3,
            height: 2,
        };
        let out = upsample(&plane, (1, 1), (2, 2), (6, 4)).unwrap();
        // Output row 3: inrow 1, row below clamped to 1: colsum = 4 * sample.
        let row3: Vec<u8> = out[18..24].to_vec();
        assert_eq!(row3[5], ((60u32 * 4 * 4 + 7) >> 4) as u8);
        assert_eq!(row3[0], ((40u32 * 4 * 4 + 8) >> 4) as u8);
        // Output row 0: the row above row 0 is row 0 too.
        assert_eq!(out[0], 10);
    }
}
