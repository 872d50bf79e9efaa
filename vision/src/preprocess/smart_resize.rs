//! transformers' `smart_resize` (models/qwen2_vl/image_processing_pil_qwen2_vl.py): the size an image is
//! resized to, both sides multiples of `factor` (patch x merge), the pixel count within [min, max].
//!
//! Python's arithmetic exactly: `round` is half to even (1280x720 -> 1280x704; half away from zero would
//! give 1280x736, 40 more image tokens), `int / int` is one correctly rounded division (exact here as the
//! products stay below 2^53), `math.floor`/`math.ceil` of doubles.

/// Why transformers refuses a size.
#[derive(Clone, Debug, PartialEq)]
pub enum SmartResizeError {
    /// transformers: "absolute aspect ratio must be smaller than 200".
    AspectRatio { ratio: f64 },
    /// A side became 0 (possible only with a tiny `min_pixels`); transformers would fail in the resize.
    Empty { height: u64, width: u64 },
}

/// transformers' refusal bound on `max(h, w) / min(h, w)`.
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// `(height, width)` after resize, as transformers' `smart_resize(height, width, factor, min_pixels,
/// max_pixels)`. `height` and `width` must be positive.
pub fn smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u64, u64), SmartResizeError> {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = height.max(width) as f64 / height.min(width) as f64;
    if ratio > MAX_ASPECT_RATIO {
        return Err(SmartResizeError::AspectRatio { ratio });
    }
    let mut h_bar = (h / f).round_ties_even() as u64 * factor;
    let mut w_bar = (w / f).round_ties_even() as u64 * factor;
    let pixels = height * width;
    // Saturating: absurd bounds (an option set to u64::MAX) must not wrap; the caller's pixel bound refuses.
    if h_bar.saturating_mul(w_bar) > max_pixels {
        let beta = (pixels as f64 / max_pixels as f64).sqrt();
        h_bar = factor.max((h / beta / f).floor() as u64 * factor);
        w_bar = factor.max((w / beta / f).floor() as u64 * factor);
    } else if h_bar.saturating_mul(w_bar) < min_pixels {
        let beta = (min_pixels as f64 / pixels as f64).sqrt();
        h_bar = ((h * beta / f).ceil() as u64).saturating_mul(factor);
        w_bar = ((w * beta / f).ceil() as u64).saturating_mul(factor);
    }
    if h_bar == 0 || w_bar == 0 {
        return Err(SmartResizeError::Empty {
            height: h_bar,
            width: w_bar,
        });
    }
    Ok((h_bar, w_bar))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-VL-2B: patch 16 x merge 2, min 65 536, max 16 777 216 (REFERENCE.md).
    const F: u64 = 32;
    const MIN: u64 = 65_536;
    const MAX: u64 = 16_777_216;

    #[test]
    fn hd_frame_rounds_half_to_even() {
        // 720 / 32 = 22.5 -> 22 (even) -> 704; 1280 / 32 = 40 exactly.
        assert_eq!(smart_resize(720, 1280, F, MIN, MAX), Ok((704, 1280)));
        assert_eq!(704 / 16 * (1280 / 16) / 4, 880, "image tokens");
    }

    #[test]
    fn control_half_away_from_zero_gives_736() {
        // The mistake every port makes: f64::round is half away from zero.
        let wrong = (720f64 / 32.0).round() as u64 * 32;
        assert_eq!(wrong, 736);
        assert_ne!(smart_resize(720, 1280, F, MIN, MAX).unwrap().0, wrong);
        assert_eq!(
            736 / 16 * (1280 / 16) / 4,
            920,
            "the wrong count of image tokens"
        );
    }

    #[test]
    fn tiny_images_grow_to_min_pixels() {
        // beta = sqrt(65536 / 100) = 25.6: ceil(10 * 25.6 / 32) = 8 -> 256.
        assert_eq!(smart_resize(10, 10, F, MIN, MAX), Ok((256, 256)));
        assert_eq!(smart_resize(1, 1, F, 1024, 4_194_304), Ok((32, 32)));
    }

    #[test]
    fn large_images_shrink_below_max_pixels() {
        let (h, w) = smart_resize(6000, 8000, F, MIN, MAX).unwrap();
        assert!(h * w <= MAX && h % F == 0 && w % F == 0, "{h}x{w}");
        assert_eq!((h, w), (3520, 4704));
    }

    #[test]
    fn aspect_ratio_over_200_is_refused() {
        assert!(
            smart_resize(10, 2000, F, MIN, MAX).is_ok(),
            "200 exactly is allowed"
        );
        assert_eq!(
            smart_resize(10, 2001, F, MIN, MAX),
            Err(SmartResizeError::AspectRatio { ratio: 200.1 })
        );
    }

    #[test]
    fn absurd_min_pixels_saturate_instead_of_wrapping() {
        let (h, w) = smart_resize(10, 10, F, u64::MAX, u64::MAX).unwrap();
        assert!(h.saturating_mul(w) > 1 << 40, "{h}x{w}");
    }

    #[test]
    fn a_zero_side_is_refused() {
        // round(10 / 32) = 0 and min_pixels 0 keeps it: transformers would hand PIL a 0-pixel size.
        assert_eq!(
            smart_resize(10, 100, F, 0, MAX),
            Err(SmartResizeError::Empty {
                height: 0,
                width: 96
            })
        );
    }
}
