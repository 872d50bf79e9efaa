//! Shared by the tower tests: packs built from the committed checkpoints, the transformers
//! references of tests/fixtures/vision (tools/vision_reference.py), and the comparison rule.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use compute::{GemmBackend, HostGemm, Runtime};
use packs::stfile::StFile;
use packs::{BuildOptions, Pack, QuantKind};
use vision::preprocess::PixelPatches;
use vision::tower::{Tower, TowerAblation, VisionOutput};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// The two reference cases: the chat checkpoint (2 pictures) and the wide random one (3 pictures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Chat,
    Wide,
}

impl Case {
    pub fn checkpoint(self) -> PathBuf {
        match self {
            Case::Chat => fixtures().join("chat/Qwen3-VL-tiny"),
            Case::Wide => fixtures().join("vision/Qwen3-VL-vision-wide"),
        }
    }
    pub fn reference(self) -> PathBuf {
        match self {
            Case::Chat => fixtures().join("vision/chat.safetensors"),
            Case::Wide => fixtures().join("vision/wide.safetensors"),
        }
    }
}

/// A pack of `case`'s checkpoint in `dir`, every linear (decoder and tower) stored as `kind`.
pub fn build_pack(case: Case, kind: QuantKind, dir: &Path) -> Arc<Pack> {
    let out = dir.join(format!("{case:?}-{kind}.pack"));
    packs::build_from_hf(&case.checkpoint(), &out, &BuildOptions::new(kind)).unwrap();
    Arc::new(Pack::open(&out).unwrap())
}

/// transformers' inputs and outputs for one case; `kind` picks the quant-aware outputs.
pub struct Reference {
    pub images: Vec<PixelPatches>,
    pub image_embeds: Vec<f32>,
    pub deepstack: Vec<f32>,
    pub sets: usize,
    pub tokens: usize,
    pub out_hidden: usize,
}

impl Reference {
    pub fn open(case: Case, kind: QuantKind) -> Reference {
        let f = StFile::open(case.reference()).unwrap();
        let (pixels, pshape) = f.f32("pixel_values", 2).unwrap();
        let (grid, _) = f.i64("image_grid_thw", 2).unwrap();
        let suffix = match kind {
            QuantKind::I8 => "_i8",
            QuantKind::Q4 => "_q4",
            _ => "",
        };
        let (image_embeds, eshape) = f.f32(&format!("image_embeds{suffix}"), 2).unwrap();
        let (deepstack, dshape) = f.f32(&format!("deepstack{suffix}"), 3).unwrap();
        let row_len = pshape[1];
        let mut images = Vec::new();
        let mut at = 0;
        for g in grid.chunks_exact(3) {
            let grid = [g[0] as usize, g[1] as usize, g[2] as usize];
            let rows = grid.iter().product::<usize>();
            images.push(PixelPatches {
                values: pixels[at * row_len..(at + rows) * row_len].to_vec(),
                row_len,
                grid,
                size_in: (grid[2] as u32 * 16, grid[1] as u32 * 16),
                size_resized: (grid[2] as u32 * 16, grid[1] as u32 * 16),
            });
            at += rows;
        }
        assert_eq!(at, pshape[0]);
        Reference {
            images,
            image_embeds,
            deepstack,
            sets: dshape[0],
            tokens: eshape[0],
            out_hidden: eshape[1],
        }
    }

    pub fn image_refs(&self) -> Vec<&PixelPatches> {
        self.images.iter().collect()
    }
}

pub fn pool() -> Arc<rayon::ThreadPool> {
    compute::new_pool(2).unwrap()
}

/// A runtime on a 2-thread pool with the backend `make` builds on it.
pub fn runtime(make: impl FnOnce(Arc<rayon::ThreadPool>) -> Box<dyn GemmBackend>) -> Runtime {
    let pool = pool();
    Runtime::with_backend(pool.clone(), make(pool))
}

/// The tower of `pack` on the host backend, with `ablation`, over all `images` in one call.
pub fn encode(pack: &Arc<Pack>, images: &[&PixelPatches], ablation: TowerAblation) -> VisionOutput {
    let runtime = runtime(|pool| Box::new(HostGemm::new(pool)));
    encode_on(pack, &runtime, images, ablation)
}

pub fn encode_on(
    pack: &Arc<Pack>,
    runtime: &Runtime,
    images: &[&PixelPatches],
    ablation: TowerAblation,
) -> VisionOutput {
    let mut tower = Tower::new(pack, runtime).unwrap();
    tower.set_ablation(ablation);
    tower.encode(images).unwrap()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

/// Worst difference of the image rows and of each DeepStack set, each relative to the largest
/// reference value of its tensor (at least 1).
pub fn worst_relative(out: &VisionOutput, r: &Reference) -> (f32, Vec<f32>) {
    assert_eq!(out.image_embeds.len(), r.image_embeds.len());
    assert_eq!(out.sets, r.sets);
    let rel = |a: &[f32], b: &[f32]| max_abs_diff(a, b) / max_abs(b).max(1.0);
    let rows = rel(&out.image_embeds, &r.image_embeds);
    let per = r.tokens * r.out_hidden;
    let sets = (0..r.sets)
        .map(|j| {
            rel(
                &out.deepstack[j * per..(j + 1) * per],
                &r.deepstack[j * per..(j + 1) * per],
            )
        })
        .collect();
    (rows, sets)
}

/// The worst of `worst_relative`.
pub fn worst(out: &VisionOutput, r: &Reference) -> f32 {
    let (rows, sets) = worst_relative(out, r);
    sets.into_iter().fold(rows, f32::max)
}
