//! The host GEMM backend: the quant kinds' arithmetic on the CPU, split over a persistent thread pool.

use crate::backend::{BackendError, GemmBackend, GemmStats, WeightRef};
use crate::kernels;
use packs::quant;
use packs::LinearData;
use rayon::prelude::*;
use std::sync::Arc;
use std::time::Instant;

/// Weight rows per parallel task.
const N_CHUNK: usize = 64;

pub struct HostGemm {
    pool: Arc<rayon::ThreadPool>,
    a_codes: Vec<i8>,
    a_scales: Vec<f32>,
    y_t: Vec<f32>,
    stats: GemmStats,
}

impl HostGemm {
    pub fn new(pool: Arc<rayon::ThreadPool>) -> HostGemm {
        HostGemm {
            pool,
            a_codes: Vec::new(),
            a_scales: Vec::new(),
            y_t: Vec::new(),
            stats: GemmStats::default(),
        }
    }
}

/// Quantizes each activation row to int8 codes and its scale (the rule lives in `packs::quant`).
pub fn quantize_rows(x: &[f32], rows: usize, k: usize, codes: &mut Vec<i8>, scales: &mut Vec<f32>) {
    codes.resize(rows * k, 0);
    scales.resize(rows, 0.0);
    for ((xr, cr), s) in x
        .chunks_exact(k)
        .zip(codes.chunks_exact_mut(k))
        .zip(scales.iter_mut())
    {
        *s = quant::quantize_activation_row(xr, cr);
    }
}

impl GemmBackend for HostGemm {
    fn name(&self) -> &'static str {
        "host"
    }

    fn gemm(
        &mut self,
        w: &WeightRef<'_>,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        let t0 = Instant::now();
        let (n, k) = (w.linear.n, w.linear.k);
        debug_assert_eq!(x.len(), rows * k);
        debug_assert_eq!(y.len(), rows * n);
        let quantized = matches!(w.linear.data, LinearData::I8 { .. } | LinearData::Q4 { .. });
        if quantized {
            quantize_rows(x, rows, k, &mut self.a_codes, &mut self.a_scales);
        }
        // Each task owns a block of weight rows and writes them transposed ([n x rows]); one
        // transpose at the end puts them in y. Weight bytes are read once per GEMM, whatever `rows`.
        self.y_t.resize(n * rows, 0.0);
        let (a_codes, a_scales) = (&self.a_codes[..], &self.a_scales[..]);
        let data = &w.linear.data;
        let y_t = &mut self.y_t;
        self.pool.install(|| {
            y_t.par_chunks_mut(N_CHUNK * rows)
                .enumerate()
                .for_each(|(c, out)| {
                    let n0 = c * N_CHUNK;
                    kernels::gemm_block(data, k, n0, x, a_codes, a_scales, rows, out);
                })
        });
        for (j, col) in self.y_t.chunks_exact(rows).enumerate() {
            for (r, &v) in col.iter().enumerate() {
                y[r * n + j] = v;
            }
        }
        self.stats.gemms += 1;
        self.stats.rows += rows as u64;
        self.stats.host += t0.elapsed();
        Ok(())
    }

    fn take_stats(&mut self) -> GemmStats {
        std::mem::take(&mut self.stats)
    }
}
