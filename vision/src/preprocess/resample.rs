//! Pillow's `Image.resize` for 8-bit RGB with a convolution filter, bit for bit: `src/libImaging/Resample.c`
//! of Pillow 13.0.0 (the sdist's; the pass order changed in 13, see `resize_with`).
//!
//! Why by hand and why exactly this: transformers' PIL image processor resizes with Pillow, and the model
//! was trained on Pillow's pixels. Pillow's resample is antialiased (the filter's support grows with the
//! downscale factor), separable (a horizontal pass, the intermediate rounded and clipped to uint8, then a
//! vertical pass), with coefficients in fixed point (`PRECISION_BITS` = 22). A plain bicubic or a float
//! pipeline differs by several uint8 levels on downscales.

use super::RgbImage;

/// Fractional bits of the fixed-point coefficients: 32 − 8 − 2 (8 for the result, 2 for overshoot).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// A Pillow resampling filter (`PIL.Image.Resampling`), by its code in `preprocessor_config.json`'s
/// `resample`. NEAREST (0) is not a convolution in Pillow and is not offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    Lanczos,
    Bilinear,
    Bicubic,
    Box,
    Hamming,
}

impl Filter {
    /// The filter for a PIL resample code; `None` for codes this port does not implement.
    pub fn from_pil_code(code: u32) -> Option<Filter> {
        match code {
            1 => Some(Filter::Lanczos),
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            4 => Some(Filter::Box),
            5 => Some(Filter::Hamming),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let x = x * std::f64::consts::PI;
                    // Pillow writes 0.54f + 0.46f: float constants widened to double.
                    x.sin() / x * (0.54f32 as f64 + 0.46f32 as f64 * x.cos())
                }
            }
            Filter::Bicubic => {
                // Keys' cubic convolution with a = -0.5, in Pillow's operation order.
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

/// One output pixel's source window and its fixed-point weights.
struct Taps {
    /// First source index.
    start: usize,
    /// Weights for source indexes `start..start + weights.len()`.
    weights: Vec<i32>,
}

/// Pillow's `precompute_coeffs` followed by `normalize_coeffs_8bpc`, for the box `[0, in_size)`.
/// `antialias` false keeps the filter's support unscaled on downscales (the mistake ports make).
fn taps(in_size: usize, out_size: usize, filter: Filter, antialias: bool) -> Vec<Taps> {
    // Pillow's box edges are C floats; sizes here are far below 2^24, so they are exact.
    let scale = in_size as f32 as f64 / out_size as f64;
    let filterscale = if antialias { scale.max(1.0) } else { 1.0 };
    let support = filter.support() * filterscale;
    let inv_filterscale = 1.0 / filterscale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // `(int)` truncates toward zero, as `as` does.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let count = xmax.saturating_sub(xmin);
            let mut k: Vec<f64> = (0..count)
                .map(|x| filter.weight((x as f64 + xmin as f64 - center + 0.5) * inv_filterscale))
                .collect();
            let ww: f64 = k.iter().sum();
            if ww != 0.0 {
                for w in &mut k {
                    *w /= ww;
                }
            }
            let one = (1u32 << PRECISION_BITS) as f64;
            let weights = k
                .iter()
                .map(|&w| {
                    if w < 0.0 {
                        (-0.5 + w * one) as i32
                    } else {
                        (0.5 + w * one) as i32
                    }
                })
                .collect();
            Taps {
                start: xmin,
                weights,
            }
        })
        .collect()
}

/// Pillow's `clip8`: the accumulator's integer part, clipped to 0..=255.
#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes `src` to `width` x `height` as Pillow's `Image.resize(size, filter)` does for an RGB image.
pub fn resize(src: &RgbImage, width: usize, height: usize, filter: Filter) -> RgbImage {
    resize_with(src, width, height, filter, true)
}

/// The same resize with the filter's support not widened on downscales: a plain (aliasing) bicubic,
/// kept only as the tests' control.
#[doc(hidden)]
pub fn resize_without_antialias(
    src: &RgbImage,
    width: usize,
    height: usize,
    filter: Filter,
) -> RgbImage {
    resize_with(src, width, height, filter, false)
}

fn resize_with(
    src: &RgbImage,
    width: usize,
    height: usize,
    filter: Filter,
    antialias: bool,
) -> RgbImage {
    // Image.resize returns a copy when nothing changes.
    if src.width == width && src.height == height {
        return src.clone();
    }
    // Pillow 13 runs the vertical pass first when the height shrinks by more than twice what the width
    // does (ImagingResampleInner's `horizontal_first`, in C ints); the uint8 rounding between the passes
    // makes the order visible in the output.
    let height_drop = src.height as i64 - height as i64;
    let width_drop = src.width as i64 - width as i64;
    let vertical_first = height_drop > 0 && height_drop > width_drop * 2;
    let (w_pass, h_pass) = (width != src.width, height != src.height);
    if vertical_first {
        let tall = if h_pass {
            vertical(src, height, filter, antialias)
        } else {
            src.clone()
        };
        if w_pass {
            horizontal(&tall, width, filter, antialias)
        } else {
            tall
        }
    } else {
        let wide = if w_pass {
            horizontal(src, width, filter, antialias)
        } else {
            src.clone()
        };
        if h_pass {
            vertical(&wide, height, filter, antialias)
        } else {
            wide
        }
    }
}

/// One horizontal pass (`ImagingResampleHorizontal_8bpc`): every row to `width` pixels, clipped to uint8.
/// Pillow computes only the rows the vertical pass reads; the values are the same.
fn horizontal(src: &RgbImage, width: usize, filter: Filter, antialias: bool) -> RgbImage {
    let half = 1i32 << (PRECISION_BITS - 1);
    let taps = taps(src.width, width, filter, antialias);
    let mut out = vec![0u8; width * src.height * 3];
    for (row_in, row_out) in src
        .data
        .chunks_exact(src.width * 3)
        .zip(out.chunks_exact_mut(width * 3))
    {
        for (tap, px) in taps.iter().zip(row_out.chunks_exact_mut(3)) {
            let mut acc = [half; 3];
            for (i, &w) in tap.weights.iter().enumerate() {
                let s = &row_in[(tap.start + i) * 3..(tap.start + i) * 3 + 3];
                for c in 0..3 {
                    acc[c] += s[c] as i32 * w;
                }
            }
            for c in 0..3 {
                px[c] = clip8(acc[c]);
            }
        }
    }
    RgbImage {
        width,
        height: src.height,
        data: out,
    }
}

/// One vertical pass (`ImagingResampleVertical_8bpc`): every column to `height` pixels, clipped to uint8.
fn vertical(src: &RgbImage, height: usize, filter: Filter, antialias: bool) -> RgbImage {
    let half = 1i32 << (PRECISION_BITS - 1);
    let taps = taps(src.height, height, filter, antialias);
    let stride = src.width * 3;
    let mut out = vec![0u8; stride * height];
    let mut acc = vec![0i32; stride];
    for (tap, row_out) in taps.iter().zip(out.chunks_exact_mut(stride)) {
        acc.fill(half);
        for (i, &w) in tap.weights.iter().enumerate() {
            let row_in = &src.data[(tap.start + i) * stride..(tap.start + i + 1) * stride];
            for (a, &s) in acc.iter_mut().zip(row_in) {
                *a += s as i32 * w;
            }
        }
        for (o, &a) in row_out.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    RgbImage {
        width: src.width,
        height,
        data: out,
    }
}
