//! The causal mask over a KV cache stored row-major per slot (the decoder's: one KV head's K is
//! `slots x d` values, slot after slot, and its V the same): position i of a block of query
//! positions reads keys `0 .. first_len + i`, its own included. The query heads of a GQA group
//! read one KV head, so a block's rows are its (position, head) pairs, and they share each key
//! tile from L1.
//!
//! Key tiles sit at absolute key positions (tile t holds keys `[t·KEY_TILE, (t + 1)·KEY_TILE)`),
//! whatever the block's first position: a row's bits are [`oracle::attend_row`]'s over its own
//! keys, whether it was attended in a prefill of 2048 rows, in a draft window of 4, beside
//! another sequence or alone in a decode step. That is what keeps batched prefill, stepwise
//! decode, sequences side by side and drafts on the same bits.
//!
//! Per tile the keys are packed for the kernels (K transposed into `[d][KEY_TILE]`); V is read in
//! place from an f32 cache whose head dim is a multiple of [`COLUMN_PAD`](super::COLUMN_PAD), else widened (bf16 to
//! f32 is exact) and padded to [`padded_dim`]. The tile's packing is the only pass over K that
//! decode adds: the tile's 32 KB (d = 128) stay in L1 for the scores.

use super::{oracle, padded_dim, AttnPath, BlockState, HeadShape, Planted, KEY_TILE, SUM_LANES};
use half::bf16;

/// A value a KV cache holds: f32, or bf16 (widened exactly to f32 for the kernels).
pub trait CacheValue: Copy + Send + Sync + 'static {
    fn widen(self) -> f32;
    /// The values themselves when they are f32 (read in place).
    fn as_f32(values: &[Self]) -> Option<&[f32]>;
    /// `w` keys of `d` values (`keys`, row-major) widened into `kt` (`[d][KEY_TILE]`, key j in
    /// column j), in 8 x 8 register blocks when `simd` (the CPU runs AVX2): a copy, the same
    /// floats either way.
    fn transpose_keys(keys: &[Self], d: usize, w: usize, kt: &mut [f32], simd: bool);
}

/// [`CacheValue::transpose_keys`] one value at a time.
fn transpose_keys_scalar<T: CacheValue>(keys: &[T], d: usize, w: usize, kt: &mut [f32]) {
    for (j, key) in keys[..w * d].chunks_exact(d).enumerate() {
        for (c, &x) in key.iter().enumerate() {
            kt[c * KEY_TILE + j] = x.widen();
        }
    }
}

impl CacheValue for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    fn as_f32(values: &[f32]) -> Option<&[f32]> {
        Some(values)
    }
    fn transpose_keys(keys: &[f32], d: usize, w: usize, kt: &mut [f32], simd: bool) {
        assert!(keys.len() >= w * d && kt.len() >= d * KEY_TILE && w <= KEY_TILE);
        #[cfg(target_arch = "x86_64")]
        if simd && AttnPath::Avx2.is_available() {
            // SAFETY: the CPU has AVX2 (checked); keys hold w rows of d, kt d x KEY_TILE floats
            // and w <= KEY_TILE (asserted).
            unsafe { super::x86::transpose_keys_f32(keys, d, w, kt) };
            return;
        }
        let _ = simd;
        transpose_keys_scalar(keys, d, w, kt)
    }
}

impl CacheValue for bf16 {
    /// The bf16's bits as the top half of an f32 (exact; `half`'s `to_f32` also quiets a
    /// signalling NaN, a select in the loop that widens a tile's values).
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    fn as_f32(_: &[bf16]) -> Option<&[f32]> {
        None
    }
    fn transpose_keys(keys: &[bf16], d: usize, w: usize, kt: &mut [f32], simd: bool) {
        assert!(keys.len() >= w * d && kt.len() >= d * KEY_TILE && w <= KEY_TILE);
        #[cfg(target_arch = "x86_64")]
        if simd && AttnPath::Avx2.is_available() {
            // SAFETY: the CPU has AVX2 (checked); keys hold w rows of d, kt d x KEY_TILE floats
            // and w <= KEY_TILE (asserted).
            unsafe { super::x86::transpose_keys_bf16(keys, d, w, kt) };
            return;
        }
        let _ = simd;
        transpose_keys_scalar(keys, d, w, kt)
    }
}

