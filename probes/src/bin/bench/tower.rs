//! `bench vision`: the vision tower per image size and kind (preprocessing, the tower's GEMMs
//! against the host's peak, its attention) and the time to the first token (tower and the
//! decoder's prefill of the image rows among a short prompt).

use crate::measure::{load_avg, secs};
use crate::random_pack::pack_for;
use crate::report::{load, round2, round_ms};
use crate::steps::{image_prompt, prefill, prefill_prompt, Prompt, PromptImage};
use crate::{refuse, Common};
use compute::attention::AttnPath;
use compute::kernels::Isa;
use compute::{Products, Runtime};
use decoder::{Decoder, DecoderOptions};
use packs::random::RandomShape;
use packs::semantics::{ImagePreprocess, VisionSemantics};
use packs::QuantKind;
use probes::peak::PeakMix;
use serde_json::{json, Map, Value};
use std::time::Instant;
use vision::preprocess::{preprocess_bytes, PixelPatches, PreprocessOptions};
use vision::tower::{Tower, VisionOutput};
/// `WIDTHxHEIGHT`, each side 1..=16384.
fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{s:?} is not an image size WIDTHxHEIGHT (like 1280x720)");
    let (w, h) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
    let w: u32 = w.parse().map_err(|_| bad())?;
    let h: u32 = h.parse().map_err(|_| bad())?;
    if !(1..=16384).contains(&w) || !(1..=16384).contains(&h) {
        return Err(format!("{s:?}: each side must be 1 to 16384 pixels"));
    }
    Ok((w, h))
}

/// A reproducible photo-like picture (gradients plus per-pixel noise), JPEG-encoded at
/// quality 90: what preprocessing decodes.
fn picture_jpeg(w: u32, h: u32) -> Vec<u8> {
    let mut rgb = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let noise = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) >> 27;
            rgb.push((x * 255 / w.max(1)) as u8 ^ noise as u8);
            rgb.push((y * 255 / h.max(1)) as u8);
            rgb.push(((x + y) * 127 / (w + h)) as u8 + noise as u8);
        }
    }
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode(&rgb, w, h, image::ExtendedColorType::Rgb8)
        .unwrap_or_else(|e| refuse(format!("cannot encode the {w}x{h} picture: {e}")));
    out
}

/// transformers' `smart_resize` (Python's round half to even), for the synthetic pixel rows
/// used while `preprocess_bytes` is not built (then this goes: the preprocessing's own
/// `smart_resize` is the one to use).
fn smart_resize(h: u64, w: u64, factor: u64, min: u64, max: u64) -> (u64, u64) {
    let round = |x: f64| x.round_ties_even() as u64 * factor;
    let (hf, wf, f) = (h as f64, w as f64, factor as f64);
    let (mut hb, mut wb) = (round(hf / f), round(wf / f));
    if hb * wb > max {
        let beta = (hf * wf / max as f64).sqrt();
        hb = ((hf / beta / f).floor() as u64 * factor).max(factor);
        wb = ((wf / beta / f).floor() as u64 * factor).max(factor);
    } else if hb * wb < min {
        let beta = (min as f64 / (hf * wf)).sqrt();
        hb = (hf * beta / f).ceil() as u64 * factor;
        wb = (wf * beta / f).ceil() as u64 * factor;
    }
    (hb, wb)
}

/// Pixel rows of the grid preprocessing would give a `w x h` picture, with reproducible values
/// in [-1, 1].
fn synthetic_patches(w: u32, h: u32, cfg: &ImagePreprocess) -> PixelPatches {
    let factor = (cfg.patch_size * cfg.merge_size) as u64;
    let (hb, wb) = smart_resize(h as u64, w as u64, factor, cfg.min_pixels, cfg.max_pixels);
    let grid = [
        1,
        hb as usize / cfg.patch_size,
        wb as usize / cfg.patch_size,
    ];
    let row_len = 3 * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size;
    let values = (0..grid[1] * grid[2] * row_len)
        .map(|i| ((i * 7919) % 255) as f32 / 127.5 - 1.0)
        .collect();
    PixelPatches {
        values,
        row_len,
        grid,
        size_in: (w, h),
        size_resized: (wb as u32, hb as u32),
    }
}

/// One image size: its pixel rows and how long preprocessing took (None: synthetic rows).
struct Image {
    label: String,
    patches: PixelPatches,
    preprocess_s: Option<f64>,
}

