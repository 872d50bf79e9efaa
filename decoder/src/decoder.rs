//! `Decoder`: embed the rows, run the layers, final norm and head — one clear pass per step.
//!
//! What is the same for every family lives here (the cache slot rule, the rotary tables of the
//! step, the embedding, the final norm and the head); a family's layers live in its folder
//! (`qwen3_vl/`). Cache slot and rotary position are separate numbers everywhere.

use std::sync::Arc;
use std::time::Duration;

use compute::ops::norm::rmsnorm;
use compute::ops::rope::{RopeLayout, Rotary};
use compute::ops::rows::{for_rows, grow};
use compute::timing::TimeSpent;
use compute::{HostGemm, LinearHandle, PackLinear, Runtime};
use packs::{Embedding, NormIndex, Pack, Semantics};

use crate::attention::AttnShape;
use crate::hybrid::HybridInputs;
use crate::kv::{KvCache, KvDtype};
use crate::options::{DecoderOptions, Logits};
use crate::qwen3_5;
use crate::qwen3_vl;
use crate::qwen3_vl::deepstack::{self, add_deepstack};
use crate::qwen3_vl::moe::{MoeScratch, MoeStats, Routing};
use crate::recurrent::StateLayout;
use crate::step::{Scratch, Segment, Step, StepState};
use crate::DecoderError;

pub struct Decoder {
    pack: Arc<Pack>,
    sem: Semantics,
    runtime: Runtime,
    rotary: Rotary,
    shape: AttnShape,
    eps: f32,
    kv: KvCache,
    layers: Layers,
    final_norm: NormIndex,
    head: LinearHandle,
    state: StepState,
    options: DecoderOptions,
    /// Hidden states after each layer of the last step, when tracing.
    trace: Vec<Vec<f32>>,
    /// Qwen3.5's MTP head, when the pack carries it.
    mtp: Option<qwen3_5::mtp::Mtp>,
    /// With `keep_last_hidden` on: every row's final (normed) hidden state of the last step.
    hidden: Vec<f32>,
    keep_hidden: bool,
    /// The MTP head's output rows of its last step (cut to them: `grow` keeps a buffer's largest
    /// size, and a chained draft reads the last row).
    mtp_out: Vec<f32>,
    /// The MTP head's inputs of its last step (hidden, embeddings), the sequences' rows one after
    /// another; reused.
    mtp_in: (Vec<f32>, Vec<f32>),
    /// The head the MTP head's logits come from ([`Decoder::set_mtp_vocab`]): the LM head, or
    /// its first rows.
    mtp_logits: LinearHandle,
}