/// Query positions of one KV head's group: position i's head h reads its `d` queries at
/// `q[i·q_stride + h·d]` and writes its `d` outputs at `out[i·out_stride + h·d]`; position i
/// reads keys `0 .. first_len + i`.
pub struct CausalBlock<'a> {
    pub q: &'a [f32],
    pub q_stride: usize,
    pub out: &'a mut [f32],
    pub out_stride: usize,
    pub positions: usize,
    /// Query heads per KV head (the GQA group).
    pub heads: usize,
    /// Keys the first position reads (at least 1: its own).
    pub first_len: usize,
}

impl CausalBlock<'_> {
    /// Keys the last position reads.
    pub fn last_len(&self) -> usize {
        self.first_len + self.positions - 1
    }

    fn check(&self, d: usize) {
        let span = self.heads * d;
        let ok = |len: usize, stride: usize| len >= (self.positions - 1) * stride + span;
        assert!(
            self.first_len >= 1
                && self.heads >= 1
                && ok(self.q.len(), self.q_stride)
                && ok(self.out.len(), self.out_stride),
            "causal attention: {} positions of {} heads of d {d} reading from {} keys: q holds {} \
             (stride {}), out {} (stride {})",
            self.positions,
            self.heads,
            self.first_len,
            self.q.len(),
            self.q_stride,
            self.out.len(),
            self.out_stride
        );
    }
}

/// Where one KV head's keys are: row-major (`d` values a slot, slot after slot), or stored as the
/// kernels read them, tiles of [`KEY_TILE`] slots each transposed (`[tile][d][KEY_TILE]`, slot
/// `t·KEY_TILE + j`'s value c at `t·d·KEY_TILE + c·KEY_TILE + j`; the decoder's cache). Tiles need
/// no packing per call: an f32 tile is read in place, a bf16 one widened in order, where row-major
/// keys are transposed tile by tile (in a one-row decode step that costs more than the dots).
#[derive(Clone, Copy)]
pub enum Keys<'a, T> {
    RowMajor(&'a [T]),
    Tiles(&'a [T]),
}

impl<T> Keys<'_, T> {
    /// Values the keys of `slots` slots need.
    fn needs(&self, slots: usize, d: usize) -> usize {
        match self {
            Keys::RowMajor(_) => slots * d,
            Keys::Tiles(_) => slots.div_ceil(KEY_TILE) * KEY_TILE * d,
        }
    }

    fn len(&self) -> usize {
        match self {
            Keys::RowMajor(k) | Keys::Tiles(k) => k.len(),
        }
    }
}

/// Per-thread buffers of a causal call: the rows' running state and one packed tile.
#[derive(Default)]
pub struct CausalScratch {
    state: BlockState,
    kt: Vec<f32>,
    v: Vec<f32>,
}

/// `block`'s outputs over one KV head's cache keys `k` and rows `v` (row-major, `d` values a
/// slot; at least `block.last_len()` slots), with the arithmetic of the module docs of
/// `attention`, on the fastest path this CPU runs.
pub fn attend_causal<T: CacheValue>(
    shape: HeadShape,
    k: Keys<'_, T>,
    v: &[T],
    block: CausalBlock<'_>,
    scratch: &mut CausalScratch,
) {
    attend_causal_on(
        AttnPath::best(),
        shape,
        k,
        v,
        block,
        scratch,
        Planted::default(),
    )
}

