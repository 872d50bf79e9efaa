//! `vision::preprocess::preprocess_bytes`: encoded images (the fixture PNGs) mutated byte by byte
//! and in their IHDR dimensions (CRC kept valid, so the decoder reaches the size checks), with the
//! chat checkpoint's preprocessing config and edge pixel limits.

use std::path::Path;

use packs::semantics::ImagePreprocess;
use vision::preprocess::{preprocess_bytes, PreprocessOptions};

use crate::category;
use crate::input::{Base, FilePatch, Input, Patch};
use crate::rng::Rng;
use crate::runner::Target;

pub const FILE: &str = "image.bin";

pub struct ImageTarget {
    bases: Vec<Base>,
    cfg: ImagePreprocess,
}

impl ImageTarget {
    pub fn new() -> Result<ImageTarget, String> {
        let fx = super::fixtures().join("chat");
        let pre = super::fixtures().join("preprocess");
        let mut bases = ["picture-1.png", "picture-2.png"]
            .into_iter()
            .map(|f| super::file_base(f, FILE, &fx.join(f)))
            .collect::<Result<Vec<_>, _>>()?;
        // Every decoder and colour path the preprocessing fixtures exercise, small ones.
        for f in [
            "gif_2frames_160x120.gif",
            "gif_sub_frame_transparent_96x64.gif",
            "jpeg_exif6_200x150.jpg",
            "jpeg_cmyk_96x64.jpg",
            "jpeg_gray_200x150.jpg",
            "palette_alpha_levels_200x150.png",
            "gray16_80x60.png",
            "gray4bit_64x40.png",
            "png_exif8_96x64.png",
            "png_xmp6_96x64.png",
            "rgb_trns_96x64.png",
            "tiny_20x14.png",
        ] {
            bases.push(super::file_base(f, FILE, &pre.join(f))?);
        }
        // Our JPEG decoder's progressive, restart-marker and 4:2:0 paths.
        let jpeg = super::fixtures().join("jpeg");
        for f in [
            "pil_restart_progressive_420_q80_45x45.jpg",
            "pil_restart_blocks_420_q90_64x40.jpg",
            "simplejpeg_440_q70_31x9.jpg",
        ] {
            bases.push(super::file_base(f, FILE, &jpeg.join(f))?);
        }
        let path = fx.join("Qwen3-VL-tiny/preprocessor_config.json");
        let text = std::fs::read(&path).map_err(|e| e.to_string())?;
        let json = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
        let cfg = packs::hf::parse_preprocessor_config(&path, &json).map_err(|e| e.to_string())?;
        Ok(ImageTarget { bases, cfg })
    }
}

/// CRC-32 (IEEE) as PNG chunks use it.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A PNG whose IHDR says another width and height (and valid CRC).
fn png_with_size(png: &[u8], w: u32, h: u32) -> Vec<u8> {
    let mut out = png.to_vec();
    // Signature (8), length (4), "IHDR" (4), then width and height; CRC over type + data (17).
    if out.len() >= 33 && &out[12..16] == b"IHDR" {
        out[16..20].copy_from_slice(&w.to_be_bytes());
        out[20..24].copy_from_slice(&h.to_be_bytes());
        let crc = crc32(&out[12..29]);
        out[29..33].copy_from_slice(&crc.to_be_bytes());
    }
    out
}

impl Target for ImageTarget {
    fn name(&self) -> &'static str {
        "image"
    }

    fn bases(&self) -> &[Base] {
        &self.bases
    }

    fn generate(&self, rng: &mut Rng) -> Input {
        let base = rng.below(self.bases.len());
        let png = self.bases[base].file(FILE).expect("an image base");
        let edge = |rng: &mut Rng| match rng.below(3) {
            0 => rng.interesting() as u32,
            1 => rng.range(0, 4) as u32,
            _ => rng.range(1, 100_000) as u32,
        };
        let bytes = match rng.below(4) {
            0 if png.starts_with(b"\x89PNG") => {
                let (w, h) = (edge(rng), edge(rng));
                png_with_size(png, w, h)
            }
            1 => crate::bytes::mutate(rng, png, 0..png.len()),
            _ => crate::bytes::mutate(rng, png, 0..64.min(png.len())),
        };
        Input {
            base,
            patches: vec![FilePatch {
                file: FILE.into(),
                patch: Patch::Replace(bytes),
            }],
            knobs: rng.next_u64(),
        }
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn run(&self, dir: &Path, _out: &Path, input: &Input) -> Result<(), String> {
        let file;
        let bytes = match input.patches.first().map(|p| &p.patch) {
            Some(Patch::Replace(b)) => b,
            _ => {
                file = std::fs::read(dir.join(FILE)).map_err(|e| e.to_string())?;
                &file
            }
        };
        let k = input.knobs;
        let opts = PreprocessOptions {
            min_pixels: k.is_multiple_of(8).then_some((k >> 8) % 5000),
            max_pixels: (k % 8 == 1).then_some((k >> 8) % 200_000),
            ..PreprocessOptions::default()
        };
        let p = preprocess_bytes(bytes, "image", &self.cfg, &opts).map_err(|e| {
            let what = e.to_string();
            let what = what.strip_prefix("image: ").unwrap_or(&what);
            format!("{}: {}", category::of(&e), category::of_message(what))
        })?;
        assert_eq!(p.values.len(), p.grid.iter().product::<usize>() * p.row_len);
        Ok(())
    }
}
