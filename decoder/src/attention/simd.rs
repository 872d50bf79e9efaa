//! The AVX2 attention kernels: explicit 8-lane loops for f32 and bf16 caches, built once per head dim
//! the loops unroll over (`D` = 128 for every Qwen3-VL decoder, 64) and once for any other head dim
//! (`D = 0`, the head dim read at run time). Every build does the same operations in the same order
//! per value as the portable path (see [`super::attend_causal`]), so all give the same bits.
//!
//! The inner loops step raw pointers by a constant (no bounds checks or index math per slot); the
//! slices they walk are bounds-checked once per KV head by `k_head`/`v_head`.
//!
//! Safety: every `unsafe fn` here needs the CPU to support AVX2 (they are inlined into
//! `super::attend_avx2`, compiled for AVX2 and FMA). In the contracts, `d` is the head dim the
//! function works with: `D` when `D != 0`, else its `d` argument; "readable for n" means valid for
//! reads of n consecutive elements of the pointer's type (all come from slices, so aligned).

#![deny(unsafe_op_in_unsafe_fn)]
// Index loops mirror the register tiles (query j, slot s, column block c).
#![allow(clippy::needless_range_loop)]

use super::{AttnShape, Block, KvHeads, SLOT_BLOCK, V_SLOT_BLOCK};
use compute::kernels::simd::{bf16x8_to_ps, transpose8};
use half::bf16;
use std::any::TypeId;
use std::arch::x86_64::*;

/// The cache as one of `U` when `T` is `U`.
pub fn cast<'a, T: 'static, U: 'static>(kv: KvHeads<'a, T>) -> Option<KvHeads<'a, U>> {
    let same = |s: &'a [T]| {
        // SAFETY: called only inside `then`'s closure, i.e. when `T` and `U` have the same
        // `TypeId`: they are the same type, so the layout and length carry over.
        unsafe { std::slice::from_raw_parts(s.as_ptr() as *const U, s.len()) }
    };
    (TypeId::of::<T>() == TypeId::of::<U>()).then(|| KvHeads {
        k: same(kv.k),
        v: same(kv.v),
        capacity: kv.capacity,
        head_dim: kv.head_dim,
    })
}

/// A cache element type read 8 at a time as f32.
pub trait Lanes {
    type Elem: Copy;
    /// Whether a load costs vector operations besides the load (bf16's widening): then each K
    /// vector is worth sharing between more queries ([`scores_block`]) and each V vector between
    /// more outputs ([`pv_block`]).
    const WIDENS: bool;
    /// The 8 elements at `p` as f32.
    ///
    /// # Safety
    /// The CPU must support AVX2; `p` must be readable for 8 elements.
    unsafe fn load8(p: *const Self::Elem) -> __m256;
    fn widen(x: Self::Elem) -> f32;
}

pub struct F32Lanes;
impl Lanes for F32Lanes {
    type Elem = f32;
    const WIDENS: bool = false;
    /// # Safety
    /// The CPU must support AVX (the trait asks AVX2); `p` must be readable for 8 floats.
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: AVX and the 8 floats at `p`, as this function requires of its caller.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    fn widen(x: f32) -> f32 {
        x
    }
}

/// bf16 widens by a 16-bit shift (exact; a NaN keeps its payload, where `half` would also set
/// the quiet bit — a cache holding NaN gives NaN either way).
pub struct Bf16Lanes;
impl Lanes for Bf16Lanes {
    type Elem = bf16;
    const WIDENS: bool = true;
    /// # Safety
    /// The trait's: AVX2; `p` must be readable for 8 bf16 values.
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        // SAFETY: `bf16x8_to_ps`'s contract is this one.
        unsafe { bf16x8_to_ps(p) }
    }
    #[inline(always)]
    fn widen(x: bf16) -> f32 {
        x.to_f32()
    }
}

/// Slots ahead of the one being read whose K or V rows are prefetched: the hardware prefetcher
/// alone left each thread at about half the streaming read rate (`bench attention`).
const PREFETCH_SLOTS: usize = 16;

