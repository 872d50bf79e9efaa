//! The quant layouts and their scalar arithmetic: the one implementation that host kernels and
//! device designs are checked against. Every rule here is spelled out in FORMAT.md so that an
//! independent reference can reproduce the bytes; "round" is half away from zero (`f32::round`).

use std::fmt;
use std::str::FromStr;

use half::bf16;
use serde::{Deserialize, Serialize};

/// How the linear weights of a pack are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantKind {
    /// Every weight f32: the exact path.
    F32,
    /// Linears and embedding bf16, norms f32.
    Bf16,
    /// Linears int8 per output row (f32 scale), embedding bf16, norms f32.
    I8,
    /// Linears int4 codes -8..=7 in groups of 32 along K (bf16 scale), stored offset-binary
    /// (`code + 8`), embedding bf16, norms f32.
    Q4,
}

impl QuantKind {
    pub const ALL: [QuantKind; 4] = [
        QuantKind::F32,
        QuantKind::Bf16,
        QuantKind::I8,
        QuantKind::Q4,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            QuantKind::F32 => "f32",
            QuantKind::Bf16 => "bf16",
            QuantKind::I8 => "i8",
            QuantKind::Q4 => "q4",
        }
    }

    /// i8 and q4 store linears as integer codes plus scales.
    pub fn is_integer(self) -> bool {
        matches!(self, QuantKind::I8 | QuantKind::Q4)
    }
}

impl fmt::Display for QuantKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for QuantKind {
    type Err = QuantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QuantKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| QuantError::UnknownKind(s.to_string()))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("unknown quant kind {0:?} (expected one of f32, bf16, i8, q4)")]
    UnknownKind(String),
    #[error("q4 needs the input dimension K to be a multiple of {Q4_GROUP}, got K = {k}")]
    Q4GroupMismatch { k: usize },
    #[error("weight has {len} values, expected N x K = {n} x {k}")]
    LengthMismatch { len: usize, n: usize, k: usize },
}

/// Elements per q4 group along K.
pub const Q4_GROUP: usize = 32;

/// Per output row r: `s_r = max|w[r,:]| / 127` (f32), codes `clamp(round(w / s_r), -127, 127)`.
/// A zero row (or one whose scale underflows to 0) has scale 0 and codes 0.
/// Returns codes [n*k] row-major and scales [n]. Panics if `w.len() != n * k` (a caller bug).
pub fn quantize_i8_rows(w: &[f32], n: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    assert_eq!(
        w.len(),
        n * k,
        "quantize_i8_rows: w has {} values, expected {n} x {k}",
        w.len()
    );
    let mut codes = vec![0i8; n * k];
    let mut scales = vec![0f32; n];
    if k == 0 {
        return (codes, scales);
    }
    for ((row, codes_row), scale) in w
        .chunks_exact(k)
        .zip(codes.chunks_exact_mut(k))
        .zip(&mut scales)
    {
        *scale = quantize_i8_row(row, codes_row);
    }
    (codes, scales)
}

/// One row of [`quantize_i8_rows`]; returns the row's scale.
pub fn quantize_i8_row(row: &[f32], codes: &mut [i8]) -> f32 {
    symmetric_i8_row(row, codes)
}

/// Shared by weight rows and activation rows: the two rules are the same formula.
fn symmetric_i8_row(x: &[f32], codes: &mut [i8]) -> f32 {
    debug_assert_eq!(x.len(), codes.len());
    // A NaN anywhere makes the scale NaN (f32::max would skip it), so a broken row stays visible.
    let max_abs = x.iter().fold(0f32, |m, v| {
        if m.is_nan() || v.abs() <= m {
            m
        } else {
            v.abs()
        }
    });
    let scale = max_abs / 127.0;
    if scale == 0.0 {
        codes.fill(0);
        return scale;
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = round_clamp(v / scale, -127, 127);
    }
    scale
}

