//! A baseline and progressive JPEG decoder that gives the bytes Pillow gives: libjpeg-turbo's
//! decompression with its defaults (what `PIL.Image.open(...).convert("RGB")` runs): islow IDCT,
//! fancy upsampling, its YCbCr -> RGB tables, its colour-space guess from JFIF / Adobe markers and
//! component ids, its handling of scan data that ends early; CMYK as Pillow unpacks it. The `image`
//! crate's JPEG decoder (zune-jpeg) differs from it by a few levels on most pixels of a 4:2:0 file
//! and by tens of levels on the last column of an odd-width one.
//!
//! What this does not follow (arithmetic coding, 12-bit and lossless frames, 2-component files, a
//! progressive file whose first coefficients stay unrefined, where libjpeg smooths blocks) is
//! `Unsupported`, and so is data it cannot walk (`Corrupt`): the caller then decodes with the
//! `image` crate as before. Files are decoded whole (every coefficient kept), scalar code throughout.

mod bits;
mod color;
mod idct;
mod scan;
mod upsample;

use bits::HuffTable;
use scan::{Frame, ScanHeader};

/// Each scan walks the whole frame: a file of thousands of them is an attack, not a picture (a
/// progressive encoder writes about ten).
const MAX_SCANS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JpegError {
    Unsupported(&'static str),
    Corrupt(&'static str),
}

/// Decoded samples as Pillow holds them after decoding: `channels` interleaved per pixel, rows top
/// to bottom; 1 (mode L), 3 (RGB) or 4 (CMYK, as Pillow's "CMYK;I" unpacks it).
pub struct JpegPixels {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
    pub data: Vec<u8>,
}

/// Decodes a whole JPEG file.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<JpegPixels, JpegError> {
    if bytes.get(..2) != Some(&[0xFF, 0xD8]) {
        return Err(JpegError::Corrupt("no SOI marker"));
    }
    let mut at = 2usize;
    let mut qt: [Option<[u16; 64]>; 4] = [None; 4];
    let mut dc_tables: [Option<HuffTable>; 4] = Default::default();
    let mut ac_tables: [Option<HuffTable>; 4] = Default::default();
    let mut restart_interval = 0usize;
    let mut frame: Option<Frame> = None;
    let (mut jfif, mut adobe) = (false, None::<u8>);
    let mut scans = 0usize;
    let mut work = 0usize;
    loop {
        let (marker, seg, next) = next_segment(bytes, at)?;
        at = next;
        match marker {
            0xD9 => break,
            0xD0..=0xD7 | 0x01 => continue,
            _ => {}
        }
        match marker {
            0xC0..=0xC2 => {
                if frame.is_some() {
                    return Err(JpegError::Corrupt("two frame headers"));
                }
                frame = Some(Frame::parse(seg, marker == 0xC2, max_pixels)?);
            }
            0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => {
                return Err(JpegError::Unsupported(
                    "lossless, hierarchical or arithmetic-coded JPEG",
                ))
            }
            0xC4 => parse_dht(seg, &mut dc_tables, &mut ac_tables)?,
            0xDB => parse_dqt(seg, &mut qt)?,
            0xDD => {
                if seg.len() < 2 {
                    return Err(JpegError::Corrupt("a short DRI segment"));
                }
                restart_interval = u16::from_be_bytes([seg[0], seg[1]]) as usize;
            }
            // libjpeg guesses the colour space once, at the first scan: later markers do not count.
            0xE0 if scans == 0 => jfif |= seg.len() >= 14 && seg.starts_with(b"JFIF\0"),
            0xEE if scans == 0 && seg.len() >= 12 && seg.starts_with(b"Adobe") => {
                adobe = Some(seg[11])
            }
            0xDA => {
                scans += 1;
                if scans > MAX_SCANS {
                    return Err(JpegError::Unsupported(
                        "more scans than a JPEG encoder writes",
                    ));
                }
                let frame = frame
                    .as_mut()
                    .ok_or(JpegError::Corrupt("a scan before the frame header"))?;
                let header = ScanHeader::parse(seg, frame)?;
                work += header.work(frame);
                if work > frame.work_budget() {
                    return Err(JpegError::Unsupported(
                        "scans that walk the frame more often than an encoder writes them",
                    ));
                }
                for sc in &header.components {
                    let comp = &mut frame.components[sc.index];
                    // libjpeg latches a component's quantization table at its first scan.
                    if comp.quant.is_none() {
                        comp.quant =
                            Some(qt[comp.tq].ok_or(JpegError::Corrupt(
                                "a scan before its quantization table",
                            ))?);
                    }
                }
                at = scan::decode_scan(
                    bytes,
                    at,
                    frame,
                    &header,
                    &dc_tables,
                    &ac_tables,
                    restart_interval,
                )?;
            }
            _ => {} // APPn, COM and the rest: skipped
        }
    }
    let frame = frame.ok_or(JpegError::Corrupt("no frame header"))?;
    // jdapimin.c's `default_decompress_parms`: is the file's colour transform YCC (YCbCr for three
    // components, YCCK for four)?
    let ycc = match frame.components.len() {
        1 => false,
        3 => {
            let ids: Vec<u8> = frame.components.iter().map(|c| c.id).collect();
            if jfif {
                true
            } else if let Some(transform) = adobe {
                transform != 0
            } else {
                ids != [b'R', b'G', b'B']
            }
        }
        4 => adobe.is_some_and(|transform| transform != 0),
        _ => {
            return Err(JpegError::Unsupported(
                "a component count other than 1, 3 or 4",
            ))
        }
    };
    frame.check_complete()?;
    assemble(&frame, ycc)
}

/// The marker at `at` (after any fill bytes): its code, its segment's contents (empty for the
/// standalone RSTn, TEM and EOI markers) and where the next one may start.
fn next_segment(bytes: &[u8], mut at: usize) -> Result<(u8, &[u8], usize), JpegError> {
    while bytes.get(at) == Some(&0xFF) && bytes.get(at + 1) == Some(&0xFF) {
        at += 1;
    }
    let (Some(&0xFF), Some(&marker)) = (bytes.get(at), bytes.get(at + 1)) else {
        return Err(JpegError::Corrupt("expected a marker"));
    };
    at += 2;
    if matches!(marker, 0xD0..=0xD7 | 0x01 | 0xD9) {
        return Ok((marker, &[], at));
    }
    let len = match (bytes.get(at), bytes.get(at + 1)) {
        (Some(&hi), Some(&lo)) => u16::from_be_bytes([hi, lo]) as usize,
        _ => return Err(JpegError::Corrupt("a segment without its length")),
    };
    if len < 2 || at + len > bytes.len() {
        return Err(JpegError::Corrupt("a segment longer than the file"));
    }
    Ok((marker, &bytes[at + 2..at + len], at + len))
}

/// Whether the entropy-coded data is followed by an EOI marker (FF D9): the segments are walked
/// up to the first scan (an EXIF thumbnail's own EOI sits inside a segment and is skipped); inside
/// scans FF is always stuffed (FF 00) or a marker, so the first FF D9 after it is the real end. A
/// header that cannot be walked counts as ended (the decoder then says what is wrong).
pub fn has_end_marker(bytes: &[u8]) -> bool {
    let mut at = 2;
    loop {
        let Ok((marker, _, next)) = next_segment(bytes, at) else {
            return true;
        };
        match marker {
            0xDA => return bytes[next..].windows(2).any(|w| w == [0xFF, 0xD9]),
            0xD9 => return true,
            _ => at = next,
        }
    }
}

/// IDCT, upsampling and colour conversion of the whole frame.
fn assemble(frame: &Frame, ycc: bool) -> Result<JpegPixels, JpegError> {
    let (w, h) = (frame.width, frame.height);
    let mut planes = Vec::with_capacity(frame.components.len());
    for comp in &frame.components {
        let stride = comp.blocks_w * 8;
        let mut samples = vec![0u8; stride * comp.blocks_h * 8];
        let quant = comp
            .quant
            .ok_or(JpegError::Corrupt("a component that is in no scan"))?;
        for by in 0..comp.blocks_h {
            for bx in 0..comp.blocks_w {
                let coef = comp.block(bx, by);
                let at = by * 8 * stride + bx * 8;
                idct::idct_islow(coef, &quant, &mut samples[at..], stride);
            }
        }
        let plane = upsample::Plane {
            samples: &samples,
            stride,
            width: (w * comp.h).div_ceil(frame.max_h),
            height: (h * comp.v).div_ceil(frame.max_v),
        };
        planes.push(upsample::upsample(
            &plane,
            (comp.h, comp.v),
            (frame.max_h, frame.max_v),
            (w, h),
        )?);
    }
    let t = color::YccTables::new();
    let data = match planes.len() {
        1 => planes.pop().unwrap_or_default(),
        3 => {
            let mut rgb = vec![0u8; w * h * 3];
            let samples = planes[0].iter().zip(&planes[1]).zip(&planes[2]);
            if ycc {
                for (px, ((&y, &cb), &cr)) in rgb.chunks_exact_mut(3).zip(samples) {
                    px.copy_from_slice(&t.rgb(y, cb, cr));
                }
            } else {
                for (px, ((&r, &g), &b)) in rgb.chunks_exact_mut(3).zip(samples) {
                    px.copy_from_slice(&[r, g, b]);
                }
            }
            rgb
        }
        _ => {
            // libjpeg's CMYK output (YCCK through `ycck_cmyk_convert`: 255 minus the YCC -> RGB
            // colour, K as stored), then Pillow's "CMYK;I" unpacking, every sample inverted (Pillow
            // assumes Adobe's convention for any CMYK JPEG): YCCK comes out as that RGB colour.
            let mut cmyk = vec![0u8; w * h * 4];
            let samples = planes[0]
                .iter()
                .zip(&planes[1])
                .zip(&planes[2])
                .zip(&planes[3]);
            for (px, (((&a, &b), &c), &k)) in cmyk.chunks_exact_mut(4).zip(samples) {
                let [c0, c1, c2] = if ycc {
                    t.rgb(a, b, c)
                } else {
                    [255 - a, 255 - b, 255 - c]
                };
                px.copy_from_slice(&[c0, c1, c2, 255 - k]);
            }
            cmyk
        }
    };
    Ok(JpegPixels {
        width: w,
        height: h,
        channels: frame.components.len(),
        data,
    })
}

fn parse_dqt(mut seg: &[u8], qt: &mut [Option<[u16; 64]>; 4]) -> Result<(), JpegError> {
    while !seg.is_empty() {
        let (pq, tq) = ((seg[0] >> 4) as usize, (seg[0] & 15) as usize);
        let size = if pq == 0 { 64 } else { 128 };
        if tq > 3 || pq > 1 || seg.len() < 1 + size {
            return Err(JpegError::Corrupt("a bad DQT segment"));
        }
        let mut table = [0u16; 64];
        for k in 0..64 {
            let v = if pq == 0 {
                seg[1 + k] as u16
            } else {
                u16::from_be_bytes([seg[1 + 2 * k], seg[2 + 2 * k]])
            };
            table[scan::NATURAL_ORDER[k]] = v;
        }
        qt[tq] = Some(table);
        seg = &seg[1 + size..];
    }
    Ok(())
}

fn parse_dht(
    mut seg: &[u8],
    dc: &mut [Option<HuffTable>; 4],
    ac: &mut [Option<HuffTable>; 4],
) -> Result<(), JpegError> {
    while !seg.is_empty() {
        if seg.len() < 17 {
            return Err(JpegError::Corrupt("a short DHT segment"));
        }
        let (class, id) = (seg[0] >> 4, (seg[0] & 15) as usize);
        let mut counts = [0u8; 16];
        counts.copy_from_slice(&seg[1..17]);
        let n: usize = counts.iter().map(|&c| c as usize).sum();
        if class > 1 || id > 3 || seg.len() < 17 + n {
            return Err(JpegError::Corrupt("a bad DHT segment"));
        }
        let table = HuffTable::new(&counts, seg[17..17 + n].to_vec())?;
        if class == 0 {
            dc[id] = Some(table);
        } else {
            ac[id] = Some(table);
        }
        seg = &seg[17 + n..];
    }
    Ok(())
}
