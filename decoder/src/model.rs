//! `Forward`: the Qwen3-VL text decoder, one clear pass per step.

use crate::attention::{attend_rows_parallel, AttnShape};
use crate::backend::{BackendError, GemmBackend, WeightRef};
use crate::device::{AbGemm, DeviceConfig, DeviceGemm};
use crate::host::HostGemm;
use crate::hybrid::HybridInputs;
use crate::kv::{KvCache, KvData, KvDtype, KvElem, KvStore};
use crate::moe::{self, MoeScratch, MoeStats, Routing};
use crate::norm::{rmsnorm, rmsnorm_inplace};
use crate::rope::{rotate_half, RopeLayout, Rotary};
use packs::moe::ExpertProj;
use packs::names::{self, Norm, Proj};
use packs::{Embedding, LinearIndex, NormIndex, Pack, PackError, Semantics};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cache slot {slot} refused: the next free slot is {next} (capacity {capacity}); call reset() or truncate() to rewind")]
    NotNextSlot {
        slot: usize,
        next: usize,
        capacity: usize,
    },
    #[error("{rows} rows from cache slot {start} need {needed} slots, the KV cache holds {capacity} (raise the context capacity)")]
    OverCapacity {
        rows: usize,
        start: usize,
        needed: usize,
        capacity: usize,
    },
    #[error("token id {token} at row {row} is outside the vocabulary (0..{vocab})")]
    TokenOutOfVocab {
        token: u32,
        row: usize,
        vocab: usize,
    },
    #[error("invalid hybrid inputs: {0}")]
    Hybrid(String),
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Pack(#[from] PackError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Which rows' logits a step returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Logits {
    #[default]
    LastRow,
    AllRows,
}

/// Deliberate mistakes, for controls: tests and probes show that the checks catch each one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ablation {
    /// Use this rotary layout instead of the pack's.
    pub rope_layout: Option<RopeLayout>,
    /// Add DeepStack set l before decoder layer l instead of after it.
    pub deepstack_before_layer: bool,
    /// Add DeepStack to every prompt row (row r takes set row r % image_rows), not only image rows.
    pub deepstack_every_row: bool,
    /// Leave DeepStack out after the sparse (MoE) layers.
    pub deepstack_skip_sparse_layers: bool,
    /// Keep the raw softmax weights of the top-k experts where the pack asks for renormalization.
    pub moe_skip_renormalize: bool,
    /// Run every expert with its gate and up projections swapped.
    pub moe_swap_gate_up: bool,
    /// Break routing ties by the lower expert index instead of torch.topk's order.
    pub moe_ties_lower_index: bool,
}

#[derive(Clone, Debug)]
pub struct ForwardOptions {
    /// KV cache slots (the longest prompt + generation).
    pub capacity: usize,
    /// Threads of the persistent pool (GEMMs and attention).
    pub threads: usize,
    pub kv_dtype: KvDtype,
    /// Keep every layer's output hidden states (for per-layer comparison with a reference).
    pub trace_layers: bool,
    pub ablation: Ablation,
}

impl Default for ForwardOptions {
    fn default() -> Self {
        ForwardOptions {
            capacity: 2048,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kv_dtype: KvDtype::F32,
            trace_layers: false,
            ablation: Ablation::default(),
        }
    }
}

/// The GEMM backend a forward runs its projections on.
pub enum BackendChoice {
    Host,
    /// Every projection on the NPU runtime.
    Device(DeviceConfig),
    /// Host and device, compared GEMM by GEMM (the host's result is used).
    Ab(DeviceConfig),
    Custom(Box<dyn GemmBackend>),
}

/// Reusable activations: grown to the largest batch seen, never reallocated per step after that.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Router logits of a sparse layer (rows x experts).
    router: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    logits: Vec<f32>,
}

