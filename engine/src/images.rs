//! Pictures into the prompt: decoding and preprocessing (the `vision` crate) and the encoder that
//! turns pixel rows into image rows and DeepStack sets (the vision tower, on the session's runtime).

use std::path::Path;
use std::sync::Arc;

use compute::Runtime;
use packs::semantics::ImagePreprocess;
use packs::Pack;
use vision::preprocess::{PixelPatches, PreprocessOptions};
use vision::tower::{Tower, VisionOutput};

use crate::error::Result;
use crate::message::Image;

/// Pixel rows -> image rows. The tower in a product; a fixed table of transformers' rows in tests.
pub trait ImageEncoder: Send {
    /// The spatial merge (2x2 patches per image token in Qwen3-VL).
    fn merge_size(&self) -> usize;
    fn encode(&mut self, images: &[&PixelPatches]) -> Result<VisionOutput>;
}

/// The pack's vision tower.
pub struct TowerEncoder {
    tower: Tower,
    merge: usize,
}

impl TowerEncoder {
    /// The pack's tower, its linears registered on `runtime`.
    pub fn new(pack: &Arc<Pack>, runtime: &Runtime) -> Result<TowerEncoder> {
        let merge = pack
            .semantics()
            .vision
            .as_ref()
            .map(|v| v.spatial_merge_size)
            .ok_or_else(|| vision::tower::VisionError::NoTower {
                path: pack.path().display().to_string(),
            })?;
        Ok(TowerEncoder {
            tower: Tower::new(pack, runtime)?,
            merge,
        })
    }
}

impl ImageEncoder for TowerEncoder {
    fn merge_size(&self) -> usize {
        self.merge
    }
    fn encode(&mut self, images: &[&PixelPatches]) -> Result<VisionOutput> {
        Ok(self.tower.encode(images)?)
    }
}

/// Decodes and preprocesses the picture at `path` with the pack's preprocessing settings.
pub fn load_image(
    path: &Path,
    preprocess: &ImagePreprocess,
    options: &PreprocessOptions,
) -> Result<Image> {
    let patches = vision::preprocess::load_image(path, preprocess, options)?;
    Ok(Image::new(path.display().to_string(), patches))
}
