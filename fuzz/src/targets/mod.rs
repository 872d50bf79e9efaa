//! The fuzz targets: one per parser that reads untrusted input.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::input::Base;
use crate::runner::Target;

pub mod chat_body;
pub mod checkpoint;
pub mod image;
pub mod inputs;
pub mod pack;
pub mod template;

/// Every target's name, in the order `--target all` runs them.
pub const NAMES: [&str; 6] = [
    "pack",
    "checkpoint",
    "inputs",
    "chat-body",
    "image",
    "template",
];

/// The repository's test fixtures (tests/fixtures).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// The target named `name`; building its bases may write packs under `work`.
pub fn by_name(name: &str, work: &Path) -> Result<Arc<dyn Target>, String> {
    Ok(match name {
        "pack" => Arc::new(pack::PackTarget::new(work)?),
        "checkpoint" => Arc::new(checkpoint::CheckpointTarget::new()?),
        "inputs" => Arc::new(inputs::InputsTarget::new()?),
        "chat-body" => Arc::new(chat_body::ChatBodyTarget::new()),
        "image" => Arc::new(image::ImageTarget::new()?),
        "template" => Arc::new(template::TemplateTarget::new()?),
        other => {
            return Err(format!(
                "unknown target {other:?} (expected one of: {}, all)",
                NAMES.join(", ")
            ))
        }
    })
}

/// Every file of a directory (not recursive) as a base.
pub fn dir_base(name: &str, dir: &Path) -> Result<Base, String> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries.flatten() {
        if e.path().is_file() {
            let bytes =
                std::fs::read(e.path()).map_err(|err| format!("{}: {err}", e.path().display()))?;
            files.push((e.file_name().to_string_lossy().into_owned(), bytes));
        }
    }
    files.sort();
    Ok(Base {
        name: name.into(),
        files,
    })
}

/// One file as a base.
pub fn file_base(name: &str, file_name: &str, path: &Path) -> Result<Base, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Base {
        name: name.into(),
        files: vec![(file_name.into(), bytes)],
    })
}
