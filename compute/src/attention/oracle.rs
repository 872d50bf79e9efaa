//! The arithmetic of one query row, written out plainly (the module docs of `attention` state
//! it): the portable path, and the oracle every SIMD path is tested bit-equal to.

use super::{Elem, HeadShape, PackedKv, KEY_TILE, SUM_LANES};

/// `a` if it is greater than `b`, else `b` (the `vmaxps` rule, element first).
#[inline(always)]
pub(crate) fn greater(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The coefficients of `2^f − 1 = f·(P2[4] + f·(P2[3] + … f·P2[0]))` on `f ∈ [−½, ½]` (a
/// relative-error fit: `pow2` is within 2e-7 of `2^t`, as `tests.rs` checks).
// The last is the fit's, 2 ulp from ln 2 (f32's LN_2 would move the fit's error).
#[allow(clippy::approx_constant)]
pub(crate) const POW2: [f32; 5] = [
    1.326_453_4e-3,
    9.671_487e-3,
    5.550_734e-2,
    2.402_224_2e-1,
    0.693_147,
];

/// The smallest exponent [`pow2`] takes: `2^−126` is the smallest normal f32, so `2^n` is one.
pub(crate) const POW2_MIN: f32 = -126.0;

/// `2^t` as the kernels compute it (one `vmaxps`, `vrndscaleps`, `vsubps`, 5 FMAs and one
/// `vscalefps`): `t' = greater(−126, t)` (a NaN stays), `n = round_ties_even(t')`, `f = t' − n`,
/// `y = fma(… fma(P2[0], f, P2[1]) …, f, 1)`, then `y·2^n`, rounded once (a normal power of 2,
/// so a product `vscalefps` rounds alike, a denormal result included).
#[inline(always)]
pub fn pow2(t: f32) -> f32 {
    pow2_by(&POW2, t)
}

/// [`pow2`] with the polynomial's `coefficients` (highest degree first, the constant 1 implied):
/// [`POW2`], or the bf16 variant's shorter one for its p.
#[inline(always)]
pub(crate) fn pow2_by(coefficients: &[f32], t: f32) -> f32 {
    let t = greater(POW2_MIN, t);
    let n = t.round_ties_even();
    let f = t - n;
    let mut y = coefficients[0];
    for &c in &coefficients[1..] {
        y = y.mul_add(f, c);
    }
    let y = y.mul_add(f, 1.0);
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The running-sum lanes added 0 to 15, in order.
#[inline(always)]
pub(crate) fn sum_lanes(l: &[f32]) -> f32 {
    let mut sum = l[0];
    for &x in &l[1..] {
        sum += x;
    }
    sum
}

/// Attention of the query `q` (`shape.d` values) over the `kv.len` keys of `kv`, into `out`
/// (`shape.d` values), tile by tile as the module docs fix it.
pub fn attend_row(shape: HeadShape, q: &[f32], kv: PackedKv<'_>, out: &mut [f32]) {
    let d = shape.d;
    let dp = super::padded_dim(d);
    let out = &mut out[..d];
    let mut m = f32::NEG_INFINITY;
    let mut l = [0f32; SUM_LANES];
    let mut p = [0f32; KEY_TILE];
    out.fill(0.0);
    for (t, t0) in (0..kv.len).step_by(KEY_TILE).enumerate() {
        let w = (kv.len - t0).min(KEY_TILE);
        let kt = &kv.kt[t * d * KEY_TILE..][..d * KEY_TILE];
        let v = &kv.v[t0 * dp..][..w * dp];
        tile_step(shape, q, kt, v, w, (&mut m, &mut l, out), &mut p);
    }
    finish_row(&l, out);
}

/// One key tile of `w` keys (`kt`: `[d][KEY_TILE]`, key j in column j; `v`: `w` rows of
/// `padded_dim(d)`; f32 or bf16, each value widened exactly as it is read) into one row's running
/// state `(m, l, o)` (`o`: `d` values), as the module docs fix it; `p` is scratch.
pub(crate) fn tile_step<E: Elem>(
    shape: HeadShape,
    q: &[f32],
    kt: &[E],
    v: &[E],
    w: usize,
    (m, l, o): (&mut f32, &mut [f32; SUM_LANES], &mut [f32]),
    p: &mut [f32; KEY_TILE],
) {
    let d = shape.d;
    let dp = super::padded_dim(d);
    let q = &q[..d];
    let mut tile_max = f32::NEG_INFINITY;
    for (j, pj) in p[..w].iter_mut().enumerate() {
        let mut acc = 0f32;
        for (c, &qc) in q.iter().enumerate() {
            acc = qc.mul_add(kt[c * KEY_TILE + j].widen(), acc);
        }
        *pj = acc;
        tile_max = greater(*pj, tile_max);
    }
    let m_new = greater(tile_max, *m);
    let (c, mu) = (shape.log2e_scale, m_new * shape.log2e_scale);
    let alpha = if m_new == *m {
        1.0
    } else {
        pow2(m.mul_add(c, -mu))
    };
    for pj in &mut p[..w] {
        *pj = pow2(pj.mul_add(c, -mu));
    }
    for (i, li) in l.iter_mut().enumerate() {
        *li *= alpha;
        for j in (i..w).step_by(SUM_LANES) {
            *li += p[j];
        }
    }
    for (c, oc) in o[..d].iter_mut().enumerate() {
        let mut a = *oc * alpha;
        for (j, &pj) in p[..w].iter().enumerate() {
            a = pj.mul_add(v[j * dp + c].widen(), a);
        }
        *oc = a;
    }
    *m = m_new;
}

/// `o_c = o_c · (1 / Σ_i l[i])`, the lanes summed 0 to 15.
pub(crate) fn finish_row(l: &[f32], o: &mut [f32]) {
    let inv = 1.0 / sum_lanes(l);
    for x in o.iter_mut() {
        *x *= inv;
    }
}