impl Decoder {
    /// The decoder of `pack` on `runtime` (its linears are registered there now).
    pub fn new(
        pack: &Arc<Pack>,
        runtime: &Runtime,
        options: DecoderOptions,
    ) -> Result<Decoder, DecoderError> {
        let sem = pack.semantics().clone();
        if options.capacity == 0 {
            return Err(DecoderError::Options(
                "context capacity must be at least 1 slot".into(),
            ));
        }
        let layout = options
            .ablation
            .rope_layout
            .unwrap_or_else(|| RopeLayout::from_semantics(&sem));
        let rotary_dim = if options.ablation.rotary_all_dims {
            sem.head_dim
        } else {
            sem.rotary_dim()
        };
        let rotary = Rotary::new(layout, sem.rope_theta, rotary_dim);
        let shape = AttnShape {
            heads: sem.num_heads,
            kv_heads: sem.num_kv_heads,
            head_dim: sem.head_dim,
        };
        let layers = if sem.delta_net.is_some() {
            Layers::Qwen35(
                (0..sem.num_layers)
                    .map(|l| qwen3_5::Layer::resolve(pack, runtime, l))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        } else {
            Layers::Qwen3Vl(
                (0..sem.num_layers)
                    .map(|l| qwen3_vl::Layer::resolve(pack, runtime, l))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        };
        let final_norm = pack.norm_index(packs::names::FINAL_NORM)?;
        let mtp = qwen3_5::mtp::Mtp::resolve(pack, runtime)?;
        let head = runtime.register(pack, &[PackLinear::Head])?[0];
        let routing = sem.moe.as_ref().map(|m| Routing {
            num_experts: m.num_experts,
            top_k: m.top_k,
            renormalize: m.norm_topk_prob && !options.ablation.moe_skip_renormalize,
            ties_lower_index: options.ablation.moe_ties_lower_index,
        });
        let kv = cache_for(&sem, shape, options.capacity, options.kv_dtype);
        let state = StepState {
            scratch: Scratch::default(),
            routing,
            router_gemm: routing.map(|_| HostGemm::new(runtime.pool().clone())),
            moe: MoeScratch::default(),
            trace_routes: options.trace_layers,
            routes_trace: Vec::new(),
            attention_time: TimeSpent::default(),
            delta_net_time: TimeSpent::default(),
        };
        Ok(Decoder {
            pack: pack.clone(),
            eps: sem.rms_norm_eps as f32,
            sem,
            runtime: runtime.clone(),
            rotary,
            shape,
            kv,
            layers,
            final_norm,
            head,
            state,
            options,
            trace: Vec::new(),
            mtp,
            mtp_logits: head,
            hidden: Vec::new(),
            keep_hidden: false,
            mtp_out: Vec::new(),
            mtp_in: (Vec::new(), Vec::new()),
        })
    }

    pub fn semantics(&self) -> &Semantics {
        &self.sem
    }
    pub fn pack(&self) -> &Arc<Pack> {
        &self.pack
    }
    /// The runtime the decoder's GEMMs and attention run on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }
    /// The rotary tables the decoder rotates q and k with (probes check its angles).
    pub fn rotary(&self) -> &Rotary {
        &self.rotary
    }
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }
    /// Filled cache slots; the next step must start here.
    pub fn next_slot(&self) -> usize {
        self.kv.len()
    }
    /// Bytes the KV cache holds (all slots allocated up front).
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes_allocated()
    }
    pub fn reset(&mut self) {
        self.kv.reset();
    }
    /// Frees the decoder's own cache (a caller that steps sequences on their own caches only);
    /// the one-sequence steps then refuse every row by capacity.
    pub fn release_cache(&mut self) {
        self.kv = KvCache::empty();
    }
    /// Keeps a prompt state at the filled slots (see [`KvCache::checkpoint`]).
    pub fn checkpoint(&mut self) {
        self.kv.checkpoint();
    }
    /// Forget slots `len..` (decoding continues at the slot returned: `len`, or 0 where a
    /// recurrent state cannot go back there; see [`KvCache::truncate`]).
    #[must_use = "a recurrent cache may keep fewer slots than asked"]
    pub fn truncate(&mut self, len: usize) -> usize {
        // A recurrent state's rollback replays rows: on the decoder's pool.
        let kv = &mut self.kv;
        self.runtime.pool().install(|| kv.truncate(len))
    }
    /// Wall time the steps since the last call spent in attention over the cache (the K/V writes
    /// included), and restarts the count: with the backend's GEMM time it splits a step into
    /// GEMMs, attention and the rest (`bench` reports the three).
    pub fn take_attention_time(&mut self) -> Duration {
        self.state.attention_time.take()
    }
    /// Wall time the steps since the last call spent in Gated DeltaNet mixers outside their
    /// GEMMs (conv, norms, the delta rule), and restarts the count.
    pub fn take_delta_net_time(&mut self) -> Duration {
        self.state.delta_net_time.take()
    }
    /// Expert runs and routed rows of the sparse layers since the last call, and restarts the
    /// count (`bench` turns them into bytes read per token).
    pub fn take_moe_stats(&mut self) -> MoeStats {
        std::mem::take(&mut self.state.moe.stats)
    }
    /// The experts each row of the last step's sparse layers was routed to, when tracing is on:
    /// one entry per sparse layer, `rows x top_k` each, in top-k order.
    pub fn routes_trace(&self) -> &[Vec<usize>] {
        &self.state.routes_trace
    }
    /// Hidden states after each layer of the last step (`rows x hidden` each), when tracing is on.
    pub fn layer_trace(&self) -> &[Vec<f32>] {
        &self.trace
    }

    /// One token at `rotary_pos` (all three planes) written to `cache_slot`; last-row logits.
    pub fn step(
        &mut self,
        token: u32,
        rotary_pos: i64,
        cache_slot: usize,
    ) -> Result<&[f32], DecoderError> {
        self.step_batch(&[token], rotary_pos, cache_slot, Logits::LastRow)
    }

    /// A text prompt: row i at rotary position `start_pos + i` and cache slot `start_slot + i`.
    pub fn step_batch(
        &mut self,
        tokens: &[u32],
        start_pos: i64,
        start_slot: usize,
        logits: Logits,
    ) -> Result<&[f32], DecoderError> {
        let input = StepInput::Tokens { tokens, start_pos };
        self.step_own_cache(input, start_slot, logits)
    }

    /// Rows given as embeddings (`rows x hidden`), with position planes, image rows and DeepStack.
    pub fn step_batch_embeds(
        &mut self,
        rows_embeds: &[f32],
        hybrid: &HybridInputs,
        start_slot: usize,
        logits: Logits,
    ) -> Result<&[f32], DecoderError> {
        let input = StepInput::Embeds {
            embeds: rows_embeds,
            hybrid,
        };
        self.step_own_cache(input, start_slot, logits)
    }

    /// A KV cache for one sequence of this decoder: `capacity` slots, allocated now.
    pub fn new_cache(&self, capacity: usize, dtype: KvDtype) -> KvCache {
        cache_for(&self.sem, self.shape, capacity, dtype)
    }

