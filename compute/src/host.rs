//! The host GEMM backend: the quant kinds' arithmetic on the CPU (SIMD kernels chosen at run time),
//! split over the forward's persistent rayon pool — no thread is spawned per GEMM.

use crate::backend::{BackendError, GemmBackend, GemmStats, WeightRef};
use crate::kernels::{ActivationLayout, Activations, Bf16Rows, Kernels, Products};
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
    /// The input rounded to bf16, for bf16 weights with bf16 products.
    bf16_rows: Bf16Rows,
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
            bf16_rows: Bf16Rows::default(),
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

/// Whether a weight multiplies by bf16 products: stored bf16 and registered for them.
fn bf16_products(w: &WeightRef<'_>) -> bool {
    matches!(w.linear.data, LinearData::Bf16(_)) && w.products == Products::Bf16
}

/// Weight rows a task's chunk is a multiple of: a q4 pack panel (16 rows, two of the f32 and i8
/// tiles' panels), so that every chunk of a q4 weight but the last begins a whole pack panel and
/// its kernels read the panels straight from the pack.
const TASK_ROWS: usize = packs::quant::Q4_PANEL;

/// Weight rows per task: whole panels, about `TASKS_PER_THREAD` tasks per thread, at most `MAX_CHUNK`.
pub fn chunk_rows(n: usize, threads: usize) -> usize {
    let per_task = n.div_ceil(threads.max(1) * TASKS_PER_THREAD);
    per_task.div_ceil(TASK_ROWS).clamp(1, MAX_CHUNK / TASK_ROWS) * TASK_ROWS
}

