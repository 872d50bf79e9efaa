//! The bundled default: the tiny chat checkpoint of tests/fixtures/chat (a random-weight
//! Qwen3-VL with a real byte-level tokenizer and Qwen's chat template) built into an f32 pack on
//! first use, with its two pictures and question.

use std::path::{Path, PathBuf};

pub const QUESTION: &str = "Describe these pictures.";

/// tests/fixtures/chat of this checkout.
pub fn chat_dir() -> PathBuf {
    workspace().join("tests/fixtures/chat")
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xdna-vl sits in the workspace")
}

pub fn checkpoint() -> PathBuf {
    chat_dir().join("Qwen3-VL-tiny")
}

pub fn pictures() -> Vec<PathBuf> {
    vec![
        chat_dir().join("picture-1.png"),
        chat_dir().join("picture-2.png"),
    ]
}

/// $XDG_CACHE_HOME/xdna-vl, else ~/.cache/xdna-vl, else target/xdna-vl of this checkout.
fn cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("xdna-vl");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(h).join(".cache/xdna-vl");
    }
    workspace().join("target/xdna-vl")
}

/// The bundled pack, built (atomically: into a temporary name, then renamed) when absent, older
/// than the checkpoint, or in another pack format.
pub fn pack() -> Result<PathBuf, String> {
    let ck = checkpoint();
    let config = ck.join("config.json");
    if !config.exists() {
        return Err(format!(
            "the bundled model is missing: {} has no config.json (is this a full checkout?); give a PACK",
            ck.display()
        ));
    }
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let pack = dir.join("qwen3-vl-tiny-f32.pack");
    let fresh = std::fs::metadata(&pack)
        .and_then(|p| Ok(p.modified()? >= std::fs::metadata(&config)?.modified()?))
        .unwrap_or(false)
        && packs::Pack::open(&pack).is_ok();
    if !fresh {
        eprintln!("building the bundled model into {} ...", pack.display());
        let tmp = dir.join(format!("qwen3-vl-tiny-f32.pack.{}.tmp", std::process::id()));
        let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
        packs::build::build_from_hf(&ck, &tmp, &opts).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &pack)
            .map_err(|e| format!("cannot move {} to {}: {e}", tmp.display(), pack.display()))?;
    }
    Ok(pack)
}
