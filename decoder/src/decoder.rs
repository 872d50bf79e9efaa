//! `Decoder`: embed the rows, run the layers, final norm and head — one clear pass per step.
//!
//! What is the same for every family lives here (the cache slot rule, the rotary tables of the
//! step, the embedding, the final norm and the head); a family's layers live in its folder
//! (`qwen3_vl/`). Cache slot and rotary position are separate numbers everywhere.

use std::sync::Arc;
use std::time::Duration;

use compute::ops::norm::rmsnorm;
use compute::ops::rope::{RopeLayout, Rotary};
use compute::ops::rows::grow;
use compute::timing::TimeSpent;
use compute::{HostGemm, LinearHandle, PackLinear, Runtime};
use packs::{Embedding, NormIndex, Pack, Semantics};

use crate::attention::AttnShape;
use crate::hybrid::HybridInputs;
use crate::kv::KvCache;
use crate::options::{DecoderOptions, Logits};
use crate::qwen3_vl::deepstack::{self, add_deepstack};
use crate::qwen3_vl::moe::{MoeScratch, MoeStats, Routing};
use crate::qwen3_vl::Layer;
use crate::step::{Scratch, Step, StepState};
use crate::DecoderError;

pub struct Decoder {
    pack: Arc<Pack>,
    sem: Semantics,
    runtime: Runtime,
    rotary: Rotary,
    shape: AttnShape,
    eps: f32,
    kv: KvCache,
    layers: Vec<Layer>,
    final_norm: NormIndex,
    head: LinearHandle,
    state: StepState,
    options: DecoderOptions,
    /// Hidden states after each layer of the last step, when tracing.
    trace: Vec<Vec<f32>>,
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
        let rotary = Rotary::new(layout, sem.rope_theta, sem.head_dim);
        let shape = AttnShape {
            heads: sem.num_heads,
            kv_heads: sem.num_kv_heads,
            head_dim: sem.head_dim,
        };
        let layers = (0..sem.num_layers)
            .map(|l| Layer::resolve(pack, runtime, l))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = pack.norm_index(packs::names::FINAL_NORM)?;
        let head = runtime.register(pack, &[PackLinear::Head])?[0];
        let routing = sem.moe.as_ref().map(|m| Routing {
            num_experts: m.num_experts,
            top_k: m.top_k,
            renormalize: m.norm_topk_prob && !options.ablation.moe_skip_renormalize,
            ties_lower_index: options.ablation.moe_ties_lower_index,
        });
        let kv = KvCache::new(
            options.kv_dtype,
            sem.num_layers,
            options.capacity,
            shape.kv_heads,
            shape.head_dim,
        );
        let state = StepState {
            scratch: Scratch::default(),
            routing,
            router_gemm: routing.map(|_| HostGemm::new(runtime.pool().clone())),
            moe: MoeScratch::default(),
            trace_routes: options.trace_layers,
            routes_trace: Vec::new(),
            attention_time: TimeSpent::default(),
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
    /// Forget slots `len..` (decoding continues at slot `len`).
    pub fn truncate(&mut self, len: usize) {
        self.kv.truncate(len);
    }
    /// Wall time the steps since the last call spent in attention over the cache (the K/V writes
    /// included), and restarts the count: with the backend's GEMM time it splits a step into
    /// GEMMs, attention and the rest (`bench` reports the three).
    pub fn take_attention_time(&mut self) -> Duration {
        self.state.attention_time.take()
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
        let hidden = self.sem.hidden_size;
        let rows = tokens.len();
        if rows == 0 {
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
        let mut x = std::mem::take(&mut self.state.scratch.x);
        let xs = grow(&mut x, rows * hidden);
        for (row, &token) in xs.chunks_exact_mut(hidden).zip(tokens) {
            self.embed_row(token, row);
        }
        let result = self.run(
            &mut x,
            rows,
            &HybridInputs::text(start_pos),
            start_slot,
            logits,
        );
        self.state.scratch.x = x;
        result?;
        Ok(self.logits_slice(rows, logits))
    }

    /// Rows given as embeddings (`rows x hidden`), with position planes, image rows and DeepStack.
    pub fn step_batch_embeds(
        &mut self,
        rows_embeds: &[f32],
        hybrid: &HybridInputs,
        start_slot: usize,
        logits: Logits,
    ) -> Result<&[f32], DecoderError> {
        let hidden = self.sem.hidden_size;
        if rows_embeds.is_empty() || !rows_embeds.len().is_multiple_of(hidden) {
            return Err(DecoderError::Hybrid(format!(
                "row embeddings hold {} values, not a positive multiple of hidden size {hidden}",
                rows_embeds.len()
            )));
        }
        let rows = rows_embeds.len() / hidden;
        self.check_hybrid(hybrid, rows)?;
        // A NaN row would decode garbage with no error: refuse it here, where every front end passes.
        if let Some(i) = packs::first_non_finite(rows_embeds) {
            return Err(DecoderError::Hybrid(format!(
                "row embeddings hold {} at row {}, column {}: every row must be finite",
                rows_embeds[i],
                i / hidden,
                i % hidden
            )));
        }
        deepstack::check_finite(hybrid, hidden).map_err(DecoderError::Hybrid)?;
        let mut x = std::mem::take(&mut self.state.scratch.x);
        grow(&mut x, rows * hidden).copy_from_slice(rows_embeds);
        let result = self.run(&mut x, rows, hybrid, start_slot, logits);
        self.state.scratch.x = x;
        result?;
        Ok(self.logits_slice(rows, logits))
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

    fn logits_slice(&self, rows: usize, which: Logits) -> &[f32] {
        let vocab = self.sem.vocab_size;
        let logits = &self.state.scratch.logits;
        match which {
            Logits::LastRow => &logits[..vocab],
            Logits::AllRows => &logits[..rows * vocab],
        }
    }

    /// Runs the step on a thread of the persistent pool: each GEMM and attention inside then forks
    /// from a pool thread (a few microseconds) instead of entering the pool from outside (tens).
    fn run(
        &mut self,
        x: &mut [f32],
        rows: usize,
        hybrid: &HybridInputs,
        start_slot: usize,
        which: Logits,
    ) -> Result<(), DecoderError> {
        let pool = Arc::clone(self.runtime.pool());
        pool.install(|| self.run_on_pool(x, rows, hybrid, start_slot, which))
    }

    /// The decoder over `rows` rows already embedded in `x`. The KV cache advances only on success.
    fn run_on_pool(
        &mut self,
        x: &mut [f32],
        rows: usize,
        hybrid: &HybridInputs,
        start_slot: usize,
        which: Logits,
    ) -> Result<(), DecoderError> {
        let cap = self.kv.capacity();
        if start_slot != self.kv.len() {
            return Err(DecoderError::NotNextSlot {
                slot: start_slot,
                next: self.kv.len(),
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
        let hidden = self.sem.hidden_size;
        let half = self.sem.head_dim / 2;
        let ablation = self.options.ablation;
        let x = &mut x[..rows * hidden];
        self.trace.clear();
        self.state.routes_trace.clear();
        let step = Step {
            pack: &self.pack,
            runtime: &self.runtime,
            pool: self.runtime.pool(),
            rows,
            start_slot,
            hidden,
            intermediate: self.sem.intermediate_size,
            eps: self.eps,
            shape: self.shape,
            ablation,
        };
        let st = &mut self.state;
        // cos/sin of every row, shared by all layers.
        let s = &mut st.scratch;
        grow(&mut s.cos, rows * half);
        grow(&mut s.sin, rows * half);
        for r in 0..rows {
            let pos = hybrid.position(r, rows);
            self.rotary.cos_sin(
                pos,
                &mut s.cos[r * half..(r + 1) * half],
                &mut s.sin[r * half..(r + 1) * half],
            );
        }
        for (l, layer) in self.layers.iter().enumerate() {
            if ablation.deepstack_before_layer {
                add_deepstack(x, hybrid, l, hidden, ablation.deepstack_every_row);
            }
            layer.forward(l, &step, &mut self.kv, st, x)?;
            // DeepStack after the layer, one path for dense and sparse layers alike.
            let skip = layer.is_sparse() && ablation.deepstack_skip_sparse_layers;
            if !ablation.deepstack_before_layer && !skip {
                add_deepstack(x, hybrid, l, hidden, ablation.deepstack_every_row);
            }
            if self.options.trace_layers {
                self.trace.push(x.to_vec());
            }
        }
        // Final norm and head, on the rows whose logits are wanted.
        let first = match which {
            Logits::LastRow => rows - 1,
            Logits::AllRows => 0,
        };
        let out_rows = rows - first;
        let s = &mut st.scratch;
        let w_final = self.pack.norm_at(self.final_norm);
        let xn = grow(&mut s.xn, out_rows * hidden);
        for (xr, nr) in x[first * hidden..]
            .chunks_exact(hidden)
            .zip(xn.chunks_exact_mut(hidden))
        {
            rmsnorm(xr, w_final, self.eps, nr);
        }
        let vocab = self.sem.vocab_size;
        self.runtime.gemm(
            &self.pack,
            self.head,
            &s.xn[..out_rows * hidden],
            out_rows,
            grow(&mut s.logits, out_rows * vocab),
        )?;
        self.kv.commit(start_slot + rows);
        Ok(())
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