    /// Whether the pack carries Qwen3.5's MTP head (a draft source: [`Decoder::mtp_step`]).
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Keep every row's final (normed) hidden state from the next step on ([`last_hidden`]):
    /// the MTP head's input. Off by default: a decoder that drafts no MTP rows does not pay for
    /// a norm over every prompt row.
    ///
    /// [`last_hidden`]: Decoder::last_hidden
    pub fn keep_last_hidden(&mut self, on: bool) {
        self.keep_hidden = on;
    }

    /// With [`Decoder::keep_last_hidden`] on: the final (normed) hidden state of every row of
    /// the last step (`rows x hidden`, the rows of all its sequences one after another).
    pub fn last_hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// The MTP head's logits over the first `ids` token ids only (rounded up to a whole q4 panel
    /// of 16, at most the vocabulary): what a draft may propose. A draft only proposes; the model
    /// verifies it, so answers are unchanged, and a token past the range is found by the
    /// verifying row instead. The head is most of a draft's cost (Qwen3.5's 248,320 rows against
    /// one layer), and byte-level BPE ids are in merge order, the most frequent pieces first.
    /// Returns the ids the logits now cover.
    pub fn set_mtp_vocab(&mut self, ids: usize) -> Result<usize, DecoderError> {
        let vocab = self.sem.vocab_size;
        let rows = ids
            .clamp(1, vocab)
            .next_multiple_of(packs::quant::Q4_PANEL)
            .min(vocab);
        if rows == self.mtp_vocab() {
            return Ok(rows);
        }
        self.mtp_logits = if rows == vocab {
            self.head
        } else {
            let at = PackLinear::head_rows(&self.pack, rows).ok_or_else(|| {
                DecoderError::Options(format!(
                    "the MTP drafts' vocabulary: {rows} rows are not a prefix of the head"
                ))
            })?;
            let handle = self.runtime.register(&self.pack, &[at]).map_err(|e| {
                DecoderError::Options(format!(
                    "the MTP drafts' first {rows} ids (--draft-vocab): {e}; choose a vocabulary \
                     the backend has designs for, or all"
                ))
            })?;
            handle[0]
        };
        Ok(rows)
    }

    /// The token ids the MTP head's logits cover ([`Decoder::set_mtp_vocab`]).
    fn mtp_vocab(&self) -> usize {
        self.mtp_logits.weight(&self.pack).linear.n
    }

    /// The MTP head's cache for one sequence: one attention layer, `capacity` slots.
    pub fn new_mtp_cache(&self, capacity: usize, dtype: KvDtype) -> KvCache {
        KvCache::new(dtype, 1, capacity, self.shape.kv_heads, self.shape.head_dim)
    }

    /// The MTP head's output rows of its last step (`rows x hidden`): a chained draft reads the
    /// last one as its hidden state.
    pub fn mtp_hidden(&self) -> &[f32] {
        &self.mtp_out
    }

    /// The MTP head over rows of one sequence: row r reads `hidden` row r (the model's final
    /// hidden state of a row, or the head's own output row when chaining) and `embeds` row r (the
    /// embedding fed after that row), at `hybrid`'s positions; its K/V go to `cache` (from
    /// [`Decoder::new_mtp_cache`]) from its next slot. Returns the head's logits of the rows
    /// `logits` asks for: the token two after each row's, over the ids [`Decoder::set_mtp_vocab`]
    /// chose (all by default).
    pub fn mtp_step(
        &mut self,
        cache: &mut KvCache,
        hidden: &[f32],
        embeds: &[f32],
        hybrid: &HybridInputs,
        logits: Logits,
    ) -> Result<&[f32], DecoderError> {
        let mut one = [MtpSequenceStep {
            cache,
            hidden,
            embeds,
            hybrid,
            logits,
        }];
        let out = self.mtp_step_sequences(&mut one).map_err(|e| match e {
            DecoderError::InSequence { source, .. } => *source,
            e => e,
        })?;
        Ok(out.logits)
    }

    /// [`Decoder::mtp_step`] over the rows of several sequences at once: every GEMM of the head
    /// (its layer and its logits) runs once over all rows, attention per sequence over its own
    /// head cache, as [`Decoder::step_sequences`] does for the model. A row's result does not
    /// depend on the rows beside it. [`Decoder::mtp_hidden`] then holds the sequences' output
    /// rows one after another. A refusal names the sequence by index; no cache advances.
    pub fn mtp_step_sequences(
        &mut self,
        sequences: &mut [MtpSequenceStep<'_>],
    ) -> Result<SequenceLogits<'_>, DecoderError> {
        let h = self.sem.hidden_size;
        let Some(mtp) = self.mtp.take() else {
            return Err(DecoderError::Options(format!(
                "{}: the pack has no MTP head (mtp.*): use prompt-lookup drafts instead",
                self.pack.path().display()
            )));
        };
        let result = self.mtp_run(&mtp, sequences, h);
        self.mtp = Some(mtp);
        let spans = result?;
        let vocab = self.mtp_vocab();
        Ok(SequenceLogits::of_spans(
            &self.state.scratch.logits,
            spans,
            vocab,
        ))
    }

