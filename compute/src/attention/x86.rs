//! The f32 attention kernels on AVX2 + FMA (ymm) and AVX-512 F (zmm): one body, generic over
//! the vector ([`Vf`]), doing per value the operations of `oracle.rs` in its order.
//!
//! A block of query rows walks the key tiles; per tile, register tiles of up to
//! [`MAX_TILE_ROWS`] rows take the scores (keys along the lanes: `CK` vectors of keys x R rows
//! of accumulators, one broadcast query element and `CK` K loads per step of c), the online
//! softmax update (per row, from the scores stored to a small buffer) and `p · V` (value columns
//! along the lanes: `CV` vectors of columns x R rows of accumulators, one broadcast weight and
//! `CV` V loads per key). The tile's K and V stay in L1 while every row of the block uses them.

// Index loops mirror the register tiles (row r, vector i).
#![allow(clippy::needless_range_loop)]

use super::causal::CausalBlock;
use super::oracle::greater;
use super::oracle::{pow2, POW2, POW2_MIN};
use super::{
    AttnPath, BlockState, Elem, HeadShape, PackedKv, Planted, QueryBlock, KEY_TILE, MAX_TILE_ROWS,
    SUM_LANES,
};
use half::bf16;
use std::arch::x86_64::*;

/// An f32 vector of `LANES` lanes. Every method needs the CPU features of its implementation
/// (the callers are compiled with them and inline these).
pub(crate) trait Vf: Copy {
    const LANES: usize;
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn splat(x: f32) -> Self;
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn zero() -> Self;
    /// # Safety
    /// The implementation's CPU features; `p` readable for `LANES` floats.
    unsafe fn load(p: *const f32) -> Self;
    /// `LANES` bf16 widened exactly: each one's 16 bits shifted into the top half of a lane.
    ///
    /// # Safety
    /// The implementation's CPU features; `p` readable for `LANES` bf16.
    unsafe fn load_bf16(p: *const bf16) -> Self;
    /// # Safety
    /// The implementation's CPU features; `p` writable for `LANES` floats.
    unsafe fn store(self, p: *mut f32);
    /// `a·b + c`, rounded once.
    ///
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn mul(self, b: Self) -> Self;
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn add(self, b: Self) -> Self;
    /// `self` where greater than `b`, else `b` (`vmaxps`, element first).
    ///
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn max(self, b: Self) -> Self;
    /// [`pow2`] per lane.
    ///
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn pow2(self) -> Self;
    /// The largest lane (`vmaxps` halving; the order of a maximum changes at most the sign of a
    /// zero, which no later value sees: `fma(x, c, −(±0)·c)` and `pow2(±0)` are the same).
    ///
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn hmax(self) -> f32;
    /// Whether a lane is above `m` or NaN (`vcmpps` not-less-or-equal, unordered).
    ///
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn any_above(self, m: f32) -> bool;
}

/// The running maximum after a tile whose scores' lane maxima are `mx`: `greater(hmax(mx), m)`,
/// which is `m` itself when no lane is above it or NaN, so that case (the usual one once the
/// first tiles have set the maximum) skips the reduction.
///
/// # Safety
/// `V`'s CPU features.
#[inline(always)]
pub(super) unsafe fn running_max<V: Vf>(mx: V, m: f32) -> f32 {
    // SAFETY: `V`'s features (contract); register-only.
    unsafe {
        if mx.any_above(m) {
            greater(mx.hmax(), m)
        } else {
            m
        }
    }
}

#[derive(Clone, Copy)]
struct Ymm(__m256);