fn prepare_image(
    (w, h): (u32, u32),
    cfg: &ImagePreprocess,
    reps: usize,
    note: &mut Option<String>,
) -> Image {
    let label = format!("{w}x{h}");
    let jpeg = picture_jpeg(w, h);
    let opts = PreprocessOptions::default();
    let mut times = Vec::new();
    let mut patches = None;
    for _ in 0..reps.max(2) {
        let t = Instant::now();
        match preprocess_bytes(&jpeg, &label, cfg, &opts) {
            Ok(p) => {
                times.push(secs(t.elapsed()));
                patches = Some(p);
            }
            Err(e) => {
                *note = Some(format!("preprocessing not measured ({e}): synthetic pixel rows of the grid smart_resize gives"));
                break;
            }
        }
    }
    match patches {
        Some(patches) => Image {
            label,
            patches,
            preprocess_s: Some(times.iter().copied().fold(f64::INFINITY, f64::min)),
        },
        None => Image {
            label,
            patches: synthetic_patches(w, h, cfg),
            preprocess_s: None,
        },
    }
}

/// Multiply-adds of every linear of the tower over one image of `n` patches (patch embedding,
/// qkv, proj, fc1, fc2 of every block, the merger and the DeepStack mergers), and of its
/// attention (q·kᵀ and p·v over the image's `n` rows, every head and block).
fn tower_macs(v: &VisionSemantics, n: u64) -> (u64, u64) {
    let (h, inter, out) = (
        v.hidden_size as u64,
        v.intermediate_size as u64,
        v.out_hidden_size as u64,
    );
    let merged = v.merged_hidden() as u64;
    let tokens = n / (v.spatial_merge_size * v.spatial_merge_size) as u64;
    let patch = n * h * v.patch_row_len() as u64;
    let blocks = v.depth as u64 * n * (3 * h * h + h * h + 2 * inter * h);
    let mergers =
        (1 + v.deepstack_visual_indexes.len() as u64) * tokens * (merged * merged + out * merged);
    let attention = v.depth as u64 * 2 * n * n * h;
    (patch + blocks + mergers, attention)
}

/// The prompt the decoder prefills after the tower: `prompt / 2` text rows, vision start, the image
/// rows the tower gave for one image of patch grid `grid`, vision end, the rest of the text.
fn tower_prompt(
    f: &Decoder,
    out: VisionOutput,
    grid: [usize; 3],
    merge: usize,
    prompt: usize,
) -> Prompt {
    let image_tokens = grid.iter().product::<usize>() / (merge * merge);
    let first_row = prompt / 2 + 1;
    let rows = first_row + image_tokens + 1 + (prompt - prompt / 2);
    let image = PromptImage {
        first_row,
        grid,
        merge,
        embeds: Some(&out.image_embeds),
        deepstack: out.deepstack,
        sets: out.sets,
    };
    image_prompt(f, rows, image)
}

/// The peak the tower's GEMMs of `kind` are set against: the instructions the kernels of
/// `isa` run for many rows.
fn matching_peak(kind: QuantKind, isa: Isa) -> PeakMix {
    match (kind, isa) {
        (QuantKind::F32 | QuantKind::Bf16, _) => PeakMix::F32FmaYmm,
        (_, Isa::Avx512Vnni) => PeakMix::I8VnniZmm,
        (QuantKind::I8, _) => PeakMix::I8MaddwdYmm,
        _ => PeakMix::I8Avx2Ymm,
    }
}

/// `bench vision`: `--images` parsed and the shape's tower variant found before any pack is
/// touched.
pub fn run(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    images: &[String],
    prompt: usize,
    reps: usize,
) -> Value {
    let sizes: Vec<(u32, u32)> = images
        .iter()
        .map(|s| parse_size(s).unwrap_or_else(|e| refuse(format!("--images: {e}"))))
        .collect();
    if sizes.is_empty() {
        refuse("--images names no image size");
    }
    let Some(shape) = shape.with_tower() else {
        refuse(format!(
            "shape {} has no vision tower (expected one of {})",
            shape.name,
            RandomShape::NAMES.join(", ")
        ))
    };
    bench(c, &shape, kinds, &sizes, prompt, reps.max(1))
}

