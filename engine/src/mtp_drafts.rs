//! Drafts from Qwen3.5's MTP head (`--drafts mtp`): the head reads each row's final hidden state
//! and the embedding fed after it, so it runs one row behind the model. After every forward the
//! session hands over the rows' hidden states, embeddings and positions; when a token is sampled
//! the head catches up over the rows whose next embedding is now known (the last one reads the
//! sampled token's), which gives the first draft, then chains: each further draft reads the
//! previous draft's embedding and the head's own output row. The chained rows are dropped from
//! the head's cache again: only rows computed from the model's own hidden states stay.

use compute::ops::sampling::argmax;
use decoder::{Decoder, HybridInputs, KvCache, KvDtype, Logits, MtpSequenceStep};

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

    /// One more row, a kept one.
    fn push(&mut self, row: &KeptRow) {
        self.hidden.extend_from_slice(&row.hidden);
        self.embeds.extend_from_slice(&row.embed);
        self.positions.push(row.position);
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
    /// The inputs of one head step, reused: the embeddings each row reads, the hidden state a
    /// chained row reads, one embedding row, and the rows' positions.
    next_embeds: Vec<f32>,
    chained_hidden: Vec<f32>,
    row: Vec<f32>,
    hybrid: HybridInputs,
    /// The row before the model's prompt state (`keep_row_before`): where a later prompt
    /// starting the same way resumes, the head re-reads it with that prompt's next embedding.
    kept: Option<KeptRow>,
}

/// One row the head reads: its slot, the model's final hidden state there, the embedding fed at
/// it and its position.
#[derive(Clone)]
struct KeptRow {
    slot: usize,
    hidden: Vec<f32>,
    embed: Vec<f32>,
    position: [i64; 3],
}