/// Dequantize i8 rows: `w[r, j] = codes[r, j] as f32 * scales[r]`.
pub fn dequantize_i8_rows(codes: &[i8], scales: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(codes.len(), n * k, "dequantize_i8_rows: codes length");
    assert_eq!(scales.len(), n, "dequantize_i8_rows: scales length");
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        out.extend(
            codes[r * k..(r + 1) * k]
                .iter()
                .map(|&c| c as f32 * scales[r]),
        );
    }
    out
}

/// The q4 scale of one group: m is the value of largest magnitude (the first on ties), scale
/// `bf16(m / -8)` rounded to nearest even. So m itself maps to code -8, the one code whose
/// magnitude has no positive twin.
pub fn q4_group_scale(group: &[f32]) -> bf16 {
    let mut m = 0f32;
    for &v in group {
        if v.abs() > m.abs() {
            m = v;
        }
    }
    if m == 0.0 {
        return bf16::ZERO;
    }
    bf16::from_f32(m / -8.0)
}

/// Quantize one row (k values, k % 32 == 0) into packed codes [k/2] and scales [k/32].
pub fn quantize_q4_row(row: &[f32], codes: &mut [u8], scales: &mut [bf16]) {
    debug_assert_eq!(row.len() % Q4_GROUP, 0);
    debug_assert_eq!(codes.len() * 2, row.len());
    debug_assert_eq!(scales.len() * Q4_GROUP, row.len());
    for ((group, group_codes), scale) in row
        .chunks_exact(Q4_GROUP)
        .zip(codes.chunks_exact_mut(Q4_GROUP / 2))
        .zip(scales.iter_mut())
    {
        *scale = q4_group_scale(group);
        // Codes use the rounded scale, so dequantization reproduces exactly what was chosen.
        let s = scale.to_f32();
        for (byte, pair) in group_codes.iter_mut().zip(group.chunks_exact(2)) {
            *byte = q4_byte(q4_value_code(pair[0], s), q4_value_code(pair[1], s));
        }
    }
}

fn q4_value_code(v: f32, scale: f32) -> i8 {
    // A zero scale (zero group, or a scale that underflowed) gives code 0.
    if scale == 0.0 || !scale.is_finite() {
        return 0;
    }
    round_clamp(v / scale, -8, 7)
}

/// `clamp(round(x), lo, hi)` with round half away from zero (`f32::round`); NaN gives 0.
/// Written with an integer truncation instead of the `roundf` libm call, which dominated
/// quantizing a whole checkpoint; `round_clamp_matches_f32_round` checks it against `f32::round`.
#[inline]
pub fn round_clamp(x: f32, lo: i8, hi: i8) -> i8 {
    // Clamping to [lo - 1, hi + 1] first keeps the truncation in range and commutes with the
    // final clamp.
    let x = x.clamp(lo as f32 - 1.0, hi as f32 + 1.0);
    // `as i32` truncates toward zero (NaN -> 0); x - t is exact for |x| < 2^23.
    let t = x as i32;
    let frac = x - t as f32;
    let r = if frac >= 0.5 {
        t + 1
    } else if frac <= -0.5 {
        t - 1
    } else {
        t
    };
    r.clamp(lo as i32, hi as i32) as i8
}

/// Quantize W [n x k] row-major to q4: codes [n * k/2] (element 2i low nibble, 2i+1 high nibble,
/// offset-binary: [`q4_byte`]) and bf16 scales [n * k/32]. K % 32 != 0 is refused.
pub fn quantize_q4(w: &[f32], n: usize, k: usize) -> Result<(Vec<u8>, Vec<bf16>), QuantError> {
    if !k.is_multiple_of(Q4_GROUP) {
        return Err(QuantError::Q4GroupMismatch { k });
    }
    if w.len() != n * k {
        return Err(QuantError::LengthMismatch { len: w.len(), n, k });
    }
    let mut codes = vec![0u8; n * k / 2];
    let mut scales = vec![bf16::ZERO; n * k / Q4_GROUP];
    if k == 0 {
        return Ok((codes, scales));
    }
    for ((row, codes_row), scales_row) in w
        .chunks_exact(k)
        .zip(codes.chunks_exact_mut(k / 2))
        .zip(scales.chunks_exact_mut(k / Q4_GROUP))
    {
        quantize_q4_row(row, codes_row, scales_row);
    }
    Ok((codes, scales))
}

