//! `packs build`: a hub checkpoint streamed tensor by tensor into a pack.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use crate::encode;
use crate::layout::{self, WeightPlan};
use crate::quant::QuantKind;
use crate::semantics::SemanticsError;
use crate::writer::{PackWriter, WriteError};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Checkpoint(#[from] crate::hf::HfError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("invalid semantics: {0}")]
    Semantics(#[from] SemanticsError),
    #[error("tensor {tensor}: row {row} holds a non-finite value ({value})")]
    NonFinite {
        tensor: String,
        row: usize,
        value: f32,
    },
    #[error("unknown random shape {0:?} (expected one of: {names})", names = crate::random::RandomShape::NAMES.join(", "))]
    UnknownShape(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    pub quant: QuantKind,
    /// States the MRoPE section when the config lacks it (refused if it contradicts the config).
    pub mrope_section: Option<[usize; 3]>,
    /// Show a progress bar of tensors converted.
    pub progress: bool,
}

impl BuildOptions {
    pub fn new(quant: QuantKind) -> BuildOptions {
        BuildOptions {
            quant,
            mrope_section: None,
            progress: false,
        }
    }
}

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildReport {
    pub out: PathBuf,
    /// Container tensors written (scales count separately).
    pub tensors: usize,
    pub file_len: u64,
}

/// Builds a pack at `out` from the checkpoint directory `dir`. Atomic: on error nothing is left.
pub fn build_from_hf(
    dir: &Path,
    out: &Path,
    opts: &BuildOptions,
) -> Result<BuildReport, BuildError> {
    let checkpoint = crate::hf::Checkpoint::open(dir, opts.mrope_section)?;
    let sem = checkpoint.semantics(opts.quant);
    sem.validate()?;
    write_pack(out, &sem, opts.progress, |weight, first_row, values| {
        checkpoint
            .read_rows(&weight.source, first_row, values)
            .map_err(BuildError::from)
    })
}

/// Writes every weight of `sem`'s plan, asking `fill` for the f32 rows of each.
pub(crate) fn write_pack<F>(
    out: &Path,
    sem: &crate::Semantics,
    progress: bool,
    mut fill: F,
) -> Result<BuildReport, BuildError>
where
    F: FnMut(&WeightPlan, usize, &mut [f32]) -> Result<(), BuildError>,
{
    let weights = layout::weights(sem);
    let specs = layout::tensor_specs(sem);
    let tensors = specs.len();
    let mut writer = PackWriter::create(out, sem, specs)?;
    let bar = progress_bar(progress, weights.len() as u64);
    for weight in &weights {
        bar.set_message(weight.name.clone());
        encode::write_weight(&mut writer, weight, sem.quant, |first_row, values| {
            fill(weight, first_row, values)
        })?;
        bar.inc(1);
    }
    let file_len = writer.finish()?;
    bar.finish_and_clear();
    Ok(BuildReport {
        out: out.to_path_buf(),
        tensors,
        file_len,
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