/// One sequence's ask for drafts ([`propose_drafts`]): its drafter, the token just sampled after
/// the model's last row, and how many drafts at most.
pub struct DraftAsk<'a> {
    pub drafter: &'a mut MtpDrafter,
    pub token: u32,
    pub k: usize,
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
            hybrid: HybridInputs::default(),
            kept: None,
        }
    }

    /// Bytes a row of the head's cache takes.
    pub fn bytes_per_token(&self) -> usize {
        self.cache.bytes_per_token()
    }

    /// Forgets everything at and after slot `slot` (a rolled-back window, a new prompt's rows).
    /// The head's row `slot - 1` read the embedding fed at `slot`; when the head has run it and
    /// a new prompt follows, it is read again from the kept row ([`MtpDrafter::keep_row_before`])
    /// if there is one for it: the head then drafts as after reading the new prompt whole.
    pub fn truncate(&mut self, slot: usize) {
        let done = self.cache.len();
        if self.kept.as_ref().is_some_and(|k| slot <= k.slot) {
            self.kept = None;
        }
        if slot > done {
            self.pending.truncate(slot - done);
            return;
        }
        self.pending.truncate(0);
        match self.kept.as_ref().filter(|k| k.slot + 1 == slot) {
            Some(k) => {
                let _ = self.cache.truncate(k.slot);
                self.pending.push(k);
            }
            // The head's rows are K/V only: they cut anywhere.
            None => {
                let _ = self.cache.truncate(slot);
            }
        }
    }

    /// Whether a prompt sharing the first `slot` rows with what the head read resumes there
    /// exactly (as if it read the new prompt whole): the head has not run row `slot - 1` yet, or
    /// keeps it ([`MtpDrafter::keep_row_before`]), or `slot` is 0.
    pub fn resumes_at(&self, slot: usize) -> bool {
        let done = self.cache.len();
        slot == 0
            || (slot > done && slot <= done + self.pending.rows())
            || self.kept.as_ref().is_some_and(|k| k.slot + 1 == slot)
    }

    /// `src`'s first `slot` rows as this drafter's, as if it read them itself (a prompt copying a
    /// running conversation's rows up to its prompt state): the head's rows before `slot - 1`,
    /// and the rows it has not run yet. Returns false, holding nothing, where `src` does not
    /// resume exactly at `slot` ([`MtpDrafter::resumes_at`]).
    pub fn copy_prefix(&mut self, src: &MtpDrafter, slot: usize) -> bool {
        self.truncate(0);
        if slot == 0 || !src.resumes_at(slot) {
            return false;
        }
        let (done, h) = (src.cache.len(), self.hidden_size);
        let ran = done.min(slot - 1);
        if ran > 0 && self.cache.copy_prefix(&src.cache, ran) != ran {
            self.truncate(0);
            return false;
        }
        let p = &mut self.pending;
        if slot > done {
            // Rows `done..slot` are pending in `src`.
            let n = slot - done;
            p.hidden.extend_from_slice(&src.pending.hidden[..n * h]);
            p.embeds.extend_from_slice(&src.pending.embeds[..n * h]);
            p.positions.extend_from_slice(&src.pending.positions[..n]);
        } else if let Some(k) = &src.kept {
            p.push(k);
        }
        self.kept = src.kept.clone().filter(|k| k.slot < slot);
        true
    }

    /// The model keeps a prompt state at `slot` (a Qwen3.5 cache's, before a prompt's last row:
    /// where a later prompt starting the same way resumes): the head keeps row `slot - 1`, which
    /// it has read but not run yet, to run it again then.
    pub fn keep_row_before(&mut self, slot: usize) {
        let (done, h) = (self.cache.len(), self.hidden_size);
        self.kept = (slot > done && slot <= done + self.pending.rows()).then(|| {
            let i = slot - 1 - done;
            let p = &self.pending;
            KeptRow {
                slot: slot - 1,
                hidden: p.hidden[i * h..(i + 1) * h].to_vec(),
                embed: p.embeds[i * h..(i + 1) * h].to_vec(),
                position: p.positions[i],
            }
        });
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

    /// [`MtpDrafter::ran_rows`] for text rows: the model ran `tokens` from `first_slot` at plain
    /// positions from `start_pos` (a decode step or a draft window), their final hidden states
    /// `hidden`; their embeddings go straight to the pending rows.
    pub fn ran_tokens(
        &mut self,
        first_slot: usize,
        hidden: &[f32],
        decoder: &Decoder,
        (tokens, start_pos): (&[u32], i64),
    ) {
        self.truncate(first_slot);
        let (h, n) = (self.hidden_size, tokens.len());
        debug_assert_eq!(hidden.len(), n * h);
        debug_assert_eq!(self.cache.len() + self.pending.rows(), first_slot);
        let p = &mut self.pending;
        p.hidden.extend_from_slice(hidden);
        let at = p.embeds.len();
        p.embeds.resize(at + n * h, 0.0);
        for (row, &t) in p.embeds[at..].chunks_exact_mut(h).zip(tokens) {
            decoder.embed_row(t, row);
        }
        let text = HybridInputs::text(start_pos);
        p.positions.extend((0..n).map(|r| text.position(r, n)));
    }

    /// Up to `k` drafts to follow `token` (sampled after the model's last row): the head catches
    /// up over the pending rows, then chains. [`propose_drafts`] for one sequence.
    pub fn propose(&mut self, decoder: &mut Decoder, token: u32, k: usize) -> Result<Vec<u32>> {
        let mut ask = [DraftAsk {
            drafter: self,
            token,
            k,
        }];
        Ok(propose_drafts(decoder, &mut ask)?.pop().unwrap_or_default())
    }

    /// Whether `k` drafts can be made now: rows to catch up over and room for them and the chain.
    fn can_draft(&self, k: usize) -> bool {
        let n = self.pending.rows();
        k > 0 && n > 0 && self.cache.len() + n + k <= self.cache.capacity()
    }

    /// The catch-up step's inputs: row r reads the embedding fed at row r + 1, the last row the
    /// sampled `token`'s, at the pending rows' positions.
    fn catch_up_inputs(&mut self, decoder: &Decoder, token: u32) {
        let (h, n) = (self.hidden_size, self.pending.rows());
        self.row.resize(h, 0.0);
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
        self.hybrid = HybridInputs {
            planes: Some(planes),
            ..HybridInputs::default()
        };
    }

    /// The chained step's inputs: draft `i` (its embedding, at `i` after the last caught-up
    /// row's position) reads the head's own output row of the step before.
    fn chain_inputs(&mut self, decoder: &Decoder, draft: u32, last: [i64; 3], i: usize) {
        decoder.embed_row(draft, &mut self.row);
        self.hybrid = HybridInputs::text(last[0] + i as i64);
    }
}

