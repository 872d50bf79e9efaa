//! The portable path: plain loops with `packs::quant`'s arithmetic, for any CPU. The SIMD paths are
//! tested against this one and against the packs oracles.

use super::{q4_halves, Activations, WeightBlock};
use packs::quant::{self, Q4_GROUP};

pub(crate) fn gemm_block(
    block: &WeightBlock<'_>,
    k: usize,
    x: &[f32],
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    match *block {
        WeightBlock::F32(w) => {
            for (j, wr) in w.chunks_exact(k.max(1)).enumerate() {
                for (r, o) in out.iter_mut().enumerate() {
                    o[j] = dot_f32(&x[r * k..(r + 1) * k], wr);
                }
            }
        }
        WeightBlock::Bf16(w) => {
            let mut wr = vec![0.0f32; k];
            for (j, ws) in w.chunks_exact(k.max(1)).enumerate() {
                for (d, s) in wr.iter_mut().zip(ws) {
                    *d = s.to_f32();
                }
                for (r, o) in out.iter_mut().enumerate() {
                    o[j] = dot_f32(&x[r * k..(r + 1) * k], &wr);
                }
            }
        }
        WeightBlock::I8 { codes, scales } => {
            for (j, &s_w) in scales.iter().enumerate() {
                let wr = &codes[j * k..(j + 1) * k];
                for (r, o) in out.iter_mut().enumerate() {
                    let acc = quant::dot_i8(acts.codes(r), wr);
                    o[j] = quant::finish_i8(acc, acts.scale(r), s_w);
                }
            }
        }
        WeightBlock::Q4 { codes, scales } => {
            let groups = k / Q4_GROUP;
            let mut wr = vec![0u8; k / 2];
            for j in 0..out[0].len() {
                // The row, row-major, out of the pack layout.
                for (g, dst) in wr.chunks_exact_mut(Q4_GROUP / 2).enumerate() {
                    dst.copy_from_slice(&codes.group(j, g));
                }
                let sr = &scales[j * groups..(j + 1) * groups];
                for (r, o) in out.iter_mut().enumerate() {
                    let sum = q4_scaled_sum_grouped(acts.codes(r), &wr, sr);
                    o[j] = quant::finish_q4(sum, acts.scale(r));
                }
            }
        }
    }
}

/// `quant::q4_row_scaled_sum` for activation codes in the `Q4Groups` layout ([`q4_halves`]): byte
/// i of a group holds elements 2i (low nibble) and 2i+1 (high).
pub fn q4_scaled_sum_grouped(a: &[i8], codes_row: &[u8], scales_row: &[half::bf16]) -> f32 {
    let groups = scales_row.len();
    let mut sum = 0f32;
    for (g, (wg, scale)) in codes_row
        .chunks_exact(Q4_GROUP / 2)
        .zip(scales_row)
        .enumerate()
    {
        let (even, odd) = q4_halves(g, groups);
        let (even, odd) = (&a[even..even + Q4_GROUP / 2], &a[odd..odd + Q4_GROUP / 2]);
        let mut acc = 0i32;
        for ((&b, &e), &o) in wg.iter().zip(even).zip(odd) {
            let (lo, hi) = quant::q4_byte_codes(b);
            acc += e as i32 * lo as i32 + o as i32 * hi as i32;
        }
        sum += acc as f32 * scale.to_f32();
    }
    sum
}

/// The f32 dot every path reproduces: 16 lanes (lane i takes elements i, i+16, ... of the whole
/// 16-blocks, each a multiply then an add), the lanes summed in ascending order, then the tail.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut ac = a.chunks_exact(16);
    let mut bc = b.chunks_exact(16);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut sum = 0.0f32;
    for v in acc {
        sum += v;
    }
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        sum += x * y;
    }
    sum
}
