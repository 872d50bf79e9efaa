//! `hybrid-inputs/1` files: a prompt's ids, position planes, image rows and DeepStack sets, as
//! `tools/hf_reference.py` and `tools/hybrid_input.py` write them.

use decoder::{Decoder, HybridInputs};
use packs::stfile::{StError, StFile};
use packs::Semantics;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "hybrid-inputs/1";

#[derive(Clone, Debug)]
pub struct PromptInputs {
    pub path: PathBuf,
    pub input_ids: Vec<i64>,
    /// 3 x rows, plane-major.
    pub position_ids: Vec<i64>,
    /// image_rows x hidden.
    pub image_embeds: Vec<f32>,
    /// sets x image_rows x hidden.
    pub deepstack: Vec<f32>,
    pub deepstack_sets: usize,
    pub hidden: usize,
    pub image_token_id: i64,
    pub rope_delta: i64,
}

impl PromptInputs {
    pub fn open(path: impl AsRef<Path>) -> Result<PromptInputs, StError> {
        PromptInputs::open_path(path.as_ref())
    }

    /// [`PromptInputs::open`] without the generic: its body is compiled once, here, not again in
    /// every crate and test binary that opens one.
    fn open_path(path: &Path) -> Result<PromptInputs, StError> {
        let f = StFile::open(path)?;
        match f.metadata("format") {
            Some(FORMAT) => {}
            Some(other) => {
                return Err(f.err(format!("metadata format = {other:?}, expected {FORMAT:?}")))
            }
            None => {
                return Err(f.err(format!(
                    "metadata `format` is missing (expected {FORMAT:?})"
                )))
            }
        }
        let image_token_id = f.meta_i64("image_token_id")?;
        let rope_delta = f.meta_i64("rope_delta")?;
        let (input_ids, _) = f.i64("input_ids", 1)?;
        let rows = input_ids.len();
        if rows == 0 {
            return Err(f.err("`input_ids` is empty"));
        }
        let (position_ids, pshape) = f.i64("position_ids", 2)?;
        if pshape != [3, rows] {
            return Err(f.err(format!(
                "`position_ids` has shape {pshape:?}, expected [3, {rows}] (t, h, w planes x rows)"
            )));
        }
        let (image_embeds, ishape) = f.f32("image_embeds", 2)?;
        let image_rows = input_ids.iter().filter(|&&t| t == image_token_id).count();
        if ishape[0] != image_rows {
            return Err(f.err(format!(
                "`image_embeds` has {} rows but `input_ids` holds {image_rows} image tokens (id {image_token_id})",
                ishape[0]
            )));
        }
        let hidden = ishape[1];
        let (deepstack, dshape) = f.f32("deepstack", 3)?;
        if dshape[1] != image_rows || dshape[2] != hidden {
            return Err(f.err(format!(
                "`deepstack` has shape {dshape:?}, expected [sets, {image_rows}, {hidden}]"
            )));
        }
        for (name, values, shape) in [
            ("image_embeds", &image_embeds, &ishape),
            ("deepstack", &deepstack, &dshape),
        ] {
            if let Some(i) = packs::first_non_finite(values) {
                return Err(f.err(format!(
                    "`{name}` holds {} at {} (shape {shape:?}): image rows and DeepStack sets must be finite",
                    values[i],
                    index_in(shape, i)
                )));
            }
        }
        let rope_max = position_ids.iter().copied().max().unwrap_or(0);
        // Checked: a max position of i64::MAX must be refused, not wrapped into agreement.
        let Some(planes_delta) = rope_max
            .checked_add(1)
            .and_then(|m| m.checked_sub(rows as i64))
        else {
            return Err(f.err(format!(
                "`position_ids` holds {rope_max}: the next position would overflow"
            )));
        };
        if planes_delta != rope_delta {
            return Err(f.err(format!(
                "metadata rope_delta = {rope_delta} disagrees with the planes: max position {rope_max} + 1 - {rows} rows = {planes_delta}"
            )));
        }
        Ok(PromptInputs {
            path: f.path.clone(),
            input_ids,
            position_ids,
            image_embeds,
            deepstack,
            deepstack_sets: dshape[0],
            hidden,
            image_token_id,
            rope_delta,
        })
    }

    pub fn rows(&self) -> usize {
        self.input_ids.len()
    }

    /// Rows whose id is the image token, ascending.
    pub fn image_rows(&self) -> Vec<usize> {
        (0..self.rows())
            .filter(|&r| self.input_ids[r] == self.image_token_id)
            .collect()
    }

    /// Refuses inputs made for another model, naming what differs.
    pub fn check_against(&self, sem: &Semantics) -> Result<(), String> {
        let p = self.path.display();
        if self.hidden != sem.hidden_size && !self.image_embeds.is_empty() {
            return Err(format!(
                "{p}: image rows are {} wide, the pack's hidden size is {}",
                self.hidden, sem.hidden_size
            ));
        }
        if let Some(id) = sem.image_token_id {
            if i64::from(id) != self.image_token_id {
                return Err(format!(
                    "{p}: image_token_id {} differs from the pack's {id}",
                    self.image_token_id
                ));
            }
        }
        for (row, &t) in self.input_ids.iter().enumerate() {
            if t != self.image_token_id && (t < 0 || t as usize >= sem.vocab_size) {
                return Err(format!(
                    "{p}: input_ids[{row}] = {t} is outside the vocabulary (0..{})",
                    sem.vocab_size
                ));
            }
        }
        Ok(())
    }

    /// The hybrid side of the prompt: planes, image rows, DeepStack sets.
    pub fn hybrid(&self) -> HybridInputs {
        HybridInputs {
            planes: Some(self.position_ids.clone()),
            start_pos: 0,
            image_rows: self.image_rows(),
            deepstack: self.deepstack.clone(),
            deepstack_sets: self.deepstack_sets,
        }
    }

    /// The next decoded token's rotary position: max(position) + 1.
    pub fn next_rotary_pos(&self) -> i64 {
        self.position_ids.iter().copied().max().unwrap_or(-1) + 1
    }
}

/// A flat index as `[i, j, ...]` in a row-major tensor of `shape`.
pub fn index_in(shape: &[usize], flat: usize) -> String {
    let mut rest = flat;
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        idx[d] = rest % n.max(1);
        rest /= n.max(1);
    }
    format!("{idx:?}")
}

impl PromptInputs {
    /// The prompt's row embeddings: text rows take the pack's embedding of their id, image rows take
    /// `image_embeds` in order.
    pub fn embeds(&self, forward: &Decoder) -> Vec<f32> {
        let h = forward.semantics().hidden_size;
        let mut out = vec![0.0f32; self.rows() * h];
        let mut image = 0;
        for (row, &id) in out.chunks_exact_mut(h).zip(&self.input_ids) {
            if id == self.image_token_id {
                row.copy_from_slice(&self.image_embeds[image * h..(image + 1) * h]);
                image += 1;
            } else {
                forward.embed_row(id as u32, row);
            }
        }
        out
    }
}