    /// The checks and the pass of [`Decoder::mtp_step_sequences`]; returns each sequence's
    /// (first row, rows) in the logits.
    fn mtp_run(
        &mut self,
        mtp: &qwen3_5::mtp::Mtp,
        sequences: &mut [MtpSequenceStep<'_>],
        h: usize,
    ) -> Result<Vec<(usize, usize)>, DecoderError> {
        if sequences.is_empty() {
            return Err(DecoderError::Options(
                "mtp_step_sequences needs at least one sequence".into(),
            ));
        }
        let segments = segments_of(sequences.len(), |i| {
            let seq = &sequences[i];
            let rows = seq.embeds.len() / h.max(1);
            if rows == 0 || seq.embeds.len() != rows * h || seq.hidden.len() != rows * h {
                return Err(DecoderError::Options(format!(
                    "mtp_step: {} hidden and {} embedding values, expected the same positive \
                     number of rows of {h}",
                    seq.hidden.len(),
                    seq.embeds.len()
                )));
            }
            if seq.cache.layers() != 1 || seq.cache.kv_dim() != self.shape.kv_dim() {
                return Err(DecoderError::Options(
                    "the MTP head's cache must come from Decoder::new_mtp_cache".into(),
                ));
            }
            self.check_hybrid(seq.hybrid, rows)?;
            self.check_room(seq.cache, seq.cache.len(), rows)?;
            Ok((rows, seq.cache.len(), seq.hybrid))
        })?;
        let rows: usize = segments.iter().map(|s| s.rows).sum();
        // The head reads its rows' inputs one after another, as the model's step reads `x`.
        let (mut hidden, mut embeds) = (
            std::mem::take(&mut self.mtp_in.0),
            std::mem::take(&mut self.mtp_in.1),
        );
        hidden.clear();
        embeds.clear();
        for seq in sequences.iter() {
            hidden.extend_from_slice(seq.hidden);
            embeds.extend_from_slice(seq.embeds);
        }
        let which: Vec<Logits> = sequences.iter().map(|s| s.logits).collect();
        let mut caches: Vec<&mut KvCache> = sequences.iter_mut().map(|s| &mut *s.cache).collect();
        let runtime = self.runtime.clone();
        let result = runtime.pass(|| {
            let step = Step {
                pack: &self.pack,
                runtime: &self.runtime,
                pool: self.runtime.pool(),
                rows,
                segments: &segments,
                hidden: h,
                intermediate: self.sem.intermediate_size,
                eps: self.eps,
                shape: self.shape,
                rotary_dim: self.rotary.head_dim,
                ablation: self.options.ablation,
            };
            rotary_tables(&self.rotary, &segments, &mut self.state.scratch);
            let mut out = std::mem::take(&mut self.mtp_out);
            let r = mtp.forward(
                &step,
                &mut caches,
                &mut self.state,
                &hidden,
                &embeds,
                &mut out,
            );
            out.truncate(if r.is_ok() { rows * h } else { 0 });
            self.mtp_out = out;
            r?;
            // The wanted rows, segment after segment, into one GEMM over the head.
            let (spans, out_rows) = logit_spans(&segments, &which);
            let (head, vocab) = (self.mtp_logits, self.mtp_vocab());
            let s = &mut self.state.scratch;
            let xn = grow(&mut s.xn, out_rows * h);
            for (seg, &(at, n)) in segments.iter().zip(&spans) {
                let first = seg.row0 + seg.rows - n;
                xn[at * h..(at + n) * h].copy_from_slice(&self.mtp_out[first * h..(first + n) * h]);
            }
            self.runtime.gemm(
                &self.pack,
                head,
                &s.xn[..out_rows * h],
                out_rows,
                grow(&mut s.logits, out_rows * vocab),
            )?;
            for (seg, kv) in segments.iter().zip(caches.iter_mut()) {
                kv.commit(seg.start_slot + seg.rows);
            }
            Ok(spans)
        });
        self.mtp_in = (hidden, embeds);
        result
    }

    /// One forward over the rows of several sequences: every GEMM runs once over all rows (one
    /// read of the weights), attention runs per sequence over its own cache. Sequence i's rows go
    /// to its cache from its next free slot. Each cache advances only if the whole step succeeds;
    /// a refusal names the sequence by index.
    pub fn step_sequences(
        &mut self,
        sequences: &mut [SequenceStep<'_>],
    ) -> Result<SequenceLogits<'_>, DecoderError> {
        if sequences.is_empty() {
            return Err(DecoderError::Options(
                "step_sequences needs at least one sequence".into(),
            ));
        }
        let texts = text_inputs(sequences);
        let segments = segments_of(sequences.len(), |i| {
            let seq = &sequences[i];
            self.check_cache(seq.cache)?;
            let hybrid = match seq.input {
                StepInput::Tokens { .. } => &texts[i],
                StepInput::Embeds { hybrid, .. } => hybrid,
            };
            let rows = self.check_input(&seq.input)?;
            self.check_room(seq.cache, seq.cache.len(), rows)?;
            Ok((rows, seq.cache.len(), hybrid))
        })?;
        let which: Vec<Logits> = sequences.iter().map(|s| s.logits).collect();
        let mut x = std::mem::take(&mut self.state.scratch.x);
        self.embed_inputs(&mut x, sequences.iter().map(|s| &s.input));
        let mut caches: Vec<&mut KvCache> = sequences.iter_mut().map(|s| &mut *s.cache).collect();
        let result = self.run(&mut x, &segments, &mut caches, &which);
        self.state.scratch.x = x;
        let spans = result?;
        let vocab = self.sem.vocab_size;
        Ok(SequenceLogits::of_spans(
            &self.state.scratch.logits,
            spans,
            vocab,
        ))
    }

    /// One sequence on the decoder's own cache; `start_slot` must be its next free slot.
    fn step_own_cache(
        &mut self,
        input: StepInput<'_>,
        start_slot: usize,
        logits: Logits,
    ) -> Result<&[f32], DecoderError> {
        let text;
        let hybrid = match input {
            StepInput::Tokens { start_pos, .. } => {
                text = HybridInputs::text(start_pos);
                &text
            }
            StepInput::Embeds { hybrid, .. } => hybrid,
        };
        let rows = self.check_input(&input)?;
        self.check_room(&self.kv, start_slot, rows)?;
        let segments = [Segment {
            row0: 0,
            rows,
            start_slot,
            hybrid,
        }];
        let mut x = std::mem::take(&mut self.state.scratch.x);
        self.embed_inputs(&mut x, std::iter::once(&input));
        let mut kv = std::mem::replace(&mut self.kv, KvCache::empty());
        let result = self.run(&mut x, &segments, &mut [&mut kv], &[logits]);
        self.kv = kv;
        self.state.scratch.x = x;
        let spans = result?;
        Ok(&self.state.scratch.logits[..spans[0].1 * self.sem.vocab_size])
    }

    /// Refuses input the pack cannot take, by name; returns its rows.
    fn check_input(&self, input: &StepInput<'_>) -> Result<usize, DecoderError> {
        let hidden = self.sem.hidden_size;
        match *input {
            StepInput::Tokens { tokens, .. } => {
                if tokens.is_empty() {
                    return Err(DecoderError::Options(
                        "step_batch needs at least one token".into(),
                    ));
                }
                for (row, &token) in tokens.iter().enumerate() {
                    if token as usize >= self.sem.vocab_size {
                        return Err(DecoderError::TokenOutOfVocab {
                            token,
                            row,
                            vocab: self.sem.vocab_size,
                        });
                    }
                }
                Ok(tokens.len())
            }
            StepInput::Embeds { embeds, hybrid } => {
                if embeds.is_empty() || !embeds.len().is_multiple_of(hidden) {
                    return Err(DecoderError::Hybrid(format!(
                        "row embeddings hold {} values, not a positive multiple of hidden size {hidden}",
                        embeds.len()
                    )));
                }
                let rows = embeds.len() / hidden;
                self.check_hybrid(hybrid, rows)?;
                // A NaN row would decode garbage with no error: refuse it here, where every front
                // end passes.
                if let Some(i) = packs::first_non_finite(embeds) {
                    return Err(DecoderError::Hybrid(format!(
                        "row embeddings hold {} at row {}, column {}: every row must be finite",
                        embeds[i],
                        i / hidden,
                        i % hidden
                    )));
                }
                deepstack::check_finite(hybrid, hidden).map_err(DecoderError::Hybrid)?;
                Ok(rows)
            }
        }
    }

    /// `rows` rows from `start_slot` must start at the cache's next free slot and fit it.
    fn check_room(&self, kv: &KvCache, start_slot: usize, rows: usize) -> Result<(), DecoderError> {
        let cap = kv.capacity();
        if start_slot != kv.len() {
            return Err(DecoderError::NotNextSlot {
                slot: start_slot,
                next: kv.len(),
                capacity: cap,
            });
        }
        if start_slot + rows > cap {
            return Err(DecoderError::OverCapacity {
                rows,
                start: start_slot,
                needed: start_slot + rows,
                capacity: cap,
            });
        }
        Ok(())
    }

    /// A sequence's cache must have this decoder's layers and KV geometry.
    fn check_cache(&self, kv: &KvCache) -> Result<(), DecoderError> {
        let (layers, kv_dim) = (self.sem.kv_layers().len(), self.shape.kv_dim());
        let recurrent = self.sem.delta_net.as_ref().map(StateLayout::of);
        if kv.recurrent.as_ref().map(|r| r.layout()) != recurrent {
            return Err(DecoderError::Options(
                "the cache's recurrent state does not fit this decoder's DeltaNet layers: make it \
                 with Decoder::new_cache"
                    .into(),
            ));
        }
        if kv.layers() != layers || kv.kv_dim() != kv_dim || kv.head_dim() != self.shape.head_dim {
            return Err(DecoderError::Options(format!(
                "the cache has {} layers of {} KV values (head dim {}), this decoder {layers} of \
                 {kv_dim} (head dim {}): make it with Decoder::new_cache",
                kv.layers(),
                kv.kv_dim(),
                kv.head_dim(),
                self.shape.head_dim
            )));
        }
        Ok(())
    }

    /// The inputs' rows, one after another, into `x` (`rows x hidden`).
    fn embed_inputs<'i>(&self, x: &mut Vec<f32>, inputs: impl Iterator<Item = &'i StepInput<'i>>) {
        let hidden = self.sem.hidden_size;
        x.clear();
        for input in inputs {
            match *input {
                StepInput::Tokens { tokens, .. } => {
                    let at = x.len();
                    x.resize(at + tokens.len() * hidden, 0.0);
                    for (row, &token) in x[at..].chunks_exact_mut(hidden).zip(tokens) {
                        self.embed_row(token, row);
                    }
                }
                StepInput::Embeds { embeds, .. } => x.extend_from_slice(embeds),
            }
        }
    }

