//! The 16-bit variant: q, k, v and the probabilities p in bf16, every product accumulated in
//! f32 as AVX-512 BF16's `vdpbf16ps` does it ([`crate::kernels::bf16_dot`] is the oracle of one
//! lane). Per query row, over the f32 variant's tiles (module docs of `attention`):
//! - `q' = to_bf16(q)`; keys and values were packed as `to_bf16(k)`, `to_bf16(v)`;
//! - `s_j = bf16_dot::dot(0, q', k'_j)` (pairs of elements ascending; the scale comes below);
//! - `m' = max(m, max_j s_j)`; with `c = scale·log2(e)` (`HeadShape::log2e_scale`) and
//!   `μ = m'·c` (rounded): `α = pow2(fma(m, c, −μ))` (1 without a `pow2` when `m' = m`) and
//!   `p_j = to_bf16(pow2_by(&P2_BF16, fma(s_j, c, −μ)))`: e^{(s_j − m')·scale} as the f32 variant
//!   takes it ([`oracle::pow2`](super::oracle::pow2)) but by a 3-FMA polynomial ([`P2_BF16`],
//!   within 1.02e-4, where the bf16 rounding that follows is 2^−9);
//! - `l[k] = dot_pair(dot_pair(l[k]·α, [p_2k, p_2k+1], [1, 1]), [p_32+2k, p_33+2k], [1, 1])`: the
//!   rounded p summed into 16 lanes by `vdpbf16ps` against ones, the tile's 32-key halves in
//!   order (keys past the tile's are p = 0);
//! - `o_c = dot_pair(… dot_pair(o_c·α, [p_0, p_1], [v_0c, v_1c]) …)` over the tile's pairs of keys
//!   ascending, an odd tile's last key paired with a zero key (p = 0, v = 0);
//!
//! then `out_c = o_c · (1 / Σ_i l[i])`. The AVX-512 BF16 path (zmm) is tested bit-equal to
//! [`attend_row`]; a CPU without the instructions runs [`attend_row`].
//!
//! Packed layouts (pairs adjacent, as `vdpbf16ps` reads them): a key tile is
//! `[d/2][KEY_TILE][2]` (key j's elements 2u, 2u + 1 together), a value tile
//! `[KEY_TILE/2][dp][2]` (column c of keys 2u, 2u + 1 together); keys past `len` are zero.

use super::oracle::{greater, pow2, pow2_by, sum_lanes};
use super::{padded_dim, HeadShape, KEY_TILE, SUM_LANES};
use crate::kernels::bf16_dot::{dot, dot_pair, to_bf16};
use half::bf16;

/// The coefficients of the bf16 variant's `2^f − 1 = f·(P2_BF16[2] + f·(P2_BF16[1] +
/// f·P2_BF16[0]))` on `f ∈ [−½, ½]`, a relative-error fit: `pow2_by(&P2_BF16, t)` is within
/// 1.02e-4 of `2^t`, a twentieth of the 2^−9 its p is rounded by next, for 2 FMAs fewer than the
/// f32 variant's `oracle::POW2` (`tests.rs` checks the bound).
pub const P2_BF16: [f32; 3] = [5.500_858_3e-2, 2.422_103_7e-1, 0.693_282_9];

/// A pair of bf16 ones: `dot_pair(l, [p_0, p_1], ONES)` is `l + p_1 + p_0` (products by 1 exact).
const ONES: [bf16; 2] = [bf16::ONE, bf16::ONE];

/// One head's keys and values over one segment, packed in bf16 (module docs).
#[derive(Clone, Copy, Debug)]
pub struct PackedKvBf16<'a> {
    /// `len.div_ceil(KEY_TILE)` tiles of `[d/2][KEY_TILE][2]`.
    pub kt: &'a [bf16],
    /// `len.div_ceil(KEY_TILE)` tiles of `[KEY_TILE/2][dp][2]`.
    pub v: &'a [bf16],
    pub len: usize,
}

