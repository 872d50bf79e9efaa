//! The gated delta rule of one value head over a run of rows, in two forms:
//!
//! - **recurrent** ([`recurrent_rows`]), row after row, for decode and for steps short enough to
//!   roll back to any of their rows (draft windows). Its arithmetic per state element is
//!   [`delta_rule_row_oracle`]'s, the definition the fast copies are tested bit-equal against:
//!   with `d = e^g`, `kv = kᵀS`, `qs = qᵀS` (the state before the decay), `δ = β(v − d·kv)`,
//!   `o = d·qs + (q·k)δ` (= qᵀS' by linearity) and `S' = d·S + k⊗δ`. So one pass reads S (the two
//!   dot products) and one pass reads and writes it (the update); no allocation per call.
//!   Each column of S evolves alone (its kv, δ and update use that column only), so the kernel
//!   walks S in column blocks of [`BLOCK`] (128 key rows x 64 columns = 32 KiB, L1-sized) and both
//!   passes of a row hit L1.
//! - **chunked** ([`chunked_rows`]), transformers' `torch_chunk_gated_delta_rule` (chunks of
//!   [`CHUNK`] rows): within a chunk the rows' updates are solved together by a unit lower
//!   triangular system (the UT transform) and applied to S as matrix products, so S is read and
//!   written once per chunk instead of once per row. Same sums in another order: it stays within
//!   [`CHUNKED_REL_BOUND`] of the recurrent form (measured on random inputs in the tests).
//!
//! Both are plain loops the compiler vectorizes; [`DeltaIsa`] picks a copy compiled for AVX2 or
//! AVX-512 (`compute::kernels::Isa::best`, so `XDNA_VL_KERNELS` applies). No FMA contraction:
//! the products and sums are separate roundings in every copy, so the copies are bit-equal.

use compute::ops::mathf::silu;

/// Columns of S a recurrent block keeps in flight (4 zmm accumulators per dot product).
pub const BLOCK: usize = 64;
/// Rows of a chunk of the chunked form (transformers' `chunk_size`).
pub const CHUNK: usize = 64;
/// Largest |chunked − recurrent| / max|recurrent| seen on the tests' random inputs was 9.1e-7
/// (outputs and final state); the tests hold it to this.
pub const CHUNKED_REL_BOUND: f32 = 1e-5;

/// Which form a step of more than `MAX_ROLLBACK_ROWS` rows (one that keeps no per-row states)
/// runs. Recurrent by default: on the 2-core Zen 4 its column blocks run a 128 x 128 head over
/// 512 rows in 0.85 ms against the chunked form's 3.7–7.9 ms (`delta_rule_speed` below; PERF.md),
/// and it makes a prompt's result independent of how it is sliced into steps (bit for bit, which
/// `tests/sequences.rs` checks). `XDNA_VL_DELTA_RULE=chunked` picks the chunked form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaRuleForm {
    Recurrent,
    Chunked,
}

impl DeltaRuleForm {
    pub fn from_env() -> DeltaRuleForm {
        match std::env::var("XDNA_VL_DELTA_RULE").as_deref() {
            Ok("chunked") => DeltaRuleForm::Chunked,
            _ => DeltaRuleForm::Recurrent,
        }
    }
}

/// Which compiled copy of the kernels runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaIsa {
    Portable,
    Avx2,
    Avx512,
}

impl DeltaIsa {
    /// The copy for the instruction set the GEMM kernels use.
    pub fn best() -> DeltaIsa {
        match compute::kernels::Isa::best() {
            #[cfg(target_arch = "x86_64")]
            compute::kernels::Isa::Avx512Vnni => DeltaIsa::Avx512,
            #[cfg(target_arch = "x86_64")]
            compute::kernels::Isa::Avx2 => DeltaIsa::Avx2,
            _ => DeltaIsa::Portable,
        }
    }
}