    /// The embedding row of `token` as f32.
    pub fn embed_row(&self, token: u32, out: &mut [f32]) {
        let h = self.sem.hidden_size;
        let t = token as usize;
        match self.pack.embedding() {
            Embedding::F32(e) => out.copy_from_slice(&e[t * h..(t + 1) * h]),
            Embedding::Bf16(e) => {
                for (o, v) in out.iter_mut().zip(&e[t * h..(t + 1) * h]) {
                    *o = v.to_f32();
                }
            }
        }
    }

    fn check_hybrid(&self, h: &HybridInputs, rows: usize) -> Result<(), DecoderError> {
        let bad = |m: String| Err(DecoderError::Hybrid(m));
        if let Some(planes) = &h.planes {
            if !self.rotary.layout.is_mrope() {
                return bad(format!(
                    "position planes given, but the pack ({}) declares no MRoPE; pass plain positions",
                    self.pack.path().display()
                ));
            }
            if planes.len() != 3 * rows {
                return bad(format!(
                    "{} position values given, expected 3 planes x {rows} rows = {}",
                    planes.len(),
                    3 * rows
                ));
            }
        }
        let mut prev = None;
        for &r in &h.image_rows {
            if r >= rows {
                return bad(format!(
                    "image row {r} is outside the prompt of {rows} rows"
                ));
            }
            if prev.is_some_and(|p| p >= r) {
                return bad(format!(
                    "image rows must be strictly ascending (row {r} follows {})",
                    prev.unwrap_or(0)
                ));
            }
            prev = Some(r);
        }
        deepstack::check(h, self.sem.deepstack_sets, self.sem.hidden_size)
            .map_err(DecoderError::Hybrid)
    }