/// Floats of a packed key tile and of a packed value tile.
pub(crate) fn tile_sizes(d: usize) -> (usize, usize) {
    (d * KEY_TILE, KEY_TILE * padded_dim(d))
}

/// Where key `j`'s element `c` sits in packed key tiles.
#[inline(always)]
pub(crate) fn key_at(d: usize, j: usize, c: usize) -> usize {
    (j / KEY_TILE) * d * KEY_TILE + (c / 2) * 2 * KEY_TILE + (j % KEY_TILE) * 2 + c % 2
}

/// Where key `j`'s value column `c` sits in packed value tiles.
#[inline(always)]
pub(crate) fn value_at(dp: usize, j: usize, c: usize) -> usize {
    (j / KEY_TILE) * KEY_TILE * dp + ((j % KEY_TILE) / 2) * 2 * dp + c * 2 + j % 2
}

/// One tile of `w` keys and values (`d` values each, row j at `j·stride` of `keys` and of
/// `values`) rounded to bf16 into a packed key tile `kt` and value tile `vt` (module docs), the
/// keys past `w` zero; on AVX-512 BF16 when `simd` (the same bits: a copy of rounded values).
pub(crate) fn pack_tile(
    (keys, values): (&[f32], &[f32]),
    (d, stride): (usize, usize),
    w: usize,
    (kt, vt): (&mut [bf16], &mut [bf16]),
    simd: bool,
) {
    let (kt_tile, v_tile) = tile_sizes(d);
    let dp = padded_dim(d);
    assert!(
        (1..=KEY_TILE).contains(&w)
            && d.is_multiple_of(2)
            && keys.len() >= (w - 1) * stride + d
            && values.len() >= (w - 1) * stride + d
            && kt.len() >= kt_tile
            && vt.len() >= v_tile,
        "bf16 pack_tile: {w} keys of {d}, {stride} apart, from {} / {} values into {} / {}",
        keys.len(),
        values.len(),
        kt.len(),
        vt.len()
    );
    let (kt, vt) = (&mut kt[..kt_tile], &mut vt[..v_tile]);
    #[cfg(target_arch = "x86_64")]
    if simd && super::Operands::Bf16.has_simd() {
        // SAFETY: the CPU has AVX-512 F, BW and BF16 (`has_simd`); the sizes were checked.
        unsafe { x86::pack_tile((keys, values), (d, stride), w, kt, vt) };
        return;
    }
    let _ = simd;
    kt.fill(bf16::ZERO);
    vt.fill(bf16::ZERO);
    for j in 0..w {
        let (k, x) = (&keys[j * stride..][..d], &values[j * stride..][..d]);
        for c in 0..d {
            kt[key_at(d, j, c)] = to_bf16(k[c]);
            vt[value_at(dp, j, c)] = to_bf16(x[c]);
        }
    }
}

