//! A checkpoint's chat format, parsed once: tokenizer, template, generation config.

use crate::assets::ChatAssets;
use crate::error::Result;
use crate::generation_config::GenerationConfig;
use crate::sampling::SamplingParams;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

pub struct ChatFormat {
    pub source_name: String,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub generation: GenerationConfig,
}

impl ChatFormat {
    pub fn new(assets: &ChatAssets) -> Result<ChatFormat> {
        let tokenizer = Tokenizer::from_bytes(&assets.tokenizer_json, &assets.source_name)?;
        let template = ChatTemplate::new(&assets.chat_template, assets.tokenizer_config.as_ref())?;
        let generation = match &assets.generation_config {
            Some(v) => GenerationConfig::from_json(v, &assets.source_name)?,
            None => GenerationConfig::default(),
        };
        Ok(ChatFormat {
            source_name: assets.source_name.clone(),
            tokenizer,
            template,
            generation,
        })
    }

    /// The ids that end an answer: the generation config's, and `<|im_end|>` (the end of an
    /// assistant turn in the chat format, which transformers' Qwen3-VL configs also list).
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut ids = self.generation.eos_token_ids.clone();
        if !ids.contains(&self.tokenizer.special.im_end) {
            ids.push(self.tokenizer.special.im_end);
        }
        ids
    }

    /// The checkpoint's recommended sampling with its eos ids.
    pub fn default_sampling(&self) -> SamplingParams {
        let mut p = SamplingParams::from_generation_config(&self.generation);
        p.eos_ids = self.eos_ids();
        if let Some(n) = self.generation.max_new_tokens {
            p.max_tokens = n;
        }
        p
    }
}
