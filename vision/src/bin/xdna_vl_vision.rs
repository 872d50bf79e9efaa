//! `xdna-vl-vision PACK IMAGE... -o rows.safetensors`: images through the pack's preprocessing and
//! vision tower; writes `pixel_values`, `image_grid_thw`, `image_embeds` and `deepstack` (the names
//! and layouts of tools/vision_reference.py) and prints, per image, its sizes, grid, tokens and
//! times. `--pixels FILE` takes transformers' pixel rows instead of images (a reference's inputs).
//! Bad input: a message naming it, exit 2.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use compute::cli::RuntimeArgs;
use compute::Runtime;
use packs::Pack;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use vision::preprocess::{load_image, PixelPatches, PreprocessOptions};
use vision::tower::{Tower, VisionOutput};

const EXIT_BAD_INPUT: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "xdna-vl-vision",
    about = "Images -> Qwen3-VL image rows and DeepStack sets"
)]
struct Args {
    /// The pack (with a vision tower).
    pack: PathBuf,
    /// Image files (PNG, JPEG, WebP, GIF), in prompt order.
    images: Vec<PathBuf>,
    /// Where to write the rows (safetensors).
    #[arg(short, long)]
    out: PathBuf,
    /// Least pixels after resize (default: the pack's preprocessing config).
    #[arg(long)]
    min_pixels: Option<u64>,
    /// Most pixels after resize (default: the pack's preprocessing config).
    #[arg(long)]
    max_pixels: Option<u64>,
    /// Pixel rows instead of images: a safetensors file with `pixel_values` F32 [patches, row]
    /// and `image_grid_thw` I64 [images, 3] (tools/vision_reference.py's inputs).
    #[arg(long, conflicts_with_all = ["images", "min_pixels", "max_pixels"])]
    pixels: Option<PathBuf>,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

fn refuse(msg: impl std::fmt::Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(EXIT_BAD_INPUT)
}

fn main() {
    let args = Args::parse();
    if args.images.is_empty() && args.pixels.is_none() {
        refuse("no images given (IMAGE... or --pixels FILE)");
    }
    let pack = Arc::new(Pack::open(&args.pack).unwrap_or_else(|e| refuse(e)));
    let runtime =
        Runtime::new(&args.runtime.options("xdna-vl-vision")).unwrap_or_else(|e| refuse(e));
    let mut tower = Tower::new(&pack, &runtime).unwrap_or_else(|e| refuse(e));

    // (patches, preprocessing ms) per image.
    let images: Vec<(PixelPatches, f64)> = match &args.pixels {
        Some(path) => read_pixels(path)
            .unwrap_or_else(|e| refuse(e))
            .into_iter()
            .map(|p| (p, 0.0))
            .collect(),
        None => {
            let cfg = pack.semantics().preprocess.clone().unwrap_or_else(|| {
                refuse(format!(
                    "{}: the pack has no image preprocessing config (the checkpoint's preprocessor_config.json, or processor_config.json as transformers 5 saves it); build it again from a checkpoint that has one",
                    args.pack.display()
                ))
            });
            let opts = PreprocessOptions {
                min_pixels: args.min_pixels,
                max_pixels: args.max_pixels,
                ..PreprocessOptions::default()
            };
            args.images
                .iter()
                .map(|path| {
                    let t0 = Instant::now();
                    let p = load_image(path, &cfg, &opts).unwrap_or_else(|e| refuse(e));
                    (p, t0.elapsed().as_secs_f64() * 1e3)
                })
                .collect()
        }
    };

    // One encode per image (each attends only to itself either way), so each has its own time.
    let merge = tower.semantics().spatial_merge_size;
    let mut outs = Vec::with_capacity(images.len());
    for (i, (p, pre_ms)) in images.iter().enumerate() {
        let t0 = Instant::now();
        let out = tower
            .encode(&[p])
            .unwrap_or_else(|e| refuse(format!("{}: {e}", image_name(&args, i))));
        let tower_ms = t0.elapsed().as_secs_f64() * 1e3;
        let [t, h, w] = p.grid;
        let sizes = match args.pixels {
            Some(_) => "pixel rows".to_string(),
            None => format!(
                "{}x{} -> {}x{}",
                p.size_in.0, p.size_in.1, p.size_resized.0, p.size_resized.1
            ),
        };
        println!(
            "{}: {sizes}, grid (t, h, w) = ({t}, {h}, {w}), {} tokens, preprocessing {pre_ms:.1} ms, tower {tower_ms:.1} ms",
            image_name(&args, i),
            p.tokens(merge),
        );
        outs.push(out);
    }
    if let Some(r) = runtime.ab_report() {
        println!(
            "ab: {} GEMMs, {} differing ({} values, max abs diff {})",
            r.gemms, r.differing_gemms, r.differing_values, r.max_abs_diff
        );
    }
    let refs: Vec<&PixelPatches> = images.iter().map(|(p, _)| p).collect();
    write_rows(&args.out, &refs, &outs)
        .unwrap_or_else(|e| refuse(format!("{}: {e}", args.out.display())));
}

fn image_name(args: &Args, i: usize) -> String {
    match args.images.get(i) {
        Some(p) => p.display().to_string(),
        None => format!("image {i}"),
    }
}

/// `pixel_values` [patches, row] split by `image_grid_thw` [images, 3].
fn read_pixels(path: &Path) -> Result<Vec<PixelPatches>, String> {
    let f = packs::stfile::StFile::open(path).map_err(|e| e.to_string())?;
    let (values, shape) = f.f32("pixel_values", 2).map_err(|e| e.to_string())?;
    let (grid, gshape) = f.i64("image_grid_thw", 2).map_err(|e| e.to_string())?;
    if gshape[1] != 3 {
        return Err(format!(
            "{}: image_grid_thw has shape {gshape:?}, expected [images, 3]",
            path.display()
        ));
    }
    let row_len = shape[1];
    let mut out = Vec::new();
    let mut at = 0usize;
    for (i, g) in grid.chunks_exact(3).enumerate() {
        if g.iter().any(|&v| v <= 0 || v > 1 << 20) {
            return Err(format!(
                "{}: image_grid_thw[{i}] = {g:?}: every side must be in 1..=2^20",
                path.display()
            ));
        }
        let grid = [g[0] as usize, g[1] as usize, g[2] as usize];
        let rows = grid[0] * grid[1] * grid[2];
        if at + rows > shape[0] {
            return Err(format!(
                "{}: image_grid_thw needs more than the {} rows of pixel_values (image {i} ends at row {})",
                path.display(),
                shape[0],
                at + rows
            ));
        }
        out.push(PixelPatches {
            values: values[at * row_len..(at + rows) * row_len].to_vec(),
            row_len,
            grid,
            size_in: (0, 0),
            size_resized: (0, 0),
        });
        at += rows;
    }
    if at != shape[0] {
        return Err(format!(
            "{}: pixel_values has {} rows, image_grid_thw covers {at}",
            path.display(),
            shape[0]
        ));
    }
    Ok(out)
}

fn view(dtype: Dtype, shape: Vec<usize>, bytes: &[u8]) -> Result<TensorView<'_>, String> {
    TensorView::new(dtype, shape, bytes).map_err(|e| e.to_string())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The rows of every image, image after image; DeepStack set by set.
fn write_rows(path: &Path, images: &[&PixelPatches], outs: &[VisionOutput]) -> Result<(), String> {
    let row_len = images[0].row_len;
    let pixels: Vec<f32> = images
        .iter()
        .flat_map(|p| p.values.iter().copied())
        .collect();
    let grids: Vec<u8> = images
        .iter()
        .flat_map(|p| p.grid.iter().flat_map(|&g| (g as i64).to_le_bytes()))
        .collect();
    let tokens: usize = outs
        .iter()
        .map(|o| o.tokens_per_image.iter().sum::<usize>())
        .sum();
    let out_h = outs[0].image_embeds.len() / outs[0].tokens_per_image.iter().sum::<usize>().max(1);
    let sets = outs[0].sets;
    let embeds: Vec<f32> = outs
        .iter()
        .flat_map(|o| o.image_embeds.iter().copied())
        .collect();
    let mut deep = Vec::with_capacity(sets * tokens * out_h);
    for j in 0..sets {
        for o in outs {
            let t: usize = o.tokens_per_image.iter().sum();
            deep.extend_from_slice(&o.deepstack[j * t * out_h..(j + 1) * t * out_h]);
        }
    }
    let (pb, eb, db) = (f32_bytes(&pixels), f32_bytes(&embeds), f32_bytes(&deep));
    let views = vec![
        (
            "pixel_values".to_string(),
            view(Dtype::F32, vec![pixels.len() / row_len, row_len], &pb)?,
        ),
        (
            "image_grid_thw".to_string(),
            view(Dtype::I64, vec![images.len(), 3], &grids)?,
        ),
        (
            "image_embeds".to_string(),
            view(Dtype::F32, vec![tokens, out_h], &eb)?,
        ),
        (
            "deepstack".to_string(),
            view(Dtype::F32, vec![sets, tokens, out_h], &db)?,
        ),
    ];
    let meta =
        std::collections::HashMap::from([("format".to_string(), "vision-rows/1".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| e.to_string())
}