    /// Runs the step on a thread of the persistent pool: each GEMM and attention inside then forks
    /// from a pool thread (a few microseconds) instead of entering the pool from outside (tens).
    /// Returns each segment's logits rows: (first row in the logits, rows).
    fn run(
        &mut self,
        x: &mut [f32],
        segments: &[Segment<'_>],
        caches: &mut [&mut KvCache],
        which: &[Logits],
    ) -> Result<Vec<(usize, usize)>, DecoderError> {
        let runtime = self.runtime.clone();
        runtime.pass(|| self.run_on_pool(x, segments, caches, which))
    }

    /// The decoder over the segments' rows, already embedded in `x` one after another. The caches
    /// advance only on success.
    fn run_on_pool(
        &mut self,
        x: &mut [f32],
        segments: &[Segment<'_>],
        caches: &mut [&mut KvCache],
        which: &[Logits],
    ) -> Result<Vec<(usize, usize)>, DecoderError> {
        let rows: usize = segments.iter().map(|s| s.rows).sum();
        let hidden = self.sem.hidden_size;
        let ablation = self.options.ablation;
        let x = &mut x[..rows * hidden];
        self.trace.clear();
        self.state.routes_trace.clear();
        let step = Step {
            pack: &self.pack,
            runtime: &self.runtime,
            pool: self.runtime.pool(),
            rows,
            segments,
            hidden,
            intermediate: self.sem.intermediate_size,
            eps: self.eps,
            shape: self.shape,
            rotary_dim: self.rotary.head_dim,
            ablation,
        };
        let st = &mut self.state;
        rotary_tables(&self.rotary, segments, &mut st.scratch);
        let deepstack = |x: &mut [f32], l: usize| {
            for seg in segments {
                let xs = &mut x[seg.row0 * hidden..(seg.row0 + seg.rows) * hidden];
                add_deepstack(xs, seg.hybrid, l, hidden, ablation.deepstack_every_row);
            }
        };
        // Every state usable before any begins: a refusal leaves all of them as they were.
        for (i, (seg, kv)) in segments.iter().zip(caches.iter()).enumerate() {
            if let Some(r) = &kv.recurrent {
                r.check_usable(seg.start_slot)
                    .map_err(|e| DecoderError::InSequence {
                        index: i,
                        source: Box::new(e),
                    })?;
            }
        }
        for (seg, kv) in segments.iter().zip(caches.iter_mut()) {
            if let Some(r) = &mut kv.recurrent {
                r.begin(seg.start_slot, seg.rows);
            }
        }
        match &self.layers {
            Layers::Qwen3Vl(layers) => {
                for (l, layer) in layers.iter().enumerate() {
                    if ablation.deepstack_before_layer {
                        deepstack(x, l);
                    }
                    layer.forward(l, &step, caches, st, x)?;
                    // DeepStack after the layer, one path for dense and sparse layers alike.
                    let skip = layer.is_sparse() && ablation.deepstack_skip_sparse_layers;
                    if !ablation.deepstack_before_layer && !skip {
                        deepstack(x, l);
                    }
                    if self.options.trace_layers {
                        self.trace.push(x.to_vec());
                    }
                }
            }
            Layers::Qwen35(layers) => {
                for layer in layers {
                    layer.forward(&step, caches, st, x)?;
                    if self.options.trace_layers {
                        self.trace.push(x.to_vec());
                    }
                }
            }
        }
        if self.keep_hidden {
            // The MTP head reads every row's final hidden state.
            let w = self.pack.norm_at(self.final_norm);
            self.hidden.resize(rows * hidden, 0.0);
            let out = &mut self.hidden[..];
            for_rows(self.runtime.pool(), out, hidden, |r, o| {
                rmsnorm(&x[r * hidden..(r + 1) * hidden], w, self.eps, o)
            });
        }
        // Final norm and head, on the rows whose logits are wanted, segment after segment.
        let (spans, out_rows) = logit_spans(segments, which);
        let s = &mut st.scratch;
        let w_final = self.pack.norm_at(self.final_norm);
        let xn = grow(&mut s.xn, out_rows * hidden);
        let mut at = 0;
        for (seg, &(_, n)) in segments.iter().zip(&spans) {
            let first = seg.row0 + seg.rows - n;
            for r in first..first + n {
                let out = &mut xn[at * hidden..(at + 1) * hidden];
                rmsnorm(&x[r * hidden..(r + 1) * hidden], w_final, self.eps, out);
                at += 1;
            }
        }
        let vocab = self.sem.vocab_size;
        self.runtime.gemm(
            &self.pack,
            self.head,
            &s.xn[..out_rows * hidden],
            out_rows,
            grow(&mut s.logits, out_rows * vocab),
        )?;
        for (seg, kv) in segments.iter().zip(caches.iter_mut()) {
            kv.commit(seg.start_slot + seg.rows);
            if let Some(r) = &mut kv.recurrent {
                r.commit();
            }
        }
        Ok(spans)
    }
}

/// A step's segments, one sequence's rows after another's: `check(i)` gives sequence i's rows,
/// first cache slot and positions, or its refusal, which is returned named by the index.
fn segments_of<'h>(
    count: usize,
    mut check: impl FnMut(usize) -> Result<(usize, usize, &'h HybridInputs), DecoderError>,
) -> Result<Vec<Segment<'h>>, DecoderError> {
    let mut segments = Vec::with_capacity(count);
    let mut row0 = 0;
    for index in 0..count {
        let (rows, start_slot, hybrid) = check(index).map_err(|e| DecoderError::InSequence {
            index,
            source: Box::new(e),
        })?;
        segments.push(Segment {
            row0,
            rows,
            start_slot,
            hybrid,
        });
        row0 += rows;
    }
    Ok(segments)
}

/// Per segment, where its wanted logits rows go (first row, rows: its last row, or all of them),
/// one segment after another; and the rows in all.
fn logit_spans(segments: &[Segment<'_>], which: &[Logits]) -> (Vec<(usize, usize)>, usize) {
    let mut spans = Vec::with_capacity(segments.len());
    let mut rows = 0;
    for (seg, w) in segments.iter().zip(which) {
        let n = match w {
            Logits::LastRow => 1,
            Logits::AllRows => seg.rows,
        };
        spans.push((rows, n));
        rows += n;
    }
    (spans, rows)
}

/// cos/sin of every row of the step (`rotary_dim / 2` each), shared by all layers.
fn rotary_tables(rotary: &Rotary, segments: &[Segment<'_>], s: &mut Scratch) {
    let half = rotary.head_dim / 2;
    let rows: usize = segments.iter().map(|g| g.rows).sum();
    grow(&mut s.cos, rows * half);
    grow(&mut s.sin, rows * half);
    for seg in segments {
        for r in 0..seg.rows {
            let at = (seg.row0 + r) * half;
            rotary.cos_sin(
                seg.hybrid.position(r, seg.rows),
                &mut s.cos[at..at + half],
                &mut s.sin[at..at + half],
            );
        }
    }
}

/// A family's layers on the one decoder loop.
enum Layers {
    Qwen3Vl(Vec<qwen3_vl::Layer>),
    Qwen35(Vec<qwen3_5::Layer>),
}

/// A sequence's cache for a pack: K/V for its attention layers, and the recurrent state of its
/// DeltaNet layers (Qwen3.5).
fn cache_for(sem: &Semantics, shape: AttnShape, capacity: usize, dtype: KvDtype) -> KvCache {
    let kv = KvCache::new(
        dtype,
        sem.kv_layers().len(),
        capacity,
        shape.kv_heads,
        shape.head_dim,
    );
    match &sem.delta_net {
        Some(d) => kv.with_recurrent(StateLayout::of(d)),
        None => kv,
    }
}

/// One decode step by the rule every caller shares: `token` at the decoder's next free cache
/// slot, rotated by `*next_rotary_pos`, which then moves on by one (after an image the rotary
/// position runs behind the slot, so the two are separate numbers). The engine's decode loop and
/// the teacher-forced replays both step through here.
pub fn decode_step<'d>(
    decoder: &'d mut Decoder,
    token: u32,
    next_rotary_pos: &mut i64,
) -> Result<&'d [f32], DecoderError> {
    let slot = decoder.next_slot();
    let logits = decoder.step(token, *next_rotary_pos, slot)?;
    *next_rotary_pos += 1;
    Ok(logits)
}

/// What one sequence feeds a step.
#[derive(Clone, Copy)]
pub enum StepInput<'a> {
    /// Text ids, row i at rotary position `start_pos + i` on all planes.
    Tokens { tokens: &'a [u32], start_pos: i64 },
    /// Row embeddings (`rows x hidden`) with their planes, image rows and DeepStack sets.
    Embeds {
        embeds: &'a [f32],
        hybrid: &'a HybridInputs,
    },
}

/// One sequence's part of [`Decoder::step_sequences`]: its cache (its rows go to the next free
/// slots), its input and which of its rows' logits it wants.
pub struct SequenceStep<'a> {
    pub cache: &'a mut KvCache,
    pub input: StepInput<'a>,
    pub logits: Logits,
}