/// Query vectors per score tile and slots per tile: `SCORE_Q x SCORE_S` = 8 dots, one register
/// each, so each K vector loaded (and widened) serves `SCORE_Q` queries.
const SCORE_Q: usize = 4;
const SCORE_S: usize = SLOT_BLOCK / SCORE_Q;
/// Query vectors per score tile for a cache that widens (one slot per tile: 8 dots).
const SCORE_Q_WIDENED: usize = 8;
/// Outputs per value tile and 8-wide column blocks per tile (`PV_H x PV_NV` accumulators): an
/// f32 cache's tiles (its loads are loads only: 4 x 2 read 854 -> 884 ms there) and the pairs a
/// widening cache leaves over; a single output runs `1 x PV_NV`.
const PV_H: usize = 2;
const PV_NV: usize = 4;
/// The same for a cache that widens: each V vector widened once serves 4 outputs, where 2 x 4
/// tiles widened it twice as often (`bench attention --rows 512`, bf16: 6% less time).
const PV_H_WIDENED: usize = 4;
const PV_NV_WIDENED: usize = 2;

/// The head dim: `D` when the kernel is built for one (the loops unroll over a constant), else the
/// run-time `d` (`D == 0`).
#[inline(always)]
fn dim<const D: usize>(d: usize) -> usize {
    if D == 0 {
        d
    } else {
        D
    }
}

/// Prefetches the `bytes` bytes from `p` (a line each); `p` may point past the cache (a prefetch
/// never faults, and `wrapping_add` keeps the address arithmetic defined).
///
/// # Safety
/// None: a prefetch reads nothing, and SSE is part of every x86_64 CPU.
#[inline(always)]
unsafe fn prefetch_bytes(p: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch of any address is defined (it never faults); SSE is baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8) };
    }
}

/// `super::dot` of one slot: lane i accumulates elements i, i+8, ...; lanes summed 0 to 7; the tail.
///
/// # Safety
/// The CPU must support AVX2; `q` must be readable for `d` floats and `k` for `d` elements.
#[inline(always)]
unsafe fn dot<L: Lanes>(q: *const f32, k: *const L::Elem, d: usize) -> f32 {
    let blocks = d / 8;
    // SAFETY: AVX2, which the caller guarantees (`L::load8` asks no more); every read is of an
    // element below `d` of `q` or `k` (`8 * b + 8 <= d`, then `j < d`), as the contract allows;
    // the store writes the 8 floats of `lanes`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for b in 0..blocks {
            let qv = _mm256_loadu_ps(q.add(8 * b));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(qv, L::load8(k.add(8 * b))));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut sum = compute::ops::mathf::sum_lanes(&lanes);
        for j in 8 * blocks..d {
            sum += *q.add(j) * L::widen(*k.add(j));
        }
        sum
    }
}

/// Column block b of every dot of a [`scores_tile`]: `acc[j][s] += q_j[8b..] * k_s[8b..]`.
///
/// # Safety
/// The CPU must support AVX2; `8 * b + 8 <= d`; every `qs[j]` must be readable for `d` floats and
/// `k` for `S` rows of `d` elements.
#[inline(always)]
unsafe fn score_step<L: Lanes, const Q: usize, const S: usize>(
    acc: &mut [[__m256; S]; Q],
    qs: [*const f32; Q],
    k: *const L::Elem,
    d: usize,
    b: usize,
) {
    // SAFETY: AVX2, which the caller guarantees; the loads read elements `8b..8b + 8` of every
    // `qs[j]` and of the K rows `s < S` (at `k + s * d`), inside them as `8 * b + 8 <= d`.
    unsafe {
        let mut kv = [_mm256_setzero_ps(); S];
        for s in 0..S {
            kv[s] = L::load8(k.add(s * d + 8 * b));
        }
        for j in 0..Q {
            let qv = _mm256_loadu_ps(qs[j].add(8 * b));
            for s in 0..S {
                acc[j][s] = _mm256_add_ps(acc[j][s], _mm256_mul_ps(qv, kv[s]));
            }
        }
    }
}

