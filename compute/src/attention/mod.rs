//! Attention as a tiled kernel (flash-attention style): query rows against tiles of
//! [`KEY_TILE`] keys with an online softmax, so no row ever holds all its scores.
//!
//! The arithmetic of one query row and head over its `len` keys is fixed, whatever the rows of the
//! call, the block or thread that takes the row, and the CPU path (`oracle.rs` writes it out, every
//! SIMD path is tested bit-equal to it). Key tile t covers keys `[t·KEY_TILE, (t + 1)·KEY_TILE)` of
//! the row's segment; the part of the last tile past `len` is absent. Per tile, from m = −∞, l = 0
//! (in [`SUM_LANES`] lanes), o = 0:
//! - `s_j = dot(q, k_j)`, the dot `acc = fma(q_c, k_jc, acc)` for c ascending from 0 (unscaled);
//! - `m' = max(m, max_j s_j)`; with `c = scale·log2(e)` ([`HeadShape::log2e_scale`], rounded once
//!   from f64) and `μ = m'·c`: `α = pow2(fma(m, c, −μ))` ([`oracle::pow2`], as every exponential
//!   here; 1 without a pow2 when `m' = m`, the value `2^0` has);
//! - `p_j = pow2(fma(s_j, c, −μ))` (the bf16 variant rounds it to bf16 for `p · V`): about 10
//!   vector operations per 16 keys where `mathf::exp` of the scaled, shifted score took about 27;
//! - `l[i] = l[i]·α + p_i + p_{i+16} + p_{i+32} + p_{i+48}` (lane i of the running sum, the tile's
//!   keys i, i + 16, ... in order);
//! - `o_c = fma(p_j, v_jc, … fma(p_0, v_0c, o_c·α))` over the tile's keys j ascending;
//!
//! then `out_c = o_c · (1 / Σ_i l[i])`, the lanes summed 0 to 15.
//!
//! Paths: portable (any CPU, the oracle itself), AVX2 + FMA (ymm) and AVX-512 F (zmm): keys along
//! the lanes for the scores (K transposed per tile by the caller's packing), value columns along
//! the lanes for `p · V`, register tiles of a few query rows.
//!
//! Masks: [`segments`] (every row of a segment attends all rows of it: the vision tower's images,
//! transformers' `cu_seqlens`) and [`causal`] (a row attends the cache slots up to its own, over
//! the decoder's KV cache, f32 or bf16 read in place, the tiles at absolute slots: prefill, decode,
//! draft windows and sequences side by side on the same bits).

// Every unsafe operation inside an `unsafe fn` sits in an `unsafe` block with a `// SAFETY:` reason.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bf16;
pub mod causal;
pub mod oracle;
pub mod segments;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

/// Keys one tile holds: at d = 64 a tile's K and V are 16 KB each, in L1 while a block of query
/// rows uses them.
pub const KEY_TILE: usize = 64;

/// Lanes of the running softmax sum `l` (one zmm; two ymm on AVX2).
pub const SUM_LANES: usize = 16;

/// Value columns are padded to a multiple of this (one zmm) in the packed values and the
/// running outputs, so the `p · V` loops need no column tail.
pub const COLUMN_PAD: usize = 16;

/// The head dim rounded up to [`COLUMN_PAD`].
pub fn padded_dim(d: usize) -> usize {
    d.div_ceil(COLUMN_PAD) * COLUMN_PAD
}

/// A value the f32 tile kernels read K and V as: f32, or bf16 widened exactly in registers (its
/// bits the top half of an f32), so a bf16 cache's tiles are read in place at half the bytes.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn widen(self) -> f32;
    /// `V::LANES` values from `p`, widened.
    ///
    /// # Safety
    /// `V`'s CPU features; `p` readable for `V::LANES` values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load<V: x86::Vf>(p: *const Self) -> V;
}

impl Elem for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load<V: x86::Vf>(p: *const f32) -> V {
        // SAFETY: the features and the readable floats are this function's contract.
        unsafe { V::load(p) }
    }
}

impl Elem for half::bf16 {
    /// The bf16's bits as the top half of an f32 (exact; `half`'s `to_f32` also quiets a
    /// signalling NaN, a select in the loops that read a tile).
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load<V: x86::Vf>(p: *const half::bf16) -> V {
        // SAFETY: the features and the readable values are this function's contract.
        unsafe { V::load_bf16(p) }
    }
}

/// A path the attention kernels run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnPath {
    /// Portable Rust: the oracle (`oracle.rs`), any CPU.
    Scalar,
    /// AVX2 + FMA, 8-lane ymm.
    Avx2,
    /// AVX-512 F, 16-lane zmm.
    Avx512,
}

impl AttnPath {
    /// Fastest first.
    pub const ALL: [AttnPath; 3] = [AttnPath::Avx512, AttnPath::Avx2, AttnPath::Scalar];

