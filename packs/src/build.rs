//! `packs build`: a hub checkpoint streamed tensor by tensor into a pack.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use crate::encode;
pub use crate::error::BuildError;
use crate::layout::{self, WeightPlan};
use crate::quant::QuantKind;
use crate::writer::PackWriter;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    pub quant: QuantKind,
    /// States the MRoPE section when the config lacks it (refused if it contradicts the config).
    pub mrope_section: Option<[usize; 3]>,
    /// Show a progress bar of tensors converted.
    pub progress: bool,
    /// Carry the vision tower when the checkpoint has one (`--no-vision` leaves it out).
    pub vision: bool,
    /// How the tower's linears are stored (`--vision-quant`); `None`: as the decoder's.
    pub vision_quant: Option<QuantKind>,
    /// The tower's bf16 linears multiply by bf16 products (`--vision-products bf16`;
    /// `VisionSemantics::bf16_products`).
    pub vision_bf16_products: bool,
}

impl BuildOptions {
    pub fn new(quant: QuantKind) -> BuildOptions {
        BuildOptions {
            quant,
            mrope_section: None,
            progress: false,
            vision: true,
            vision_quant: None,
            vision_bf16_products: false,
        }
    }
}

/// The tower `packs build` makes when `--vision-quant` / `--vision-products` are not given
/// (`vision_quant`, `bf16_products`): the stored kind and whether it multiplies by bf16 products.
/// Beside an i8 or q4 decoder, a bf16 tower with bf16 products: 3.0e-3..4.5e-3 from transformers'
/// f32 tower on the committed cases where an i8 tower is 1.9e-2..2.3e-2 and a q4 one
/// 1.6e-1..1.8e-1 (`vision/tests/integration/tower_precision.rs`, README "The tower's
/// precision"). Beside an f32 or bf16 decoder, the decoder's kind with f32 products: such a pack
/// is held to transformers as a whole. (`BuildOptions::new` leaves `vision_quant` at `None`,
/// "as the decoder", for library callers.)
pub fn tower_defaults(
    quant: QuantKind,
    vision_quant: Option<QuantKind>,
    bf16_products: Option<bool>,
) -> (QuantKind, bool) {
    let quantized = matches!(quant, QuantKind::I8 | QuantKind::Q4);
    let kind = vision_quant.unwrap_or(if quantized { QuantKind::Bf16 } else { quant });
    let products = bf16_products.unwrap_or(quantized && kind == QuantKind::Bf16);
    (kind, products)
}

/// An asset file larger than this is refused (Qwen's tokenizer.json is ~11 MB).
pub const MAX_ASSET_BYTES: u64 = 64 << 20;

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildReport {
    pub out: PathBuf,
    /// Container tensors written (scales count separately).
    pub tensors: usize,
    pub file_len: u64,
    /// What the build left out and why (printed by `packs build`).
    pub warnings: Vec<String>,
}

/// Builds a pack at `out` from the checkpoint directory `dir`. Atomic: on error nothing is left.
pub fn build_from_hf(
    dir: &Path,
    out: &Path,
    opts: &BuildOptions,
) -> Result<BuildReport, BuildError> {
    let checkpoint = crate::hf::Checkpoint::open(dir, opts.mrope_section, opts.vision)?;
    let mut sem = checkpoint.semantics(opts.quant, opts.vision_quant);
    if let Some(v) = &mut sem.vision {
        v.bf16_products = opts.vision_bf16_products;
    }
    // The quant options meet the config here (a q4 tower's K): name the config.
    sem.validate()
        .map_err(|source| crate::hf::HfError::Semantics {
            path: dir.join(crate::hf::CONFIG),
            source,
        })?;
    let assets = read_assets(dir)?;
    let mut report = write_pack(
        out,
        &sem,
        &assets,
        Progress {
            show: opts.progress,
            // Which shard a weight comes from: a hub build's progress reads shard by shard.
            source: &|name: &str| {
                checkpoint
                    .source_path(name)
                    .and_then(|p| p.file_name())
                    .map(|f| f.to_string_lossy().into_owned())
            },
        },
        |weight, first_row, values| {
            checkpoint
                .read_weight(weight, first_row, values)
                .map_err(BuildError::from)
        },
    )
    .map_err(|e| match e {
        // Name the shard that holds the bad value.
        BuildError::NonFinite { tensor, row, value } => match checkpoint.source_path(&tensor) {
            Some(path) => BuildError::NonFiniteWeight {
                path: path.to_path_buf(),
                tensor,
                row,
                value,
            },
            None => BuildError::NonFinite { tensor, row, value },
        },
        e => e,
    })?;
    report.warnings = checkpoint.warnings().to_vec();
    Ok(report)
}