fn grow(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

pub struct Forward {
    pack: Arc<Pack>,
    sem: Semantics,
    rotary: Rotary,
    shape: AttnShape,
    eps: f32,
    backend: Box<dyn GemmBackend>,
    pool: Arc<rayon::ThreadPool>,
    kv: KvCache,
    /// Linear weights, resolved once in the pack's table, the head last. Layer l's start at
    /// `layer_base[l]`: q, k, v, o, then gate, up, down (dense) or each expert's gate, up, down
    /// (sparse), so a dense pack's ids are layer * 7 + proj.
    linears: Vec<LinearIndex>,
    layer_base: Vec<usize>,
    /// Each sparse layer's router (f32), run on the host backend whatever `backend` is.
    routers: Vec<Option<LinearIndex>>,
    router_gemm: Option<HostGemm>,
    routing: Option<Routing>,
    moe_scratch: MoeScratch,
    /// Norm weights per layer, resolved once: input, post-attention, q, k.
    norms: Vec<[NormIndex; 4]>,
    final_norm: NormIndex,
    scratch: Scratch,
    options: ForwardOptions,
    trace: Vec<Vec<f32>>,
    /// Per sparse layer of the last step (when tracing): the experts of every row.
    routes_trace: Vec<Vec<usize>>,
    /// Wall time spent in attention (cache writes included) since [`Forward::take_attention_time`].
    attention_time: Duration,
}

const PROJS: [Proj; 7] = Proj::ALL;

impl Forward {
    pub fn new(
        pack: &Arc<Pack>,
        backend: BackendChoice,
        options: ForwardOptions,
    ) -> Result<Forward, ForwardError> {
        let sem = pack.semantics().clone();
        if options.capacity == 0 {
            return Err(ForwardError::Options(
                "context capacity must be at least 1 slot".into(),
            ));
        }
        if options.threads == 0 {
            return Err(ForwardError::Options("threads must be at least 1".into()));
        }
        let pool =
            compute::new_pool(options.threads).map_err(|e| ForwardError::Options(e.to_string()))?;
        let mut backend: Box<dyn GemmBackend> = match backend {
            BackendChoice::Host => Box::new(HostGemm::new(pool.clone())),
            BackendChoice::Device(config) => Box::new(DeviceGemm::open(&config)?),
            BackendChoice::Ab(config) => Box::new(AbGemm::new(
                HostGemm::new(pool.clone()),
                DeviceGemm::open(&config)?,
            )),
            BackendChoice::Custom(b) => b,
        };
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
        // Resolve every weight now, once: a broken pack fails here by name, not mid-step, and a
        // step looks no layer weight up by name (those lookups, a String each for the scales'
        // names, were ~0.2 ms of a 2B decode step).
        let mut linears = Vec::with_capacity(sem.num_layers * 7);
        let mut layer_base = Vec::with_capacity(sem.num_layers);
        let mut routers = Vec::with_capacity(sem.num_layers);
        let mut norms = Vec::with_capacity(sem.num_layers);
        for l in 0..sem.num_layers {
            layer_base.push(linears.len());
            match sem.moe.as_ref().filter(|_| sem.is_sparse(l)) {
                None => {
                    for p in PROJS {
                        linears.push(pack.linear_index(&names::proj(l, p))?);
                    }
                    routers.push(None);
                }
                Some(m) => {
                    for p in &PROJS[..4] {
                        linears.push(pack.linear_index(&names::proj(l, *p))?);
                    }
                    for e in 0..m.num_experts {
                        for p in ExpertProj::ALL {
                            linears.push(pack.linear_index(&packs::moe::expert(l, e, p))?);
                        }
                    }
                    routers.push(Some(pack.linear_index(&packs::moe::router(l))?));
                }
            }
            norms.push([
                pack.norm_index(&names::norm(l, Norm::Input))?,
                pack.norm_index(&names::norm(l, Norm::PostAttention))?,
                pack.norm_index(&names::norm(l, Norm::QNorm))?,
                pack.norm_index(&names::norm(l, Norm::KNorm))?,
            ]);
        }
        let final_norm = pack.norm_index(names::FINAL_NORM)?;
        let refs: Vec<WeightRef<'_>> = (0..=linears.len())
            .map(|id| weight_ref(pack, &linears, id))
            .collect();
        backend.prepare(&refs)?;
        drop(refs);
        let routing = sem.moe.as_ref().map(|m| Routing {
            num_experts: m.num_experts,
            top_k: m.top_k,
            renormalize: m.norm_topk_prob && !options.ablation.moe_skip_renormalize,
            ties_lower_index: options.ablation.moe_ties_lower_index,
        });
        let router_gemm = routing.map(|_| HostGemm::new(pool.clone()));
        let kv = KvCache::new(
            options.kv_dtype,
            sem.num_layers,
            options.capacity,
            shape.kv_heads,
            shape.head_dim,
        );
        Ok(Forward {
            pack: pack.clone(),
            eps: sem.rms_norm_eps as f32,
            sem,
            rotary,
            shape,
            backend,
            pool,
            kv,
            linears,
            layer_base,
            routers,
            router_gemm,
            routing,
            moe_scratch: MoeScratch::default(),
            norms,
            final_norm,
            scratch: Scratch::default(),
            options,
            trace: Vec::new(),
            routes_trace: Vec::new(),
            attention_time: Duration::ZERO,
        })
    }

    pub fn semantics(&self) -> &Semantics {
        &self.sem
    }
    pub fn pack(&self) -> &Arc<Pack> {
        &self.pack
    }
    /// The rotary tables the forward rotates q and k with (probes check its angles).
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
    /// How many backend weight ids the decoder uses (`0..weight_ids()`: the layers' projections,
    /// then the head). Another model part sharing the backend (the vision tower) prepares its
    /// weights under ids from here on.
    pub fn weight_ids(&self) -> usize {
        self.linears.len() + 1
    }
    /// The persistent pool the forward's GEMMs and attention fork on (the vision tower runs on it too).
    pub fn pool(&self) -> &Arc<rayon::ThreadPool> {
        &self.pool
    }
    pub fn backend(&self) -> &dyn GemmBackend {
        self.backend.as_ref()
    }
    pub fn backend_mut(&mut self) -> &mut dyn GemmBackend {
        self.backend.as_mut()
    }
    /// Wall time the steps since the last call spent in attention over the cache (the K/V writes
    /// included), and restarts the count: with the backend's GEMM time it splits a step into GEMMs,
    /// attention and the rest (`bench` reports the three).
    pub fn take_attention_time(&mut self) -> Duration {
        std::mem::take(&mut self.attention_time)
    }
    /// Expert runs and routed rows of the sparse layers since the last call, and restarts the
    /// count (`bench` turns them into bytes read per token).
    pub fn take_moe_stats(&mut self) -> MoeStats {
        std::mem::take(&mut self.moe_scratch.stats)
    }
    /// The experts each row of the last step's sparse layer `layer` was routed to, when tracing
    /// is on: `rows x top_k`, in top-k order.
    pub fn routes_trace(&self) -> &[Vec<usize>] {
        &self.routes_trace
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
    ) -> Result<&[f32], ForwardError> {
        self.step_batch(&[token], rotary_pos, cache_slot, Logits::LastRow)
    }

    /// A text prompt: row i at rotary position `start_pos + i` and cache slot `start_slot + i`.
    pub fn step_batch(
        &mut self,
        tokens: &[u32],
        start_pos: i64,
        start_slot: usize,
        logits: Logits,
    ) -> Result<&[f32], ForwardError> {
        let hidden = self.sem.hidden_size;
        let rows = tokens.len();
        if rows == 0 {
            return Err(ForwardError::Options(
                "step_batch needs at least one token".into(),
            ));
        }
        for (row, &token) in tokens.iter().enumerate() {
            if token as usize >= self.sem.vocab_size {
                return Err(ForwardError::TokenOutOfVocab {
                    token,
                    row,
                    vocab: self.sem.vocab_size,
                });
            }
        }
        let mut x = std::mem::take(&mut self.scratch.x);
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
        self.scratch.x = x;
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
    ) -> Result<&[f32], ForwardError> {
        let hidden = self.sem.hidden_size;
        if rows_embeds.is_empty() || !rows_embeds.len().is_multiple_of(hidden) {
            return Err(ForwardError::Hybrid(format!(
                "row embeddings hold {} values, not a positive multiple of hidden size {hidden}",
                rows_embeds.len()
            )));
        }
        let rows = rows_embeds.len() / hidden;
        self.check_hybrid(hybrid, rows)?;
        // A NaN row would decode garbage with no error: refuse it here, where every front end passes.
        if let Some(i) = packs::first_non_finite(rows_embeds) {
            return Err(ForwardError::Hybrid(format!(
                "row embeddings hold {} at row {}, column {}: every row must be finite",
                rows_embeds[i],
                i / hidden,
                i % hidden
            )));
        }
        if let Some(i) = packs::first_non_finite(&hybrid.deepstack) {
            let per_set = (hybrid.image_rows.len() * hidden).max(1);
            return Err(ForwardError::Hybrid(format!(
                "DeepStack holds {} at set {}, image row {}, column {}: every set must be finite",
                hybrid.deepstack[i],
                i / per_set,
                i % per_set / hidden,
                i % hidden
            )));
        }
        let mut x = std::mem::take(&mut self.scratch.x);
        grow(&mut x, rows * hidden).copy_from_slice(rows_embeds);
        let result = self.run(&mut x, rows, hybrid, start_slot, logits);
        self.scratch.x = x;
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

    fn check_hybrid(&self, h: &HybridInputs, rows: usize) -> Result<(), ForwardError> {
        let bad = |m: String| Err(ForwardError::Hybrid(m));
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
        let n_img = h.image_rows.len();
        let hidden = self.sem.hidden_size;
        if n_img > 0 && h.deepstack_sets != self.sem.deepstack_sets {
            return bad(format!(
                "{} DeepStack sets given, the pack declares {}",
                h.deepstack_sets, self.sem.deepstack_sets
            ));
        }
        if n_img == 0 && !h.deepstack.is_empty() {
            return bad("DeepStack sets given but no image rows".into());
        }
        if h.deepstack.len() != h.deepstack_sets * n_img * hidden {
            let per_set = h.deepstack.len().checked_div(h.deepstack_sets).unwrap_or(0);
            return bad(format!(
                "DeepStack holds {} values: {} sets of {} rows x {hidden} expected (one row per image row); got {} values per set",
                h.deepstack.len(),
                h.deepstack_sets,
                n_img,
                per_set
            ));
        }
        Ok(())
    }

    fn logits_slice(&self, rows: usize, which: Logits) -> &[f32] {
        let vocab = self.sem.vocab_size;
        match which {
            Logits::LastRow => &self.scratch.logits[..vocab],
            Logits::AllRows => &self.scratch.logits[..rows * vocab],
        }
    }

    fn gemm(
        &mut self,
        id: usize,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), ForwardError> {
        self.gemm_group([id], x, rows, [y])
    }

    /// Weights `ids` applied to the same input: `ys[i] = x · W[ids[i]]ᵀ` (one device launch batch).
    fn gemm_group<const N: usize>(
        &mut self,
        ids: [usize; N],
        x: &[f32],
        rows: usize,
        mut ys: [&mut [f32]; N],
    ) -> Result<(), ForwardError> {
        let refs = ids.map(|id| weight_ref(&self.pack, &self.linears, id));
        self.backend.gemm_group(&refs, x, rows, &mut ys)?;
        Ok(())
    }

    /// The MoE MLP of sparse layer `layer` on the normalized rows `xn`, into `s.proj`: the router
    /// on the host in f32, then each chosen expert's gate/up/down on the backend, once per batch
    /// (`crate::moe`).
    fn sparse_mlp(
        &mut self,
        layer: usize,
        xn: &[f32],
        rows: usize,
        s: &mut Scratch,
    ) -> Result<(), ForwardError> {
        let (Some(rule), Some(router), Some(router_gemm)) =
            (self.routing, self.routers[layer], self.router_gemm.as_mut())
        else {
            unreachable!("a sparse layer has a router and routing rule (set in Forward::new)")
        };
        let hidden = self.sem.hidden_size;
        let inter = self.sem.moe.as_ref().map_or(0, |m| m.moe_intermediate_size);
        let logits = grow(&mut s.router, rows * rule.num_experts);
        let router = WeightRef {
            id: 0,
            linear: self.pack.linear_at(router),
        };
        router_gemm.gemm(&router, xn, rows, logits)?;
        let mut scratch = std::mem::take(&mut self.moe_scratch);
        moe::route(
            &s.router[..rows * rule.num_experts],
            rows,
            rule,
            &mut scratch,
        );
        if self.options.trace_layers {
            self.routes_trace.push(scratch.routes.experts.clone());
        }
        let base = self.layer_base[layer] + 4;
        let swap = self.options.ablation.moe_swap_gate_up;
        let pool = Arc::clone(&self.pool);
        let (gate, up) = (&mut s.gate, &mut s.up);
        let result = moe::sparse_mlp(
            xn,
            rows,
            hidden,
            rule,
            &mut scratch,
            grow(&mut s.proj, rows * hidden),
            |e, x, m, y| {
                let id = base + 3 * e;
                let (g, u) = if swap { (id + 1, id) } else { (id, id + 1) };
                self.gemm_group([g, u], x, m, [grow(gate, m * inter), grow(up, m * inter)])?;
                let up = &up[..m * inter];
                for_rows(&pool, &mut gate[..m * inter], inter, |r, g| {
                    crate::mathf::silu_mul(g, &up[r * inter..(r + 1) * inter])
                });
                self.gemm(id + 2, &gate[..m * inter], m, y)
            },
        );
        self.moe_scratch = scratch;
        result
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
    ) -> Result<(), ForwardError> {
        let pool = Arc::clone(&self.pool);
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
    ) -> Result<(), ForwardError> {
        let cap = self.kv.capacity();
        if start_slot != self.kv.len() {
            return Err(ForwardError::NotNextSlot {
                slot: start_slot,
                next: self.kv.len(),
                capacity: cap,
            });
        }
        if start_slot + rows > cap {
            return Err(ForwardError::OverCapacity {
                rows,
                start: start_slot,
                needed: start_slot + rows,
                capacity: cap,
            });
        }
        let sem = self.sem.clone();
        let (hidden, inter, d) = (sem.hidden_size, sem.intermediate_size, sem.head_dim);
        let (q_dim, kv_dim) = (self.shape.q_dim(), self.shape.kv_dim());
        let half = d / 2;
        let eps = self.eps;
        let ablation = self.options.ablation;
        let x = &mut x[..rows * hidden];
        self.trace.clear();
        self.routes_trace.clear();
        let pack = Arc::clone(&self.pack);
        let pool = Arc::clone(&self.pool);

        let mut s = std::mem::take(&mut self.scratch);
        // cos/sin of every row, shared by all layers.
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
        let result = (|| -> Result<(), ForwardError> {
            for layer in 0..sem.num_layers {
                if ablation.deepstack_before_layer {
                    add_deepstack(x, hybrid, layer, hidden, ablation.deepstack_every_row);
                }
                let [w_in, w_post, w_q, w_k] = self.norms[layer].map(|n| pack.norm_at(n));
                // Attention block.
                let xn = grow(&mut s.xn, rows * hidden);
                for_rows(&pool, xn, hidden, |r, nr| {
                    rmsnorm(&x[r * hidden..(r + 1) * hidden], w_in, eps, nr)
                });
                let id = self.layer_base[layer];
                let xn = &s.xn[..rows * hidden];
                self.gemm_group(
                    [id, id + 1, id + 2],
                    xn,
                    rows,
                    [
                        grow(&mut s.q, rows * q_dim),
                        grow(&mut s.k, rows * kv_dim),
                        grow(&mut s.v, rows * kv_dim),
                    ],
                )?;
                let (cos, sin) = (&s.cos, &s.sin);
                let norm_rotate = |w: &[f32], r: usize, row: &mut [f32]| {
                    let (cos, sin) = (
                        &cos[r * half..(r + 1) * half],
                        &sin[r * half..(r + 1) * half],
                    );
                    for head in row.chunks_exact_mut(d) {
                        rmsnorm_inplace(head, w, eps);
                        rotate_half(head, cos, sin);
                    }
                };
                for_rows(&pool, &mut s.q[..rows * q_dim], q_dim, |r, row| {
                    norm_rotate(w_q, r, row)
                });
                for_rows(&pool, &mut s.k[..rows * kv_dim], kv_dim, |r, row| {
                    norm_rotate(w_k, r, row)
                });
                let attn = grow(&mut s.attn, rows * q_dim);
                let attention_start = Instant::now();
                match &mut self.kv.data {
                    KvData::F32(store) => attend_rows(
                        &self.pool, self.shape, store, layer, start_slot, rows, &s.q, &s.k, &s.v,
                        attn,
                    ),
                    KvData::Bf16(store) => attend_rows(
                        &self.pool, self.shape, store, layer, start_slot, rows, &s.q, &s.k, &s.v,
                        attn,
                    ),
                }
                self.attention_time += attention_start.elapsed();
                self.gemm(
                    id + 3,
                    &s.attn[..rows * q_dim],
                    rows,
                    grow(&mut s.proj, rows * hidden),
                )?;
                add_rows(&pool, x, &s.proj, hidden);
                // MLP block.
                let xn = grow(&mut s.xn, rows * hidden);
                for_rows(&pool, xn, hidden, |r, nr| {
                    rmsnorm(&x[r * hidden..(r + 1) * hidden], w_post, eps, nr)
                });
                let xn = &s.xn[..rows * hidden];
                let sparse = self.routers[layer].is_some();
                if sparse {
                    // The normalized rows are read while the other buffers are written.
                    let xn = std::mem::take(&mut s.xn);
                    let result = self.sparse_mlp(layer, &xn[..rows * hidden], rows, &mut s);
                    s.xn = xn;
                    result?;
                } else {
                    self.gemm_group(
                        [id + 4, id + 5],
                        xn,
                        rows,
                        [
                            grow(&mut s.gate, rows * inter),
                            grow(&mut s.up, rows * inter),
                        ],
                    )?;
                    let up = &s.up;
                    for_rows(&pool, &mut s.gate[..rows * inter], inter, |r, g| {
                        crate::mathf::silu_mul(g, &up[r * inter..(r + 1) * inter])
                    });
                    self.gemm(
                        id + 6,
                        &s.gate[..rows * inter],
                        rows,
                        grow(&mut s.proj, rows * hidden),
                    )?;
                }
                add_rows(&pool, x, &s.proj, hidden);
                // The tail, one path for dense and sparse layers alike: DeepStack after the layer.
                let skip = sparse && ablation.deepstack_skip_sparse_layers;
                if !ablation.deepstack_before_layer && !skip {
                    add_deepstack(x, hybrid, layer, hidden, ablation.deepstack_every_row);
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
            let w_final = pack.norm_at(self.final_norm);
            let xn = grow(&mut s.xn, out_rows * hidden);
            for (xr, nr) in x[first * hidden..]
                .chunks_exact(hidden)
                .zip(xn.chunks_exact_mut(hidden))
            {
                rmsnorm(xr, w_final, eps, nr);
            }
            let head = self.linears.len();
            let vocab = sem.vocab_size;
            self.gemm(
                head,
                &s.xn[..out_rows * hidden],
                out_rows,
                grow(&mut s.logits, out_rows * vocab),
            )?;
            Ok(())
        })();
        self.scratch = s;
        result?;
        self.kv.commit(start_slot + rows);
        Ok(())
    }
}

/// `f(r, row)` for every row of `x` (rows of `width`): on the pool when there are several rows (each
/// row's arithmetic is the same either way), in place for one.
fn for_rows<F>(pool: &rayon::ThreadPool, x: &mut [f32], width: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    if x.len() <= width {
        x.chunks_exact_mut(width.max(1))
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    } else {
        pool.install(|| {
            x.par_chunks_mut(width)
                .enumerate()
                .for_each(|(r, row)| f(r, row))
        });
    }
}

/// The residual: `x += y` over the rows of `x`.
fn add_rows(pool: &rayon::ThreadPool, x: &mut [f32], y: &[f32], width: usize) {
    for_rows(pool, x, width, |r, row| {
        for (a, b) in row.iter_mut().zip(&y[r * width..]) {
            *a += b;
        }
    });
}

/// The weight with table index `id`: a layer projection, or the head (the last id).
fn weight_ref<'p>(pack: &'p Pack, linears: &[LinearIndex], id: usize) -> WeightRef<'p> {
    let linear = match linears.get(id) {
        Some(&at) => pack.linear_at(at),
        None => pack.head(),
    };
    WeightRef { id, linear }
}

/// DeepStack: after layer l (l < sets), set l is added to the image rows, row i of the set to the
/// i-th image row in prompt order.
fn add_deepstack(x: &mut [f32], h: &HybridInputs, layer: usize, hidden: usize, every_row: bool) {
    let n_img = h.image_rows.len();
    if layer >= h.deepstack_sets || n_img == 0 {
        return;
    }
    let set = &h.deepstack[layer * n_img * hidden..(layer + 1) * n_img * hidden];
    if every_row {
        for (r, xr) in x.chunks_exact_mut(hidden).enumerate() {
            let i = r % n_img;
            for (a, b) in xr.iter_mut().zip(&set[i * hidden..(i + 1) * hidden]) {
                *a += b;
            }
        }
        return;
    }
    for (i, &r) in h.image_rows.iter().enumerate() {
        for (a, b) in x[r * hidden..(r + 1) * hidden]
            .iter_mut()
            .zip(&set[i * hidden..(i + 1) * hidden])
        {
            *a += b;
        }
    }
}

/// Writes the rows' K/V at their slots, then attends every row in parallel.
#[allow(clippy::too_many_arguments)]
fn attend_rows<T: KvElem>(
    pool: &rayon::ThreadPool,
    shape: AttnShape,
    store: &mut KvStore<T>,
    layer: usize,
    start_slot: usize,
    rows: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    attn: &mut [f32],
) {
    let kv_dim = shape.kv_dim();
    for r in 0..rows {
        store.write(
            layer,
            start_slot + r,
            &k[r * kv_dim..(r + 1) * kv_dim],
            &v[r * kv_dim..(r + 1) * kv_dim],
        );
    }
    attend_rows_parallel(pool, shape, store.layer(layer), start_slot, rows, q, attn);
}
