//! What the xdna-vl test modules share: the repository root, the tiny chat checkpoint and its f32
//! pack, built once for the whole test binary.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// tests/fixtures/chat: the checkpoint, its pictures and transformers' answer.
pub fn chat_dir() -> PathBuf {
    root().join("tests/fixtures/chat")
}

pub fn checkpoint() -> PathBuf {
    chat_dir().join("Qwen3-VL-tiny")
}

/// The tiny chat checkpoint as an f32 pack.
pub fn pack() -> &'static Path {
    static PACK: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, p) = PACK.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("chat-f32.pack");
        let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
        packs::build::build_from_hf(&checkpoint(), &out, &opts).unwrap();
        (dir, out)
    });
    p
}
