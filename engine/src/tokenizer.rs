//! The checkpoint's tokenizer (`tokenizer.json`, run by the `tokenizers` library that transformers'
//! fast tokenizers are) and the special tokens the chat format is made of.

use std::sync::{Arc, OnceLock};

use crate::constraint::TokenSpace;
use crate::error::{EngineError, Result};

pub const IM_END: &str = "<|im_end|>";
pub const IMAGE_PAD: &str = "<|image_pad|>";
pub const VISION_START: &str = "<|vision_start|>";
pub const VISION_END: &str = "<|vision_end|>";
pub const ENDOFTEXT: &str = "<|endoftext|>";

/// Ids of the tokens the engine handles itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialIds {
    pub im_end: u32,
    pub image_pad: u32,
    pub vision_start: u32,
    pub vision_end: u32,
    pub endoftext: Option<u32>,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub special: SpecialIds,
    /// The vocabulary for constrained decoding, built at the first constrained answer.
    token_space: OnceLock<std::result::Result<Arc<TokenSpace>, String>>,
}

impl Tokenizer {
    /// `source` names the pack or directory in errors.
    pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| {
            EngineError::Tokenizer(format!(
                "{source}: tokenizer.json is refused by the tokenizers library: {e}"
            ))
        })?;
        let id = |t: &str| {
            inner.token_to_id(t).ok_or_else(|| {
                EngineError::Tokenizer(format!(
                    "{source}: tokenizer.json has no {t} token: not a Qwen3-VL chat tokenizer"
                ))
            })
        };
        let special = SpecialIds {
            im_end: id(IM_END)?,
            image_pad: id(IMAGE_PAD)?,
            vision_start: id(VISION_START)?,
            vision_end: id(VISION_END)?,
            endoftext: inner.token_to_id(ENDOFTEXT),
        };
        Ok(Tokenizer {
            inner,
            special,
            token_space: OnceLock::new(),
        })
    }

    /// Ids of `text` as transformers' processor tokenizes a rendered prompt (special tokens written
    /// in the text are matched as tokens; the post-processor's additions, none for Qwen, applied).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EngineError::Tokenizer(format!("cannot encode the prompt: {e}")))
    }

    /// The text of `ids`, special tokens skipped (transformers' `decode(skip_special_tokens=True)`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| EngineError::Tokenizer(format!("cannot decode ids {ids:?}: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The vocabulary as the constraint parser sees it (built once, then shared).
    pub fn token_space(&self) -> Result<Arc<TokenSpace>> {
        self.token_space
            .get_or_init(|| {
                let json = serde_json::to_value(&self.inner).map_err(|e| e.to_string())?;
                TokenSpace::new(&json, self.special.im_end)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(EngineError::Tokenizer)
    }
}
