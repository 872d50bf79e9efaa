//! What the designs compute, in the header's layouts, with the pack's scalar arithmetic
//! (`packs::quant`: the one implementation of it). Rows of C are split over worker threads; each
//! element is computed by the same call in the same order whatever the split.

use half::bf16;
use packs::quant::{dot_i8, q4_row_scaled_sum, Q4_GROUP};

use crate::design::{Geometry, Kind};

/// Work (M*N*K) below which one thread does it all.
const PARALLEL_MIN_WORK: usize = 1 << 20;

/// C = A x B^T for `geometry`. Slices have exactly the header's sizes (checked at allocation).
pub fn gemm(geometry: &Geometry, a: &[u8], b: &[u8], c: &mut [u8], threads: usize) {
    let Geometry { kind, m, k, n } = *geometry;
    let a: &[i8] = bytemuck::cast_slice(a);
    // The q4 scales as bf16 values (copied: the byte offset need not suit a cast).
    let (codes, scales): (&[u8], Vec<bf16>) = match kind {
        Kind::I8 => (b, Vec::new()),
        Kind::Q4 => {
            let (codes, scale_bytes) = b.split_at(n * (k / 2));
            let scales = scale_bytes
                .chunks_exact(2)
                .map(|s| bf16::from_bits(u16::from_le_bytes([s[0], s[1]])))
                .collect();
            (codes, scales)
        }
    };
    let row_of_c = |row: usize, c_row: &mut [u8]| {
        let a_row = &a[row * k..(row + 1) * k];
        for (col, out) in c_row.chunks_exact_mut(4).enumerate() {
            let bytes = match kind {
                Kind::I8 => {
                    let b_row: &[i8] = bytemuck::cast_slice(&codes[col * k..(col + 1) * k]);
                    dot_i8(a_row, b_row).to_le_bytes()
                }
                Kind::Q4 => {
                    let codes_row = &codes[col * (k / 2)..(col + 1) * (k / 2)];
                    let groups = k / Q4_GROUP;
                    let scales_row = &scales[col * groups..(col + 1) * groups];
                    q4_row_scaled_sum(a_row, codes_row, scales_row).to_le_bytes()
                }
            };
            out.copy_from_slice(&bytes);
        }
    };
    let row_bytes = n * 4;
    let threads = if m.saturating_mul(n).saturating_mul(k) < PARALLEL_MIN_WORK {
        1
    } else {
        threads.clamp(1, m)
    };
    if threads == 1 {
        for (row, c_row) in c.chunks_exact_mut(row_bytes).enumerate() {
            row_of_c(row, c_row);
        }
        return;
    }
    let rows_per_thread = m.div_ceil(threads);
    std::thread::scope(|scope| {
        for (chunk_index, chunk) in c.chunks_mut(rows_per_thread * row_bytes).enumerate() {
            let row_of_c = &row_of_c;
            scope.spawn(move || {
                for (i, c_row) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                    row_of_c(chunk_index * rows_per_thread + i, c_row);
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use packs::quant::{gemm_i8_ref, gemm_q4_ref, quantize_q4};

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    #[test]
    fn i8_matches_the_oracle_with_unit_scales_single_and_threaded() {
        let (m, k, n) = (5, 40, 7);
        let mut seed = 1;
        let a: Vec<i8> = (0..m * k)
            .map(|_| (lcg(&mut seed) % 255) as i32 as i8)
            .collect();
        let w: Vec<i8> = (0..n * k)
            .map(|_| (lcg(&mut seed) % 255) as i32 as i8)
            .collect();
        let mut expected = vec![0f32; m * n];
        gemm_i8_ref(&a, &vec![1.0; m], m, k, &w, &vec![1.0; n], n, &mut expected);
        let g = Geometry {
            kind: Kind::I8,
            m,
            k,
            n,
        };
        for threads in [1, 3] {
            let mut c = vec![0u8; m * n * 4];
            gemm(
                &g,
                bytemuck::cast_slice(&a),
                bytemuck::cast_slice(&w),
                &mut c,
                threads,
            );
            let got: Vec<f32> = c
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as f32)
                .collect();
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn q4_matches_the_oracle_with_unit_activation_scales() {
        let (m, k, n) = (3, 64, 4);
        let mut seed = 7;
        let a: Vec<i8> = (0..m * k)
            .map(|_| (lcg(&mut seed) % 255) as i32 as i8)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|_| (lcg(&mut seed) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let (codes, scales) = quantize_q4(&w, n, k).unwrap();
        let mut expected = vec![0f32; m * n];
        gemm_q4_ref(&a, &vec![1.0; m], m, k, &codes, &scales, n, &mut expected);
        let mut b = codes.clone();
        b.extend(scales.iter().flat_map(|s| s.to_bits().to_le_bytes()));
        let mut c = vec![0u8; m * n * 4];
        gemm(
            &Geometry {
                kind: Kind::Q4,
                m,
                k,
                n,
            },
            bytemuck::cast_slice(&a),
            &b,
            &mut c,
            1,
        );
        let got: Vec<f32> = c
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