/// The asset files of a checkpoint directory (those it has), by pack asset name. The chat
/// template is the checkpoint's own, found where transformers looks: `chat_template.jinja`, else
/// `chat_template.json`'s `chat_template`, else `tokenizer_config.json`'s (a string, or the
/// template named "default" in a list).
pub fn read_assets(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, BuildError> {
    let read = |file: &str| -> Result<Option<Vec<u8>>, BuildError> {
        let path = dir.join(file);
        let io = |e: std::io::Error| BuildError::Asset {
            path: path.clone(),
            what: e.to_string(),
        };
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
            Ok(m) if m.len() > MAX_ASSET_BYTES => {
                return Err(BuildError::Asset {
                    path,
                    what: format!(
                        "{} bytes, more than the {MAX_ASSET_BYTES} an asset may hold",
                        m.len()
                    ),
                })
            }
            Ok(_) => {}
        }
        std::fs::read(&path).map(Some).map_err(io)
    };
    let template_in = |file: &str| -> Result<Option<Vec<u8>>, BuildError> {
        let Some(bytes) = read(file)? else {
            return Ok(None);
        };
        let path = dir.join(file);
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| BuildError::Asset {
                path: path.clone(),
                what: format!("not valid JSON: {e}"),
            })?;
        Ok(match json.get("chat_template") {
            Some(serde_json::Value::String(t)) => Some(t.clone().into_bytes()),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(|t| t.as_bytes().to_vec()),
            _ => None,
        })
    };
    let mut assets = Vec::new();
    for file in layout::ASSETS {
        let bytes = if file == "chat_template.jinja" {
            match read(file)? {
                Some(t) => Some(t),
                None => match template_in("chat_template.json")? {
                    Some(t) => Some(t),
                    None => template_in("tokenizer_config.json")?,
                },
            }
        } else {
            read(file)?
        };
        if let Some(bytes) = bytes {
            assets.push((file.to_string(), bytes));
        }
    }
    Ok(assets)
}

/// What a build's progress bar shows.
pub(crate) struct Progress<'a> {
    pub show: bool,
    /// The file a weight (by pack name) is read from, shown beside it.
    pub source: &'a dyn Fn(&str) -> Option<String>,
}

impl Progress<'_> {
    /// The bar's message for weight `name`: its source file first, when known.
    fn message(&self, name: &str) -> String {
        match (self.source)(name) {
            Some(file) => format!("{file}: {name}"),
            None => name.to_string(),
        }
    }
}

/// Writes every weight of `sem`'s plan, asking `fill` for the f32 rows of each, then `assets`.
pub(crate) fn write_pack<F>(
    out: &Path,
    sem: &crate::Semantics,
    assets: &[(String, Vec<u8>)],
    progress: Progress<'_>,
    mut fill: F,
) -> Result<BuildReport, BuildError>
where
    F: FnMut(&WeightPlan, usize, &mut [f32]) -> Result<(), BuildError>,
{
    let weights = layout::weights(sem);
    let mut specs = layout::tensor_specs(sem);
    specs.extend(
        assets
            .iter()
            .map(|(file, bytes)| layout::asset_spec(file, bytes.len())),
    );
    let tensors = specs.len();
    let mut writer = PackWriter::create(out, sem, specs)?;
    let bar = progress_bar(progress.show, weights.len() as u64);
    for weight in &weights {
        if progress.show {
            bar.set_message(progress.message(&weight.name));
        }
        encode::write_weight(&mut writer, weight, |first_row, values| {
            fill(weight, first_row, values)
        })?;
        bar.inc(1);
    }
    for (file, bytes) in assets {
        writer.write_tensor(&crate::names::asset(file), bytes)?;
    }
    let file_len = writer.finish()?;
    bar.finish_and_clear();
    Ok(BuildReport {
        out: out.to_path_buf(),
        tensors,
        file_len,
        warnings: Vec::new(),
    })
}

fn progress_bar(show: bool, len: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} tensors  {wide_msg}",
    )
    .expect("static template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

#[cfg(test)]
mod progress_tests {
    use super::Progress;

    #[test]
    fn the_default_tower_is_bf16_products_beside_a_quantized_decoder_only() {
        use super::tower_defaults;
        use crate::quant::QuantKind::*;
        assert_eq!(tower_defaults(Q4, None, None), (Bf16, true));
        assert_eq!(tower_defaults(I8, None, None), (Bf16, true));
        // Full-precision packs keep their kind and transformers' arithmetic.
        assert_eq!(tower_defaults(Bf16, None, None), (Bf16, false));
        assert_eq!(tower_defaults(F32, None, None), (F32, false));
        // Given options win.
        assert_eq!(tower_defaults(Q4, Some(Q4), None), (Q4, false));
        assert_eq!(tower_defaults(Q4, None, Some(false)), (Bf16, false));
        assert_eq!(tower_defaults(Bf16, None, Some(true)), (Bf16, true));
    }

    #[test]
    fn the_message_names_the_shard_a_weight_comes_from() {
        let shard_of = |name: &str| {
            name.starts_with("layers.1.")
                .then(|| "model-00002-of-00002.safetensors".to_string())
        };
        let p = Progress {
            show: true,
            source: &shard_of,
        };
        assert_eq!(
            p.message("layers.1.mlp.down"),
            "model-00002-of-00002.safetensors: layers.1.mlp.down"
        );
        // Control: a weight with no known source is shown alone, not under another shard.
        assert_eq!(p.message("layers.0.mlp.down"), "layers.0.mlp.down");
    }
}