    pub fn name(self) -> &'static str {
        match self {
            AttnPath::Scalar => "scalar",
            AttnPath::Avx2 => "avx2",
            AttnPath::Avx512 => "avx512",
        }
    }

    /// Whether this CPU runs the path.
    pub fn is_available(self) -> bool {
        match self {
            AttnPath::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            AttnPath::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            AttnPath::Avx512 => {
                AttnPath::Avx2.is_available() && is_x86_feature_detected!("avx512f")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest path this CPU runs (decided once). `XDNA_VL_KERNELS=avx2` or `scalar`
    /// ([`crate::kernels::KERNELS_ENV`]) caps it, as it caps the GEMM kernels: every path gives
    /// the same bits, so it only changes speed.
    pub fn best() -> AttnPath {
        static BEST: OnceLock<AttnPath> = OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = match std::env::var(crate::kernels::KERNELS_ENV).as_deref() {
                Ok("scalar") => AttnPath::Scalar,
                Ok("avx2") => AttnPath::Avx2,
                _ => AttnPath::Avx512,
            };
            let rank = |p: AttnPath| AttnPath::ALL.iter().position(|&q| q == p);
            AttnPath::ALL
                .into_iter()
                .filter(|&p| rank(p) >= rank(cap))
                .find(|p| p.is_available())
                .unwrap_or(AttnPath::Scalar)
        })
    }
}

impl std::fmt::Display for AttnPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One head's keys and values over one segment, packed for the kernels.
#[derive(Clone, Copy, Debug)]
pub struct PackedKv<'a> {
    /// `len.div_ceil(KEY_TILE)` tiles of `[d][KEY_TILE]`: key j of a tile in column j, the keys
    /// past `len` zero.
    pub kt: &'a [f32],
    /// `len` rows of `dp` values (the first `d` the value's; the rest are never read into
    /// an output column below `d`).
    pub v: &'a [f32],
    pub len: usize,
}

/// A block of query rows of one head, all attending the same `kv`: the rows' queries (`d` values
/// from `q[r·q_stride]`) and where each row's `d` outputs go (`out[r·out_stride]`).
pub struct QueryBlock<'a> {
    pub q: &'a [f32],
    pub q_stride: usize,
    pub rows: usize,
    pub out: &'a mut [f32],
    pub out_stride: usize,
}

/// The shape every block of a call shares.
#[derive(Clone, Copy, Debug)]
pub struct HeadShape {
    /// The head dim.
    pub d: usize,
    /// `scale` of the scores (transformers' `head_dim^−½`).
    pub scale: f32,
    /// `scale · log2(e)` rounded once (from f64): the bf16 variant's exponents are
    /// `s·scale·log2(e)`, its `exp` a power of 2 (`oracle::pow2`).
    pub log2e_scale: f32,
}

impl HeadShape {
    pub fn new(d: usize) -> HeadShape {
        HeadShape {
            d,
            scale: (d as f32).powf(-0.5),
            log2e_scale: ((d as f64).powf(-0.5) * std::f64::consts::LOG2_E) as f32,
        }
    }
    fn dp(&self) -> usize {
        padded_dim(self.d)
    }
}

/// Per-thread running state of a block: `m` (a row), `l` ([`SUM_LANES`] a row), `o` (`dp` a
/// row) and one register tile's probabilities.
#[derive(Default)]
pub(crate) struct BlockState {
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
    p: Vec<f32>,
    /// The bf16 variant's queries (a block) and probabilities (a register tile).
    qb: Vec<half::bf16>,
    pb: Vec<half::bf16>,
}

impl BlockState {
    fn reset(&mut self, rows: usize, dp: usize) {
        let grow = |v: &mut Vec<f32>, n: usize, x: f32| {
            v.clear();
            v.resize(n, x);
        };
        grow(&mut self.m, rows, f32::NEG_INFINITY);
        grow(&mut self.l, rows * SUM_LANES, 0.0);
        grow(&mut self.o, rows * dp, 0.0);
        if self.p.len() < MAX_TILE_ROWS * KEY_TILE {
            self.p.resize(MAX_TILE_ROWS * KEY_TILE, 0.0);
        }
    }
}

/// Query rows of the SIMD paths' register tiles.
pub(crate) const MAX_TILE_ROWS: usize = 4;

/// What the products read: f32 operands (the f32 variant), or bf16 ones with f32 sums
/// (`bf16.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operands {
    F32,
    Bf16,
}

impl Operands {
    /// Whether this CPU runs the operands' SIMD path (else their oracle runs).
    pub fn has_simd(self) -> bool {
        match self {
            Operands::F32 => AttnPath::best() != AttnPath::Scalar,
            Operands::Bf16 => {
                crate::kernels::bf16_dot::has_avx512_bf16() && AttnPath::Avx512.is_available()
            }
        }
    }
}