/// Rows of a q4 *panel*: how a pack stores q4 codes (FORMAT.md). The quantization above works on
/// row-major codes (`n x k/2`, row after row); a pack keeps each whole panel of 16 consecutive rows
/// *chunk-major*: for group g, for chunk t (bytes `4t..4t + 4` of the group's 16, 8 codes), the 16
/// rows' 4 bytes side by side (`256 g + 64 t + 4 c` for row c of the panel). Rows past the last
/// whole panel (`n % 16`) stay row-major. The scales stay row-major.
///
/// Why: the CPU kernels compute with lanes = weight rows, 4 bytes each (`vpdpbusd` multiplies 4
/// byte pairs per 32-bit lane), and 16 rows' 4 bytes are one 64-byte load — a `zmm`, or two `ymm` —
/// straight from the pack, for one activation row or for 16. The 8-row group-pair panels of
/// `xdna-vl-pack/4` had to be transposed in registers first: 7.5 us per 256 weight rows at K 2048,
/// 0.73 of a one-row GEMV, on every multi-row decode step (PERF.md, "Chunk-major q4 panels").
pub const Q4_PANEL: usize = 16;

/// Bytes of a q4 *chunk*: 8 codes, the 4 bytes a 32-bit lane of a kernel holds.
pub const Q4_CHUNK: usize = 4;

/// Chunks per q4 group (16 bytes).
pub const Q4_CHUNKS: usize = Q4_GROUP / 2 / Q4_CHUNK;

/// Where chunk 0 of row `j`'s group `g` starts in the pack layout of a q4 weight of `n` rows of
/// `k`, and the byte step from one of its chunks to the next: 64 (a chunk of all 16 rows) in a
/// whole panel, 4 in the row-major rows after the last one.
#[inline]
pub fn q4_group_chunks(n: usize, k: usize, j: usize, g: usize) -> (usize, usize) {
    let row_bytes = k / 2;
    if j >= n / Q4_PANEL * Q4_PANEL {
        return (j * row_bytes + g * (Q4_GROUP / 2), Q4_CHUNK);
    }
    let base = j / Q4_PANEL * Q4_PANEL * row_bytes;
    (
        base + g * Q4_PANEL * (Q4_GROUP / 2) + j % Q4_PANEL * Q4_CHUNK,
        Q4_PANEL * Q4_CHUNK,
    )
}

/// Row `j`'s group `g` (its 16 bytes in row-major order) from q4 codes in the pack layout of a
/// weight of `n` rows of `k`.
#[inline]
pub fn q4_group_bytes(codes: &[u8], n: usize, k: usize, j: usize, g: usize) -> [u8; Q4_GROUP / 2] {
    let (start, step) = q4_group_chunks(n, k, j, g);
    let mut out = [0u8; Q4_GROUP / 2];
    for (t, chunk) in out.chunks_exact_mut(Q4_CHUNK).enumerate() {
        let at = start + t * step;
        chunk.copy_from_slice(&codes[at..at + Q4_CHUNK]);
    }
    out
}

/// Row-major q4 codes (`n x k/2`) in the pack layout ([`Q4_PANEL`]).
pub fn q4_to_panels(row_major: &[u8], n: usize, k: usize) -> Vec<u8> {
    q4_permute(row_major, n, k, true)
}

/// Pack-layout q4 codes back to row-major (`n x k/2`).
pub fn q4_from_panels(panels: &[u8], n: usize, k: usize) -> Vec<u8> {
    q4_permute(panels, n, k, false)
}

