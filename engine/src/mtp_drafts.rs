//! Drafts from Qwen3.5's MTP head (`--drafts mtp`): the head reads each row's final hidden state
//! and the embedding fed after it, so it runs one row behind the model. After every forward the
//! session hands over the rows' hidden states, embeddings and positions; when a token is sampled
//! the head catches up over the rows whose next embedding is now known (the last one reads the
//! sampled token's), which gives the first draft, then chains: each further draft reads the
//! previous draft's embedding and the head's own output row. The chained rows are dropped from
//! the head's cache again: only rows computed from the model's own hidden states stay.

use compute::ops::sampling::argmax;
use decoder::{Decoder, HybridInputs, KvCache, KvDtype, Logits};

use crate::error::Result;

/// The rows `cache.len()..` of the model's cache the head has not yet read, row after row:
/// their final hidden states, the embeddings fed at them (each the previous row's "next") and
/// their positions. Flat buffers, reused step to step.
#[derive(Default)]
struct Pending {
    hidden: Vec<f32>,
    embeds: Vec<f32>,
    positions: Vec<[i64; 3]>,
}

impl Pending {
    fn rows(&self) -> usize {
        self.positions.len()
    }

    fn truncate(&mut self, rows: usize) {
        let h = self.hidden.len() / self.rows().max(1);
        self.hidden.truncate(rows * h);
        self.embeds.truncate(rows * h);
        self.positions.truncate(rows);
    }
}

pub struct MtpDrafter {
    hidden_size: usize,
    cache: KvCache,
    pending: Pending,
    /// The inputs of one head step, reused.
    next_embeds: Vec<f32>,
    chained_hidden: Vec<f32>,
    row: Vec<f32>,
}

impl MtpDrafter {
    /// A drafter for `decoder`'s pack (it must carry the head) with `capacity` slots.
    pub fn new(decoder: &Decoder, capacity: usize, dtype: KvDtype) -> MtpDrafter {
        MtpDrafter {
            hidden_size: decoder.semantics().hidden_size,
            cache: decoder.new_mtp_cache(capacity, dtype),
            pending: Pending::default(),
            next_embeds: Vec::new(),
            chained_hidden: Vec::new(),
            row: Vec::new(),
        }
    }

    /// Bytes a row of the head's cache takes.
    pub fn bytes_per_token(&self) -> usize {
        self.cache.bytes_per_token()
    }

    /// Forgets everything at and after slot `slot` (a rolled-back window, a new prompt's rows).
    pub fn truncate(&mut self, slot: usize) {
        let done = self.cache.len();
        if slot <= done {
            // The head's rows are K/V only: they cut anywhere.
            let _ = self.cache.truncate(slot);
            self.pending.truncate(0);
        } else {
            self.pending.truncate(slot - done);
        }
    }

    /// The model ran rows `first_slot..` (`embeds`, `rows x hidden`) at `hybrid`'s positions:
    /// their hidden states are `before` (rows of an earlier step of the same prompt, if it was
    /// run in two) then the decoder's `last_hidden()`.
    pub fn ran(
        &mut self,
        first_slot: usize,
        decoder: &Decoder,
        embeds: &[f32],
        hybrid: &HybridInputs,
        before: &[f32],
    ) {
        self.ran_rows(first_slot, (before, decoder.last_hidden()), embeds, hybrid);
    }

    /// [`MtpDrafter::ran`] with the rows' hidden states given: `hidden.0` then `hidden.1` (a
    /// sequence's rows of a forward over several).
    pub fn ran_rows(
        &mut self,
        first_slot: usize,
        hidden: (&[f32], &[f32]),
        embeds: &[f32],
        hybrid: &HybridInputs,
    ) {
        self.truncate(first_slot);
        let rows = embeds.len() / self.hidden_size;
        debug_assert_eq!(hidden.0.len() + hidden.1.len(), embeds.len());
        debug_assert_eq!(self.cache.len() + self.pending.rows(), first_slot);
        let p = &mut self.pending;
        p.hidden.extend_from_slice(hidden.0);
        p.hidden.extend_from_slice(hidden.1);
        p.embeds.extend_from_slice(embeds);
        p.positions
            .extend((0..rows).map(|r| hybrid.position(r, rows)));
    }

    /// Up to `k` drafts to follow `token` (sampled after the model's last row): the head catches
    /// up over the pending rows, then chains.
    pub fn propose(&mut self, decoder: &mut Decoder, token: u32, k: usize) -> Result<Vec<u32>> {
        let n = self.pending.rows();
        if k == 0 || n == 0 || self.cache.len() + n + k > self.cache.capacity() {
            return Ok(Vec::new());
        }
        let h = decoder.semantics().hidden_size;
        self.row.resize(h, 0.0);
        // Row r reads the embedding fed at row r + 1; the last row, the sampled token's.
        self.next_embeds.clear();
        self.next_embeds
            .extend_from_slice(&self.pending.embeds[h..]);
        decoder.embed_row(token, &mut self.row);
        self.next_embeds.extend_from_slice(&self.row);
        let mut planes = vec![0i64; 3 * n];
        for (r, p) in self.pending.positions.iter().enumerate() {
            for (plane, &v) in p.iter().enumerate() {
                planes[plane * n + r] = v;
            }
        }
        let last = self.pending.positions[n - 1];
        let hybrid = HybridInputs {
            planes: Some(planes),
            ..HybridInputs::default()
        };
        let done = self.cache.len() + n;
        let logits = decoder.mtp_step(
            &mut self.cache,
            &self.pending.hidden,
            &self.next_embeds,
            &hybrid,
            Logits::LastRow,
        )?;
        let mut drafts = vec![argmax(logits)];
        self.pending.truncate(0);
        for i in 1..k {
            // The chained row reads the head's own last output row as its hidden state.
            let out = decoder.mtp_hidden();
            self.chained_hidden.clear();
            self.chained_hidden.extend_from_slice(&out[out.len() - h..]);
            decoder.embed_row(drafts[i - 1], &mut self.row);
            let p = last[0] + i as i64;
            let chained = HybridInputs {
                planes: Some(vec![p, p, p]),
                ..HybridInputs::default()
            };
            let logits = decoder.mtp_step(
                &mut self.cache,
                &self.chained_hidden,
                &self.row,
                &chained,
                Logits::LastRow,
            )?;
            drafts.push(argmax(logits));
        }
        // Only rows read from the model's own hidden states stay in the head's cache.
        let _ = self.cache.truncate(done);
        Ok(drafts)
    }
}