/// The scores of Q query vectors (`qs[j]`, `d` values each) against S consecutive slots (`k` at
/// the first, rows of `d`), times `scale`, into `outs[j][..S]`; `Q * S = 8`. Each dot in [`dot`]'s
/// order: lane l of accumulator (j, s) adds `q[l + 8b] * k[l + 8b]` for b = 0, 1, ...; the 8
/// accumulators are transposed so that lanes become dots, then lanes 0..7 of every dot are added in
/// order as whole vectors; then the elements past the last multiple of 8, in order.
///
/// # Safety
/// The CPU must support AVX2; every `qs[j]` must be readable for `d` floats, `k` for `S` rows of
/// `d` elements, and every `outs[j]` writable for `S` floats.
#[inline(always)]
unsafe fn scores_tile<L: Lanes, const D: usize, const Q: usize, const S: usize>(
    qs: [*const f32; Q],
    k: *const L::Elem,
    d: usize,
    scale: f32,
    outs: [*mut f32; Q],
) {
    let d = dim::<D>(d);
    let blocks = d / 8;
    // SAFETY: AVX2, which the caller guarantees (`score_step`'s and `transpose8`'s too); the steps
    // take column blocks `b < d / 8`, so `8 * b + 8 <= d` with the rows of this function's contract;
    // the tail reads elements `8 * blocks .. d` of every query and K row; the stores write `dots`
    // and `outs[j][..S]`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); S]; Q];
        // Two column blocks per pass (each accumulator still adds them in order): half the loop
        // overhead in a loop the front end, not the FP pipes, otherwise limits.
        let mut b = 0;
        while b + 2 <= blocks {
            score_step::<L, Q, S>(&mut acc, qs, k, d, b);
            score_step::<L, Q, S>(&mut acc, qs, k, d, b + 1);
            b += 2;
        }
        if b < blocks {
            score_step::<L, Q, S>(&mut acc, qs, k, d, b);
        }
        let mut flat = [_mm256_setzero_ps(); 8];
        for j in 0..Q {
            for s in 0..S {
                flat[j * S + s] = acc[j][s];
            }
        }
        let t = transpose8(flat);
        let mut sum = t[0];
        for &ti in &t[1..] {
            sum = _mm256_add_ps(sum, ti);
        }
        let mut dots = [0f32; 8];
        if 8 * blocks < d {
            _mm256_storeu_ps(dots.as_mut_ptr(), sum);
            for j in 0..Q {
                for s in 0..S {
                    for e in 8 * blocks..d {
                        dots[j * S + s] += *qs[j].add(e) * L::widen(*k.add(s * d + e));
                    }
                }
            }
            sum = _mm256_loadu_ps(dots.as_ptr());
        }
        _mm256_storeu_ps(dots.as_mut_ptr(), _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
        for j in 0..Q {
            for s in 0..S {
                *outs[j].add(s) = dots[j * S + s];
            }
        }
    }
}

