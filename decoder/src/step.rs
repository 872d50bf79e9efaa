//! What one step's layers read ([`Step`]) and write besides the rows ([`StepState`]): the seam
//! between the decoder loop and a family's layers.

use compute::timing::TimeSpent;
use compute::{HostGemm, Runtime};
use packs::Pack;

use crate::attention::AttnShape;
use crate::hybrid::HybridInputs;
use crate::options::Ablation;
use crate::qwen3_vl::moe::{MoeScratch, Routing};

/// Reusable activations: grown to the largest batch seen, never reallocated per step after that.
#[derive(Default)]
pub struct Scratch {
    pub x: Vec<f32>,
    pub xn: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub attn: Vec<f32>,
    pub proj: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// Router logits of a sparse layer (rows x experts).
    pub router: Vec<f32>,
    /// Qwen3.5-MoE's shared expert output (rows x hidden) and its gate logits (rows).
    pub shared: Vec<f32>,
    pub shared_gate: Vec<f32>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub logits: Vec<f32>,
}

/// What the layers of a step write besides the rows: scratch, the MoE router's state, timings.
pub struct StepState {
    pub scratch: Scratch,
    /// The routing rule and the host GEMM of the sparse layers' routers (f32 on the host whatever
    /// the backend: their logits choose experts).
    pub routing: Option<Routing>,
    pub router_gemm: Option<HostGemm>,
    pub moe: MoeScratch,
    pub trace_routes: bool,
    /// Per sparse layer of the last step (when tracing): the experts of every row.
    pub routes_trace: Vec<Vec<usize>>,
    /// Attention over the cache (the K/V writes included).
    pub attention_time: TimeSpent,
    /// Qwen3.5's Gated DeltaNet mixers outside their GEMMs (conv, norms, the delta rule).
    pub delta_net_time: TimeSpent,
}

/// One sequence's rows within a step: rows `row0..row0 + rows` of the step, at its cache slots
/// `start_slot..` (the sequence's cache is the step's cache of the same index).
pub struct Segment<'a> {
    pub row0: usize,
    pub rows: usize,
    pub start_slot: usize,
    pub hybrid: &'a HybridInputs,
}

impl Segment<'_> {
    /// The segment's part of a `rows x width` buffer.
    pub fn of<'b>(&self, x: &'b [f32], width: usize) -> &'b [f32] {
        &x[self.row0 * width..(self.row0 + self.rows) * width]
    }
}

/// What every layer of one step reads.
pub struct Step<'a> {
    pub pack: &'a Pack,
    pub runtime: &'a Runtime,
    pub pool: &'a rayon::ThreadPool,
    /// Rows of all sequences, one after another.
    pub rows: usize,
    pub segments: &'a [Segment<'a>],
    pub hidden: usize,
    pub intermediate: usize,
    pub eps: f32,
    pub shape: AttnShape,
    /// Values rotated at the front of each head (all of head_dim but in Qwen3.5); the step's
    /// cos/sin tables hold `rotary_dim / 2` per row.
    pub rotary_dim: usize,
    pub ablation: Ablation,
}