impl HostGemm {
    /// `ys[i] = x · ws[i]ᵀ` for weights of one kind, as one parallel region: the input is prepared
    /// once, and every weight's row chunks are tasks of the same fork-join.
    fn run(
        &mut self,
        ws: &[WeightRef<'_>],
        x: &[f32],
        rows: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), BackendError> {
        let t0 = Instant::now();
        let k = ws.first().map_or(0, |w| w.linear.k);
        for (w, y) in ws.iter().zip(ys.iter()) {
            let name = w.linear.name;
            assert_eq!(
                w.linear.k, k,
                "host gemm group: {name} has K {} not {k}",
                w.linear.k
            );
            assert_eq!(x.len(), rows * k, "host gemm {name}: x is not rows x k");
            assert_eq!(
                y.len(),
                rows * w.linear.n,
                "host gemm {name}: y is not rows x n"
            );
        }
        let layout = ws.first().and_then(|w| layout_of(&w.linear.data));
        let products = ws.first().is_some_and(bf16_products);
        let kernels = self.kernels;
        let threads = self.pool.current_num_threads();
        let (acts, bf16_rows) = (&mut self.acts, &mut self.bf16_rows);
        self.pool.install(|| {
            if let Some(layout) = layout {
                acts.prepare(kernels, layout, x, rows, k);
            }
            if products {
                bf16_rows.prepare(kernels, x, rows, k);
            }
            let (acts, bf16_rows) = (&*acts, &*bf16_rows);
            // Task t computes weight rows n0.. of one weight and writes that column span of every
            // output row: `spans[t * rows + r]`.
            let mut tasks = Vec::new();
            let mut spans: Vec<&mut [f32]> = Vec::new();
            for (wi, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
                let n = w.linear.n;
                if n == 0 || rows == 0 {
                    continue;
                }
                let chunk = chunk_rows(n, threads);
                let mut row_spans: Vec<_> =
                    y.chunks_mut(n).map(|row| row.chunks_mut(chunk)).collect();
                for c in 0..n.div_ceil(chunk) {
                    tasks.push((wi, c * chunk));
                    for row in row_spans.iter_mut() {
                        spans.push(row.next().expect("every row splits into the same spans"));
                    }
                }
            }
            tasks
                .par_iter()
                .zip(spans.par_chunks_mut(rows.max(1)))
                .for_each(|(&(wi, n0), out)| match ws[wi].linear.data {
                    LinearData::Bf16(w) if products => {
                        kernels.bf16_products_block(w, k, n0, bf16_rows, out)
                    }
                    ref data => kernels.gemm_block(data, k, n0, x, acts, out),
                });
        });
        self.stats.gemms += ws.len() as u64;
        self.stats.rows += (rows * ws.len()) as u64;
        self.stats.host += t0.elapsed();
        Ok(())
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
        self.run(std::slice::from_ref(w), x, rows, &mut [y])
    }

    fn gemm_group(
        &mut self,
        ws: &[WeightRef<'_>],
        x: &[f32],
        rows: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), BackendError> {
        let same_kind = ws.iter().all(|w| {
            std::mem::discriminant(&w.linear.data) == std::mem::discriminant(&ws[0].linear.data)
                && bf16_products(w) == bf16_products(&ws[0])
        });
        if ws.len() != ys.len() || !same_kind {
            // Mixed kinds (or a caller mismatch) run one by one.
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                self.gemm(w, x, rows, y)?;
            }
            return Ok(());
        }
        self.run(ws, x, rows, ys)
    }

    fn take_stats(&mut self) -> GemmStats {
        std::mem::take(&mut self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use packs::quant::{self, Q4_GROUP};
    use packs::Linear;

    /// The host backend on its own pool of two threads.
    fn two_thread_host() -> HostGemm {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
        HostGemm::new(Arc::new(pool.unwrap()))
    }

    fn weight<'a>(name: &'a str, n: usize, k: usize, data: LinearData<'a>) -> WeightRef<'a> {
        WeightRef::new(0, Linear { name, n, k, data })
    }

    /// Split over many tasks (n up to 300 rows, two threads), grouped or alone, the host backend
    /// writes every output where the packs oracle does.
    #[test]
    fn grouped_and_single_gemms_match_the_oracle() {
        let mut host = two_thread_host();
        let k = 96;
        let ns = [5usize, 300, 24];
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed >> 8
        };
        let i8_codes: Vec<Vec<i8>> = ns
            .iter()
            .map(|&n| (0..n * k).map(|_| next() as i8).collect())
            .collect();
        let i8_scales: Vec<Vec<f32>> = ns
            .iter()
            .map(|&n| (0..n).map(|j| 0.01 + j as f32 * 1e-4).collect())
            .collect();
        let q4_codes: Vec<Vec<u8>> = ns
            .iter()
            .map(|&n| (0..n * k / 2).map(|_| next() as u8).collect())
            .collect();
        // The kernels read the pack layout; the oracle, row-major codes.
        let q4_panels: Vec<Vec<u8>> = q4_codes
            .iter()
            .zip(&ns)
            .map(|(c, &n)| quant::q4_to_panels(c, n, k))
            .collect();
        let q4_scales: Vec<Vec<bf16>> = ns
            .iter()
            .map(|&n| {
                (0..n * k / Q4_GROUP)
                    .map(|g| bf16::from_f32(0.02 + (g % 5) as f32 * 1e-3))
                    .collect()
            })
            .collect();
        for rows in [1, 3, 16] {
            let x: Vec<f32> = (0..rows * k)
                .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let mut a = vec![0i8; rows * k];
            let mut a_s = vec![0f32; rows];
            for r in 0..rows {
                a_s[r] = quant::quantize_activation_row(
                    &x[r * k..(r + 1) * k],
                    &mut a[r * k..(r + 1) * k],
                );
            }
            for q4 in [false, true] {
                let ws: Vec<WeightRef<'_>> = (0..ns.len())
                    .map(|i| {
                        let data = if q4 {
                            LinearData::Q4 {
                                codes: &q4_panels[i],
                                scales: &q4_scales[i],
                            }
                        } else {
                            LinearData::I8 {
                                codes: &i8_codes[i],
                                scales: &i8_scales[i],
                            }
                        };
                        weight("w", ns[i], k, data)
                    })
                    .collect();
                let mut want: Vec<Vec<f32>> = ns.iter().map(|&n| vec![0f32; rows * n]).collect();
                for (i, &n) in ns.iter().enumerate() {
                    if q4 {
                        quant::gemm_q4_ref(
                            &a,
                            &a_s,
                            rows,
                            k,
                            &q4_codes[i],
                            &q4_scales[i],
                            n,
                            &mut want[i],
                        );
                    } else {
                        quant::gemm_i8_ref(
                            &a,
                            &a_s,
                            rows,
                            k,
                            &i8_codes[i],
                            &i8_scales[i],
                            n,
                            &mut want[i],
                        );
                    }
                }
                let mut grouped: Vec<Vec<f32>> =
                    ns.iter().map(|&n| vec![f32::NAN; rows * n]).collect();
                let mut ys: Vec<&mut [f32]> =
                    grouped.iter_mut().map(|y| y.as_mut_slice()).collect();
                host.gemm_group(&ws, &x, rows, &mut ys).unwrap();
                for (i, w) in ws.iter().enumerate() {
                    let mut alone = vec![f32::NAN; rows * ns[i]];
                    host.gemm(w, &x, rows, &mut alone).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&alone),
                        bits(&want[i]),
                        "alone q4={q4} rows {rows} weight {i}"
                    );
                    assert_eq!(
                        bits(&grouped[i]),
                        bits(&want[i]),
                        "grouped q4={q4} rows {rows} weight {i}"
                    );
                }
            }
        }
        assert_eq!(host.take_stats().gemms, 3 * 2 * 6);
    }