/// The scores of `n` query vectors (`item(j)`: query j's values and where its score of the
/// block's first slot goes) against the [`SLOT_BLOCK`] slots from `k`: for a cache that widens,
/// tiles of 8 queries x 1 slot (`bench attention --rows 512 --threads 1`, bf16: 3% less time than
/// starting with 4 x 2); then tiles of [`SCORE_Q`] queries, then of 2, then of 1 for the rest.
///
/// # Safety
/// The CPU must support AVX2; when `n > 0`, `k` must be readable for [`SLOT_BLOCK`] rows of `d`
/// elements; for every `j < n`, `item(j)` must give a query readable for `d` floats and a score row
/// writable for [`SLOT_BLOCK`] floats.
#[inline(always)]
unsafe fn scores_block<L: Lanes, const D: usize>(
    n: usize,
    item: impl Fn(usize) -> (*const f32, *mut f32),
    k: *const L::Elem,
    d: usize,
    scale: f32,
) {
    let d = dim::<D>(d);
    let mut j = 0;
    // SAFETY (every tile below): AVX2, which the caller guarantees; the tiles' queries and score
    // rows are `item(j)` for `j < n`, their `S` slots `s .. s + S <= SLOT_BLOCK` of the block (K
    // rows at `k + s * d`, scores at `item(j).1 + s`), all inside this function's contract.

    // A cache that widens: tiles of 8 queries x 1 slot, each K vector widened once for all 8.
    while L::WIDENS && j + SCORE_Q_WIDENED <= n {
        let its: [(*const f32, *mut f32); SCORE_Q_WIDENED] = std::array::from_fn(|t| item(j + t));
        let qs = its.map(|t| t.0);
        for s in 0..SLOT_BLOCK {
            // SAFETY: as above.
            unsafe {
                let outs = its.map(|t| t.1.add(s));
                scores_tile::<L, D, SCORE_Q_WIDENED, 1>(qs, k.add(s * d), d, scale, outs);
            }
        }
        j += SCORE_Q_WIDENED;
    }
    while j + SCORE_Q <= n {
        let its: [(*const f32, *mut f32); SCORE_Q] = std::array::from_fn(|t| item(j + t));
        let qs = its.map(|t| t.0);
        for s in (0..SLOT_BLOCK).step_by(SCORE_S) {
            // SAFETY: as above.
            unsafe {
                let outs = its.map(|t| t.1.add(s));
                scores_tile::<L, D, SCORE_Q, SCORE_S>(qs, k.add(s * d), d, scale, outs);
            }
        }
        j += SCORE_Q;
    }
    // A pair left (a decode row of a 2-query-head group, as in the 2B model): each K vector
    // loaded and widened once for both.
    if j + 2 <= n {
        let its: [(*const f32, *mut f32); 2] = std::array::from_fn(|t| item(j + t));
        let qs = its.map(|t| t.0);
        for s in (0..SLOT_BLOCK).step_by(SLOT_BLOCK / 2) {
            // SAFETY: as above.
            unsafe {
                let outs = its.map(|t| t.1.add(s));
                scores_tile::<L, D, 2, { SLOT_BLOCK / 2 }>(qs, k.add(s * d), d, scale, outs);
            }
        }
        j += 2;
    }
    while j < n {
        let (q, o) = item(j);
        // SAFETY: as above (one query, all `SLOT_BLOCK` slots).
        unsafe { scores_tile::<L, D, 1, SLOT_BLOCK>([q], k, d, scale, [o]) };
        j += 1;
    }
}

/// Adds `Σ_s p_h[s] · v_s` over `n` slots (in order) to H outputs, for the 8-wide column blocks
/// `c0 .. c0 + NV`: `ps[h]` is output h's weight of the first slot, `v` the first slot's V row
/// (rows of `d`), `outs[h]` output h's column 0. With `PF`, the row [`PREFETCH_SLOTS`] ahead of each
/// slot is prefetched.
///
/// # Safety
/// The CPU must support AVX2; `8 * (c0 + NV) <= d`; `n >= 1`; every `ps[h]` must be readable for
/// `n` floats, `v` for `n` rows of `d` elements, and every `outs[h]` readable and writable for `d`
/// floats.
#[inline(always)]
unsafe fn pv_tile<L: Lanes, const D: usize, const H: usize, const NV: usize, const PF: bool>(
    ps: [*const f32; H],
    v: *const L::Elem,
    d: usize,
    c0: usize,
    n: usize,
    outs: [*mut f32; H],
) {
    let d = dim::<D>(d);
    // SAFETY: AVX2, which the caller guarantees (`pv_step`'s too); the loads and stores of
    // `outs[h]` and the V reads of `pv_step` cover columns `8 * c0 .. 8 * (c0 + NV) <= d` (so `vp`
    // lies in slot 0's row), the weights and V rows slots `s < n`: inside this function's contract.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NV]; H];
        for h in 0..H {
            for c in 0..NV {
                acc[h][c] = _mm256_loadu_ps(outs[h].add(8 * (c0 + c)));
            }
        }
        let vp = v.add(8 * c0);
        // Two slots per pass, in order (half the loop overhead, as in `scores_tile`).
        let mut s = 0;
        while s + 2 <= n {
            pv_step::<L, H, NV, PF>(&mut acc, ps, vp, d, s);
            pv_step::<L, H, NV, PF>(&mut acc, ps, vp, d, s + 1);
            s += 2;
        }
        if s < n {
            pv_step::<L, H, NV, PF>(&mut acc, ps, vp, d, s);
        }
        for h in 0..H {
            for c in 0..NV {
                _mm256_storeu_ps(outs[h].add(8 * (c0 + c)), acc[h][c]);
            }
        }
    }
}

