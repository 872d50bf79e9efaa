//! The 16-bit variant: q, k, v and the probabilities p in bf16, every product accumulated in
//! f32 as AVX-512 BF16's `vdpbf16ps` does it ([`crate::kernels::bf16_dot`] is the oracle of one
//! lane). Per query row, over the f32 variant's tiles (module docs of `attention`):
//! - `q' = to_bf16(q)`; keys and values were packed as `to_bf16(k)`, `to_bf16(v)`;
//! - `s_j = bf16_dot::dot(0, q', k'_j) · scale` (pairs of elements ascending);
//! - `m'`, `α` as the f32 variant; `p_j = to_bf16(exp(s_j − m'))`;
//! - `l[i] = l[i]·α + p_i + p_{i+16} + …` (the rounded p, in f32);
//! - `o_c = dot_pair(… dot_pair(o_c·α, [p_0, p_1], [v_0c, v_1c]) …)` over the tile's pairs of keys
//!   ascending, an odd tile's last key paired with a zero key (p = 0, v = 0);
//!
//! then `out_c = o_c · (1 / Σ_i l[i])`. The AVX-512 BF16 path (zmm) is tested bit-equal to
//! [`attend_row`]; a CPU without the instructions runs [`attend_row`].
//!
//! Packed layouts (pairs adjacent, as `vdpbf16ps` reads them): a key tile is
//! `[d/2][KEY_TILE][2]` (key j's elements 2u, 2u + 1 together), a value tile
//! `[KEY_TILE/2][dp][2]` (column c of keys 2u, 2u + 1 together); keys past `len` are zero.

