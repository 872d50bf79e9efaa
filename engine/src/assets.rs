//! The chat files a checkpoint ships beside its weights: `tokenizer.json`, the chat template,
//! `tokenizer_config.json` (the special tokens the template sees) and `generation_config.json`.
//! A pack carries them (`packs build` stores them); a checkpoint directory has them as files.

use std::path::Path;

use crate::error::{EngineError, Result};

pub const TOKENIZER: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub const CHAT_TEMPLATE: &str = "chat_template.jinja";
pub const CHAT_TEMPLATE_JSON: &str = "chat_template.json";
pub const GENERATION_CONFIG: &str = "generation_config.json";

/// The raw chat files, as the checkpoint has them.
#[derive(Clone, Debug)]
pub struct ChatAssets {
    /// Where they came from (a pack or a directory), for messages.
    pub source_name: String,
    pub tokenizer_json: Vec<u8>,
    pub chat_template: String,
    pub tokenizer_config: Option<serde_json::Value>,
    pub generation_config: Option<serde_json::Value>,
}

impl ChatAssets {
    /// From a hub checkpoint directory. The template is taken as transformers takes it:
    /// `chat_template.jinja`, else `chat_template.json`'s `chat_template`, else
    /// `tokenizer_config.json`'s `chat_template`.
    pub fn from_dir(dir: &Path) -> Result<ChatAssets> {
        let source_name = dir.display().to_string();
        let read = |name: &str| -> Result<Option<Vec<u8>>> {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(EngineError::Read {
                    path,
                    reason: e.to_string(),
                }),
            }
        };
        Self::from_files(source_name, |name| read(name))
    }

    /// From a lookup of files by name (a directory, or a pack's assets).
    pub fn from_files(
        source_name: String,
        mut get: impl FnMut(&str) -> Result<Option<Vec<u8>>>,
    ) -> Result<ChatAssets> {
        let tokenizer_json = get(TOKENIZER)?.ok_or_else(|| EngineError::MissingAsset {
            source_name: source_name.clone(),
            asset: TOKENIZER,
        })?;
        let tokenizer_config = get(TOKENIZER_CONFIG)?
            .map(|b| parse_json(&source_name, TOKENIZER_CONFIG, &b))
            .transpose()?;
        let generation_config = get(GENERATION_CONFIG)?
            .map(|b| parse_json(&source_name, GENERATION_CONFIG, &b))
            .transpose()?;
        let chat_template = match get(CHAT_TEMPLATE)? {
            Some(b) => utf8(&source_name, CHAT_TEMPLATE, b)?,
            None => {
                let from_json = get(CHAT_TEMPLATE_JSON)?
                    .map(|b| parse_json(&source_name, CHAT_TEMPLATE_JSON, &b))
                    .transpose()?;
                template_field(&from_json)
                    .or_else(|| template_field(&tokenizer_config))
                    .ok_or_else(|| EngineError::MissingAsset {
                        source_name: source_name.clone(),
                        asset: "chat template (chat_template.jinja, chat_template.json or tokenizer_config.json's chat_template)",
                    })?
            }
        };
        Ok(ChatAssets {
            source_name,
            tokenizer_json,
            chat_template,
            tokenizer_config,
            generation_config,
        })
    }
}

fn template_field(v: &Option<serde_json::Value>) -> Option<String> {
    v.as_ref()?
        .get("chat_template")?
        .as_str()
        .map(str::to_string)
}

fn utf8(source: &str, name: &str, b: Vec<u8>) -> Result<String> {
    String::from_utf8(b).map_err(|e| EngineError::Asset {
        name: format!("{source}: {name}"),
        what: format!("not UTF-8 ({e})"),
    })
}

fn parse_json(source: &str, name: &str, b: &[u8]) -> Result<serde_json::Value> {
    serde_json::from_slice(b).map_err(|e| EngineError::Asset {
        name: format!("{source}: {name}"),
        what: format!("not valid JSON ({e})"),
    })
}

/// The chat files a pack carries (stored by `packs build` as the checkpoint has them, the
/// template resolved as transformers resolves it).
pub fn from_pack(pack: &packs::Pack) -> Result<ChatAssets> {
    ChatAssets::from_files(pack.path().display().to_string(), |name| {
        Ok(pack.asset(name).map(<[u8]>::to_vec))
    })
}
