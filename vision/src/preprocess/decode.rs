//! Encoded file -> upright 8-bit RGB, as transformers' `load_image` (PIL `open`, `exif_transpose`,
//! `convert("RGB")`) followed by the processor's `convert_to_rgb` sees it.
//!
//! Decoding is the `image` crate's; what PIL does with the decoded samples is ours, measured on Pillow 13:
//! gray is repeated to R = G = B; alpha is dropped, not composited; 16-bit RGB(A)/LA keep their high byte;
//! 16-bit gray (PIL mode I;16) is clipped to 255, not scaled; 1/2/4-bit gray scale to 0..255 (x255, x85,
//! x17); a single transparent colour becomes white (transparency.rs).

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use super::{transparency, PreprocessError, PreprocessOptions, RgbImage};

/// The formats the engine accepts (the `image` crate is built with exactly these).
const FORMATS: &str = "PNG, JPEG, WebP or GIF";

fn refuse(name: &str, what: impl Into<String>) -> PreprocessError {
    PreprocessError::Image {
        name: name.to_string(),
        what: what.into(),
    }
}

/// Decodes `bytes` to upright RGB. `whiten_transparent_color` is the processor's `do_convert_rgb`.
pub fn decode_rgb(
    bytes: &[u8],
    name: &str,
    whiten_transparent_color: bool,
    opts: &PreprocessOptions,
) -> Result<RgbImage, PreprocessError> {
    if bytes.is_empty() {
        return Err(refuse(
            name,
            "the file is empty (0 bytes); expected a PNG, JPEG, WebP or GIF image",
        ));
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| refuse(name, format!("cannot read: {e}")))?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) => {}
        Some(other) => {
            return Err(refuse(
                name,
                format!("{other:?} images are not supported; expected a {FORMATS} image"),
            ))
        }
        None => {
            let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
            return Err(refuse(
                name,
                format!(
                    "not a {FORMATS} image (the file starts with bytes {})",
                    head.join(" ")
                ),
            ));
        }
    }
    let mut reader = reader;
    // Our pixel bound is checked below from the header; the decoder's own allocation cap must not be
    // the tighter one (16 bytes a pixel covers RGBA16 plus a frame buffer).
    let mut limits = Limits::default();
    let cap = opts
        .max_decoded_pixels
        .saturating_mul(16)
        .max(limits.max_alloc.unwrap_or(0));
    limits.max_alloc = Some(cap);
    reader.limits(limits);

    let mut decoder = reader
        .into_decoder()
        .map_err(|e| refuse(name, format!("cannot read the image header: {e}")))?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(refuse(
            name,
            format!("the image is {width}x{height} pixels: it has no pixels"),
        ));
    }
    let pixels = width as u64 * height as u64;
    if pixels > opts.max_decoded_pixels {
        return Err(PreprocessError::TooManyPixels {
            name: name.to_string(),
            width,
            height,
            bound: opts.max_decoded_pixels,
        });
    }
    // PIL's exif_transpose; a damaged EXIF block is ignored as PIL does (the image stays as stored).
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut image = DynamicImage::from_decoder(decoder).map_err(|e| {
        refuse(
            name,
            format!("cannot decode the {width}x{height} image: {e}"),
        )
    })?;
    image.apply_orientation(orientation);

    let mut rgb = to_rgb_as_pil(image, name)?;
    if whiten_transparent_color {
        if let Some(color) = transparency::transparent_color(bytes) {
            for px in rgb.data.chunks_exact_mut(3) {
                if px == color {
                    px.copy_from_slice(&[255, 255, 255]);
                }
            }
        }
    }
    Ok(rgb)
}

/// PIL's `convert("RGB")` of the mode PIL would have opened the file in (see the module comment).
fn to_rgb_as_pil(image: DynamicImage, name: &str) -> Result<RgbImage, PreprocessError> {
    let (width, height) = (image.width() as usize, image.height() as usize);
    let gray = |v: u8| [v, v, v];
    let data: Vec<u8> = match image {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageRgba8(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        DynamicImage::ImageLuma8(b) => b.into_raw().into_iter().flat_map(gray).collect(),
        DynamicImage::ImageLumaA8(b) => b
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| gray(p[0]))
            .collect(),
        DynamicImage::ImageLuma16(b) => b
            .into_raw()
            .into_iter()
            .flat_map(|v| gray(v.min(255) as u8))
            .collect(),
        DynamicImage::ImageLumaA16(b) => b
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| gray((p[0] >> 8) as u8))
            .collect(),
        DynamicImage::ImageRgb16(b) => b.into_raw().into_iter().map(|v| (v >> 8) as u8).collect(),
        DynamicImage::ImageRgba16(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [(p[0] >> 8) as u8, (p[1] >> 8) as u8, (p[2] >> 8) as u8])
            .collect(),
        other => {
            return Err(refuse(
                name,
                format!(
                    "decoded as {:?} samples, which this port does not convert to RGB",
                    other.color()
                ),
            ))
        }
    };
    Ok(RgbImage {
        width,
        height,
        data,
    })
}