/// Slot s of a [`pv_tile`]: `acc[h][c] += p_h[s] * v_s[8c..]` (`v` at column block c0 of slot 0).
///
/// # Safety
/// The CPU must support AVX2; every `ps[h]` must be readable at index `s`, and `v + s * d` for
/// `8 * NV` elements.
#[inline(always)]
unsafe fn pv_step<L: Lanes, const H: usize, const NV: usize, const PF: bool>(
    acc: &mut [[__m256; NV]; H],
    ps: [*const f32; H],
    v: *const L::Elem,
    d: usize,
    s: usize,
) {
    // SAFETY: AVX2, which the caller guarantees; `vp` and the loads from it are the `8 * NV`
    // elements at `v + s * d`, the weights `ps[h][s]`, as this function requires; the prefetch
    // address is only computed (`wrapping_add`) and never read.
    unsafe {
        let vp = v.add(s * d);
        if PF {
            let ahead = vp.wrapping_add(PREFETCH_SLOTS * d) as *const u8;
            prefetch_bytes(ahead, d * std::mem::size_of::<L::Elem>());
        }
        let mut x = [_mm256_setzero_ps(); NV];
        for c in 0..NV {
            x[c] = L::load8(vp.add(8 * c));
        }
        for h in 0..H {
            let w = _mm256_broadcast_ss(&*ps[h].add(s));
            for c in 0..NV {
                acc[h][c] = _mm256_add_ps(acc[h][c], _mm256_mul_ps(w, x[c]));
            }
        }
    }
}

/// [`pv_tile`]s of NV column blocks over every column of H outputs (the first tile prefetching
/// with `pf`), then single column blocks, then the columns past the last multiple of 8, slot by
/// slot.
///
/// # Safety
/// The CPU must support AVX2; `n >= 1`; every `ps[h]` must be readable for `n` floats, `v` for `n`
/// rows of `d` elements, and every `outs[h]` readable and writable for `d` floats.
#[inline(always)]
unsafe fn pv_outputs<L: Lanes, const D: usize, const H: usize, const NV: usize>(
    ps: [*const f32; H],
    v: *const L::Elem,
    d: usize,
    n: usize,
    outs: [*mut f32; H],
    pf: bool,
) {
    let d = dim::<D>(d);
    let vectors = d / 8;
    let mut c = 0;
    // SAFETY (the tiles): AVX2, which the caller guarantees; every tile's columns end at
    // `8 * (c + NV) <= 8 * vectors <= d` (or `8 * (c + 1)`); the rest is this function's contract.
    if pf && c + NV <= vectors {
        // SAFETY: as above.
        unsafe { pv_tile::<L, D, H, NV, true>(ps, v, d, c, n, outs) };
        c += NV;
    }
    while c + NV <= vectors {
        // SAFETY: as above.
        unsafe { pv_tile::<L, D, H, NV, false>(ps, v, d, c, n, outs) };
        c += NV;
    }
    while c < vectors {
        // SAFETY: as above.
        unsafe { pv_tile::<L, D, H, 1, false>(ps, v, d, c, n, outs) };
        c += 1;
    }
    for j in 8 * vectors..d {
        for s in 0..n {
            for h in 0..H {
                // SAFETY: `j < d` and `s < n`: inside every output, weight row and V row of the
                // contract.
                unsafe { *outs[h].add(j) += *ps[h].add(s) * L::widen(*v.add(s * d + j)) };
            }
        }
    }
}

