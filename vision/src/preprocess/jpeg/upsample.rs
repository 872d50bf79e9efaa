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
    /// Row `y`'s real samples.
    fn row(&self, y: usize) -> &[u8] {
        &self.samples[y * self.stride..y * self.stride + self.width]
    }

    /// For output row `y` of a 2x vertical upsampling: the nearer input row and the farther one
    /// (above for even rows, below for odd), clamped to the real rows as jdmainct.c's context rows
    /// are.
    fn rows_for(&self, y: usize) -> (&[u8], &[u8]) {
        let near = y / 2;
        let far = if y % 2 == 1 {
            (near + 1).min(self.height - 1)
        } else {
            near.saturating_sub(1)
        };
        (self.row(near), self.row(far))
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
    let lines = out.chunks_exact_mut(out_w).enumerate();
    if h == max_h && v == max_v {
        for (y, line) in lines {
            line.copy_from_slice(&plane.row(y)[..out_w]);
        }
    } else if h * 2 == max_h && v == max_v && plane.width > 2 {
        let mut row = vec![0u8; 2 * plane.width];
        for (y, line) in lines {
            h2v1_fancy(plane.row(y), &mut row);
            line.copy_from_slice(&row[..out_w]);
        }
    } else if h == max_h && v * 2 == max_v {
        // h1v2_fancy_upsample (libjpeg-turbo uses it at any width).
        for (y, line) in lines {
            let (near, far) = plane.rows_for(y);
            let bias = if y % 2 == 1 { 2 } else { 1 };
            for ((o, &a), &b) in line.iter_mut().zip(near).zip(far) {
                *o = ((a as u32 * 3 + b as u32 + bias) >> 2) as u8;
            }
        }
    } else if h * 2 == max_h && v * 2 == max_v && plane.width > 2 {
        let mut row = vec![0u8; 2 * plane.width];
        let mut colsum = vec![0u32; plane.width];
        for (y, line) in lines {
            let (near, far) = plane.rows_for(y);
            for ((s, &a), &b) in colsum.iter_mut().zip(near).zip(far) {
                *s = a as u32 * 3 + b as u32;
            }
            h2v2_fancy(&colsum, &mut row);
            line.copy_from_slice(&row[..out_w]);
        }
    } else if max_h % h == 0 && max_v % v == 0 {
        // int_upsample (and h2v1_upsample / h2v2_upsample, the narrow cases): each sample repeated.
        let (he, ve) = (max_h / h, max_v / v);
        for (y, line) in lines {
            let src = plane.row(y / ve);
            for (x, o) in line.iter_mut().enumerate() {
                *o = src[x / he];
            }
        }
    } else {
        return Err(JpegError::Unsupported("fractional sampling factors"));
    }
    Ok(out)
}

/// `h2v1_fancy_upsample` of one row of samples into `out` (2 * its length).
fn h2v1_fancy(s: &[u8], out: &mut [u8]) {
    let w = s.len();
    let s = |x: usize| s[x] as u32;
    out[0] = s(0) as u8;
    out[1] = ((s(0) * 3 + s(1) + 2) >> 2) as u8;
    for x in 1..w - 1 {
        out[2 * x] = ((s(x) * 3 + s(x - 1) + 1) >> 2) as u8;
        out[2 * x + 1] = ((s(x) * 3 + s(x + 1) + 2) >> 2) as u8;
    }
    out[2 * w - 2] = ((s(w - 1) * 3 + s(w - 2) + 1) >> 2) as u8;
    out[2 * w - 1] = s(w - 1) as u8;
}

/// `h2v2_fancy_upsample` of one output row, from its column sums (3 * nearer row + farther row),
/// into `out` (2 * their length).
fn h2v2_fancy(c: &[u32], out: &mut [u8]) {
    let w = c.len();
    out[0] = ((c[0] * 4 + 8) >> 4) as u8;
    out[1] = ((c[0] * 3 + c[1] + 7) >> 4) as u8;
    for x in 1..w - 1 {
        out[2 * x] = ((c[x] * 3 + c[x - 1] + 8) >> 4) as u8;
        out[2 * x + 1] = ((c[x] * 3 + c[x + 1] + 7) >> 4) as u8;
    }
    out[2 * w - 2] = ((c[w - 1] * 3 + c[w - 2] + 8) >> 4) as u8;
    out[2 * w - 1] = ((c[w - 1] * 4 + 7) >> 4) as u8;
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
