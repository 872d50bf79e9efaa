//! Image file -> pixel rows in the 2x2 merge order, equal to transformers' Qwen3-VL image processor.
//!
//! The processor matched is transformers 5.x's **PIL/NumPy one**, `Qwen2VLImageProcessorPil`
//! (models/qwen2_vl/image_processing_pil_qwen2_vl.py), fed a file path as `Qwen3VLProcessor` feeds it:
//! `load_image` (PIL open, `exif_transpose`, `convert("RGB")`), `convert_to_rgb`, `smart_resize`, Pillow's
//! `Image.resize` with the config's filter (BICUBIC), `rescale`, `normalize`, `patchify`. It is the one
//! transformers uses when torchvision is absent; the torchvision "fast" processor resizes differently
//! (a few uint8 levels). Steps, each in its own file:
//! - decode.rs: decode (JPEG with jpeg/, the rest with the `image` crate), EXIF orientation, PIL's
//!   conversions to 8-bit RGB;
//! - jpeg/: libjpeg-turbo's JPEG decompression as Pillow runs it, bit for bit;
//! - transparency.rs: the single transparent colour PIL whitens;
//! - gif_first_frame.rs: a GIF's first frame on its screen, as Pillow lays it out;
//! - smart_resize.rs: the target size (Python's rounding);
//! - resample.rs: Pillow's antialiased convolution resize, bit for bit;
//! - patch_rows.rs: rescale, normalize, the temporal repeat and the merge-order layout.

use std::path::Path;

use packs::semantics::ImagePreprocess;

mod decode;
mod gif_first_frame;
pub mod jpeg;
pub mod patch_rows;
pub mod resample;
pub mod smart_resize;
mod transparency;

pub use decode::decode_rgb;
pub use smart_resize::{smart_resize, SmartResizeError, MAX_ASPECT_RATIO};

#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// Unreadable, truncated, empty or unsupported input.
    #[error("{name}: {what}")]
    Image { name: String, what: String },
    /// Refused from the header, before any pixel is decoded.
    #[error(
        "{name}: the image is {width}x{height} = {} pixels, more than the {bound} decoded pixels allowed \
         (PreprocessOptions::max_decoded_pixels; raise it to accept larger images)",
        *width as u64 * *height as u64
    )]
    TooManyPixels {
        name: String,
        width: u32,
        height: u32,
        bound: u64,
    },
    /// transformers refuses these too (`smart_resize`).
    #[error(
        "{name}: the image is {width}x{height}, an aspect ratio of {ratio:.1}; transformers refuses \
         ratios above {MAX_ASPECT_RATIO} (crop or pad it first)"
    )]
    AspectRatio {
        name: String,
        width: u32,
        height: u32,
        ratio: f64,
    },
    /// The resize target has no pixels, or more than the decoded-pixel bound.
    #[error("{name}: {what}")]
    Size { name: String, what: String },
    /// The preprocessing config (preprocessor_config.json or the options) cannot be followed.
    #[error("{name}: preprocessing config: {what}")]
    Config { name: String, what: String },
}

/// What a caller may override beside the checkpoint's preprocessing config.
#[derive(Clone, Debug)]
pub struct PreprocessOptions {
    /// Overrides the checkpoint's `min_pixels` (size.shortest_edge).
    pub min_pixels: Option<u64>,
    /// Overrides the checkpoint's `max_pixels` (size.longest_edge).
    pub max_pixels: Option<u64>,
    /// Decoded images with more pixels than this are refused before their pixels are allocated; the
    /// resize target is held to it too.
    pub max_decoded_pixels: u64,
}

impl Default for PreprocessOptions {
    fn default() -> Self {
        PreprocessOptions {
            min_pixels: None,
            max_pixels: None,
            max_decoded_pixels: 8192 * 8192,
        }
    }
}