/// Adds `n` slots' weighted V rows (from `v`) to `m` outputs (`item(j)`: output j's weight of the
/// first slot and its column 0): for a cache that widens, tiles of [`PV_H_WIDENED`] outputs; then
/// tiles of [`PV_H`] (a decode row of a 2-query-head group), then of one; the first tile
/// prefetches with `pf`.
///
/// # Safety
/// The CPU must support AVX2; `n >= 1`; when `m > 0`, `v` must be readable for `n` rows of `d`
/// elements; for every `j < m`, `item(j)` must give weights readable for `n` floats and an output
/// readable and writable for `d` floats.
#[inline(always)]
unsafe fn pv_block<L: Lanes, const D: usize>(
    m: usize,
    item: impl Fn(usize) -> (*const f32, *mut f32),
    v: *const L::Elem,
    d: usize,
    n: usize,
    mut pf: bool,
) {
    let mut j = 0;
    // SAFETY (every call below): AVX2, which the caller guarantees; the outputs are `item(j)` for
    // `j < m`, and `v`, `d`, `n` this function's: `pv_outputs`'s contract is this one's.
    while L::WIDENS && j + PV_H_WIDENED <= m {
        let its: [(*const f32, *mut f32); PV_H_WIDENED] = std::array::from_fn(|t| item(j + t));
        let (ps, outs) = (its.map(|t| t.0), its.map(|t| t.1));
        // SAFETY: as above.
        unsafe { pv_outputs::<L, D, PV_H_WIDENED, PV_NV_WIDENED>(ps, v, d, n, outs, pf) };
        pf = false;
        j += PV_H_WIDENED;
    }
    while j + PV_H <= m {
        let its: [(*const f32, *mut f32); PV_H] = std::array::from_fn(|t| item(j + t));
        // SAFETY: as above.
        unsafe {
            pv_outputs::<L, D, PV_H, PV_NV>(its.map(|t| t.0), v, d, n, its.map(|t| t.1), pf);
        }
        pf = false;
        j += PV_H;
    }
    while j < m {
        let (p, o) = item(j);
        // SAFETY: as above.
        unsafe { pv_outputs::<L, D, 1, PV_NV>([p], v, d, n, [o], pf) };
        pf = false;
        j += 1;
    }
}

/// [`super::attend_causal`] on AVX2, for a head dim of `shape.head_dim`: the build for 128, for 64,
/// or for any.
///
/// # Safety
/// The CPU must support AVX2, and `kv.head_dim` must equal `shape.head_dim`: the pointer loops step
/// K and V rows by `shape.head_dim` over the `b.max_slots()` slots that `k_head`/`v_head` checked
/// with `kv.head_dim`. (The lengths of `q`, `out` and `scores` are asserted.)
#[inline(always)]
pub unsafe fn attend<L: Lanes>(
    shape: AttnShape,
    b: Block,
    q: &[f32],
    kv: KvHeads<'_, L::Elem>,
    out: &mut [f32],
    scores: &mut [f32],
) {
    // SAFETY: this function's contract, and `D` is `shape.head_dim` or 0.
    unsafe {
        match shape.head_dim {
            128 => attend_d::<L, 128>(shape, b, q, kv, out, scores),
            64 => attend_d::<L, 64>(shape, b, q, kv, out, scores),
            _ => attend_d::<L, 0>(shape, b, q, kv, out, scores),
        }
    }
}