fn q4_permute(src: &[u8], n: usize, k: usize, to_panels: bool) -> Vec<u8> {
    assert_eq!(src.len(), n * k / 2, "q4 layout: codes are not {n} x {k}/2");
    let mut out = vec![0u8; src.len()];
    for j in 0..n {
        for g in 0..k / Q4_GROUP {
            let (start, step) = q4_group_chunks(n, k, j, g);
            for t in 0..Q4_CHUNKS {
                let row_major = j * k / 2 + g * (Q4_GROUP / 2) + t * Q4_CHUNK;
                let panel = start + t * step;
                let (from, to) = if to_panels {
                    (row_major, panel)
                } else {
                    (panel, row_major)
                };
                out[to..to + Q4_CHUNK].copy_from_slice(&src[from..from + Q4_CHUNK]);
            }
        }
    }
    out
}

/// What a q4 nibble holds: the code plus this, 0..=15 for codes -8..=7 (offset binary). Stored so,
/// the nibble is already the unsigned operand `vpdpbusd` / `vpmaddubsw` multiply (the kernels then
/// subtract `Q4_CODE_OFFSET * Σa` per group), with no per-byte conversion while decoding.
pub const Q4_CODE_OFFSET: i8 = 8;

/// The byte holding two q4 codes (each -8..=7): `lo` in the low nibble, `hi` in the high one, each
/// as `code + Q4_CODE_OFFSET`.
#[inline]
pub fn q4_byte(lo: i8, hi: i8) -> u8 {
    debug_assert!((-8..=7).contains(&lo) && (-8..=7).contains(&hi));
    let nibble = |c: i8| (c + Q4_CODE_OFFSET) as u8 & 0x0F;
    nibble(lo) | (nibble(hi) << 4)
}

/// The two codes of a q4 byte: (low nibble, high nibble), each `nibble - Q4_CODE_OFFSET`.
#[inline]
pub fn q4_byte_codes(byte: u8) -> (i8, i8) {
    (
        (byte & 0x0F) as i8 - Q4_CODE_OFFSET,
        (byte >> 4) as i8 - Q4_CODE_OFFSET,
    )
}

/// Element j of a packed q4 row (even j the low nibble of byte j/2, odd j the high one).
#[inline]
pub fn q4_code(codes_row: &[u8], j: usize) -> i8 {
    let (lo, hi) = q4_byte_codes(codes_row[j / 2]);
    if j.is_multiple_of(2) {
        lo
    } else {
        hi
    }
}

/// Dequantize q4: `w[r, j] = code(r, j) as f32 * f32(scale[r, j / 32])`.
pub fn dequantize_q4(codes: &[u8], scales: &[bf16], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(
        k % Q4_GROUP,
        0,
        "dequantize_q4: K = {k} is not a multiple of {Q4_GROUP}"
    );
    assert_eq!(codes.len(), n * k / 2, "dequantize_q4: codes length");
    assert_eq!(
        scales.len(),
        n * k / Q4_GROUP,
        "dequantize_q4: scales length"
    );
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        let codes_row = &codes[r * k / 2..(r + 1) * k / 2];
        let scales_row = &scales[r * k / Q4_GROUP..(r + 1) * k / Q4_GROUP];
        out.extend(
            (0..k).map(|j| q4_code(codes_row, j) as f32 * scales_row[j / Q4_GROUP].to_f32()),
        );
    }
    out
}

/// Activation row quantization: s_a = max|x|/127 (f32), codes clamp(round(x / s_a), -127, 127)
/// (f32 division, round half away from zero = f32::round); zero row -> s_a = 0, codes 0. Returns s_a.
pub fn quantize_activation_row(x: &[f32], codes: &mut [i8]) -> f32 {
    assert_eq!(
        x.len(),
        codes.len(),
        "quantize_activation_row: x and codes differ in length"
    );
    symmetric_i8_row(x, codes)
}

