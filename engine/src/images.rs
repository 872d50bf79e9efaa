//! Pictures into the prompt: decoding and preprocessing (the `vision` crate) and the encoder that
//! turns pixel rows into image rows and DeepStack sets (the vision tower, on the session's runtime).

use std::path::Path;
use std::sync::Arc;

use compute::Runtime;
use packs::semantics::ImagePreprocess;
use packs::Pack;
use vision::preprocess::{PixelPatches, PreprocessOptions};
use vision::tower::{Tower, VisionOutput};

use crate::error::{EngineError, Result};
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

/// What turns a picture into pixel rows for one pack: its preprocessing settings, if it has a
/// tower. Shared by the session and the scheduler's handles (which decode on their own threads).
#[derive(Clone, Debug)]
pub struct ImageSettings {
    preprocess: Option<ImagePreprocess>,
    pack: String,
}

impl ImageSettings {
    pub fn of(pack: &Pack) -> ImageSettings {
        ImageSettings {
            preprocess: pack.semantics().preprocess.clone(),
            pack: pack.path().display().to_string(),
        }
    }

    /// The preprocessing settings, or a refusal naming the picture `name` and the fix.
    pub fn settings(&self, name: &str) -> Result<&ImagePreprocess> {
        self.preprocess.as_ref().ok_or_else(|| EngineError::Image {
            name: name.to_string(),
            what: format!(
                "the pack {} has no image preprocessing settings: rebuild it with `packs build` from a checkpoint with a vision tower and its image processor (preprocessor_config.json, or the processor_config.json transformers 5 saves)",
                self.pack
            ),
        })
    }

    /// Decodes and preprocesses an encoded picture (PNG, JPEG, WebP, GIF) given as bytes; `name`
    /// names it in messages.
    pub fn from_bytes(&self, name: &str, bytes: &[u8]) -> Result<Image> {
        let pre = self.settings(name)?;
        let patches =
            vision::preprocess::preprocess_bytes(bytes, name, pre, &PreprocessOptions::default())?;
        Ok(Image::new(name, patches))
    }
}