/// An 8-bit RGB image, rows top to bottom, pixels as R, G, B.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    /// `height * width * 3` samples.
    pub data: Vec<u8>,
}

/// One image ready for the tower: transformers' `pixel_values` rows and `image_grid_thw`.
#[derive(Clone, Debug, PartialEq)]
pub struct PixelPatches {
    /// `[grid t*h*w, channels * temporal_patch * patch * patch]`, rows in the 2x2 merge order.
    pub values: Vec<f32>,
    /// Values per row (`channels * temporal_patch * patch * patch`, 1536 for Qwen3-VL).
    pub row_len: usize,
    /// `(t, h, w)` in patches (`image_grid_thw`).
    pub grid: [usize; 3],
    /// Decoded size (width, height), after EXIF orientation.
    pub size_in: (u32, u32),
    /// Resized size (width, height).
    pub size_resized: (u32, u32),
}

impl PixelPatches {
    /// Image tokens this picture becomes (`t * h * w / merge^2`).
    pub fn tokens(&self, merge_size: usize) -> usize {
        self.grid[0] * self.grid[1] * self.grid[2] / (merge_size * merge_size)
    }
}

/// Decodes and preprocesses the image file at `path`.
pub fn load_image(
    path: &Path,
    cfg: &ImagePreprocess,
    opts: &PreprocessOptions,
) -> Result<PixelPatches, PreprocessError> {
    let name = path.display().to_string();
    let unreadable = |e: std::io::Error| PreprocessError::Image {
        name: name.clone(),
        what: format!("cannot read: {e}"),
    };
    // The encoded file is read whole; one far larger than any image within the pixel bound is not.
    let file_len = std::fs::metadata(path).map_err(unreadable)?.len();
    let most = max_encoded_bytes(opts);
    if file_len > most {
        return Err(PreprocessError::Image {
            name,
            what: format!(
                "the file is {file_len} bytes, more than the {most} an image within the {} decoded pixels \
                 allowed needs (PreprocessOptions::max_decoded_pixels)",
                opts.max_decoded_pixels
            ),
        });
    }
    let bytes = std::fs::read(path).map_err(unreadable)?;
    preprocess_bytes(&bytes, &name, cfg, opts)
}

/// The largest encoded file `load_image` reads: 8 bytes a pixel (RGBA16 stored raw) plus 64 MiB of
/// metadata, for the pixel bound in `opts`.
fn max_encoded_bytes(opts: &PreprocessOptions) -> u64 {
    opts.max_decoded_pixels
        .saturating_mul(8)
        .saturating_add(64 << 20)
}

/// Decodes and preprocesses an encoded image (PNG, JPEG, WebP, GIF); `name` names it in errors.
pub fn preprocess_bytes(
    bytes: &[u8],
    name: &str,
    cfg: &ImagePreprocess,
    opts: &PreprocessOptions,
) -> Result<PixelPatches, PreprocessError> {
    let (decoded, resized) = decode_and_resize(bytes, name, cfg, opts)?;
    let (values, grid) = patch_rows::patch_rows(&resized, cfg);
    Ok(PixelPatches {
        values,
        row_len: 3 * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size,
        grid,
        size_in: (decoded.0 as u32, decoded.1 as u32),
        size_resized: (resized.width as u32, resized.height as u32),
    })
}

/// The decoded size (width, height) and the resized 8-bit image, the uint8 pixels transformers
/// rescales: what the tests compare bit for bit with Pillow.
pub fn decode_and_resize(
    bytes: &[u8],
    name: &str,
    cfg: &ImagePreprocess,
    opts: &PreprocessOptions,
) -> Result<((usize, usize), RgbImage), PreprocessError> {
    let filter = check_config(cfg, name)?;
    let decoded = decode_rgb(bytes, name, cfg.do_convert_rgb, opts)?;
    let size_in = (decoded.width, decoded.height);
    let factor = cfg.patch_size * cfg.merge_size;
    if !cfg.do_resize {
        if decoded.width % factor != 0 || decoded.height % factor != 0 {
            return Err(PreprocessError::Size {
                name: name.to_string(),
                what: format!(
                    "do_resize is false and the image is {}x{}: both sides must be multiples of \
                     patch_size x merge_size = {factor}",
                    decoded.width, decoded.height
                ),
            });
        }
        return Ok((size_in, decoded));
    }
    let (height, width) = target_size(decoded.width, decoded.height, cfg, opts, name)?;
    Ok((size_in, resample::resize(&decoded, width, height, filter)))
}