/// Exact integer dot product.
#[inline]
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    assert_eq!(a.len(), b.len(), "dot_i8: lengths differ");
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// q4 row: for each group g ascending, `sum += (int dot of the group) as f32 * f32(scale[g])`;
/// returns sum (f32, without the activation scale).
pub fn q4_row_scaled_sum(a: &[i8], codes_row: &[u8], scales_row: &[bf16]) -> f32 {
    let k = a.len();
    assert_eq!(
        k % Q4_GROUP,
        0,
        "q4_row_scaled_sum: K = {k} not a multiple of {Q4_GROUP}"
    );
    assert_eq!(codes_row.len() * 2, k, "q4_row_scaled_sum: codes length");
    assert_eq!(
        scales_row.len() * Q4_GROUP,
        k,
        "q4_row_scaled_sum: scales length"
    );
    let mut sum = 0f32;
    for (g, scale) in scales_row.iter().enumerate() {
        let base = g * Q4_GROUP;
        let acc: i32 = (base..base + Q4_GROUP)
            .map(|j| a[j] as i32 * q4_code(codes_row, j) as i32)
            .sum();
        sum += acc as f32 * scale.to_f32();
    }
    sum
}

/// i8 result of one output: `(acc as f32 * s_a) * s_w`.
#[inline]
pub fn finish_i8(acc: i32, s_a: f32, s_w: f32) -> f32 {
    (acc as f32 * s_a) * s_w
}

/// q4 result of one output: `group_sum * s_a`.
#[inline]
pub fn finish_q4(group_sum: f32, s_a: f32) -> f32 {
    group_sum * s_a
}

/// Scalar oracle: A codes [m x k] with row scales, W i8 [n x k] with row scales; out [m x n].
#[allow(clippy::too_many_arguments)]
pub fn gemm_i8_ref(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    k: usize,
    w: &[i8],
    w_scales: &[f32],
    n: usize,
    out: &mut [f32],
) {
    assert_eq!(a.len(), m * k, "gemm_i8_ref: a length");
    assert_eq!(a_scales.len(), m, "gemm_i8_ref: a_scales length");
    assert_eq!(w.len(), n * k, "gemm_i8_ref: w length");
    assert_eq!(w_scales.len(), n, "gemm_i8_ref: w_scales length");
    assert_eq!(out.len(), m * n, "gemm_i8_ref: out length");
    for i in 0..m {
        let a_row = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let acc = dot_i8(a_row, &w[j * k..(j + 1) * k]);
            out[i * n + j] = finish_i8(acc, a_scales[i], w_scales[j]);
        }
    }
}

/// Scalar oracle: A codes [m x k] with row scales, W q4 [n x k]; out [m x n].
#[allow(clippy::too_many_arguments)]
pub fn gemm_q4_ref(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    w_scales: &[bf16],
    n: usize,
    out: &mut [f32],
) {
    assert_eq!(
        k % Q4_GROUP,
        0,
        "gemm_q4_ref: K = {k} not a multiple of {Q4_GROUP}"
    );
    assert_eq!(a.len(), m * k, "gemm_q4_ref: a length");
    assert_eq!(a_scales.len(), m, "gemm_q4_ref: a_scales length");
    assert_eq!(w.len(), n * k / 2, "gemm_q4_ref: w length");
    assert_eq!(
        w_scales.len(),
        n * k / Q4_GROUP,
        "gemm_q4_ref: w_scales length"
    );
    assert_eq!(out.len(), m * n, "gemm_q4_ref: out length");
    let groups = k / Q4_GROUP;
    for i in 0..m {
        let a_row = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let sum = q4_row_scaled_sum(
                a_row,
                &w[j * k / 2..(j + 1) * k / 2],
                &w_scales[j * groups..(j + 1) * groups],
            );
            out[i * n + j] = finish_q4(sum, a_scales[i]);
        }
    }
}

#[cfg(test)]
#[path = "quant_tests.rs"]
mod tests;
