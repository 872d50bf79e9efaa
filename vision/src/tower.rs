//! Pixel rows -> image rows and DeepStack sets, as transformers' Qwen3-VL vision model.
//!
//! CONTRACT (the engine calls exactly this; the bodies are being built, issue 14).

use std::sync::Arc;

use gemm::GemmBackend;
use packs::Pack;

use crate::preprocess::PixelPatches;

#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error("{path}: this pack has no vision tower (build it again with `packs build` from a checkpoint that has model.visual.*)")]
    NoTower { path: String },
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Pack(#[from] packs::PackError),
    #[error(transparent)]
    Backend(#[from] gemm::BackendError),
}

/// What the tower gives the decoder for a prompt's images, in prompt order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VisionOutput {
    /// `[tokens, out_hidden]`: every image's rows, image after image.
    pub image_embeds: Vec<f32>,
    /// `[sets, tokens, out_hidden]`: DeepStack set l for every image row.
    pub deepstack: Vec<f32>,
    pub sets: usize,
    /// Image tokens of each image.
    pub tokens_per_image: Vec<usize>,
    /// `(t, h, w)` in patches per image.
    pub grids: Vec<[usize; 3]>,
}

/// The vision tower of a pack, weights resolved once.
pub struct Tower {
    _pack: Arc<Pack>,
}

impl Tower {
    /// Resolves the tower's weights in `pack`; refuses a pack without a tower by name.
    pub fn new(pack: &Arc<Pack>) -> Result<Tower, VisionError> {
        Err(VisionError::NoTower {
            path: pack.path().display().to_string(),
        })
    }

    /// Makes the tower's linears resident on `backend` under ids `first_id..` (after the
    /// decoder's: `Forward::weight_ids()`).
    pub fn prepare(
        &mut self,
        _backend: &mut dyn GemmBackend,
        _first_id: usize,
    ) -> Result<(), VisionError> {
        Ok(())
    }

    /// Runs the tower over `images` (each attends only to itself) on `backend`, forking on `pool`.
    pub fn encode(
        &mut self,
        _backend: &mut dyn GemmBackend,
        _pool: &rayon::ThreadPool,
        _images: &[&PixelPatches],
    ) -> Result<VisionOutput, VisionError> {
        Err(VisionError::Input(
            "the vision tower is not built yet".into(),
        ))
    }
}