    /// A bf16 weight multiplies by the products it was registered with, alone or grouped (a
    /// group mixing the two runs each by its own); the control: the two arithmetics differ here.
    #[test]
    fn bf16_weights_follow_their_registered_products() {
        use crate::kernels::bf16_dot::to_bf16;
        use crate::kernels::bf16_gemm::dot_bf16_products;
        use crate::kernels::scalar::dot_f32;
        let mut host = two_thread_host();
        let (rows, n, k) = (6, 300, 70);
        let mut seed = 11u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 23) as f32 - 1.0
        };
        let x: Vec<f32> = (0..rows * k).map(|_| next()).collect();
        let w: Vec<bf16> = (0..n * k).map(|_| bf16::from_f32(next())).collect();
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let xb: Vec<bf16> = x.iter().map(|&v| to_bf16(v)).collect();
        let (mut want_f32, mut want_bf16) = (vec![0f32; rows * n], vec![0f32; rows * n]);
        for r in 0..rows {
            for j in 0..n {
                want_f32[r * n + j] = dot_f32(&x[r * k..(r + 1) * k], &wf[j * k..(j + 1) * k]);
                want_bf16[r * n + j] =
                    dot_bf16_products(&xb[r * k..(r + 1) * k], &w[j * k..(j + 1) * k]);
            }
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_ne!(bits(&want_f32), bits(&want_bf16), "control");
        let with = |products| WeightRef {
            products,
            ..weight("w", n, k, LinearData::Bf16(&w))
        };
        for p in [Products::F32, Products::Bf16] {
            let want = if p == Products::F32 {
                &want_f32
            } else {
                &want_bf16
            };
            let mut y = vec![f32::NAN; rows * n];
            host.gemm(&with(p), &x, rows, &mut y).unwrap();
            assert_eq!(bits(&y), bits(want), "{p}");
        }
        let (mut a, mut b) = (vec![f32::NAN; rows * n], vec![f32::NAN; rows * n]);
        host.gemm_group(
            &[with(Products::Bf16), with(Products::F32)],
            &x,
            rows,
            &mut [&mut a, &mut b],
        )
        .unwrap();
        assert_eq!(bits(&a), bits(&want_bf16));
        assert_eq!(bits(&b), bits(&want_f32));
    }

    #[test]
    fn chunks_are_whole_panels_and_bounded() {
        assert_eq!(chunk_rows(2048, 2), 128);
        assert_eq!(chunk_rows(151936, 2), MAX_CHUNK);
        assert_eq!(chunk_rows(5, 2), TASK_ROWS);
        assert_eq!(chunk_rows(1024, 1), 128);
        for n in [1, 7, 8, 9, 100, 4096, 6144] {
            let c = chunk_rows(n, 2);
            assert!(
                c.is_multiple_of(TASK_ROWS) && (TASK_ROWS..=MAX_CHUNK).contains(&c),
                "{n}: {c}"
            );
        }
    }
}