/// Testing hooks of a call: a planted mistake for the controls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Planted {
    /// The SIMD block loop skips this key tile.
    pub skip_tile: Option<usize>,
    /// The segment kernels' last key tile, when partial, is read one key short (an off-by-one
    /// mask).
    pub short_last_tile: bool,
}

impl Planted {
    /// The keys of a tile of `w` the SIMD segment kernels read.
    pub(crate) fn keys(self, w: usize) -> usize {
        if self.short_last_tile && (2..KEY_TILE).contains(&w) {
            w - 1
        } else {
            w
        }
    }
}

/// The rows of `block` against `kv` on `path`, into the block's outputs.
pub(crate) fn attend_block(
    path: AttnPath,
    shape: HeadShape,
    kv: PackedKv<'_>,
    block: QueryBlock<'_>,
    state: &mut BlockState,
    planted: Planted,
) {
    let (d, dp) = (shape.d, shape.dp());
    let tiles = kv.len.div_ceil(KEY_TILE);
    assert!(
        kv.kt.len() >= tiles * d * KEY_TILE && kv.v.len() >= kv.len * dp,
        "attention: packed keys {} / values {} for {} keys of d {d}",
        kv.kt.len(),
        kv.v.len(),
        kv.len
    );
    if block.rows == 0 {
        return;
    }
    block.check(d);
    match path {
        #[cfg(target_arch = "x86_64")]
        AttnPath::Avx2 | AttnPath::Avx512 if path.is_available() => {
            state.reset(block.rows, dp);
            // SAFETY: the CPU runs the path (checked just above); the packed keys and values and
            // the block's queries were checked against `d`, `dp`, `len` and `rows` above, and the
            // state was sized for them.
            unsafe { x86::attend_block(path, shape, kv, &block, state, planted) };
            finish(shape, block, state);
        }
        _ => {
            for r in 0..block.rows {
                let q = &block.q[r * block.q_stride..][..d];
                let out = &mut block.out[r * block.out_stride..][..d];
                oracle::attend_row(shape, q, kv, out);
            }
        }
    }
}

/// The bf16 variant of [`attend_block`]: the AVX-512 BF16 path when `path` is
/// [`AttnPath::Avx512`] and the CPU has the instructions, else the oracle.
pub(crate) fn attend_block_bf16(
    path: AttnPath,
    shape: HeadShape,
    kv: bf16::PackedKvBf16<'_>,
    block: QueryBlock<'_>,
    state: &mut BlockState,
    planted: Planted,
) {
    let d = shape.d;
    let (kt_tile, v_tile) = bf16::tile_sizes(d);
    let tiles = kv.len.div_ceil(KEY_TILE);
    assert!(
        d.is_multiple_of(2) && kv.kt.len() >= tiles * kt_tile && kv.v.len() >= tiles * v_tile,
        "bf16 attention: packed keys {} / values {} for {} keys of d {d}",
        kv.kt.len(),
        kv.v.len(),
        kv.len
    );
    if block.rows == 0 {
        return;
    }
    block.check(d);
    #[cfg(target_arch = "x86_64")]
    if path == AttnPath::Avx512 && Operands::Bf16.has_simd() {
        state.reset(block.rows, shape.dp());
        // SAFETY: the CPU has AVX-512 F, BW, BF16, AVX2 and FMA (checked just above); the packed
        // tiles, the block's queries and d were checked above; the state was reset for the rows.
        unsafe { bf16::x86::attend_block(shape, kv, &block, state, planted) };
        finish(shape, block, state);
        return;
    }
    let _ = (path, &state, planted);
    for r in 0..block.rows {
        let q = &block.q[r * block.q_stride..][..d];
        let out = &mut block.out[r * block.out_stride..][..d];
        bf16::attend_row(shape, q, kv, out);
    }
}

impl QueryBlock<'_> {
    /// Panics unless every one of the block's (at least one) rows has `d` queries and `d`
    /// outputs at its stride.
    fn check(&self, d: usize) {
        assert!(
            self.q.len() >= (self.rows - 1) * self.q_stride + d
                && self.out.len() >= (self.rows - 1) * self.out_stride + d,
            "attention: a block of {} rows of d {d}: q holds {} (stride {}), out {} (stride {})",
            self.rows,
            self.q.len(),
            self.q_stride,
            self.out.len(),
            self.out_stride
        );
    }
}

/// `out_c = o_c · (1 / Σ_i l[i])` for every row of the block, the lanes summed 0 to 15.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn finish(shape: HeadShape, block: QueryBlock<'_>, state: &BlockState) {
    let (d, dp) = (shape.d, shape.dp());
    for r in 0..block.rows {
        let inv = 1.0 / oracle::sum_lanes(&state.l[r * SUM_LANES..][..SUM_LANES]);
        let o = &state.o[r * dp..][..d];
        for (y, &x) in block.out[r * block.out_stride..][..d].iter_mut().zip(o) {
            *y = x * inv;
        }
    }
}