/// One value head's inputs over `rows` rows: q (normalized and scaled), k (normalized) and v of
/// row `r` at `mixed[r * row_len + {q_at, k_at, v_at}..]`; β and the log-decay g of row `r` at
/// `beta[r * gate_len + head]` and `log_decay[..]` (the decay is e^g).
#[derive(Clone, Copy)]
pub struct HeadRows<'a> {
    pub rows: usize,
    pub mixed: &'a [f32],
    pub row_len: usize,
    pub q_at: usize,
    pub k_at: usize,
    pub v_at: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub beta: &'a [f32],
    pub log_decay: &'a [f32],
    pub gate_len: usize,
    pub head: usize,
}

impl<'a> HeadRows<'a> {
    #[inline(always)]
    fn q(&self, r: usize) -> &'a [f32] {
        &self.mixed[r * self.row_len + self.q_at..][..self.key_dim]
    }
    #[inline(always)]
    fn k(&self, r: usize) -> &'a [f32] {
        &self.mixed[r * self.row_len + self.k_at..][..self.key_dim]
    }
    #[inline(always)]
    fn v(&self, r: usize) -> &'a [f32] {
        &self.mixed[r * self.row_len + self.v_at..][..self.value_dim]
    }
    #[inline(always)]
    fn beta(&self, r: usize) -> f32 {
        self.beta[r * self.gate_len + self.head]
    }
    #[inline(always)]
    fn log_decay(&self, r: usize) -> f32 {
        self.log_decay[r * self.gate_len + self.head]
    }
}

/// q·k summed in order (shared by every copy: a strict-order sum is not vectorized).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        acc += x * y;
    }
    acc
}

/// The definition of one recurrent row (see the module doc), element by element: `s` is the
/// head's `k_dim x v_dim` state (key major), `decay` = e^g; writes o.
pub fn delta_rule_row_oracle(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: f32,
    decay: f32,
    o: &mut [f32],
) {
    let (dk, dv) = (k.len(), v.len());
    let qk = dot(q, k);
    for j in 0..dv {
        let (mut kv, mut qs) = (0.0f32, 0.0f32);
        for i in 0..dk {
            kv += s[i * dv + j] * k[i];
            qs += s[i * dv + j] * q[i];
        }
        let delta = beta * (v[j] - decay * kv);
        o[j] = decay * qs + qk * delta;
        for i in 0..dk {
            s[i * dv + j] = decay * s[i * dv + j] + k[i] * delta;
        }
    }
}