/// Per KV head: the scores of every row and query head (each block of [`SLOT_BLOCK`] K rows read
/// once for all of them), their softmax, then the outputs a block of [`V_SLOT_BLOCK`] V rows at a
/// time (read once, then from L1, for every row and head).
///
/// # Safety
/// As [`attend`], and `D` must be 0 or `shape.head_dim`.
#[inline(always)]
unsafe fn attend_d<L: Lanes, const D: usize>(
    shape: AttnShape,
    b: Block,
    q: &[f32],
    kv: KvHeads<'_, L::Elem>,
    out: &mut [f32],
    scores: &mut [f32],
) {
    let d = dim::<D>(shape.head_dim);
    let r = shape.group();
    let scale = 1.0 / (d as f32).sqrt();
    let span = q.len() / b.rows;
    let max = b.max_slots();
    // Row i, head h of the group: scores[(i * r + h) * max ..][..b.slots(i)].
    let at = |i: usize, h: usize| (i * r + h) * max;
    assert!(scores.len() >= b.rows * r * max && out.len() == q.len());
    out.fill(0.0);
    let elem = std::mem::size_of::<L::Elem>();
    // Below, `d == shape.head_dim == kv.head_dim` (this function's contract): `k` and `v` are
    // `max` rows of `d`; query and output (i, h) for i < b.rows, h < r are the `d` values from
    // `i * span + (g * r + h) * d`, which end by `(i + 1) * span <= q.len() == out.len()` as
    // g < span / (r * d); scores (i, h) are `at(i, h) .. at(i, h) + max`, inside `scores` (asserted).
    for g in 0..span / (r * d) {
        // The head's first `max` slots, bounds-checked here once for the pointer loops below.
        let k = kv.k_head(b.g0 + g, max).as_ptr();
        // SAFETY: called with i < b.rows, h < r only: the query lies in `q` (see above).
        let qp = |i: usize, h: usize| unsafe { q.as_ptr().add(i * span + (g * r + h) * d) };
        let sp = scores.as_mut_ptr();
        for s0 in (0..max).step_by(SLOT_BLOCK) {
            let ahead = k.wrapping_add((s0 + PREFETCH_SLOTS) * d) as *const u8;
            // SAFETY: `prefetch_bytes` asks nothing (the address is never read).
            unsafe { prefetch_bytes(ahead, SLOT_BLOCK * d * elem) };
            // Rows i0.. read the whole block; rows before it read part of it or none.
            let i0 = (s0 + SLOT_BLOCK).saturating_sub(b.first_slots).min(b.rows);
            for i in 0..i0 {
                for s in s0..b.slots(i).min(s0 + SLOT_BLOCK) {
                    for h in 0..r {
                        // SAFETY: AVX2, which the caller guarantees; slot s < b.slots(i) <= max
                        // is a K row, the query and the score `at(i, h) + s` are inside theirs.
                        unsafe {
                            *sp.add(at(i, h) + s) = dot::<L>(qp(i, h), k.add(s * d), d) * scale
                        };
                    }
                }
            }
            let item = |j: usize| {
                let (i, h) = (i0 + j / r, j % r);
                // SAFETY: called with j < (b.rows - i0) * r only, so i < b.rows, h < r, and
                // s0 < max keeps the pointer inside score row (i, h).
                (qp(i, h), unsafe { sp.add(at(i, h) + s0) })
            };
            // SAFETY: AVX2, which the caller guarantees; s0 < max keeps `k.add` inside the head.
            // When there are rows i0.. (n > 0), i0 = s0 + SLOT_BLOCK - first_slots at most, so
            // b.slots(i) >= s0 + SLOT_BLOCK for each: the block's K rows end by max, and
            // `item`'s score rows hold the block's slots.
            unsafe { scores_block::<L, D>((b.rows - i0) * r, item, k.add(s0 * d), d, scale) };
        }
        for i in 0..b.rows {
            for h in 0..r {
                super::softmax(&mut scores[at(i, h)..][..b.slots(i)]);
            }
        }
        let v = kv.v_head(b.g0 + g, max).as_ptr();
        let sp = scores.as_ptr();
        let op = out.as_mut_ptr();
        // SAFETY: called with i < b.rows, h < r only: the output lies in `out` (see above).
        let o = |i: usize, h: usize| unsafe { op.add(i * span + (g * r + h) * d) };
        for s0 in (0..max).step_by(V_SLOT_BLOCK) {
            // SAFETY: s0 < max: inside the head's V rows.
            let vs = unsafe { v.add(s0 * d) };
            // Rows i0.. read the whole block (first, prefetching the next rows); rows before it
            // read part of it or none.
            let i0 = (s0 + V_SLOT_BLOCK)
                .saturating_sub(b.first_slots)
                .min(b.rows);
            let item = |j: usize| {
                let (i, h) = (i0 + j / r, j % r);
                // SAFETY: called with j < (b.rows - i0) * r only, so i < b.rows, h < r, and
                // s0 < max keeps the pointer inside score row (i, h).
                (unsafe { sp.add(at(i, h) + s0) }, o(i, h))
            };
            // SAFETY: AVX2, which the caller guarantees. When there are rows i0.. (m > 0),
            // b.slots(i) >= s0 + V_SLOT_BLOCK for each (as for the scores): the block's V rows
            // end by max, and each weight row holds `V_SLOT_BLOCK` scores from s0.
            unsafe { pv_block::<L, D>((b.rows - i0) * r, item, vs, d, V_SLOT_BLOCK, true) };
            for i in 0..i0 {
                let n = b.slots(i).saturating_sub(s0);
                if n > 0 {
                    // SAFETY: called with h < r only; i < i0 <= b.rows, and s0 < b.slots(i) <=
                    // max keeps the pointer inside score row (i, h).
                    let item = |h: usize| (unsafe { sp.add(at(i, h) + s0) }, o(i, h));
                    // SAFETY: AVX2, which the caller guarantees; 1 <= n and s0 + n = b.slots(i)
                    // <= max: row i's `n` weights and the block's first `n` V rows.
                    unsafe { pv_block::<L, D>(r, item, vs, d, n, i0 == b.rows && i == 0) };
                }
            }
        }
    }
}
