//! Image file -> pixel rows in the 2x2 merge order, as transformers' Qwen2-VL image processor.
//!
//! CONTRACT (the engine and the tower call exactly this; the bodies are being built, issue 14).

use std::path::Path;

use packs::semantics::ImagePreprocess;

#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    #[error("{name}: {what}")]
    Image { name: String, what: String },
}

/// What a caller may override beside the checkpoint's preprocessing config.
#[derive(Clone, Debug)]
pub struct PreprocessOptions {
    /// Overrides the checkpoint's `min_pixels` (size.shortest_edge).
    pub min_pixels: Option<u64>,
    /// Overrides the checkpoint's `max_pixels` (size.longest_edge).
    pub max_pixels: Option<u64>,
    /// Decoded images with more pixels than this are refused before their pixels are allocated.
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
    let bytes = std::fs::read(path).map_err(|e| PreprocessError::Image {
        name: path.display().to_string(),
        what: e.to_string(),
    })?;
    preprocess_bytes(&bytes, &path.display().to_string(), cfg, opts)
}

/// Decodes and preprocesses an encoded image (PNG, JPEG, WebP, GIF); `name` names it in errors.
pub fn preprocess_bytes(
    _bytes: &[u8],
    name: &str,
    _cfg: &ImagePreprocess,
    _opts: &PreprocessOptions,
) -> Result<PixelPatches, PreprocessError> {
    Err(PreprocessError::Image {
        name: name.to_string(),
        what: "image preprocessing is not built yet".into(),
    })
}