/// One sequence's part of [`Decoder::mtp_step_sequences`]: its head cache (from
/// [`Decoder::new_mtp_cache`]; its rows go to the next free slots), the rows' inputs (`rows x
/// hidden` each: the hidden state a row reads and the embedding fed after it), their positions,
/// and which rows' logits it wants.
pub struct MtpSequenceStep<'a> {
    pub cache: &'a mut KvCache,
    pub hidden: &'a [f32],
    pub embeds: &'a [f32],
    pub hybrid: &'a HybridInputs,
    pub logits: Logits,
}

/// The logits of a [`Decoder::step_sequences`] (or [`Decoder::mtp_step_sequences`]), sequence by
/// sequence.
pub struct SequenceLogits<'a> {
    logits: &'a [f32],
    /// Per sequence: (first row, rows) in `logits`.
    spans: Vec<(usize, usize)>,
    vocab: usize,
}

impl<'a> SequenceLogits<'a> {
    /// The logits rows of `spans` (per sequence: first row, rows) at the start of `logits`.
    fn of_spans(logits: &'a [f32], spans: Vec<(usize, usize)>, vocab: usize) -> Self {
        let rows: usize = spans.iter().map(|s| s.1).sum();
        SequenceLogits {
            logits: &logits[..rows * vocab],
            spans,
            vocab,
        }
    }

    /// Sequence `i`'s logits: its last row's, or all its rows' (`rows x vocab`).
    pub fn of(&self, i: usize) -> &[f32] {
        let (first, rows) = self.spans[i];
        &self.logits[first * self.vocab..(first + rows) * self.vocab]
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// The plain-position inputs of the text sequences (indexed like `sequences`; unused entries for
/// the others), kept alive for the step's segments.
fn text_inputs(sequences: &[SequenceStep<'_>]) -> Vec<HybridInputs> {
    sequences
        .iter()
        .map(|s| match s.input {
            StepInput::Tokens { start_pos, .. } => HybridInputs::text(start_pos),
            StepInput::Embeds { .. } => HybridInputs::default(),
        })
        .collect()
}
