//! Encoded file -> upright 8-bit RGB, as transformers' `load_image` (PIL `open`, `exif_transpose`,
//! `convert("RGB")`) followed by the processor's `convert_to_rgb` sees it.
//!
//! JPEG pixels come from jpeg/ (libjpeg-turbo's decoding, as Pillow runs it), and from the `image`
//! crate for what that declines and for every other format; what PIL does with the decoded samples is
//! ours, measured on Pillow 13:
//! gray is repeated to R = G = B; alpha is dropped, not composited; 16-bit RGB(A)/LA keep their high byte;
//! 16-bit gray (PIL mode I;16) is clipped to 255, not scaled; 1/2/4-bit gray scale to 0..255 (x255, x85,
//! x17); a single transparent colour becomes white (transparency.rs); a GIF's screen outside its first
//! frame takes the transparent (else first) palette colour (gif_first_frame.rs).

use std::io::Cursor;

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use super::gif_first_frame::GifFirstFrame;
use super::{jpeg, transparency, PreprocessError, PreprocessOptions, RgbImage};

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
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| refuse(name, format!("cannot read: {e}")))?;
    let format = reader.format();
    match format {
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
    if format == Some(ImageFormat::Jpeg) && !jpeg::has_end_marker(bytes) {
        // Decoders fill a cut-off scan (zune-jpeg with gray, libjpeg and ours with zeros); PIL refuses
        // ("image file is truncated").
        return Err(refuse(
            name,
            format!("cannot decode the {width}x{height} image: the JPEG data ends before its end marker (truncated)"),
        ));
    }
    let orientation = exif_orientation(&mut decoder);
    // JPEG pixels from our port of libjpeg-turbo's decoding (PIL's bytes); what it does not follow
    // is decoded by the `image` crate as before.
    let native = match format {
        Some(ImageFormat::Jpeg) => jpeg::decode(bytes, opts.max_decoded_pixels)
            .ok()
            .filter(|p| (p.width, p.height) == (width as usize, height as usize))
            .and_then(jpeg_image),
        _ => None,
    };
    let mut image = match native {
        Some(image) => image,
        None => DynamicImage::from_decoder(decoder).map_err(|e| {
            refuse(
                name,
                format!("cannot decode the {width}x{height} image: {e}"),
            )
        })?,
    };
    image.apply_orientation(orientation);

    let mut rgb = to_rgb_as_pil(image, name)?;
    if format == Some(ImageFormat::Gif) {
        fill_outside_first_frame(&mut rgb, bytes);
    }
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

/// Our JPEG decoder's samples as the `image` crate's types (gray stays gray until PIL's convert;
/// CMYK is converted here, as Pillow converts it).
fn jpeg_image(p: jpeg::JpegPixels) -> Option<DynamicImage> {
    let (w, h) = (p.width as u32, p.height as u32);
    match p.channels {
        1 => image::GrayImage::from_raw(w, h, p.data).map(DynamicImage::ImageLuma8),
        3 => image::RgbImage::from_raw(w, h, p.data).map(DynamicImage::ImageRgb8),
        4 => image::RgbImage::from_raw(w, h, cmyk_to_rgb_as_pil(&p.data))
            .map(DynamicImage::ImageRgb8),
        _ => None,
    }
}

/// Pillow's `convert("RGB")` of a CMYK image (Convert.c `cmyk2rgb`): each channel is
/// `255 - k - c * (255 - k) / 255` with Pillow's rounded division by 255.
fn cmyk_to_rgb_as_pil(cmyk: &[u8]) -> Vec<u8> {
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    cmyk.chunks_exact(4)
        .flat_map(|p| {
            let nk = 255 - p[3] as u32;
            [0, 1, 2].map(|i| nk.saturating_sub(muldiv255(p[i] as u32, nk)) as u8)
        })
        .collect()
}

/// Pillow's screen outside a GIF's first frame: the transparent index's colour, else index 0's.
fn fill_outside_first_frame(rgb: &mut RgbImage, bytes: &[u8]) {
    let Some(frame) = GifFirstFrame::parse(bytes) else {
        return;
    };
    if frame.left == 0 && frame.top == 0 && frame.width >= rgb.width && frame.height >= rgb.height {
        return;
    }
    let fill = frame.fill_color();
    for (i, px) in rgb.data.chunks_exact_mut(3).enumerate() {
        if !frame.covers(i % rgb.width, i / rgb.width) {
            px.copy_from_slice(&fill);
        }
    }
}

/// PIL's `exif_transpose` orientation: the EXIF tag, else (Pillow's `getexif`) the first
/// `tiff:Orientation="N"` or `tiff:Orientation>N` in the XMP packet. PIL also reads an EXIF block that keeps
/// JPEG's "Exif\0\0" header inside a PNG eXIf or WebP EXIF chunk (as PIL itself writes them); the `image`
/// crate expects bare TIFF there, so the header is stripped first. A damaged block leaves the image as
/// stored.
fn exif_orientation(decoder: &mut impl ImageDecoder) -> Orientation {
    let from_exif = match decoder.exif_metadata() {
        Ok(Some(exif)) => {
            let tiff = exif.strip_prefix(b"Exif\0\0".as_slice()).unwrap_or(&exif);
            Orientation::from_exif_chunk(tiff)
        }
        _ => None,
    };
    from_exif
        .or_else(|| xmp_orientation(&decoder.xmp_metadata().ok().flatten()?))
        .unwrap_or(Orientation::NoTransforms)
}

/// Pillow's `re.search(rb'tiff:Orientation(="|>)([0-9])', xmp)`; a digit outside 1..=8 means no turn.
fn xmp_orientation(xmp: &[u8]) -> Option<Orientation> {
    const KEY: &[u8] = b"tiff:Orientation";
    (0..xmp.len().saturating_sub(KEY.len())).find_map(|i| {
        let rest = xmp[i..].strip_prefix(KEY)?;
        let digit = match rest {
            [b'=', b'"', d, ..] | [b'>', d, ..] if d.is_ascii_digit() => d - b'0',
            _ => return None,
        };
        Some(Orientation::from_exif(digit).unwrap_or(Orientation::NoTransforms))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xmp_orientation_reads_as_pillow() {
        let attr = br#"<rdf:Description tiff:Orientation="6"/>"#;
        assert_eq!(xmp_orientation(attr), Some(Orientation::Rotate90));
        let element = b"<tiff:Orientation>8</tiff:Orientation>";
        assert_eq!(xmp_orientation(element), Some(Orientation::Rotate270));
        // The first occurrence that matches the pattern wins; 9 is no turn; none at all is None.
        let later = br#"tiff:OrientationX tiff:Orientation="3""#;
        assert_eq!(xmp_orientation(later), Some(Orientation::Rotate180));
        assert_eq!(
            xmp_orientation(br#"tiff:Orientation="9""#),
            Some(Orientation::NoTransforms)
        );
        assert_eq!(xmp_orientation(b"<x:xmpmeta/>"), None);
        assert_eq!(xmp_orientation(b"tiff:Orientation="), None);
    }

    #[test]
    fn jpeg_end_marker_is_found_after_the_scan_only() {
        // SOI, an APP1 segment holding a thumbnail's FF D9, SOS header, data: no real end.
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD9, 0x00, 0x00];
        jpeg.extend([0xFF, 0xDA, 0x00, 0x02, 0x12, 0x34, 0xFF, 0x00, 0x56]);
        assert!(!jpeg::has_end_marker(&jpeg));
        jpeg.extend([0xFF, 0xD9]);
        assert!(jpeg::has_end_marker(&jpeg));
    }
}