fn bench(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    sizes: &[(u32, u32)],
    prompt: usize,
    reps: usize,
) -> Value {
    let load_start = load_avg();
    let isa = Isa::best();
    let vsem = shape
        .semantics
        .vision
        .clone()
        .expect("a shape with a tower");
    let cfg = shape
        .semantics
        .preprocess
        .clone()
        .unwrap_or_else(|| refuse(format!("shape {} has no preprocessing config", shape.name)));
    if !c.json {
        println!(
            "shape {} (tower depth {}, hidden {}, {} heads)  threads {}  kernels {}  load average {}",
            shape.name,
            vsem.depth,
            vsem.hidden_size,
            vsem.num_heads,
            c.threads,
            isa,
            load(load_start)
        );
    }
    // The peaks first, on as many threads as the tower.
    let mut peaks = Map::new();
    for mix in PeakMix::ALL {
        if let Some(r) = mix.measure(c.threads, 7) {
            if !c.json {
                println!("peak {:32} {r:8.1} GMAC/s", mix.name());
            }
            peaks.insert(mix.name().into(), json!(round2(r)));
        }
    }
    let peak_of = |mix: PeakMix| peaks.get(mix.name()).and_then(Value::as_f64);

    // Images: preprocessing (or synthetic rows while it is not built).
    let mut note = None;
    let images: Vec<Image> = sizes
        .iter()
        .map(|&s| prepare_image(s, &cfg, reps, &mut note))
        .collect();
    let mut images_json = Map::new();
    for im in &images {
        let p = &im.patches;
        let tokens = p.tokens(vsem.spatial_merge_size);
        if !c.json {
            println!(
                "image {:>10} -> resized {}x{}, grid {:?}, {} patches, {} tokens, preprocessing {}",
                im.label,
                p.size_resized.0,
                p.size_resized.1,
                p.grid,
                p.grid.iter().product::<usize>(),
                tokens,
                im.preprocess_s
                    .map_or("not measured".into(), |s| format!("{:.2} ms", s * 1e3))
            );
        }
        images_json.insert(
            im.label.clone(),
            json!({
                "resized": [p.size_resized.0, p.size_resized.1],
                "grid": p.grid,
                "patches": p.grid.iter().product::<usize>(),
                "tokens": tokens,
                "preprocess_ms": im.preprocess_s.map(|s| round_ms(s * 1e3)),
            }),
        );
    }
    if let (Some(n), false) = (&note, c.json) {
        println!("note: {n}");
    }

    let max_rows = images
        .iter()
        .map(|im| im.patches.tokens(vsem.spatial_merge_size))
        .max()
        .unwrap_or(0)
        + prompt
        + 2;
    let mut kinds_json = Map::new();
    for &kind in kinds {
        let pack = pack_for(c, shape, kind);
        if pack.semantics().vision.is_none() {
            refuse(format!(
                "{} has no vision tower (made before packs random gave {} one): delete it to remake it",
                pack.path().display(),
                shape.name
            ));
        }
        let options = DecoderOptions {
            capacity: max_rows + 8,
            ..DecoderOptions::default()
        };
        // The decoder and the tower on one runtime: one pool, one backend.
        let runtime = Runtime::host(c.threads).unwrap_or_else(|e| refuse(e));
        let mut f = Decoder::new(&pack, &runtime, options).unwrap_or_else(|e| refuse(e));
        let mut tower = Tower::new(&pack, &runtime).unwrap_or_else(|e| refuse(e));
        // Warm-up: the smallest image through the tower (faults its weights in), a short
        // prefill through the decoder.
        let smallest = images
            .iter()
            .min_by_key(|im| im.patches.values.len())
            .expect("at least one image");
        tower
            .encode(&[&smallest.patches])
            .unwrap_or_else(|e| refuse(e));
        prefill(&mut f, 16);
        // The tower's own kind: a q4 pack's tower may be bf16 (packs::RandomShape::semantics_for).
        let tower_kind = pack.semantics().vision.as_ref().map_or(kind, |v| v.quant);
        let bf16_products = tower_kind == QuantKind::Bf16 && tower.products() == Products::Bf16;
        let peak_mix = matching_peak(tower_kind, isa);
        // bf16 products run `vdpbf16ps`: its own peak mix.
        let peak_mix = if bf16_products {
            PeakMix::Bf16DotZmm
        } else {
            peak_mix
        };
        let (peak_name, peak) = (peak_mix.name(), peak_of(peak_mix));
        let attn_mix =
            crate::attention::tower_attention_peak(AttnPath::best(), tower.attention_operands());
        let attn_peak = attn_mix.and_then(peak_of);
        let mut per_image = Map::new();
        if !c.json {
            println!(
                "\n{kind} tower: {} (GEMMs against {} = {})",
                tower.arithmetic(),
                peak_name,
                peak.map_or("?".into(), |p| format!("{p:.1} GMAC/s"))
            );
        }
        for im in &images {
            let n = im.patches.grid.iter().product::<usize>() as u64;
            let (gemm_macs, attn_macs) = tower_macs(&vsem, n);
            // (tower s, GEMM s, attention s, prefill s, prefill rows)
            let mut best: Option<(f64, f64, f64, f64, usize)> = None;
            for _ in 0..reps {
                runtime.take_stats();
                tower.take_attention_time();
                let t = Instant::now();
                let out = tower.encode(&[&im.patches]).unwrap_or_else(|e| refuse(e));
                let tower_s = secs(t.elapsed());
                let gemm_s = secs(runtime.take_stats().host);
                let attn_s = secs(tower.take_attention_time());
                let inputs =
                    tower_prompt(&f, out, im.patches.grid, vsem.spatial_merge_size, prompt);
                let rows = inputs.hybrid.image_rows.len() + prompt + 2;
                let prefill_s = prefill_prompt(&mut f, &inputs).secs;
                let run = (tower_s, gemm_s, attn_s, prefill_s, rows);
                if best.is_none_or(|b| tower_s + prefill_s < b.0 + b.3) {
                    best = Some(run);
                }
            }
            let (tower_s, gemm_s, attn_s, prefill_s, rows) = best.expect("reps >= 1");
            let gmac_s = gemm_macs as f64 / gemm_s / 1e9;
            let pct = peak.map(|p| round2(100.0 * gmac_s / p));
            let attn_gmac_s = attn_macs as f64 / attn_s / 1e9;
            let attn_pct = attn_peak.map(|p| round2(100.0 * attn_gmac_s / p));
            let ttft = tower_s + prefill_s;
            if !c.json {
                println!(
                    "  {:>10}: tower {:9.1} ms (GEMMs {:9.1} ms, {:7.1} GMAC/s = {}% of peak; attention {:9.1} ms, {:6.1} GMAC/s = {}% of {}; rest {:7.1} ms)  prefill {} rows {:9.1} ms  TTFT {:9.1} ms{}",
                    im.label,
                    tower_s * 1e3,
                    gemm_s * 1e3,
                    gmac_s,
                    pct.map_or("?".into(), |p| format!("{p:.1}")),
                    attn_s * 1e3,
                    attn_gmac_s,
                    attn_pct.map_or("?".into(), |p| format!("{p:.1}")),
                    attn_mix.map_or("-", |m| m.name()),
                    (tower_s - gemm_s - attn_s).max(0.0) * 1e3,
                    rows,
                    prefill_s * 1e3,
                    ttft * 1e3,
                    im.preprocess_s
                        .map_or(String::new(), |p| format!(" (+ preprocessing {:.1} ms)", p * 1e3))
                );
            }
            per_image.insert(
                im.label.clone(),
                json!({
                    "tower_ms": round_ms(tower_s * 1e3),
                    "gemm_ms": round_ms(gemm_s * 1e3),
                    "gemm_gmac": round2(gemm_macs as f64 / 1e9),
                    "gemm_gmac_s": round2(gmac_s),
                    "gemm_peak_pct": pct,
                    "attention_ms": round_ms(attn_s * 1e3),
                    "attention_gmac_s": round2(attn_gmac_s),
                    "attention_peak": attn_mix.map(|m| m.name()),
                    "attention_peak_pct": attn_pct,
                    "other_ms": round_ms((tower_s - gemm_s - attn_s).max(0.0) * 1e3),
                    "prefill_rows": rows,
                    "prefill_ms": round_ms(prefill_s * 1e3),
                    "ttft_ms": round_ms(ttft * 1e3),
                    "ttft_with_preprocess_ms": im.preprocess_s.map(|p| round_ms((ttft + p) * 1e3)),
                }),
            );
        }
        kinds_json.insert(
            kind.to_string(),
            json!({
                "arithmetic": tower.arithmetic(),
                "peak": peak_name,
                "peak_gmac_s": peak,
                "images": per_image
            }),
        );
    }
    let load_end = load_avg();
    if !c.json {
        println!(
            "\nload average {} at the start, {} at the end ({} cores)",
            load(load_start),
            load(load_end),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "kernels": isa.name(),
        "reps": reps,
        "prompt_text_rows": prompt,
        "preprocess": note.map_or(Value::from("measured"), Value::from),
        "peaks_gmac_s": peaks,
        "images": images_json,
        "kinds": kinds_json,
        "load_avg_1m": [load_start, load_end],
    })
}
