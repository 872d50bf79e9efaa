//! The one colour PIL makes transparent, read from the file's own chunks, so the RGB conversion can
//! whiten it as transformers does.
//!
//! Why: transformers' `load_image` calls `convert("RGB")`, which keeps a *single* transparent colour in
//! `info["transparency"]` (a gray or RGB PNG's tRNS, a palette PNG's tRNS with exactly one 0 entry and the
//! rest 255, a GIF's transparent index); the processor's `convert_to_rgb` then sees transparency,
//! converts to RGBA (every pixel equal to that colour gets alpha 0, every other pixel 255) and composites
//! on white. So every pixel of that colour, transparent in the file or not, becomes (255, 255, 255).
//! An alpha channel (RGBA, LA) or a palette tRNS with several levels is dropped, not composited:
//! `convert("RGB")` discards it first. The rules below were measured on Pillow 13 (see
//! tools/preprocess_reference.py's cases); PIL compares each component's low byte (`& 0xff`).

use super::gif_first_frame::GifFirstFrame;

/// The colour whose pixels become white, if the file declares one in the way PIL keeps.
pub fn transparent_color(bytes: &[u8]) -> Option<[u8; 3]> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        png_transparent_color(bytes)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        gif_transparent_color(bytes)
    } else {
        None
    }
}

/// Chunks of a PNG before its first IDAT: (type, data). Stops quietly at a truncated chunk (the decoder
/// reports the damage by name).
fn png_chunks(bytes: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut chunks = Vec::new();
    let mut at = 8usize;
    while at + 8 <= bytes.len() {
        let len =
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let kind = &bytes[at + 4..at + 8];
        let Some(data) = bytes.get(at + 8..(at + 8).saturating_add(len)) else {
            break;
        };
        if kind == b"IDAT" {
            break;
        }
        chunks.push((kind, data));
        at = at + 12 + len;
    }
    chunks
}

fn png_transparent_color(bytes: &[u8]) -> Option<[u8; 3]> {
    let chunks = png_chunks(bytes);
    let find = |kind: &[u8]| chunks.iter().find(|(k, _)| *k == kind).map(|(_, d)| *d);
    let ihdr = find(b"IHDR").filter(|d| d.len() >= 13)?;
    let (bit_depth, color_type) = (ihdr[8], ihdr[9]);
    let trns = find(b"tRNS")?;
    let be16 = |i: usize| trns.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    match color_type {
        // Gray: PIL keeps the raw sample (not scaled to 8 bits) and compares it with the 8-bit pixels.
        0 => {
            let t = be16(0)?;
            match bit_depth {
                // Mode "1": PIL scales the bit to 0/255.
                1 => {
                    let v = if t != 0 { 255 } else { 0 };
                    Some([v, v, v])
                }
                // Mode "I;16": the int survives convert("RGB") and reads as the colour (t, 0, 0).
                16 => Some([t as u8, 0, 0]),
                _ => {
                    let v = t as u8;
                    Some([v, v, v])
                }
            }
        }
        // RGB: compared with the 8-bit pixels (a 16-bit PNG's high bytes).
        2 => Some([be16(0)? as u8, be16(2)? as u8, be16(4)? as u8]),
        // Palette: only "all 255 but one 0" is a single transparent colour; other tRNS are alpha levels.
        3 => {
            let zero = trns.iter().position(|&a| a == 0)?;
            let simple = trns.iter().enumerate().all(|(i, &a)| a == 255 || i == zero);
            if !simple {
                return None;
            }
            let plte = find(b"PLTE")?;
            // An index past the palette reads as black in PIL.
            Some(
                plte.get(zero * 3..zero * 3 + 3)
                    .map_or([0, 0, 0], |c| [c[0], c[1], c[2]]),
            )
        }
        _ => None,
    }
}

/// The first frame's transparent index looked up in its colour table.
fn gif_transparent_color(bytes: &[u8]) -> Option<[u8; 3]> {
    let frame = GifFirstFrame::parse(bytes)?;
    frame.transparent_index.map(|i| frame.color(i))
}
