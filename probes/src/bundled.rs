//! The bundled default: the tiny transformers-made Qwen3-VL committed under tests/fixtures, turned
//! into a pack on first use, with its prompt and reference.

use packs::quant::QuantKind;
use std::path::{Path, PathBuf};

/// The case the probes run when given no pack.
pub const DEFAULT_CASE: &str = "hd128";

/// tests/fixtures of this checkout.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("tests/fixtures")
}

pub struct Bundled {
    pub pack: PathBuf,
    pub inputs: PathBuf,
    pub reference: PathBuf,
}

/// Builds (once) the pack of `case` in `kind` under target/bundled and returns its files.
pub fn bundled(case: &str, kind: QuantKind) -> Result<Bundled, String> {
    let dir = fixtures_dir().join(case);
    let checkpoint = dir.join("checkpoint");
    if !checkpoint.join("config.json").exists() {
        return Err(format!(
            "the bundled model is missing: {} has no config.json (is this a full checkout?)",
            checkpoint.display()
        ));
    }
    let out_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("target/bundled");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let pack = out_dir.join(format!("{case}-{kind}.pack"));
    let fresh = std::fs::metadata(&pack)
        .and_then(|p| {
            Ok(p.modified()? >= std::fs::metadata(checkpoint.join("config.json"))?.modified()?)
        })
        .unwrap_or(false)
        // A pack from another version of the format is built again.
        && packs::Pack::open(&pack).is_ok();
    if !fresh {
        eprintln!("building the bundled pack {} ...", pack.display());
        let opts = packs::build::BuildOptions {
            mrope_section: None,
            ..packs::build::BuildOptions::new(kind)
        };
        packs::build::build_from_hf(&checkpoint, &pack, &opts).map_err(|e| e.to_string())?;
    }
    Ok(Bundled {
        pack,
        inputs: dir.join("inputs.safetensors"),
        reference: dir.join(testkit::reference::file_name(kind)),
    })
}
