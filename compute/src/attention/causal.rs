//! The causal mask over a KV cache (one KV head's V is `slots x d` values, slot after slot, and
//! its K the same or stored as the kernels' key tiles, [`Keys`]): position i of a block of query
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
//! Keys stored as the kernels' tiles ([`Keys::Tiles`], the decoder's cache) and values whose head
//! dim is a multiple of [`COLUMN_PAD`](super::COLUMN_PAD) are read in place, f32 or bf16 (a bf16
//! widened exactly in registers as it is loaded: its bits the top half of an f32). Widening a
//! bf16 cache's tiles into f32 buffers first made its decode attention slower than the f32
//! cache's for half the bytes (qwen3-vl-2b, ctx 2048, loaded machine: 45-57 ms a token against
//! 20-26 read in place; PERF.md, "bf16 K/V read in registers"). Otherwise each tile is packed
//! into f32 first (row-major K transposed into `[d][KEY_TILE]`, V padded to [`padded_dim`]); the
//! tile's 32 KB (d = 128) then stay in L1 for the scores.

use super::{
    oracle, padded_dim, AttnPath, BlockState, Elem, HeadShape, Planted, KEY_TILE, SUM_LANES,
};
use half::bf16;

/// A value a KV cache holds: f32, or bf16 (widened exactly to f32 for the arithmetic).
pub trait CacheValue: Copy + Send + Sync + 'static {
    fn widen(self) -> f32;
    /// Keys and values of the cache as the kernels read them in place.
    fn in_place<'a>(k: &'a [Self], v: &'a [Self]) -> InPlace<'a>;
    /// `w` keys of `d` values (`keys`, row-major) widened into `kt` (`[d][KEY_TILE]`, key j in
    /// column j), in 8 x 8 register blocks when `simd` (the CPU runs AVX2): a copy, the same
    /// floats either way.
    fn transpose_keys(keys: &[Self], d: usize, w: usize, kt: &mut [f32], simd: bool);
}

/// A KV head's key tiles and value rows of one type, for the kernels to read in place.
#[derive(Clone, Copy)]
pub enum InPlace<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    Bf16 { k: &'a [bf16], v: &'a [bf16] },
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
    fn in_place<'a>(k: &'a [f32], v: &'a [f32]) -> InPlace<'a> {
        InPlace::F32 { k, v }
    }
    fn transpose_keys(keys: &[f32], d: usize, w: usize, kt: &mut [f32], simd: bool) {
        assert!(keys.len() >= w * d && kt.len() >= d * KEY_TILE && w <= KEY_TILE);
        #[cfg(target_arch = "x86_64")]
        if simd && AttnPath::Avx2.is_available() {
            // SAFETY: the CPU has AVX2 (checked); keys hold w rows of d, kt d x KEY_TILE floats
            // and w <= KEY_TILE (asserted).
            unsafe { super::x86::transpose_keys_f32(keys, (d, d), w, kt) };
            return;
        }
        let _ = simd;
        transpose_keys_scalar(keys, d, w, kt)
    }
}

impl CacheValue for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        Elem::widen(self)
    }
    fn in_place<'a>(k: &'a [bf16], v: &'a [bf16]) -> InPlace<'a> {
        InPlace::Bf16 { k, v }
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
/// no packing per call: f32 or bf16, they are read in place, where row-major keys are transposed
/// tile by tile (in a one-row decode step that costs more than the dots).
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
    let walk = Walk {
        path,
        simd: path != AttnPath::Scalar && path.is_available(),
        shape,
        planted,
    };
    match k {
        // In place: the cache's key tiles, and value rows already `dp` apart.
        Keys::Tiles(k) if dp == d => match T::in_place(k, v) {
            InPlace::F32 { k, v } => walk.tiles(&block, state, &mut Stored { k, v }),
            InPlace::Bf16 { k, v } => walk.tiles(&block, state, &mut Stored { k, v }),
        },
        k => {
            if kt.len() < d * KEY_TILE {
                kt.resize(d * KEY_TILE, 0.0);
            }
            if vp.len() < KEY_TILE * dp {
                vp.resize(KEY_TILE * dp, 0.0);
            }
            let simd = walk.simd;
            let packed = &mut Packed { k, v, kt, vp, simd };
            walk.tiles(&block, state, packed)
        }
    }
    for r in 0..rows {
        let (i, h) = (r / block.heads, r % block.heads);
        let out = &mut block.out[i * block.out_stride + h * d..][..d];
        out.copy_from_slice(&state.o[r * dp..][..d]);
        oracle::finish_row(&state.l[r * SUM_LANES..][..SUM_LANES], out);
    }
}