use super::oracle::{greater, sum_lanes};
use super::{padded_dim, HeadShape, KEY_TILE, SUM_LANES};
use crate::kernels::bf16_dot::{dot, dot_pair, to_bf16};
use crate::ops::mathf::exp;
use half::bf16;

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
            *sj = dot(0.0, &q, &k) * shape.scale;
            tile_max = greater(*sj, tile_max);
        }
        let m_new = greater(tile_max, m);
        let alpha = if m_new == m { 1.0 } else { exp(m - m_new) };
        p.fill(bf16::ZERO);
        for (pj, &sj) in p[..w].iter_mut().zip(&s[..w]) {
            *pj = to_bf16(exp(sj - m_new));
        }
        for (i, li) in l.iter_mut().enumerate() {
            *li *= alpha;
            for j in (i..w).step_by(SUM_LANES) {
                *li += p[j].to_f32();
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

    use super::super::oracle::greater;
    use super::super::x86::{register_tiles, RegisterTile, Rows};
    use super::super::{BlockState, HeadShape, QueryBlock, KEY_TILE, MAX_TILE_ROWS, SUM_LANES};
    use super::PackedKvBf16;
    use crate::kernels::bf16_dot::x86::{dpbf16_zmm, to_bf16_zmm};
    use crate::ops::mathf::{self, simd::exp16};
    use half::bf16;
    use std::arch::x86_64::*;

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
    ) {
        let (d, dp) = (shape.d, shape.dp());
        let rows = block.rows;
        // The block's queries in bf16, `d` a row.
        state.qb.clear();
        for r in 0..rows {
            let q = &block.q[r * block.q_stride..][..d];
            state
                .qb
                .extend(q.iter().map(|&x| crate::kernels::bf16_dot::to_bf16(x)));
        }
        if state.pb.len() < MAX_TILE_ROWS * KEY_TILE {
            state.pb.resize(MAX_TILE_ROWS * KEY_TILE, bf16::ZERO);
        }
        let qb = state.qb.as_ptr();
        let (s, pb) = (state.p.as_mut_ptr(), state.pb.as_mut_ptr());
        let (kt_tile, v_tile) = super::tile_sizes(d);
        for (t, t0) in (0..kv.len).step_by(KEY_TILE).enumerate() {
            let w = (kv.len - t0).min(KEY_TILE);
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
                scale: shape.scale,
                s,
                pb,
            };
            // SAFETY: the rows are the block's (their bf16 queries `d` apart in `qb`), each
            // reading the tile's w keys; `s` and `pb` hold MAX_TILE_ROWS x KEY_TILE values.
            unsafe { register_tiles(&tile, state, dp, (0, rows), |r| qb.add(r * d), |_| w) }
        }
    }

    /// A packed key and value tile, and a register tile's scores `s` and probabilities `pb`.
    #[derive(Clone, Copy)]
    struct PackedTile {
        kt: *const bf16,
        v: *const bf16,
        d: usize,
        dp: usize,
        scale: f32,
        s: *mut f32,
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

    /// One register tile of R rows against one packed tile of `w` keys (every row's `w`).
    ///
    /// # Safety
    /// AVX-512 F, BW and BF16; each q readable for `d` bf16, m for 1, l for [`SUM_LANES`], o
    /// for `dp` floats (and writable); `kt`, `v` one packed tile each; `s` (f32) and `pb` (bf16)
    /// writable for `R x KEY_TILE`; `1 <= w <= KEY_TILE`; `d` even; `dp` a multiple of 64 or
    /// of 16.
    #[inline(always)]
    unsafe fn tile<const R: usize>(rows: Rows<bf16, R>, tile: &PackedTile) {
        let Rows { q, m, l, o, w } = rows;
        let w = w[0];
        let PackedTile {
            kt,
            v,
            d,
            dp,
            scale,
            s,
            pb,
        } = *tile;
        // SAFETY: the features (contract). Scores: pair u < d/2 of each row's q, K pairs
        // `kt + u·2·KEY_TILE + 32·i` for i < 4 (inside the tile); stores into row r's `s`.
        // Softmax: row r's s, pb, m, l. p·V: V pair rows u < ceil(w/2) <= KEY_TILE/2 at columns
        // below dp, o columns below dp.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 4]; R];
            for u in 0..d / 2 {
                let kp = kt.add(u * 2 * KEY_TILE);
                let k: [__m512i; 4] =
                    std::array::from_fn(|i| _mm512_loadu_si512(kp.add(32 * i).cast()));
                for r in 0..R {
                    let qp = _mm512_set1_epi32((q[r].add(2 * u) as *const i32).read_unaligned());
                    for i in 0..4 {
                        acc[r][i] = dpbf16_zmm(acc[r][i], qp, k[i]);
                    }
                }
            }
            let sc = _mm512_set1_ps(scale);
            let mut alpha = [0f32; R];
            let keep = if w >= 64 { u64::MAX } else { (1u64 << w) - 1 };
            for r in 0..R {
                let sr = s.add(r * KEY_TILE);
                let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
                for i in 0..4 {
                    let mask = (keep >> (16 * i)) as u16;
                    let x = _mm512_mask_blend_ps(
                        mask,
                        _mm512_set1_ps(f32::NEG_INFINITY),
                        _mm512_mul_ps(acc[r][i], sc),
                    );
                    _mm512_storeu_ps(sr.add(16 * i), x);
                    mx = _mm512_max_ps(x, mx);
                }
                let m_old = *m[r];
                let m_new = greater(_mm512_reduce_max_ps(mx), m_old);
                *m[r] = m_new;
                alpha[r] = if m_new == m_old {
                    1.0
                } else {
                    mathf::exp(m_old - m_new)
                };
                let mv = _mm512_set1_ps(m_new);
                let p: [__m512; 4] = std::array::from_fn(|i| {
                    let mask = (keep >> (16 * i)) as u16;
                    _mm512_maskz_mov_ps(
                        mask,
                        exp16(_mm512_sub_ps(_mm512_loadu_ps(sr.add(16 * i)), mv)),
                    )
                });
                let pr = pb.add(r * KEY_TILE);
                _mm512_storeu_si512(pr.cast(), to_bf16_zmm(p[0], p[1]));
                _mm512_storeu_si512(pr.add(32).cast(), to_bf16_zmm(p[2], p[3]));
                // The rounded p back in f32 (a bf16 is the top half of its f32).
                let widen = |at: usize| {
                    let h = _mm256_loadu_si256(pr.add(at).cast());
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
                };
                let mut lv = _mm512_mul_ps(_mm512_loadu_ps(l[r]), _mm512_set1_ps(alpha[r]));
                for chunk in 0..KEY_TILE / SUM_LANES {
                    lv = _mm512_add_ps(lv, widen(chunk * SUM_LANES));
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
                    acc[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o[r].add(c0 + 16 * i)), a);
                }
            }
            for u in 0..pairs {
                let vp = v.add(u * 2 * dp + 2 * c0);
                let x: [__m512i; CV] =
                    std::array::from_fn(|i| _mm512_loadu_si512(vp.add(32 * i).cast()));
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
