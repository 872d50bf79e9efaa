//! The host GEMM backend: the quant kinds' arithmetic on the CPU (SIMD kernels chosen at run time),
//! split over the forward's persistent rayon pool — no thread is spawned per GEMM.

use crate::backend::{BackendError, GemmBackend, GemmStats, WeightRef};
use crate::kernels::{ActivationLayout, Activations, Kernels, PANEL};
use packs::LinearData;
use rayon::prelude::*;
use std::sync::Arc;
use std::time::Instant;

/// Most weight rows one parallel task computes.
const MAX_CHUNK: usize = 256;
/// Tasks per pool thread to aim for (work stealing evens out the rest).
const TASKS_PER_THREAD: usize = 8;

pub struct HostGemm {
    pool: Arc<rayon::ThreadPool>,
    kernels: Kernels,
    acts: Activations,
    stats: GemmStats,
}

impl HostGemm {
    /// The fastest kernels this CPU runs, on `pool`.
    pub fn new(pool: Arc<rayon::ThreadPool>) -> HostGemm {
        HostGemm::with_kernels(pool, Kernels::best())
    }

    /// A chosen instruction set (benchmarks and tests compare them).
    pub fn with_kernels(pool: Arc<rayon::ThreadPool>, kernels: Kernels) -> HostGemm {
        HostGemm {
            pool,
            kernels,
            acts: Activations::default(),
            stats: GemmStats::default(),
        }
    }

    pub fn kernels(&self) -> Kernels {
        self.kernels
    }
}

/// The activation layout a weight's kernels read, if it is quantized.
fn layout_of(data: &LinearData<'_>) -> Option<ActivationLayout> {
    match data {
        LinearData::I8 { .. } => Some(ActivationLayout::Natural),
        LinearData::Q4 { .. } => Some(ActivationLayout::Q4Groups),
        LinearData::F32(_) | LinearData::Bf16(_) => None,
    }
}

/// Weight rows per task: whole panels, about `TASKS_PER_THREAD` tasks per thread, at most `MAX_CHUNK`.
pub fn chunk_rows(n: usize, threads: usize) -> usize {
    let per_task = n.div_ceil(threads.max(1) * TASKS_PER_THREAD);
    per_task.div_ceil(PANEL).clamp(1, MAX_CHUNK / PANEL) * PANEL
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
        assert_eq!(
            x.len(),
            rows * k,
            "host gemm {}: x is not rows x k",
            w.linear.name
        );
        assert_eq!(
            y.len(),
            rows * n,
            "host gemm {}: y is not rows x n",
            w.linear.name
        );
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let data = &w.linear.data;
        let kernels = self.kernels;
        let chunk = chunk_rows(n, self.pool.current_num_threads());
        let acts = &mut self.acts;
        self.pool.install(|| {
            if let Some(layout) = layout_of(data) {
                acts.prepare(kernels, layout, x, rows, k);
            }
            let acts = &*acts;
            // Each task owns weight rows c*chunk.. and writes that column span of every output row.
            let mut row_spans: Vec<_> = y.chunks_mut(n).map(|row| row.chunks_mut(chunk)).collect();
            let tasks = n.div_ceil(chunk);
            let mut spans: Vec<&mut [f32]> = Vec::with_capacity(tasks * rows);
            for _ in 0..tasks {
                for row in row_spans.iter_mut() {
                    spans.push(row.next().expect("every row splits into the same spans"));
                }
            }
            spans
                .par_chunks_mut(rows)
                .enumerate()
                .for_each(|(c, out)| kernels.gemm_block(data, k, c * chunk, x, acts, out));
        });
        self.stats.gemms += 1;
        self.stats.rows += rows as u64;
        self.stats.host += t0.elapsed();
        Ok(())
    }

    fn take_stats(&mut self) -> GemmStats {
        std::mem::take(&mut self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_whole_panels_and_bounded() {
        assert_eq!(chunk_rows(2048, 2), 128);
        assert_eq!(chunk_rows(151936, 2), MAX_CHUNK);
        assert_eq!(chunk_rows(5, 2), PANEL);
        assert_eq!(chunk_rows(1024, 1), 128);
        for n in [1, 7, 8, 9, 100, 4096, 6144] {
            let c = chunk_rows(n, 2);
            assert!(
                c.is_multiple_of(PANEL) && (PANEL..=MAX_CHUNK).contains(&c),
                "{n}: {c}"
            );
        }
    }
}