/// The recurrent form over `inp.rows` rows: `s` the head's state, `out` the rows' outputs
/// (`rows x value_dim`). Each row's arithmetic is the same however many rows a call has: a
/// window's prefix replayed from the state before it is bit-equal to the state the whole window
/// passed through (`recurrent.rs` rolls back so).
pub fn recurrent_rows(isa: DeltaIsa, s: &mut [f32], inp: &HeadRows<'_>, out: &mut [f32]) {
    check(s, inp, out);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `DeltaIsa::best` returns Avx512 only when the GEMM kernels' detection found
        // AVX-512 F/VL/BW (with AVX2 and FMA) on this CPU.
        DeltaIsa::Avx512 => unsafe { x86::recurrent_avx512(s, inp, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2 only when AVX2 and FMA were detected.
        DeltaIsa::Avx2 => unsafe { x86::recurrent_avx2(s, inp, out) },
        _ => recurrent_blocks(s, inp, out),
    }
}

fn check(s: &[f32], inp: &HeadRows<'_>, out: &[f32]) {
    assert_eq!(
        s.len(),
        inp.key_dim * inp.value_dim,
        "delta rule: state size"
    );
    assert!(
        out.len() >= inp.rows * inp.value_dim,
        "delta rule: output rows"
    );
}

#[inline(always)]
fn recurrent_blocks(s: &mut [f32], inp: &HeadRows<'_>, out: &mut [f32]) {
    let dv = inp.value_dim;
    let mut j0 = 0;
    while j0 + BLOCK <= dv {
        column_block::<BLOCK>(s, j0, inp, out);
        j0 += BLOCK;
    }
    while j0 < dv {
        column_block::<1>(s, j0, inp, out);
        j0 += 1;
    }
}

/// Columns `j0..j0 + W` of S through every row (the columns do not interact).
#[inline(always)]
fn column_block<const W: usize>(s: &mut [f32], j0: usize, inp: &HeadRows<'_>, out: &mut [f32]) {
    let (dk, dv) = (inp.key_dim, inp.value_dim);
    for r in 0..inp.rows {
        let (q, k, v) = (inp.q(r), inp.k(r), inp.v(r));
        let (beta, decay) = (inp.beta(r), inp.log_decay(r).exp());
        let qk = dot(q, k);
        let mut kv = [0.0f32; W];
        let mut qs = [0.0f32; W];
        for i in 0..dk {
            let srow: &[f32; W] = s[i * dv + j0..][..W].try_into().expect("W columns");
            let (ki, qi) = (k[i], q[i]);
            for j in 0..W {
                kv[j] += srow[j] * ki;
                qs[j] += srow[j] * qi;
            }
        }
        let mut delta = [0.0f32; W];
        let vb: &[f32; W] = v[j0..j0 + W].try_into().expect("W columns");
        let o: &mut [f32; W] = (&mut out[r * dv + j0..][..W])
            .try_into()
            .expect("W columns");
        for j in 0..W {
            delta[j] = beta * (vb[j] - decay * kv[j]);
            o[j] = decay * qs[j] + qk * delta[j];
        }
        for i in 0..dk {
            let srow: &mut [f32; W] = (&mut s[i * dv + j0..][..W]).try_into().expect("W columns");
            let ki = k[i];
            for j in 0..W {
                srow[j] = decay * srow[j] + ki * delta[j];
            }
        }
    }
}

/// Per-head buffers of the chunked form (made once per head and step, reused over its chunks).
#[derive(Default)]
pub struct ChunkScratch {
    /// Cumulative log-decay within the chunk.
    c: Vec<f32>,
    /// k transposed (`key_dim x n`), then scaled by e^(c_last − c_j).
    kt: Vec<f32>,
    /// Lower-triangular `n x n`: β_i k_i·k_j e^(c_i − c_j) (the UT system), and q_i·k_j
    /// e^(c_i − c_j) (the intra-chunk attention, diagonal included).
    a: Vec<f32>,
    qk: Vec<f32>,
    /// `n x value_dim`: the solved values u, then v_new = u − W S.
    u: Vec<f32>,
    /// `n x key_dim`: the solved decayed keys W.
    w: Vec<f32>,
}

/// The chunked form over `inp.rows` rows (no per-row states): `s` the head's state before the
/// rows and after them, `out` the rows' outputs.
pub fn chunked_rows(
    isa: DeltaIsa,
    s: &mut [f32],
    inp: &HeadRows<'_>,
    out: &mut [f32],
    scratch: &mut ChunkScratch,
) {
    check(s, inp, out);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `recurrent_rows`: Avx512 only when AVX-512 F/VL/BW, AVX2, FMA were found.
        DeltaIsa::Avx512 => unsafe { x86::chunked_avx512(s, inp, out, scratch) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2 only when AVX2 and FMA were detected.
        DeltaIsa::Avx2 => unsafe { x86::chunked_avx2(s, inp, out, scratch) },
        _ => chunked_all(s, inp, out, scratch),
    }
}

#[inline(always)]
fn chunked_all(s: &mut [f32], inp: &HeadRows<'_>, out: &mut [f32], sc: &mut ChunkScratch) {
    let mut r0 = 0;
    while r0 < inp.rows {
        let n = CHUNK.min(inp.rows - r0);
        chunk(s, inp, r0, n, out, sc);
        r0 += n;
    }
}

/// `y += a · x` over equal lengths (the vectorized inner loop of every product here).
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Rows `r0..r0 + n` (one chunk): with c the cumulative log-decay over the chunk,
/// A[i][j] = β_i k_i·k_j e^(c_i − c_j) (j < i), u = (I + A)⁻¹ (β v), W = (I + A)⁻¹ (β e^c k);
/// v_new = u − W S; o = (q e^c) S + (q_i·k_j e^(c_i − c_j))_(j ≤ i) v_new;
/// S ← e^(c_last) S + (k e^(c_last − c))ᵀ v_new.
#[inline(always)]
fn chunk(
    s: &mut [f32],
    inp: &HeadRows<'_>,
    r0: usize,
    n: usize,
    out: &mut [f32],
    sc: &mut ChunkScratch,
) {
    let (dk, dv) = (inp.key_dim, inp.value_dim);
    sc.c.clear();
    let mut acc = 0.0f32;
    for r in 0..n {
        acc += inp.log_decay(r0 + r);
        sc.c.push(acc);
    }
    let c = &sc.c;
    sc.kt.clear();
    sc.kt.resize(dk * n, 0.0);
    for r in 0..n {
        for (d, &kv) in inp.k(r0 + r).iter().enumerate() {
            sc.kt[d * n + r] = kv;
        }
    }
    // Gram rows, j ≤ i, as sums over the key dim of k_i[d] · kᵀ[d][..=i] (vectorized over j).
    sc.a.clear();
    sc.a.resize(n * n, 0.0);
    sc.qk.clear();
    sc.qk.resize(n * n, 0.0);
    for i in 0..n {
        let (qi, ki) = (inp.q(r0 + i), inp.k(r0 + i));
        let arow = &mut sc.a[i * n..i * n + i + 1];
        let qrow = &mut sc.qk[i * n..i * n + i + 1];
        for d in 0..dk {
            let kt = &sc.kt[d * n..d * n + i + 1];
            axpy(arow, ki[d], kt);
            axpy(qrow, qi[d], kt);
        }
        let beta = inp.beta(r0 + i);
        for j in 0..=i {
            let decay = (c[i] - c[j]).exp();
            arow[j] *= beta * decay;
            qrow[j] *= decay;
        }
    }
    // Forward substitution: row i of u and W minus A[i][j] times the rows before it.
    sc.u.clear();
    sc.u.resize(n * dv, 0.0);
    sc.w.clear();
    sc.w.resize(n * dk, 0.0);
    for (i, &ci) in c.iter().enumerate() {
        let beta = inp.beta(r0 + i);
        let scale = beta * ci.exp();
        let (done_u, rest_u) = sc.u.split_at_mut(i * dv);
        let ui = &mut rest_u[..dv];
        for (u, &v) in ui.iter_mut().zip(inp.v(r0 + i)) {
            *u = beta * v;
        }
        let (done_w, rest_w) = sc.w.split_at_mut(i * dk);
        let wi = &mut rest_w[..dk];
        for (w, &k) in wi.iter_mut().zip(inp.k(r0 + i)) {
            *w = scale * k;
        }
        for j in 0..i {
            let a = -sc.a[i * n + j];
            axpy(ui, a, &done_u[j * dv..(j + 1) * dv]);
            axpy(wi, a, &done_w[j * dk..(j + 1) * dk]);
        }
    }
    // v_new = u − W S and o = (q e^c) S, S's rows read once for all the chunk's rows.
    for i in 0..n {
        let o = &mut out[(r0 + i) * dv..(r0 + i + 1) * dv];
        o.fill(0.0);
    }
    for d in 0..dk {
        let srow = &s[d * dv..(d + 1) * dv];
        for i in 0..n {
            let wd = -sc.w[i * dk + d];
            axpy(&mut sc.u[i * dv..(i + 1) * dv], wd, srow);
        }
    }
    for i in 0..n {
        let q = inp.q(r0 + i);
        let scale = c[i].exp();
        let o = &mut out[(r0 + i) * dv..(r0 + i + 1) * dv];
        for (d, &qd) in q.iter().enumerate() {
            axpy(o, qd * scale, &s[d * dv..(d + 1) * dv]);
        }
        for j in 0..=i {
            axpy(o, sc.qk[i * n + j], &sc.u[j * dv..(j + 1) * dv]);
        }
    }
    // S ← e^(c_last) S + Σ_i (k_i e^(c_last − c_i)) ⊗ v_new_i.
    let last = c[n - 1];
    let chunk_decay = last.exp();
    for (r, &cr) in c.iter().enumerate() {
        let scale = (last - cr).exp();
        for d in 0..dk {
            sc.kt[d * n + r] *= scale;
        }
    }
    for d in 0..dk {
        let srow = &mut s[d * dv..(d + 1) * dv];
        for x in srow.iter_mut() {
            *x *= chunk_decay;
        }
        for r in 0..n {
            axpy(srow, sc.kt[d * n + r], &sc.u[r * dv..(r + 1) * dv]);
        }
    }
}

/// One output row of the depthwise causal conv with SiLU from its `kernel` input rows
/// (`window`, oldest first, the last the row itself) and the tap-major weights `taps`
/// (`kernel x channels`): `row[c] = silu(0 + Σ_j taps[j][c]·window[j][c])`, j ascending, with
/// compute's `mathf::silu` (the one the MLP uses; same bits in every copy).
pub fn conv_taps(isa: DeltaIsa, taps: &[f32], window: &[f32], row: &mut [f32]) {
    assert_eq!(taps.len(), window.len(), "conv: taps and window");
    assert_eq!(taps.len() % row.len().max(1), 0, "conv: channels");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `recurrent_rows`.
        DeltaIsa::Avx512 => unsafe { x86::conv_taps_avx512(taps, window, row) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2 only when AVX2 and FMA were detected.
        DeltaIsa::Avx2 => unsafe { x86::conv_taps_avx2(taps, window, row) },
        _ => conv_taps_body(taps, window, row),
    }
}

#[inline(always)]
fn conv_taps_body(taps: &[f32], window: &[f32], row: &mut [f32]) {
    let c_dim = row.len();
    row.fill(0.0);
    for (w, x) in taps.chunks_exact(c_dim).zip(window.chunks_exact(c_dim)) {
        for ((acc, &w), &x) in row.iter_mut().zip(w).zip(x) {
            *acc += w * x;
        }
    }
    for x in row.iter_mut() {
        *x = silu(*x);
    }
}

/// `o[i] *= silu(z[i])` (the gated norm's gate), with `mathf::silu`.
pub fn mul_silu(isa: DeltaIsa, o: &mut [f32], z: &[f32]) {
    assert_eq!(o.len(), z.len(), "mul_silu: lengths");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `recurrent_rows`.
        DeltaIsa::Avx512 => unsafe { x86::mul_silu_avx512(o, z) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2 only when AVX2 and FMA were detected.
        DeltaIsa::Avx2 => unsafe { x86::mul_silu_avx2(o, z) },
        _ => mul_silu_body(o, z),
    }
}

#[inline(always)]
fn mul_silu_body(o: &mut [f32], z: &[f32]) {
    for (o, &z) in o.iter_mut().zip(z) {
        *o *= silu(z);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    /// # Safety
    /// The CPU must have AVX-512 F, VL and BW, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma")]
    pub unsafe fn conv_taps_avx512(taps: &[f32], window: &[f32], row: &mut [f32]) {
        conv_taps_body(taps, window, row)
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn conv_taps_avx2(taps: &[f32], window: &[f32], row: &mut [f32]) {
        conv_taps_body(taps, window, row)
    }

    /// # Safety
    /// The CPU must have AVX-512 F, VL and BW, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma")]
    pub unsafe fn mul_silu_avx512(o: &mut [f32], z: &[f32]) {
        mul_silu_body(o, z)
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mul_silu_avx2(o: &mut [f32], z: &[f32]) {
        mul_silu_body(o, z)
    }

    /// # Safety
    /// The CPU must have AVX-512 F, VL and BW, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma")]
    pub unsafe fn recurrent_avx512(s: &mut [f32], inp: &HeadRows<'_>, out: &mut [f32]) {
        recurrent_blocks(s, inp, out)
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn recurrent_avx2(s: &mut [f32], inp: &HeadRows<'_>, out: &mut [f32]) {
        recurrent_blocks(s, inp, out)
    }

    /// # Safety
    /// The CPU must have AVX-512 F, VL and BW, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma")]
    pub unsafe fn chunked_avx512(
        s: &mut [f32],
        inp: &HeadRows<'_>,
        out: &mut [f32],
        sc: &mut ChunkScratch,
    ) {
        chunked_all(s, inp, out, sc)
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn chunked_avx2(
        s: &mut [f32],
        inp: &HeadRows<'_>,
        out: &mut [f32],
        sc: &mut ChunkScratch,
    ) {
        chunked_all(s, inp, out, sc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs of `rows` rows for one head of a layer with `heads` value heads: q, k unit-norm
    /// (q also scaled by 1/√dk), v O(1), β in (0, 1), g in (−2, 0), from a small LCG.
    struct Case {
        mixed: Vec<f32>,
        beta: Vec<f32>,
        g: Vec<f32>,
        rows: usize,
        dk: usize,
        dv: usize,
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn case(rows: usize, dk: usize, dv: usize, seed: u64) -> Case {
        let mut seed = seed;
        let row_len = 2 * dk + dv;
        let mut mixed: Vec<f32> = (0..rows * row_len).map(|_| lcg(&mut seed)).collect();
        for row in mixed.chunks_exact_mut(row_len) {
            for (h, part) in row[..2 * dk].chunks_exact_mut(dk).enumerate() {
                let norm = part.iter().map(|x| x * x).sum::<f32>().sqrt();
                let scale = if h == 0 { (dk as f32).sqrt() } else { 1.0 };
                for x in part.iter_mut() {
                    *x /= norm * scale;
                }
            }
        }
        let beta = (0..rows).map(|_| 0.5 + 0.49 * lcg(&mut seed)).collect();
        let g = (0..rows).map(|_| -1.0 - 0.99 * lcg(&mut seed)).collect();
        Case {
            mixed,
            beta,
            g,
            rows,
            dk,
            dv,
        }
    }

    impl Case {
        fn head(&self) -> HeadRows<'_> {
            HeadRows {
                rows: self.rows,
                mixed: &self.mixed,
                row_len: 2 * self.dk + self.dv,
                q_at: 0,
                k_at: self.dk,
                v_at: 2 * self.dk,
                key_dim: self.dk,
                value_dim: self.dv,
                beta: &self.beta,
                log_decay: &self.g,
                gate_len: 1,
                head: 0,
            }
        }
        /// The oracle row after row: final state, outputs, the state after each row.
        fn oracle(&self, s0: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
            let inp = self.head();
            let mut s = s0.to_vec();
            let mut out = vec![0.0; self.rows * self.dv];
            let mut states = Vec::new();
            for r in 0..self.rows {
                delta_rule_row_oracle(
                    &mut s,
                    inp.q(r),
                    inp.k(r),
                    inp.v(r),
                    inp.beta(r),
                    inp.log_decay(r).exp(),
                    &mut out[r * self.dv..(r + 1) * self.dv],
                );
                states.push(s.clone());
            }
            (s, out, states)
        }
    }

    fn isas() -> Vec<DeltaIsa> {
        let mut v = vec![DeltaIsa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(DeltaIsa::Avx2);
            }
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
            {
                v.push(DeltaIsa::Avx512);
            }
        }
        v
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Every copy of the recurrent kernel is bit-equal to the oracle row after row (state, outputs,
    /// and the state after each prefix of the rows run alone: what a rollback replays), with full
    /// blocks and an odd tail (dv 131 = 2 x 64 + 3) and odd key dims.
    #[test]
    fn recurrent_copies_are_bit_equal_to_the_oracle() {
        for (rows, dk, dv) in [(1, 128, 128), (5, 7, 131), (17, 33, 64), (3, 128, 65)] {
            let c = case(rows, dk, dv, 7 + dk as u64);
            let mut seed = 99;
            let s0: Vec<f32> = (0..dk * dv).map(|_| 0.1 * lcg(&mut seed)).collect();
            let (s_ref, out_ref, states) = c.oracle(&s0);
            for isa in isas() {
                let mut s = s0.clone();
                let mut out = vec![0.0; rows * dv];
                recurrent_rows(isa, &mut s, &c.head(), &mut out);
                assert_eq!(bits(&s), bits(&s_ref), "{isa:?} {rows}x{dk}x{dv}: state");
                assert_eq!(bits(&out), bits(&out_ref), "{isa:?} {rows}x{dk}x{dv}: out");
                for (r, state) in states.iter().enumerate().take(rows - 1) {
                    let mut prefix = s0.clone();
                    let head = HeadRows {
                        rows: r + 1,
                        ..c.head()
                    };
                    recurrent_rows(isa, &mut prefix, &head, &mut out);
                    assert_eq!(
                        bits(&prefix),
                        bits(state),
                        "{isa:?}: the first {} rows",
                        r + 1
                    );
                }
            }
        }
    }

    /// Controls: the same rule with the decay applied to S before the dot products (the base's
    /// order: equal in exact arithmetic, not in rounding) fails the bit check, and so does one ulp
    /// planted in one element of the state.
    #[test]
    fn another_order_or_one_ulp_fails_the_bit_check() {
        let (rows, dk, dv) = (3, 9, 70);
        let c = case(rows, dk, dv, 3);
        let mut seed = 4;
        let s0: Vec<f32> = (0..dk * dv).map(|_| 0.1 * lcg(&mut seed)).collect();
        let (s_ref, out_ref, _) = c.oracle(&s0);
        let inp = c.head();
        let mut s = s0.clone();
        let mut out = vec![0.0; rows * dv];
        for r in 0..rows {
            let (q, k, v) = (inp.q(r), inp.k(r), inp.v(r));
            let (beta, decay) = (inp.beta(r), inp.log_decay(r).exp());
            for x in s.iter_mut() {
                *x *= decay;
            }
            for j in 0..dv {
                let mut kv = 0.0f32;
                for i in 0..dk {
                    kv += s[i * dv + j] * k[i];
                }
                let delta = beta * (v[j] - kv);
                let mut o = 0.0f32;
                for i in 0..dk {
                    s[i * dv + j] += k[i] * delta;
                    o += s[i * dv + j] * q[i];
                }
                out[r * dv + j] = o;
            }
        }
        assert!(max_rel(&out, &out_ref) < 1e-5, "the same rule");
        assert_ne!(bits(&out), bits(&out_ref), "another order, other bits");
        let mut s = s0.clone();
        recurrent_rows(DeltaIsa::best(), &mut s, &inp, &mut out);
        assert_eq!(bits(&s), bits(&s_ref));
        s[69] = f32::from_bits(s[69].to_bits() + 1);
        assert_ne!(bits(&s), bits(&s_ref));
    }

    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        a.iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
            / scale
    }

    /// The chunked form stays within CHUNKED_REL_BOUND of the recurrent one (outputs and final
    /// state), over several chunks with a partial last one, from a nonzero state; control: one
    /// row's β changed in the chunked run's inputs breaks the bound.
    #[test]
    fn chunked_matches_recurrent_within_the_bound() {
        let mut worst = 0.0f32;
        for (rows, dk, dv) in [(200, 128, 128), (70, 33, 17), (64, 16, 64), (18, 8, 8)] {
            let c = case(rows, dk, dv, 11 + rows as u64);
            let mut seed = 5;
            let s0: Vec<f32> = (0..dk * dv).map(|_| 0.1 * lcg(&mut seed)).collect();
            let (s_ref, out_ref, _) = c.oracle(&s0);
            for isa in isas() {
                let mut s = s0.clone();
                let mut out = vec![0.0; rows * dv];
                chunked_rows(
                    isa,
                    &mut s,
                    &c.head(),
                    &mut out,
                    &mut ChunkScratch::default(),
                );
                let (es, eo) = (max_rel(&s, &s_ref), max_rel(&out, &out_ref));
                worst = worst.max(es).max(eo);
                assert!(
                    es <= CHUNKED_REL_BOUND && eo <= CHUNKED_REL_BOUND,
                    "{isa:?} {rows}x{dk}x{dv}: state {es:e}, out {eo:e}"
                );
            }
        }
        eprintln!("chunked vs recurrent: worst relative difference {worst:e}");
        // Control.
        let mut c = case(100, 16, 16, 1);
        let s0 = vec![0.0; 16 * 16];
        let (_, out_ref, _) = c.oracle(&s0);
        c.beta[70] *= 0.5;
        let mut s = s0.clone();
        let mut out = vec![0.0; 100 * 16];
        chunked_rows(
            DeltaIsa::best(),
            &mut s,
            &c.head(),
            &mut out,
            &mut ChunkScratch::default(),
        );
        assert!(max_rel(&out, &out_ref) > CHUNKED_REL_BOUND);
    }

    /// The conv and the gate: every copy gives the portable bits, which are the per-channel
    /// definition's; control: a tap changed moves the output.
    #[test]
    fn conv_and_gate_copies_are_bit_equal() {
        let (kernel, channels) = (4, 6 * 64 + 5);
        let mut seed = 17;
        let taps: Vec<f32> = (0..kernel * channels).map(|_| lcg(&mut seed)).collect();
        let window: Vec<f32> = (0..kernel * channels)
            .map(|_| 3.0 * lcg(&mut seed))
            .collect();
        let z: Vec<f32> = (0..channels).map(|_| 4.0 * lcg(&mut seed)).collect();
        let definition: Vec<f32> = (0..channels)
            .map(|c| {
                let mut acc = 0.0f32;
                for j in 0..kernel {
                    acc += taps[j * channels + c] * window[j * channels + c];
                }
                silu(acc)
            })
            .collect();
        for isa in isas() {
            let mut row = vec![0.0; channels];
            conv_taps(isa, &taps, &window, &mut row);
            assert_eq!(bits(&row), bits(&definition), "{isa:?}: conv");
            let mut gated = definition.clone();
            mul_silu(isa, &mut gated, &z);
            let want: Vec<f32> = definition
                .iter()
                .zip(&z)
                .map(|(o, &z)| o * silu(z))
                .collect();
            assert_eq!(bits(&gated), bits(&want), "{isa:?}: gate");
        }
        let mut moved = taps.clone();
        moved[2 * channels + 7] += 0.5;
        let mut row = vec![0.0; channels];
        conv_taps(DeltaIsa::best(), &moved, &window, &mut row);
        assert_ne!(bits(&row), bits(&definition));
    }

    /// Time of one head (128 x 128) over 512 rows in each form (`cargo test --release -p decoder
    /// -- --ignored --nocapture delta_rule_speed`).
    #[test]
    #[ignore]
    fn delta_rule_speed() {
        let (rows, dk, dv) = (512, 128, 128);
        let c = case(rows, dk, dv, 1);
        let isa = DeltaIsa::best();
        let mut out = vec![0.0; rows * dv];
        let mut sc = ChunkScratch::default();
        for _ in 0..3 {
            let mut s = vec![0.0; dk * dv];
            let t = std::time::Instant::now();
            recurrent_rows(isa, &mut s, &c.head(), &mut out);
            let rec = t.elapsed();
            let t = std::time::Instant::now();
            chunked_rows(isa, &mut s, &c.head(), &mut out, &mut sc);
            let chk = t.elapsed();
            let t = std::time::Instant::now();
            for r in 0..rows {
                let one = HeadRows {
                    rows: 1,
                    mixed: &c.mixed[r * (2 * dk + dv)..],
                    beta: &c.beta[r..],
                    log_decay: &c.g[r..],
                    ..c.head()
                };
                recurrent_rows(isa, &mut s, &one, &mut out[r * dv..]);
            }
            let per_row = t.elapsed();
            eprintln!("{isa:?} {rows} rows: recurrent {rec:?}, chunked {chk:?}, one row a call {per_row:?}");
        }
    }
}
