//! `reference*.safetensors`: transformers' logits and greedy ids for a prompt, and a text-only control.

use packs::stfile::{StError, StFile};
use packs::QuantKind;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct Reference {
    pub path: PathBuf,
    pub vocab: usize,
    /// rows x vocab: every prompt row.
    pub prefill_logits: Vec<f32>,
    /// The argmax after the prompt, then N-1 greedy steps.
    pub greedy_ids: Vec<i64>,
    /// (N-1) x vocab: logits after feeding greedy_ids[0..N-1].
    pub decode_logits: Vec<f32>,
    pub text_ids: Vec<i64>,
    /// text rows x vocab.
    pub text_logits: Vec<f32>,
}

impl Reference {
    pub fn open(path: impl AsRef<Path>) -> Result<Reference, StError> {
        Reference::open_path(path.as_ref())
    }

    /// [`Reference::open`] without the generic: its body is compiled once, here, not again in
    /// every crate and test binary that opens one.
    fn open_path(path: &Path) -> Result<Reference, StError> {
        let f = StFile::open(path)?;
        let (prefill_logits, pshape) = f.f32("prefill_logits", 2)?;
        let vocab = pshape[1];
        let (greedy_ids, _) = f.i64("greedy_ids", 1)?;
        if greedy_ids.is_empty() {
            return Err(f.err("`greedy_ids` is empty"));
        }
        let (decode_logits, dshape) = f.f32("decode_logits", 2)?;
        if dshape != [greedy_ids.len() - 1, vocab] {
            return Err(f.err(format!(
                "`decode_logits` has shape {dshape:?}, expected [{}, {vocab}] (greedy steps - 1, vocab)",
                greedy_ids.len() - 1
            )));
        }
        let (text_ids, _) = f.i64("text_ids", 1)?;
        let (text_logits, tshape) = f.f32("text_logits", 2)?;
        if tshape != [text_ids.len(), vocab] {
            return Err(f.err(format!(
                "`text_logits` has shape {tshape:?}, expected [{}, {vocab}]",
                text_ids.len()
            )));
        }
        Ok(Reference {
            path: f.path.clone(),
            vocab,
            prefill_logits,
            greedy_ids,
            decode_logits,
            text_ids,
            text_logits,
        })
    }

    pub fn prompt_rows(&self) -> usize {
        self.prefill_logits.len() / self.vocab
    }
}

/// Reference file name for a pack kind: `reference.safetensors` for the exact kinds.
pub fn file_name(kind: QuantKind) -> &'static str {
    match kind {
        QuantKind::F32 | QuantKind::Bf16 => "reference.safetensors",
        QuantKind::I8 => "reference-i8.safetensors",
        QuantKind::Q4 => "reference-q4.safetensors",
    }
}