/// The bf16 attention of the query `q` (`shape.d` f32 values, rounded here) over `kv`, into
/// `out`, as the module docs fix it.
pub fn attend_row(shape: HeadShape, q: &[f32], kv: PackedKvBf16<'_>, out: &mut [f32]) {
    let d = shape.d;
    let dp = padded_dim(d);
    assert!(d.is_multiple_of(2), "bf16 attention: head dim {d} is odd");
    let q: Vec<bf16> = q[..d].iter().map(|&x| to_bf16(x)).collect();
    let out = &mut out[..d];
    let mut m = f32::NEG_INFINITY;
    let mut l = [0f32; SUM_LANES];
    let mut s = [0f32; KEY_TILE];
    let mut p = [bf16::ZERO; KEY_TILE];
    let mut k = vec![bf16::ZERO; d];
    out.fill(0.0);
    for t0 in (0..kv.len).step_by(KEY_TILE) {
        let w = (kv.len - t0).min(KEY_TILE);
        let mut tile_max = f32::NEG_INFINITY;
        for (j, sj) in s[..w].iter_mut().enumerate() {
            for (c, kc) in k.iter_mut().enumerate() {
                *kc = kv.kt[key_at(d, t0 + j, c)];
            }
            *sj = dot(0.0, &q, &k);
            tile_max = greater(*sj, tile_max);
        }
        let m_new = greater(tile_max, m);
        let (c, mu) = (shape.log2e_scale, m_new * shape.log2e_scale);
        let alpha = if m_new == m {
            1.0
        } else {
            pow2(m.mul_add(c, -mu))
        };
        p.fill(bf16::ZERO);
        for (pj, &sj) in p[..w].iter_mut().zip(&s[..w]) {
            *pj = to_bf16(pow2_by(&P2_BF16, sj.mul_add(c, -mu)));
        }
        for (k, lk) in l.iter_mut().enumerate() {
            *lk *= alpha;
            for u in (0..w).step_by(2 * SUM_LANES) {
                *lk = dot_pair(*lk, [p[u + 2 * k], p[u + 2 * k + 1]], ONES);
            }
        }
        for (c, oc) in out.iter_mut().enumerate() {
            let mut a = *oc * alpha;
            for u in 0..w.div_ceil(2) {
                let (j0, j1) = (t0 + 2 * u, t0 + 2 * u + 1);
                let v = [kv.v[value_at(dp, j0, c)], kv.v[value_at(dp, j1, c)]];
                a = dot_pair(a, [p[2 * u], p[2 * u + 1]], v);
            }
            *oc = a;
        }
        m = m_new;
    }
    let inv = 1.0 / sum_lanes(&l);
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! The AVX-512 BF16 path: one register tile of up to [`MAX_TILE_ROWS`] rows x 64 keys of
    //! `vdpbf16ps` accumulators for the scores (a broadcast pair of query elements, 4 loads of
    //! 16 keys' pairs a step), the online softmax in f32 zmm, and `p · V` with 4 vectors of 16
    //! value columns a step (a broadcast pair of probabilities, 4 loads of 16 columns' pairs).

    // Index loops mirror the register tiles (row r, vector i).
    #![allow(clippy::needless_range_loop)]

    use super::super::oracle::pow2;
    use super::super::x86::pow2_zmm_by;
    use super::super::x86::{register_tiles, running_max, RegisterTile, Rows, Zmm};
    use super::super::{BlockState, HeadShape, Planted, QueryBlock, KEY_TILE, MAX_TILE_ROWS};
    use super::PackedKvBf16;
    use crate::kernels::bf16_dot::x86::{dpbf16_zmm, to_bf16_zmm};
    use crate::kernels::round_row_bf16;
    use half::bf16;
    use std::arch::x86_64::*;

    /// [`super::ONES`] as one 32-bit lane: bf16 1.0 is 0x3F80.
    const ONES_PAIR: i32 = 0x3F80_3F80;

    /// The bf16 block: `state` after all of `kv`'s tiles (`finish` makes the outputs).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW and BF16 (and AVX2, FMA). `kv.kt` and `kv.v` must hold
    /// `kv.len.div_ceil(KEY_TILE)` packed tiles for `shape.d` (even); the block's row r reads
    /// `q[r·q_stride ..][..d]`; `state` must be `reset` for `block.rows` rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma")]
    pub(crate) unsafe fn attend_block(
        shape: HeadShape,
        kv: PackedKvBf16<'_>,
        block: &QueryBlock<'_>,
        state: &mut BlockState,
        planted: Planted,
    ) {
        let (d, dp) = (shape.d, shape.dp());
        let rows = block.rows;
        // The block's queries in bf16, `d` a row.
        state.qb.clear();
        state.qb.resize(rows * d, bf16::ZERO);
        for (r, qb) in state.qb.chunks_exact_mut(d).enumerate() {
            // SAFETY: the features (contract); `qb` holds the row's d values.
            unsafe { round_row_bf16(&block.q[r * block.q_stride..][..d], qb) };
        }
        if state.pb.len() < MAX_TILE_ROWS * KEY_TILE {
            state.pb.resize(MAX_TILE_ROWS * KEY_TILE, bf16::ZERO);
        }
        let qb = state.qb.as_ptr();
        let pb = state.pb.as_mut_ptr();
        let (kt_tile, v_tile) = super::tile_sizes(d);
        for (t, t0) in (0..kv.len).step_by(KEY_TILE).enumerate() {
            let w = planted.keys((kv.len - t0).min(KEY_TILE));
            // SAFETY: tile t < tiles of both packed buffers (contract).
            let (kt, v) = unsafe {
                (
                    kv.kt.as_ptr().add(t * kt_tile),
                    kv.v.as_ptr().add(t * v_tile),
                )
            };
            let tile = PackedTile {
                kt,
                v,
                d,
                dp,
                c: shape.log2e_scale,
                pb,
            };
            // SAFETY: the rows are the block's (their bf16 queries `d` apart in `qb`), each
            // reading the tile's w keys; `pb` holds MAX_TILE_ROWS x KEY_TILE values.
            unsafe { register_tiles(&tile, state, dp, (0, rows), |r| qb.add(r * d), |_| w) }
        }
    }

    /// The lanes below `n` (at most 16).
    #[inline(always)]
    fn lanes16(n: usize) -> u16 {
        if n >= 16 {
            u16::MAX
        } else {
            (1u16 << n) - 1
        }
    }

    /// The 16 x 16 transpose of 32-bit elements: `out[c]` lane `r` is `r[r]` lane `c` (unpacks
    /// of 32 and 64 bits within 128-bit lanes, then two rounds of 128-bit lane shuffles).
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline(always)]
    unsafe fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        // SAFETY: register-only AVX-512 F intrinsics (contract).
        unsafe {
            // t[2i] lane L: r[2i][4L], r[2i+1][4L], r[2i][4L+1], r[2i+1][4L+1]; t[2i+1] the same
            // at 4L+2, 4L+3.
            let mut t = [_mm512_setzero_si512(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
            }
            // s[4i + c] lane L: r[4i .. 4i + 4] at column 4L + c.
            let mut s = [_mm512_setzero_si512(); 16];
            for i in 0..4 {
                s[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
                s[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
                s[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
                s[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
            }
            // Column 4L + c: lane L of s[c], s[4 + c], s[8 + c], s[12 + c].
            let mut out = [_mm512_setzero_si512(); 16];
            for c in 0..4 {
                let a = _mm512_shuffle_i32x4::<0x44>(s[c], s[4 + c]);
                let b = _mm512_shuffle_i32x4::<0x44>(s[8 + c], s[12 + c]);
                out[c] = _mm512_shuffle_i32x4::<0x88>(a, b);
                out[4 + c] = _mm512_shuffle_i32x4::<0xDD>(a, b);
                let a = _mm512_shuffle_i32x4::<0xEE>(s[c], s[4 + c]);
                let b = _mm512_shuffle_i32x4::<0xEE>(s[8 + c], s[12 + c]);
                out[8 + c] = _mm512_shuffle_i32x4::<0x88>(a, b);
                out[12 + c] = _mm512_shuffle_i32x4::<0xDD>(a, b);
            }
            out
        }
    }

    /// [`super::pack_tile`] on AVX-512 BF16: 16 keys' 16 pairs at a time rounded (one zmm of
    /// pairs a key) and transposed in registers to 16 pair rows of 16 keys; values of two keys
    /// rounded together and interleaved column by column. Not `vpscatterdd`: a scatter per key
    /// costs about 3% of `bench attention --segment 784` (PERF.md).
    ///
    /// # Safety
    /// AVX-512 F, BW and BF16; as [`super::pack_tile`], whose checks hold.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(crate) unsafe fn pack_tile(
        (keys, values): (&[f32], &[f32]),
        (d, stride): (usize, usize),
        w: usize,
        kt: &mut [bf16],
        vt: &mut [bf16],
    ) {
        let dp = super::padded_dim(d);
        let (k, x) = (keys.as_ptr(), values.as_ptr());
        let (kp, vp) = (kt.as_mut_ptr(), vt.as_mut_ptr());
        /// Column j of the interleave: value j / 2 of the first key (j even), of the second (odd).
        const INTERLEAVE: [u16; 32] = {
            let mut t = [0u16; 32];
            let mut j = 0;
            while j < 32 {
                t[j] = (j / 2 + (j % 2) * 16) as u16;
                j += 1;
            }
            t
        };
        // SAFETY: the features (contract). Keys: masked loads of values 2·u0 .. d of keys
        // j0 + j < w (inside `keys`: (w − 1)·stride + d values); the stores write pair rows
        // u0 + u < d/2 at keys j0 .. j0 + 16 <= KEY_TILE, `2·((u0 + u)·KEY_TILE + j0)` bf16 on
        // (`kt`: d·KEY_TILE), every key of the tile (keys past w get the zero rows). Values:
        // masked loads of values c0 .. d of keys 2u, 2u + 1 < w; the stores write pair row u <
        // KEY_TILE/2 at columns c0 .. c0 + 16 <= dp (`vt`: KEY_TILE·dp).
        unsafe {
            for j0 in (0..KEY_TILE).step_by(16) {
                let mut u0 = 0;
                while u0 < d / 2 {
                    let left = d - 2 * u0;
                    let mut r = [_mm512_setzero_si512(); 16];
                    for (j, rj) in r.iter_mut().enumerate() {
                        if j0 + j < w {
                            let row = k.add((j0 + j) * stride + 2 * u0);
                            let lo = _mm512_maskz_loadu_ps(lanes16(left), row);
                            let hi = _mm512_maskz_loadu_ps(
                                lanes16(left.saturating_sub(16)),
                                row.wrapping_add(16),
                            );
                            *rj = to_bf16_zmm(lo, hi);
                        }
                    }
                    let cols = transpose16(r);
                    for (u, col) in cols.iter().enumerate().take(d / 2 - u0) {
                        _mm512_storeu_si512(kp.add(2 * ((u0 + u) * KEY_TILE + j0)).cast(), *col);
                    }
                    u0 += 16;
                }
            }
            let interleave = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
            for u in 0..KEY_TILE / 2 {
                let out = vp.add(u * 2 * dp);
                let (j0, j1) = (2 * u, 2 * u + 1);
                for c0 in (0..dp).step_by(16) {
                    let cols = lanes16(d.saturating_sub(c0));
                    let first = if j0 < w {
                        _mm512_maskz_loadu_ps(cols, x.wrapping_add(j0 * stride + c0))
                    } else {
                        _mm512_setzero_ps()
                    };
                    let second = if j1 < w {
                        _mm512_maskz_loadu_ps(cols, x.wrapping_add(j1 * stride + c0))
                    } else {
                        _mm512_setzero_ps()
                    };
                    let pairs = _mm512_permutexvar_epi16(interleave, to_bf16_zmm(first, second));
                    _mm512_storeu_si512(out.add(2 * c0).cast(), pairs);
                }
            }
        }
    }

    /// A packed key and value tile, and a register tile's probabilities `pb`.
    #[derive(Clone, Copy)]
    struct PackedTile {
        kt: *const bf16,
        v: *const bf16,
        d: usize,
        dp: usize,
        /// `scale·log2(e)`.
        c: f32,
        pb: *mut bf16,
    }

    impl RegisterTile for PackedTile {
        type Q = bf16;
        /// # Safety
        /// As [`tile`].
        #[inline(always)]
        unsafe fn run<const R: usize>(&self, rows: Rows<bf16, R>) {
            // SAFETY: this method's contract is `tile`'s.
            unsafe { tile::<R>(rows, self) }
        }
    }

    /// One register tile of R rows against one packed tile of `w` keys (every row's `w`): the
    /// key vectors of 16 the tile holds (a partial tile costs its keys, not 64).
    ///
    /// # Safety
    /// As [`tile_keys`].
    #[inline(always)]
    unsafe fn tile<const R: usize>(rows: Rows<bf16, R>, tile: &PackedTile) {
        // SAFETY: `tile_keys`' contract with KV = ceil(w / 16) (1 <= w <= KEY_TILE).
        unsafe {
            match rows.w[0].div_ceil(16) {
                4 => tile_keys::<R, 4>(rows, tile),
                3 => tile_keys::<R, 3>(rows, tile),
                2 => tile_keys::<R, 2>(rows, tile),
                _ => tile_keys::<R, 1>(rows, tile),
            }
        }
    }

    /// [`tile`] with KV = ceil(w / 16) key vectors: scores in R x KV `vdpbf16ps` accumulators,
    /// the softmax on them in registers (no store and reload of the scores), the rounded p stored
    /// for `p · V`'s broadcasts.
    ///
    /// # Safety
    /// AVX-512 F, BW and BF16; each q readable for `d` bf16, m for 1, l for [`SUM_LANES`], o
    /// for `dp` floats (and writable); `kt`, `v` one packed tile each; `pb` writable for
    /// `R x KEY_TILE` bf16; `16·(KV − 1) < w <= 16·KV <= KEY_TILE`; `d` even; `dp` a
    /// multiple of 16.
    #[inline(always)]
    unsafe fn tile_keys<const R: usize, const KV: usize>(rows: Rows<bf16, R>, tile: &PackedTile) {
        let Rows { q, m, l, o, w } = rows;
        let w = w[0];
        let PackedTile {
            kt,
            v,
            d,
            dp,
            c,
            pb,
        } = *tile;
        // SAFETY: the features (contract). Scores: pair u < d/2 of each row's q, K pairs
        // `kt + u·2·KEY_TILE + 32·i` for i < KV <= 4 (inside the tile). Softmax: row r's m, l
        // and pb (bf16 pairs below 16·KV <= KEY_TILE). p·V: V pair rows u < ceil(w/2) <=
        // KEY_TILE/2 at columns below dp, o columns below dp.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); KV]; R];
            for u in 0..d / 2 {
                let kp = kt.add(u * 2 * KEY_TILE);
                let mut k = [_mm512_setzero_si512(); KV];
                for i in 0..KV {
                    k[i] = _mm512_loadu_si512(kp.add(32 * i).cast());
                }
                for r in 0..R {
                    let qp = _mm512_set1_epi32((q[r].add(2 * u) as *const i32).read_unaligned());
                    for i in 0..KV {
                        acc[r][i] = dpbf16_zmm(acc[r][i], qp, k[i]);
                    }
                }
            }
            // The last vector's keys (the others are whole).
            let last: u16 = if w == 16 * KV {
                u16::MAX
            } else {
                (1u16 << (w % 16)) - 1
            };
            let cv = _mm512_set1_ps(c);
            let mut alpha = [0f32; R];
            for r in 0..R {
                let s = acc[r];
                let mut mx = s[0];
                for i in 1..KV - 1 {
                    mx = _mm512_max_ps(s[i], mx);
                }
                // Keys past w leave the maximum as it is (a lane of the first vector keeps −∞).
                mx = if KV == 1 {
                    _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), last, s[0])
                } else {
                    _mm512_mask_max_ps(mx, last, s[KV - 1], mx)
                };
                let m_old = *m[r];
                let m_new = running_max(Zmm(mx), m_old);
                *m[r] = m_new;
                let mu = m_new * c;
                alpha[r] = if m_new == m_old {
                    1.0
                } else {
                    pow2(m_old.mul_add(c, -mu))
                };
                let neg_mu = _mm512_set1_ps(-mu);
                let mut p = [_mm512_setzero_ps(); KV];
                for i in 0..KV {
                    p[i] = pow2_zmm_by(&super::P2_BF16, _mm512_fmadd_ps(s[i], cv, neg_mu));
                }
                p[KV - 1] = _mm512_maskz_mov_ps(last, p[KV - 1]);
                let pr = pb.add(r * KEY_TILE);
                let mut lv = _mm512_loadu_ps(l[r]);
                if alpha[r] != 1.0 {
                    lv = _mm512_mul_ps(lv, _mm512_set1_ps(alpha[r]));
                }
                // The rounded p, 32 keys a register, stored for p·V and summed into l's lanes
                // against ones (one `vdpbf16ps` where widening and adding took 6 operations).
                let ones = _mm512_set1_epi32(ONES_PAIR);
                for i in (0..KV).step_by(2) {
                    let hi = if i + 1 < KV {
                        p[i + 1]
                    } else {
                        _mm512_setzero_ps()
                    };
                    let pairs = to_bf16_zmm(p[i], hi);
                    _mm512_storeu_si512(pr.add(16 * i).cast(), pairs);
                    lv = dpbf16_zmm(lv, pairs, ones);
                }
                _mm512_storeu_ps(l[r], lv);
            }
            let pairs = w.div_ceil(2);
            let mut c0 = 0;
            while c0 + 64 <= dp {
                pv::<R, 4>(o, &alpha, v, pairs, dp, c0, pb);
                c0 += 64;
            }
            while c0 < dp {
                pv::<R, 1>(o, &alpha, v, pairs, dp, c0, pb);
                c0 += 16;
            }
        }
    }

    /// `o = o·α`, then `vdpbf16ps` over the tile's `pairs` key pairs ascending, for the value
    /// columns `c0 .. c0 + 16·CV` of R rows.
    ///
    /// # Safety
    /// AVX-512 F and BF16; `c0 + 16·CV <= dp`; each o readable and writable for `dp` floats; `v`
    /// one packed value tile; `pb` readable for `R x KEY_TILE` bf16; `pairs <= KEY_TILE / 2`.
    #[inline(always)]
    unsafe fn pv<const R: usize, const CV: usize>(
        o: [*mut f32; R],
        alpha: &[f32; R],
        v: *const bf16,
        pairs: usize,
        dp: usize,
        c0: usize,
        pb: *const bf16,
    ) {
        // SAFETY: the features; loads and stores of columns c0 .. c0 + 16·CV <= dp of each o,
        // of V pair rows u < pairs (32 bf16 = 16 columns' pairs each), and pair u of row r's pb.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); CV]; R];
            for r in 0..R {
                let a = _mm512_set1_ps(alpha[r]);
                for i in 0..CV {
                    let oi = _mm512_loadu_ps(o[r].add(c0 + 16 * i));
                    // o·1 is o: most tiles keep the maximum (see `running_max`).
                    acc[r][i] = if alpha[r] == 1.0 {
                        oi
                    } else {
                        _mm512_mul_ps(oi, a)
                    };
                }
            }
            for u in 0..pairs {
                let vp = v.add(u * 2 * dp + 2 * c0);
                let mut x = [_mm512_setzero_si512(); CV];
                for i in 0..CV {
                    x[i] = _mm512_loadu_si512(vp.add(32 * i).cast());
                }
                for r in 0..R {
                    let pp = _mm512_set1_epi32(
                        (pb.add(r * KEY_TILE + 2 * u) as *const i32).read_unaligned(),
                    );
                    for i in 0..CV {
                        acc[r][i] = dpbf16_zmm(acc[r][i], pp, x[i]);
                    }
                }
            }
            for r in 0..R {
                for i in 0..CV {
                    _mm512_storeu_ps(o[r].add(c0 + 16 * i), acc[r][i]);
                }
            }
        }
    }
}