impl Vf for Ymm {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: AVX, which the caller guarantees.
        Ymm(unsafe { _mm256_set1_ps(x) })
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: AVX, which the caller guarantees.
        Ymm(unsafe { _mm256_setzero_ps() })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX and 8 readable floats at `p`, which the caller guarantees.
        Ymm(unsafe { _mm256_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> Self {
        // SAFETY: AVX2 and 8 readable bf16 (16 bytes) at `p`, which the caller guarantees.
        let x = unsafe { _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())) };
        // SAFETY: AVX2, which the caller guarantees; register-only.
        Ymm(unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX and 8 writable floats at `p`, which the caller guarantees.
        unsafe { _mm256_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: FMA, which the caller guarantees.
        Ymm(unsafe { _mm256_fmadd_ps(a.0, b.0, c.0) })
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        // SAFETY: AVX, which the caller guarantees.
        Ymm(unsafe { _mm256_mul_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        // SAFETY: AVX, which the caller guarantees.
        Ymm(unsafe { _mm256_add_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        // SAFETY: AVX, which the caller guarantees.
        Ymm(unsafe { _mm256_max_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn pow2(self) -> Self {
        // SAFETY: register-only AVX, AVX2 and FMA intrinsics, which the caller guarantees.
        unsafe {
            // `vmaxps` returns its second operand when either is NaN: a NaN stays.
            let t = _mm256_max_ps(_mm256_set1_ps(POW2_MIN), self.0);
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let y = pow2_fraction(&POW2, Ymm(_mm256_sub_ps(t, n))).0;
            // 2^n from its exponent bits (n >= −126: a normal power), one rounding as `vscalefps`.
            let pow = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            Ymm(_mm256_mul_ps(y, _mm256_castsi256_ps(pow)))
        }
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        // SAFETY: AVX, which the caller guarantees; register-only.
        unsafe {
            let x = _mm_max_ps(
                _mm256_castps256_ps128(self.0),
                _mm256_extractf128_ps::<1>(self.0),
            );
            let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
            let x = _mm_max_ss(x, _mm_shuffle_ps::<1>(x, x));
            _mm_cvtss_f32(x)
        }
    }
    #[inline(always)]
    unsafe fn any_above(self, m: f32) -> bool {
        // SAFETY: AVX, which the caller guarantees; register-only.
        unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLE_UQ>(self.0, _mm256_set1_ps(m))) != 0 }
    }
}

/// [`pow2`] on 16 lanes.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
pub(super) unsafe fn pow2_zmm(t: __m512) -> __m512 {
    // SAFETY: AVX-512 F (contract).
    unsafe { pow2_zmm_by(&POW2, t) }
}

/// [`super::oracle::pow2_by`] on 16 lanes.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
pub(super) unsafe fn pow2_zmm_by(coefficients: &[f32], t: __m512) -> __m512 {
    // SAFETY: register-only AVX-512 F intrinsics; the caller guarantees AVX-512 F.
    unsafe {
        // `vmaxps` returns its second operand when either is NaN: a NaN stays.
        let t = _mm512_max_ps(_mm512_set1_ps(POW2_MIN), t);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let y = pow2_fraction(coefficients, Zmm(_mm512_sub_ps(t, n))).0;
        _mm512_scalef_ps(y, n)
    }
}

/// [`pow2`]'s polynomial for `2^f`, `f` in [−1/2, 1/2]: `fma(… fma(c[0], f, c[1]) …, f, 1)`
/// with the `coefficients` c ([`POW2`], or the bf16 variant's shorter one).
///
/// # Safety
/// `V`'s CPU features.
#[inline(always)]
unsafe fn pow2_fraction<V: Vf>(coefficients: &[f32], f: V) -> V {
    // SAFETY: `V`'s features (contract); register-only.
    unsafe {
        let mut y = V::splat(coefficients[0]);
        for &c in &coefficients[1..] {
            y = V::fma(y, f, V::splat(c));
        }
        V::fma(y, f, V::splat(1.0))
    }
}

#[derive(Clone, Copy)]
pub(super) struct Zmm(pub(super) __m512);

impl Vf for Zmm {
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: AVX-512 F, which the caller guarantees.
        Zmm(unsafe { _mm512_set1_ps(x) })
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: AVX-512 F, which the caller guarantees.
        Zmm(unsafe { _mm512_setzero_ps() })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX-512 F and 16 readable floats at `p`, which the caller guarantees.
        Zmm(unsafe { _mm512_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> Self {
        // SAFETY: AVX-512 F and 16 readable bf16 (32 bytes) at `p`, which the caller guarantees.
        let x = unsafe { _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())) };
        // SAFETY: AVX-512 F, which the caller guarantees; register-only.
        Zmm(unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x)) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX-512 F and 16 writable floats at `p`, which the caller guarantees.
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: AVX-512 F, which the caller guarantees.
        Zmm(unsafe { _mm512_fmadd_ps(a.0, b.0, c.0) })
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        // SAFETY: AVX-512 F, which the caller guarantees.
        Zmm(unsafe { _mm512_mul_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        // SAFETY: AVX-512 F, which the caller guarantees.
        Zmm(unsafe { _mm512_add_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        // SAFETY: AVX-512 F, which the caller guarantees.
        Zmm(unsafe { _mm512_max_ps(self.0, b.0) })
    }
    #[inline(always)]
    unsafe fn pow2(self) -> Self {
        // SAFETY: AVX-512 F, which the caller guarantees.
        Zmm(unsafe { pow2_zmm(self.0) })
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        // SAFETY: AVX-512 F, which the caller guarantees; register-only.
        unsafe { _mm512_reduce_max_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn any_above(self, m: f32) -> bool {
        // SAFETY: AVX-512 F, which the caller guarantees; register-only.
        unsafe { _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(self.0, _mm512_set1_ps(m)) != 0 }
    }
}

/// [`super::attend_block`]'s SIMD part on `path`: the running state of every row of `block`
/// after all of `kv`'s key tiles (`finish` turns it into outputs).
///
/// # Safety
/// The CPU must run `path` (AVX2 + FMA, or AVX-512 F on top of them). `kv.kt` must hold
/// `kv.len.div_ceil(KEY_TILE)` tiles of `d x KEY_TILE` floats and `kv.v` `kv.len` rows of
/// `dp = padded_dim(d)`; the block's row r reads `q[r·q_stride ..][..d]`; `state` must hold
/// `block.rows` rows (`reset`) and a register tile's probabilities.
pub(super) unsafe fn attend_block(
    path: AttnPath,
    shape: HeadShape,
    kv: PackedKv<'_>,
    block: &QueryBlock<'_>,
    state: &mut BlockState,
    planted: Planted,
) {
    // SAFETY: the CPU runs `path`, as this function's contract requires; the rest is passed on.
    unsafe {
        match path {
            AttnPath::Avx512 => block_avx512(shape, kv, block, state, planted),
            _ => block_avx2(shape, kv, block, state, planted),
        }
    }
}

/// # Safety
/// As [`attend_block`], on a CPU with AVX-512 F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn block_avx512(
    shape: HeadShape,
    kv: PackedKv<'_>,
    block: &QueryBlock<'_>,
    state: &mut BlockState,
    planted: Planted,
) {
    // SAFETY: the features are enabled here; the rest is this function's contract.
    unsafe { walk_tiles::<Zmm, 4, 4>(shape, kv, block, state, planted) }
}

/// # Safety
/// As [`attend_block`], on a CPU with AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(
    shape: HeadShape,
    kv: PackedKv<'_>,
    block: &QueryBlock<'_>,
    state: &mut BlockState,
    planted: Planted,
) {
    // SAFETY: the features are enabled here; the rest is this function's contract.
    unsafe { walk_tiles::<Ymm, 2, 2>(shape, kv, block, state, planted) }
}

/// Where one register tile's rows read and write, and how many keys of the tile each reads.
#[derive(Clone, Copy)]
pub(super) struct Rows<Q, const R: usize> {
    /// Each row's query (`d` values).
    pub q: [*const Q; R],
    /// Each row's m (1 float), l ([`SUM_LANES`]) and o (`dp`).
    pub m: [*mut f32; R],
    pub l: [*mut f32; R],
    pub o: [*mut f32; R],
    /// Each row's keys of the tile (1 ..= [`KEY_TILE`]).
    pub w: [usize; R],
}

/// One register tile's work on a key tile, for any count of rows R in 1 ..= [`MAX_TILE_ROWS`]
/// (a constant to the kernel, which keeps its accumulators in registers).
pub(super) trait RegisterTile {
    /// The queries' element.
    type Q;
    /// # Safety
    /// The implementation's CPU features and contract for `rows`.
    unsafe fn run<const R: usize>(&self, rows: Rows<Self::Q, R>);
}

/// Block rows `r0 .. rows` through `tile`, [`MAX_TILE_ROWS`] at a time (the last register tile
/// the rest): row r reads its query at `q(r)` and `w(r)` keys of the tile, its running state is
/// row r of `state`. The one place the row count becomes the kernels' constant R.
///
/// # Safety
/// `tile`'s CPU features and contract for every such row; `q(r)` and `w(r)` valid for
/// `r0 <= r < rows`; `state` reset for at least `rows` rows of `dp` outputs.
#[inline(always)]
pub(super) unsafe fn register_tiles<T: RegisterTile>(
    tile: &T,
    state: &mut BlockState,
    dp: usize,
    (r0, rows): (usize, usize),
    q: impl Fn(usize) -> *const T::Q,
    w: impl Fn(usize) -> usize,
) {
    let (m, l, o) = (
        state.m.as_mut_ptr(),
        state.l.as_mut_ptr(),
        state.o.as_mut_ptr(),
    );
    /// Rows `r0 .. r0 + R`.
    ///
    /// # Safety
    /// `r0 + R <= rows` of the state behind `m`, `l` and `o`.
    #[inline(always)]
    unsafe fn at<Q, const R: usize>(
        r0: usize,
        (m, l, o, dp): (*mut f32, *mut f32, *mut f32, usize),
        q: &impl Fn(usize) -> *const Q,
        w: &impl Fn(usize) -> usize,
    ) -> Rows<Q, R> {
        // SAFETY: row r0 + i < rows of the state (contract).
        unsafe {
            Rows {
                q: std::array::from_fn(|i| q(r0 + i)),
                m: std::array::from_fn(|i| m.add(r0 + i)),
                l: std::array::from_fn(|i| l.add((r0 + i) * SUM_LANES)),
                o: std::array::from_fn(|i| o.add((r0 + i) * dp)),
                w: std::array::from_fn(|i| w(r0 + i)),
            }
        }
    }
    let ptrs = (m, l, o, dp);
    let mut r0 = r0;
    while r0 < rows {
        let n = (rows - r0).min(MAX_TILE_ROWS);
        // SAFETY: the register tile's rows are r0 .. r0 + n <= rows, in the state and valid
        // for `q` and `w` (contract); `tile`'s contract is this function's.
        unsafe {
            match n {
                4 => tile.run(at::<_, 4>(r0, ptrs, &q, &w)),
                3 => tile.run(at::<_, 3>(r0, ptrs, &q, &w)),
                2 => tile.run(at::<_, 2>(r0, ptrs, &q, &w)),
                _ => tile.run(at::<_, 1>(r0, ptrs, &q, &w)),
            }
        }
        r0 += n;
    }
}

/// The f32 kernel's key tile (`kt`: `[d][KEY_TILE]`; `v`: the tile's first value row, rows of
/// `dp`; f32 or bf16), for `V` vectors, `CK` key vectors and `CV` column vectors a step.
struct KeyTile<V, E, const CK: usize, const CV: usize> {
    kt: *const E,
    v: *const E,
    d: usize,
    dp: usize,
    /// `scale·log2(e)`.
    c: f32,
    /// A register tile's probabilities (`MAX_TILE_ROWS x KEY_TILE`).
    p: *mut f32,
    vf: std::marker::PhantomData<V>,
}

impl<V: Vf, E: Elem, const CK: usize, const CV: usize> KeyTile<V, E, CK, CV> {
    fn new(kt: *const E, v: *const E, shape: HeadShape, p: *mut f32) -> Self {
        let (d, dp, c) = (shape.d, shape.dp(), shape.log2e_scale);
        let vf = std::marker::PhantomData;
        KeyTile {
            kt,
            v,
            d,
            dp,
            c,
            p,
            vf,
        }
    }
}

impl<V: Vf, E: Elem, const CK: usize, const CV: usize> RegisterTile for KeyTile<V, E, CK, CV> {
    type Q = f32;
    /// # Safety
    /// `V`'s CPU features; the rows as [`tile`] reads them, `kt` and `v` holding the tile and
    /// `p` a register tile's probabilities.
    #[inline(always)]
    unsafe fn run<const R: usize>(&self, rows: Rows<f32, R>) {
        // SAFETY: this method's contract is `tile`'s.
        unsafe { tile::<V, E, R, CK, CV>(rows, self) }
    }
}

/// Every key tile against every register tile of rows (tile outer, so the tile's K and V stay
/// in L1 for all rows), `CK` key vectors and `CV` column vectors a step.
///
/// # Safety
/// `V`'s CPU features; the rest as [`attend_block`].
#[inline(always)]
unsafe fn walk_tiles<V: Vf, const CK: usize, const CV: usize>(
    shape: HeadShape,
    kv: PackedKv<'_>,
    block: &QueryBlock<'_>,
    state: &mut BlockState,
    planted: Planted,
) {
    let (d, dp) = (shape.d, shape.dp());
    let q = block.q.as_ptr();
    let p = state.p.as_mut_ptr();
    for (t, t0) in (0..kv.len).step_by(KEY_TILE).enumerate() {
        if planted.skip_tile == Some(t) {
            continue;
        }
        let w = planted.keys((kv.len - t0).min(KEY_TILE));
        // SAFETY: tile t of kt and rows t0 .. t0 + w of v, inside them (contract).
        let (kt, v) = unsafe {
            (
                kv.kt.as_ptr().add(t * d * KEY_TILE),
                kv.v.as_ptr().add(t0 * dp),
            )
        };
        let tile = KeyTile::<V, f32, CK, CV>::new(kt, v, shape, p);
        // SAFETY: the rows are the block's (their queries inside `q`, contract), each reading
        // the tile's w keys; `p` holds MAX_TILE_ROWS x KEY_TILE floats (`reset`).
        unsafe {
            register_tiles(
                &tile,
                state,
                dp,
                (0, block.rows),
                |r| q.add(r * block.q_stride),
                |_| w,
            )
        }
    }
}

/// One register tile of R rows against one key tile, row r reading its first `w[r]` keys: scores,
/// the online softmax update, `p · V`.
///
/// Rows of one tile may read different key counts (the causal mask's diagonal tile): `p · V`
/// runs to the largest, and a row's keys past its own count weigh `p = +0`, which leaves its
/// outputs' bits as they are: `fma(+0, v, o) = o` for a finite `v` and an `o` that is not −0
/// (o starts at +0, and a round-to-nearest sum is −0 only when both addends are).
///
/// # Safety
/// `V`'s CPU features; each row's q readable for `d` floats, m for 1, l for [`SUM_LANES`], o for
/// `dp` (and writable); `kt` readable for `d x KEY_TILE` values, `v` for `max(w)` rows of `dp`;
/// `p` writable for `R x KEY_TILE`; `1 <= w[r] <= KEY_TILE`; `dp` a multiple of `V::LANES` (it
/// is one of `COLUMN_PAD`).
#[inline(always)]
unsafe fn tile<V: Vf, E: Elem, const R: usize, const CK: usize, const CV: usize>(
    rows: Rows<f32, R>,
    kv: &KeyTile<V, E, CK, CV>,
) {
    let p = kv.p;
    let lanes = V::LANES;
    // SAFETY: `V`'s features (contract). Scores: key vectors below nkw <= KEY_TILE / lanes (the
    // tile), each row's q and p (`scores`' contract). Softmax: row r's p (keys below
    // nkw·lanes), m, l. p·V: V rows j < w at columns below dp, o columns below dp.
    unsafe {
        // A partial tile (the segment's last, the causal diagonal) takes the key vectors it
        // holds, not the whole tile: at 784 keys the last tile has 16 of 64.
        let w_max = rows.w.into_iter().max().unwrap_or(0);
        let nkw = w_max.div_ceil(lanes);
        let mut g = 0;
        while g + CK <= nkw {
            scores::<V, E, R, CK>(rows.q, (kv.kt, kv.d, p), g);
            g += CK;
        }
        while g < nkw {
            scores::<V, E, R, 1>(rows.q, (kv.kt, kv.d, p), g);
            g += 1;
        }
        let mut alpha = [0f32; R];
        for r in 0..R {
            let pr = p.add(r * KEY_TILE);
            for j in rows.w[r]..nkw * lanes {
                *pr.add(j) = f32::NEG_INFINITY;
            }
            let mut mx = V::load(pr);
            for i in 1..nkw {
                mx = V::load(pr.add(i * lanes)).max(mx);
            }
            let m_old = *rows.m[r];
            let m_new = running_max(mx, m_old);
            *rows.m[r] = m_new;
            let mu = m_new * kv.c;
            alpha[r] = if m_new == m_old {
                1.0
            } else {
                pow2(m_old.mul_add(kv.c, -mu))
            };
            let (cv, neg_mu) = (V::splat(kv.c), V::splat(-mu));
            for i in 0..nkw {
                let at = pr.add(i * lanes);
                V::fma(V::load(at), cv, neg_mu).pow2().store(at);
            }
            for j in rows.w[r]..nkw * lanes {
                *pr.add(j) = 0.0;
            }
            // The vectors past the tile's keys would add +0 (no change to l's bits): skipped.
            let av = V::splat(alpha[r]);
            for k in 0..SUM_LANES / lanes {
                let lp = rows.l[r].add(k * lanes);
                let mut acc = V::load(lp).mul(av);
                for chunk in 0..KEY_TILE / SUM_LANES {
                    let at = chunk * SUM_LANES + k * lanes;
                    if at < nkw * lanes {
                        acc = acc.add(V::load(pr.add(at)));
                    }
                }
                acc.store(lp);
            }
        }
        let w = w_max;
        let nv = kv.dp / lanes;
        let mut cv = 0;
        while cv + CV <= nv {
            pv::<V, E, R, CV>(rows, &alpha, kv.v, w, kv.dp, cv * lanes, p);
            cv += CV;
        }
        while cv < nv {
            pv::<V, E, R, 1>(rows, &alpha, kv.v, w, kv.dp, cv * lanes, p);
            cv += 1;
        }
    }
}

/// The scores of key vectors `g .. g + CK` of the tile (keys `g·LANES ..`) for R rows (unscaled)
/// into each row's probabilities: `CK` K loads and a broadcast query element a row per
/// step of c.
///
/// # Safety
/// `V`'s CPU features; `(g + CK)·V::LANES <= KEY_TILE`; each row's q readable for `d` floats;
/// `kt` readable for `d x KEY_TILE` values; `p` writable for `R x KEY_TILE`.
#[inline(always)]
unsafe fn scores<V: Vf, E: Elem, const R: usize, const CK: usize>(
    q: [*const f32; R],
    (kt, d, p): (*const E, usize, *mut f32),
    g: usize,
) {
    let lanes = V::LANES;
    // SAFETY: `V`'s features (contract); K loads at `kt + c·KEY_TILE + (g + i)·lanes` for c < d,
    // g + i < KEY_TILE / lanes (inside the tile); q reads element c < d of each row; stores into
    // row r's `p + r·KEY_TILE ..+ KEY_TILE`.
    unsafe {
        let mut acc = [[V::zero(); CK]; R];
        for c in 0..d {
            let kp = kt.add(c * KEY_TILE + g * lanes);
            let k: [V; CK] = std::array::from_fn(|i| E::load(kp.add(i * lanes)));
            for r in 0..R {
                let qc = V::splat(*q[r].add(c));
                for i in 0..CK {
                    acc[r][i] = V::fma(qc, k[i], acc[r][i]);
                }
            }
        }
        for r in 0..R {
            for i in 0..CK {
                acc[r][i].store(p.add(r * KEY_TILE + (g + i) * lanes));
            }
        }
    }
}

/// `o = o·α`, then `o = fma(p_j, v_j, o)` for the tile's keys j ascending, over the columns
/// `c0 .. c0 + CV·LANES` of R rows.
///
/// # Safety
/// `V`'s CPU features; `c0 + CV·V::LANES <= dp`; each row's o readable and writable for `dp`
/// floats; `v` readable for `w` rows of `dp`; `p` readable for `R x KEY_TILE`.
#[inline(always)]
unsafe fn pv<V: Vf, E: Elem, const R: usize, const CV: usize>(
    rows: Rows<f32, R>,
    alpha: &[f32; R],
    v: *const E,
    w: usize,
    dp: usize,
    c0: usize,
    p: *const f32,
) {
    let lanes = V::LANES;
    // SAFETY: `V`'s features; the loads and stores cover columns c0 .. c0 + CV·lanes <= dp of
    // each row's o and of V rows j < w; p reads row r < R, key j < w < KEY_TILE (contract).
    unsafe {
        let mut acc = [[V::zero(); CV]; R];
        for r in 0..R {
            let a = V::splat(alpha[r]);
            for i in 0..CV {
                let o = V::load(rows.o[r].add(c0 + i * lanes));
                // o·1 is o: most tiles keep the maximum (see `running_max`).
                acc[r][i] = if alpha[r] == 1.0 { o } else { o.mul(a) };
            }
        }
        for j in 0..w {
            let vp = v.add(j * dp + c0);
            let x: [V; CV] = std::array::from_fn(|i| E::load(vp.add(i * lanes)));
            for r in 0..R {
                let pj = V::splat(*p.add(r * KEY_TILE + j));
                for i in 0..CV {
                    acc[r][i] = V::fma(pj, x[i], acc[r][i]);
                }
            }
        }
        for r in 0..R {
            for i in 0..CV {
                acc[r][i].store(rows.o[r].add(c0 + i * lanes));
            }
        }
    }
}

/// [`super::causal`]'s SIMD part for the key tile at key `t0`: the rows of `block` from
/// position `i0` on (the first that reads a key of the tile), row r = (position r / heads, head
/// r % heads) reading `min(first_len + r / heads − t0, KEY_TILE)` keys of it, into `state`.
///
/// # Safety
/// The CPU must run `path` (AVX2 + FMA, or AVX-512 F on top of them). `kt` must hold
/// `d x KEY_TILE` values and `v` the tile's keys (`min(first_len + positions − 1 − t0,
/// KEY_TILE)` of them) in rows of `dp = padded_dim(d)`; `block` checked
/// ([`super::causal::CausalBlock`]'s check) with `t0 < first_len + i0`; `state` reset for
/// `positions · heads` rows.
pub(super) unsafe fn causal_tile<E: Elem>(
    path: AttnPath,
    shape: HeadShape,
    block: &CausalBlock<'_>,
    (t0, i0): (usize, usize),
    kt: &[E],
    v: &[E],
    state: &mut BlockState,
) {
    // SAFETY: the CPU runs `path`, as this function's contract requires; the rest is passed on.
    unsafe {
        match path {
            AttnPath::Avx512 => causal_avx512(shape, block, (t0, i0), kt, v, state),
            _ => causal_avx2(shape, block, (t0, i0), kt, v, state),
        }
    }
}

/// # Safety
/// As [`causal_tile`], on a CPU with AVX-512 F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn causal_avx512<E: Elem>(
    shape: HeadShape,
    block: &CausalBlock<'_>,
    at: (usize, usize),
    kt: &[E],
    v: &[E],
    state: &mut BlockState,
) {
    // SAFETY: the features are enabled here; the rest is this function's contract.
    unsafe { causal_rows::<Zmm, E, 4, 4>(shape, block, at, kt, v, state) }
}

/// # Safety
/// As [`causal_tile`], on a CPU with AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn causal_avx2<E: Elem>(
    shape: HeadShape,
    block: &CausalBlock<'_>,
    at: (usize, usize),
    kt: &[E],
    v: &[E],
    state: &mut BlockState,
) {
    // SAFETY: the features are enabled here; the rest is this function's contract.
    unsafe { causal_rows::<Ymm, E, 2, 2>(shape, block, at, kt, v, state) }
}

/// The register tiles of [`causal_tile`]'s rows.
///
/// # Safety
/// `V`'s CPU features; the rest as [`causal_tile`].
#[inline(always)]
unsafe fn causal_rows<V: Vf, E: Elem, const CK: usize, const CV: usize>(
    shape: HeadShape,
    block: &CausalBlock<'_>,
    (t0, i0): (usize, usize),
    kt: &[E],
    v: &[E],
    state: &mut BlockState,
) {
    let (d, heads) = (shape.d, block.heads);
    let q = block.q.as_ptr();
    let tile = KeyTile::<V, E, CK, CV>::new(kt.as_ptr(), v.as_ptr(), shape, state.p.as_mut_ptr());
    // Row r's query is position r / heads's head r % heads; position i reads keys
    // 0 .. first_len + i, from position i0 on past t0.
    // SAFETY: rows i0·heads .. positions·heads: position < positions and head < heads, inside
    // the block's q (checked) and the state (reset for them), each reading 1 ..= KEY_TILE keys
    // of the tile, at most the tile's keys in `v`; `p` holds MAX_TILE_ROWS x KEY_TILE floats.
    unsafe {
        register_tiles(
            &tile,
            state,
            shape.dp(),
            (i0 * heads, block.positions * heads),
            |r| q.add((r / heads) * block.q_stride + (r % heads) * d),
            |r| (block.first_len + r / heads - t0).min(KEY_TILE),
        )
    }
}

/// Keys `keys` (`w` rows of `d`, `stride` values apart, widened by `widen8`) into `kt`
/// (`[d][KEY_TILE]`, key j in column j): 8 x 8 blocks transposed in ymm registers, the keys and
/// columns past the last whole block one by one. A copy, so any order of it gives the same tile.
///
/// # Safety
/// AVX2; `kt` writable for `d x KEY_TILE` floats; `widen8(i)` reads 8 values of `keys` at value
/// `i` and returns them as f32 for every `i = j·stride + c` with `j + 8 <= w`, `c + 8 <= d`
/// (`widen1(i)` one value, for `j < w`, `c < d`).
#[inline(always)]
unsafe fn transpose_tile(
    (d, stride): (usize, usize),
    w: usize,
    kt: *mut f32,
    widen8: impl Fn(usize) -> __m256,
    widen1: impl Fn(usize) -> f32,
) {
    let (wb, db) = (w / 8 * 8, d / 8 * 8);
    // SAFETY: AVX2 (contract); the loads are keys j0 .. j0 + 8 <= w at columns c0 .. c0 + 8
    // <= d; the stores columns c0 + i < d of keys j0 .. j0 + 8 <= KEY_TILE.
    unsafe {
        for j0 in (0..wb).step_by(8) {
            for c0 in (0..db).step_by(8) {
                let r: [__m256; 8] = std::array::from_fn(|i| widen8((j0 + i) * stride + c0));
                let cols = crate::kernels::transpose8(r);
                for (i, col) in cols.into_iter().enumerate() {
                    _mm256_storeu_ps(kt.add((c0 + i) * KEY_TILE + j0), col);
                }
            }
            for j in j0..j0 + 8 {
                for c in db..d {
                    *kt.add(c * KEY_TILE + j) = widen1(j * stride + c);
                }
            }
        }
        for j in wb..w {
            for c in 0..d {
                *kt.add(c * KEY_TILE + j) = widen1(j * stride + c);
            }
        }
    }
}

/// [`transpose_tile`] of f32 keys, `stride` values apart.
///
/// # Safety
/// AVX2; `keys` holds `w` rows of `d` values `stride` apart (`(w − 1)·stride + d` values); `kt`
/// writable for `d x KEY_TILE` floats; `1 <= w <= KEY_TILE`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_keys_f32(
    keys: &[f32],
    (d, stride): (usize, usize),
    w: usize,
    kt: &mut [f32],
) {
    let k = keys.as_ptr();
    // SAFETY: AVX2 is enabled; every index the transposition reads is below
    // (w − 1)·stride + d (its contract), inside `keys`; kt is d x KEY_TILE (this function's
    // contract).
    unsafe {
        transpose_tile(
            (d, stride),
            w,
            kt.as_mut_ptr(),
            |i| _mm256_loadu_ps(k.add(i)),
            |i| *k.add(i),
        )
    }
}

/// [`transpose_tile`] of bf16 keys, each widened exactly (its bits in the top half of an f32).
///
/// # Safety
/// AVX2; `keys` holds `w` rows of `d`; `kt` writable for `d x KEY_TILE` floats; `w <= KEY_TILE`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_keys_bf16(keys: &[bf16], d: usize, w: usize, kt: &mut [f32]) {
    let k = keys.as_ptr();
    // SAFETY: AVX2 is enabled; every index the transposition reads is below w·d (its contract),
    // inside `keys` (8 bf16 = 16 bytes per load); kt is d x KEY_TILE (this function's contract).
    unsafe {
        transpose_tile(
            (d, d),
            w,
            kt.as_mut_ptr(),
            |i| {
                let h = _mm_loadu_si128(k.add(i) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            },
            |i| f32::from_bits(u32::from((*k.add(i)).to_bits()) << 16),
        )
    }
}