/// Where the kernels read key tile t (keys `t0 .. t0 + w`).
trait TileSource<E> {
    /// Tile `at = (t, t0, w)`'s keys (`[d][KEY_TILE]`, key j in column j) and its `w` value
    /// rows (`dp` apart).
    fn tile(&mut self, d: usize, at: (usize, usize, usize)) -> (&[E], &[E]);
}

/// The cache's own key tiles and value rows (`dp = d`), read in place.
struct Stored<'a, E> {
    k: &'a [E],
    v: &'a [E],
}

impl<E> TileSource<E> for Stored<'_, E> {
    fn tile(&mut self, d: usize, (t, t0, w): (usize, usize, usize)) -> (&[E], &[E]) {
        (
            &self.k[t * d * KEY_TILE..(t + 1) * d * KEY_TILE],
            &self.v[t0 * d..(t0 + w) * d],
        )
    }
}

/// Each tile packed into f32 buffers: row-major keys transposed (and widened), stored tiles
/// widened, value rows widened and padded to `dp`.
struct Packed<'a, T> {
    k: Keys<'a, T>,
    v: &'a [T],
    kt: &'a mut [f32],
    vp: &'a mut [f32],
    simd: bool,
}

impl<T: CacheValue> TileSource<f32> for Packed<'_, T> {
    fn tile(&mut self, d: usize, (t, t0, w): (usize, usize, usize)) -> (&[f32], &[f32]) {
        let dp = padded_dim(d);
        // The keys past `w` keep an earlier tile's (finite or not) values: their scores are
        // replaced by −∞ before the maximum, as every row's keys past its own count are.
        let kt = &mut self.kt[..d * KEY_TILE];
        match self.k {
            Keys::RowMajor(k) => T::transpose_keys(&k[t0 * d..(t0 + w) * d], d, w, kt, self.simd),
            Keys::Tiles(k) => {
                let tile = &k[t * d * KEY_TILE..(t + 1) * d * KEY_TILE];
                for (y, &x) in kt.iter_mut().zip(tile) {
                    *y = x.widen();
                }
            }
        }
        let vp = &mut self.vp[..w * dp];
        for (row, x) in vp
            .chunks_exact_mut(dp)
            .zip(self.v[t0 * d..(t0 + w) * d].chunks_exact(d))
        {
            for (y, &x) in row.iter_mut().zip(x) {
                *y = x.widen();
            }
            row[d..].fill(0.0);
        }
        (kt, vp)
    }
}

/// How a call walks its key tiles.
#[derive(Clone, Copy)]
struct Walk {
    path: AttnPath,
    /// Whether `path` is a SIMD path this CPU runs (else the oracle's arithmetic).
    simd: bool,
    shape: HeadShape,
    planted: Planted,
}

impl Walk {
    /// Every key tile the block reads, from `src`, into `state` (reset for the block's rows).
    fn tiles<E: Elem>(
        self,
        block: &CausalBlock<'_>,
        state: &mut BlockState,
        src: &mut impl TileSource<E>,
    ) {
        let Walk {
            path,
            simd,
            shape,
            planted,
        } = self;
        let (d, dp) = (shape.d, padded_dim(shape.d));
        let (keys, rows) = (block.last_len(), block.positions * block.heads);
        for (t, t0) in (0..keys).step_by(KEY_TILE).enumerate() {
            if planted.skip_tile == Some(t) {
                continue;
            }
            let w = (keys - t0).min(KEY_TILE);
            // The first position that reads a key of this tile (len = first_len + i > t0).
            let i0 = (t0 + 1).saturating_sub(block.first_len);
            let (kt, vt) = src.tile(d, (t, t0, w));
            if simd {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU runs the path (checked by the caller); kt holds d x KEY_TILE
                // values, vt the tile's w rows of dp; the block was checked and i0 is its first
                // position reading past t0; the state was reset for its rows.
                unsafe {
                    super::x86::causal_tile(path, shape, block, (t0, i0), kt, vt, state)
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
        let _ = path;
    }
}

#[cfg(test)]
mod tests;
