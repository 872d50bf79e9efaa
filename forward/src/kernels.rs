//! Host GEMM kernels over a block of weight rows. Quantized kinds follow `packs::quant` exactly:
//! integer dot products are exact and the scaled sums keep the documented order.

use packs::quant;
use packs::LinearData;

/// Computes weight rows `n0 ..` (as many as `out` holds) for all `rows` activation rows into `out`
/// ([rows of W x rows]).
#[allow(clippy::too_many_arguments)]
pub fn gemm_block(
    data: &LinearData<'_>,
    k: usize,
    n0: usize,
    x: &[f32],
    a_codes: &[i8],
    a_scales: &[f32],
    rows: usize,
    out: &mut [f32],
) {
    match *data {
        LinearData::F32(w) => {
            for (j, o) in out.chunks_exact_mut(rows).enumerate() {
                let wr = &w[(n0 + j) * k..(n0 + j + 1) * k];
                for (r, v) in o.iter_mut().enumerate() {
                    *v = dot_f32(&x[r * k..(r + 1) * k], wr);
                }
            }
        }
        LinearData::Bf16(w) => {
            let mut wr = vec![0.0f32; k];
            for (j, o) in out.chunks_exact_mut(rows).enumerate() {
                for (d, s) in wr.iter_mut().zip(&w[(n0 + j) * k..(n0 + j + 1) * k]) {
                    *d = s.to_f32();
                }
                for (r, v) in o.iter_mut().enumerate() {
                    *v = dot_f32(&x[r * k..(r + 1) * k], &wr);
                }
            }
        }
        LinearData::I8 { codes, scales } => {
            for (j, o) in out.chunks_exact_mut(rows).enumerate() {
                let n = n0 + j;
                let wr = &codes[n * k..(n + 1) * k];
                for (r, v) in o.iter_mut().enumerate() {
                    let acc = quant::dot_i8(&a_codes[r * k..(r + 1) * k], wr);
                    *v = quant::finish_i8(acc, a_scales[r], scales[n]);
                }
            }
        }
        LinearData::Q4 { codes, scales } => {
            let groups = k / quant::Q4_GROUP;
            for (j, o) in out.chunks_exact_mut(rows).enumerate() {
                let n = n0 + j;
                let cr = &codes[n * k / 2..(n + 1) * k / 2];
                let sr = &scales[n * groups..(n + 1) * groups];
                for (r, v) in o.iter_mut().enumerate() {
                    let sum = quant::q4_row_scaled_sum(&a_codes[r * k..(r + 1) * k], cr, sr);
                    *v = quant::finish_q4(sum, a_scales[r]);
                }
            }
        }
    }
}

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
