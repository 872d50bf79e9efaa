//! Drafts from Qwen3.5's MTP head (`--drafts mtp`): the head reads each row's final hidden state
//! and the embedding fed after it, so it runs one row behind the model. After every forward the
//! session hands over the rows' hidden states, embeddings and positions; when a token is sampled
//! the head catches up over the rows whose next embedding is now known (the last one reads the
//! sampled token's), which gives the first draft, then chains: each further draft reads the
//! previous draft's embedding and the head's own output row. The chained rows are dropped from
//! the head's cache again: only rows computed from the model's own hidden states stay.

use decoder::{Decoder, HybridInputs, KvCache, KvDtype, Logits};

use crate::error::Result;

/// A row the model ran that the head has not yet read.
struct Row {
    hidden: Vec<f32>,
    /// The embedding fed at this row (the previous row's "next").
    embed: Vec<f32>,
    position: [i64; 3],
}

pub struct MtpDrafter {
    cache: KvCache,
    /// Rows `cache.len()..` of the model's cache, in slot order.
    pending: Vec<Row>,
}

impl MtpDrafter {
    /// A drafter for `decoder`'s pack (it must carry the head) with `capacity` slots.
    pub fn new(decoder: &Decoder, capacity: usize, dtype: KvDtype) -> MtpDrafter {
        MtpDrafter {
            cache: decoder.new_mtp_cache(capacity, dtype),
            pending: Vec::new(),
        }
    }

    /// Forgets everything at and after slot `slot` (a rolled-back window, a new prompt's rows).
    pub fn truncate(&mut self, slot: usize) {
        let done = self.cache.len();
        if slot <= done {
            // The head's rows are K/V only: they cut anywhere.
            let _ = self.cache.truncate(slot);
            self.pending.clear();
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
        self.truncate(first_slot);
        let h = decoder.semantics().hidden_size;
        let rows = embeds.len() / h;
        let hidden: Vec<f32> = [before, decoder.last_hidden()].concat();
        debug_assert_eq!(hidden.len(), rows * h);
        debug_assert_eq!(self.cache.len() + self.pending.len(), first_slot);
        for r in 0..rows {
            self.pending.push(Row {
                hidden: hidden[r * h..(r + 1) * h].to_vec(),
                embed: embeds[r * h..(r + 1) * h].to_vec(),
                position: hybrid.position(r, rows),
            });
        }
    }

    /// Up to `k` drafts to follow `token` (sampled after the model's last row): the head catches
    /// up over the pending rows, then chains.
    pub fn propose(&mut self, decoder: &mut Decoder, token: u32, k: usize) -> Result<Vec<u32>> {
        if k == 0 || self.pending.is_empty() {
            return Ok(Vec::new());
        }
        let h = decoder.semantics().hidden_size;
        let n = self.pending.len();
        let mut hidden = Vec::with_capacity(n * h);
        let mut embeds = Vec::with_capacity(n * h);
        let mut planes = vec![0i64; 3 * n];
        let mut row = vec![0.0; h];
        for (r, p) in self.pending.iter().enumerate() {
            hidden.extend_from_slice(&p.hidden);
            match self.pending.get(r + 1) {
                Some(next) => embeds.extend_from_slice(&next.embed),
                None => {
                    decoder.embed_row(token, &mut row);
                    embeds.extend_from_slice(&row);
                }
            }
            for (plane, &v) in p.position.iter().enumerate() {
                planes[plane * n + r] = v;
            }
        }
        let last = self.pending[n - 1].position;
        let hybrid = HybridInputs {
            planes: Some(planes),
            ..HybridInputs::default()
        };
        let done = self.cache.len() + n;
        if self.cache.len() + n + k > self.cache.capacity() {
            return Ok(Vec::new());
        }
        let logits =
            decoder.mtp_step(&mut self.cache, &hidden, &embeds, &hybrid, Logits::LastRow)?;
        let mut drafts = vec![argmax(logits)];
        self.pending.clear();
        for i in 1..k {
            let out = decoder.mtp_hidden();
            let prev = out[out.len() - h..].to_vec();
            decoder.embed_row(drafts[i - 1], &mut row);
            let p = last[0] + i as i64;
            let chained = HybridInputs {
                planes: Some(vec![p, p, p]),
                ..HybridInputs::default()
            };
            let logits =
                decoder.mtp_step(&mut self.cache, &prev, &row, &chained, Logits::LastRow)?;
            drafts.push(argmax(logits));
        }
        // Only rows read from the model's own hidden states stay in the head's cache.
        let _ = self.cache.truncate(done);
        Ok(drafts)
    }
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}