/// [`attend_causal`] on `path` (the oracle's arithmetic on the scalar path), with a planted
/// mistake for the controls.
pub(crate) fn attend_causal_on<T: CacheValue>(
    path: AttnPath,
    shape: HeadShape,
    k: Keys<'_, T>,
    v: &[T],
    block: CausalBlock<'_>,
    scratch: &mut CausalScratch,
    planted: Planted,
) {
    if block.positions == 0 {
        return;
    }
    let (d, dp) = (shape.d, padded_dim(shape.d));
    block.check(d);
    let keys = block.last_len();
    assert!(
        k.len() >= k.needs(keys, d) && v.len() >= keys * d,
        "causal attention: K {} / V {} values for {keys} slots of d {d}",
        k.len(),
        v.len()
    );
    let rows = block.positions * block.heads;
    let CausalScratch { state, kt, v: vp } = scratch;
    state.reset(rows, dp);
    if kt.len() < d * KEY_TILE {
        kt.resize(d * KEY_TILE, 0.0);
    }
    // V in place: an f32 cache whose rows are already `dp` apart.
    let v_in_place = T::as_f32(v).filter(|_| dp == d);
    if v_in_place.is_none() && vp.len() < KEY_TILE * dp {
        vp.resize(KEY_TILE * dp, 0.0);
    }
    let simd = path != AttnPath::Scalar && path.is_available();
    for (t, t0) in (0..keys).step_by(KEY_TILE).enumerate() {
        if planted.skip_tile == Some(t) {
            continue;
        }
        let w = (keys - t0).min(KEY_TILE);
        // The first position that reads a key of this tile (len = first_len + i > t0).
        let i0 = (t0 + 1).saturating_sub(block.first_len);
        // The keys past `w` keep an earlier tile's (finite or not) values: their scores are
        // replaced by −∞ before the maximum, as every row's keys past its own count are.
        let kt: &[f32] = match k {
            Keys::RowMajor(k) => {
                let kt = &mut kt[..d * KEY_TILE];
                T::transpose_keys(&k[t0 * d..(t0 + w) * d], d, w, kt, simd);
                kt
            }
            Keys::Tiles(k) => {
                let tile = &k[t * d * KEY_TILE..(t + 1) * d * KEY_TILE];
                match T::as_f32(tile) {
                    Some(tile) => tile,
                    None => {
                        let kt = &mut kt[..d * KEY_TILE];
                        for (y, &x) in kt.iter_mut().zip(tile) {
                            *y = x.widen();
                        }
                        kt
                    }
                }
            }
        };
        let vt: &[f32] = match v_in_place {
            Some(v) => &v[t0 * d..(t0 + w) * d],
            None => {
                let vp = &mut vp[..w * dp];
                for (row, x) in vp
                    .chunks_exact_mut(dp)
                    .zip(v[t0 * d..(t0 + w) * d].chunks_exact(d))
                {
                    for (y, &x) in row.iter_mut().zip(x) {
                        *y = x.widen();
                    }
                    row[d..].fill(0.0);
                }
                vp
            }
        };
        if simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU runs the path (checked above); kt holds d x KEY_TILE floats, vt
            // the tile's w rows of dp; the block was checked and i0 is its first position
            // reading past t0; the state was reset for its rows.
            unsafe {
                super::x86::causal_tile(path, shape, &block, (t0, i0), kt, vt, state)
            };
            continue;
        }
        let mut p = [0f32; KEY_TILE];
        for r in i0 * block.heads..rows {
            let (i, h) = (r / block.heads, r % block.heads);
            let q = &block.q[i * block.q_stride + h * d..][..d];
            let w_r = (block.first_len + i - t0).min(KEY_TILE);
            let l: &mut [f32; SUM_LANES] = (&mut state.l[r * SUM_LANES..][..SUM_LANES])
                .try_into()
                .expect("SUM_LANES lanes");
            let o = &mut state.o[r * dp..][..d];
            oracle::tile_step(shape, q, kt, vt, w_r, (&mut state.m[r], l, o), &mut p);
        }
    }
    for r in 0..rows {
        let (i, h) = (r / block.heads, r % block.heads);
        let out = &mut block.out[i * block.out_stride + h * d..][..d];
        out.copy_from_slice(&state.o[r * dp..][..d]);
        oracle::finish_row(&state.l[r * SUM_LANES..][..SUM_LANES], out);
    }
}

#[cfg(test)]
mod tests;