/// Drafts for several sequences at once, each as [`MtpDrafter::propose`] would make it alone: one
/// head step over every sequence's catch-up rows, then one over every chained row per draft (the
/// head's weights read once per step, not once per sequence). An ask that cannot draft (k 0,
/// nothing to catch up over, no room) gets none.
pub fn propose_drafts(decoder: &mut Decoder, asks: &mut [DraftAsk<'_>]) -> Result<Vec<Vec<u32>>> {
    let h = decoder.semantics().hidden_size;
    let mut drafts = vec![Vec::new(); asks.len()];
    let live: Vec<bool> = asks.iter().map(|a| a.drafter.can_draft(a.k)).collect();
    // Per live ask: the cache length to go back to (only rows read from the model's own hidden
    // states stay) and the last caught-up row's position.
    let mut keep = vec![(0, [0i64; 3]); asks.len()];
    for (i, a) in asks.iter_mut().enumerate().filter(|(i, _)| live[*i]) {
        let d = &mut *a.drafter;
        let n = d.pending.rows();
        keep[i] = (d.cache.len() + n, d.pending.positions[n - 1]);
        d.catch_up_inputs(decoder, a.token);
    }
    let most = asks
        .iter()
        .zip(&live)
        .filter(|(_, &l)| l)
        .map(|(a, _)| a.k)
        .max()
        .unwrap_or(0);
    for t in 0..most {
        // Draft t: the catch-up step (t = 0) or one chained row for each ask wanting more.
        let drafting: Vec<usize> = (0..asks.len())
            .filter(|&i| live[i] && asks[i].k > t)
            .collect();
        if t > 0 {
            for &i in &drafting {
                asks[i]
                    .drafter
                    .chain_inputs(decoder, drafts[i][t - 1], keep[i].1, t);
            }
        }
        let mut steps: Vec<MtpSequenceStep<'_>> = asks
            .iter_mut()
            .enumerate()
            .filter(|(i, a)| live[*i] && a.k > t)
            .map(|(_, a)| {
                let MtpDrafter {
                    cache,
                    pending,
                    next_embeds,
                    chained_hidden,
                    row,
                    hybrid,
                    ..
                } = &mut *a.drafter;
                let (hidden, embeds) = if t == 0 {
                    (&pending.hidden[..], &next_embeds[..])
                } else {
                    (&chained_hidden[..], &row[..])
                };
                MtpSequenceStep {
                    cache,
                    hidden,
                    embeds,
                    hybrid,
                    logits: Logits::LastRow,
                }
            })
            .collect();
        let out = decoder.mtp_step_sequences(&mut steps)?;
        let rows: Vec<usize> = steps.iter().map(|s| s.embeds.len() / h).collect();
        drop(steps);
        for (j, &i) in drafting.iter().enumerate() {
            drafts[i].push(argmax(out.of(j)));
        }
        // The next chained row of each reads its last output row of this step.
        let out_rows = decoder.mtp_hidden();
        let mut end = 0;
        for (&i, &n) in drafting.iter().zip(&rows) {
            end += n;
            let d = &mut *asks[i].drafter;
            d.chained_hidden.clear();
            d.chained_hidden
                .extend_from_slice(&out_rows[(end - 1) * h..end * h]);
            if t == 0 {
                d.pending.truncate(0);
            }
        }
    }
    for (i, a) in asks.iter_mut().enumerate().filter(|(i, _)| live[*i]) {
        let _ = a.drafter.cache.truncate(keep[i].0);
    }
    Ok(drafts)
}