/// `smart_resize` with the config's bounds (or the options' overrides), as (height, width).
pub fn target_size(
    width: usize,
    height: usize,
    cfg: &ImagePreprocess,
    opts: &PreprocessOptions,
    name: &str,
) -> Result<(usize, usize), PreprocessError> {
    let factor = (cfg.patch_size * cfg.merge_size) as u64;
    let min_pixels = opts.min_pixels.unwrap_or(cfg.min_pixels);
    let max_pixels = opts.max_pixels.unwrap_or(cfg.max_pixels);
    let (h, w) = smart_resize(height as u64, width as u64, factor, min_pixels, max_pixels).map_err(|e| match e {
        SmartResizeError::AspectRatio { ratio } => PreprocessError::AspectRatio {
            name: name.to_string(),
            width: width as u32,
            height: height as u32,
            ratio,
        },
        SmartResizeError::Empty { height: h, width: w } => PreprocessError::Size {
            name: name.to_string(),
            what: format!(
                "the {width}x{height} image would be resized to {w}x{h} (min_pixels {min_pixels}): too small to \
                 hold one patch"
            ),
        },
    })?;
    if h.saturating_mul(w) > opts.max_decoded_pixels {
        return Err(PreprocessError::Size {
            name: name.to_string(),
            what: format!(
                "the {width}x{height} image would be resized to {w}x{h} = {} pixels, more than the {} allowed \
                 (PreprocessOptions::max_decoded_pixels; lower max_pixels or raise the bound)",
                h * w,
                opts.max_decoded_pixels
            ),
        });
    }
    Ok((h as usize, w as usize))
}

/// Refuses configs this port cannot follow exactly; returns the resize filter.
fn check_config(cfg: &ImagePreprocess, name: &str) -> Result<resample::Filter, PreprocessError> {
    let bad = |what: String| PreprocessError::Config {
        name: name.to_string(),
        what,
    };
    // Qwen3-VL has 16, 2, 2; the upper bounds keep every size product far from overflow.
    for (field, v, most) in [
        ("patch_size", cfg.patch_size, 1024),
        ("merge_size", cfg.merge_size, 64),
        ("temporal_patch_size", cfg.temporal_patch_size, 16),
    ] {
        if v == 0 || v > most {
            return Err(bad(format!("{field} is {v}; expected 1..={most}")));
        }
    }
    if cfg.do_rescale && !cfg.rescale_factor.is_finite() {
        return Err(bad(format!(
            "rescale_factor is {}; expected a finite number",
            cfg.rescale_factor
        )));
    }
    if cfg.do_normalize {
        for c in 0..3 {
            let (mean, std) = (cfg.image_mean[c], cfg.image_std[c]);
            if !mean.is_finite() || !std.is_finite() || std as f32 == 0.0 {
                return Err(bad(format!(
                    "image_mean[{c}] = {mean}, image_std[{c}] = {std}; expected finite numbers and a nonzero std"
                )));
            }
        }
    }
    resample::Filter::from_pil_code(cfg.resample).ok_or_else(|| {
        bad(format!(
            "resample is {}; this port implements PIL's convolution filters 1 (LANCZOS), 2 (BILINEAR), \
             3 (BICUBIC), 4 (BOX), 5 (HAMMING)",
            cfg.resample
        ))
    })
}
