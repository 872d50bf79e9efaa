//! The device GEMM backend: every projection and the head on the NPU runtime (the XRT shim or the
//! software NPU), weights resident per layer and projection, activations quantized per row to int8
//! on the host with the same rule the host kernels use — so host and device agree to the bit.
//!
//! Dispatch: M is padded to the smallest M tile that holds the rows (16 for decode, 128 for
//! prefill; longer prompts loop over 128-row tiles); a linear wider than the widest design (the LM
//! head) is split over N chunks. A pack whose shapes lack a design is refused at `prepare`, naming
//! the missing geometry.

use crate::backend::{BackendError, GemmBackend, GemmStats, WeightRef};
use npu_sys::plan::{design_n, kind_of, m_tile_for, n_chunks, M_TILES};
use npu_sys::{DesignKind, Designs, GemmDesign, NpuSession};
use packs::quant;
use packs::LinearData;
use std::path::PathBuf;
use std::time::Instant;

/// Where the device backend finds its runtime and designs.
#[derive(Clone, Debug, Default)]
pub struct DeviceConfig {
    /// The runtime library (None: `XDNA_VL_RUNTIME`, then the installed XRT shim).
    pub runtime: Option<PathBuf>,
    /// The designs directory (with its manifest; see `npu-designs`); `--gemm device|ab` needs one.
    pub designs: Option<PathBuf>,
    /// Who holds the device (shown to other processes waiting for the device-hold ticket).
    pub program: String,
    /// How long one launch may run (None: npu-sys' default).
    pub run_timeout: Option<std::time::Duration>,
    /// A deliberate layout mistake in the uploaded weights, for controls.
    pub plant: PlantedLayout,
    /// Launch one weight at a time and wait for it (no overlap), to measure what overlap buys.
    pub serial: bool,
}

/// Deliberate weight-layout mistakes: tests show the host/device comparison catches each one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlantedLayout {
    #[default]
    None,
    /// B read as if stored column-major ([K x N]) instead of the linear's [N x K].
    TransposedB,
    /// q4: element 2i in the high nibble instead of the low one.
    SwappedNibbles,
}

/// The weight codes as the plant says they were (mis)laid out.
fn planted<T: Copy>(
    plant: PlantedLayout,
    codes: &[T],
    n: usize,
    k: usize,
    swap: impl Fn(T) -> T,
) -> Vec<T> {
    match plant {
        PlantedLayout::None => codes.to_vec(),
        PlantedLayout::TransposedB => (0..n * k).map(|i| codes[(i % k) * n + i / k]).collect(),
        PlantedLayout::SwappedNibbles => codes.iter().map(|&c| swap(c)).collect(),
    }
}

/// One weight's designs: per M tile, one design per N chunk.
struct Resident {
    name: String,
    n: usize,
    k: usize,
    chunk_n: usize,
    tiles: Vec<(usize, Vec<GemmDesign>)>,
}

pub struct DeviceGemm {
    // Field order is drop order: designs before the session (device, lease) they live on.
    weights: Vec<Option<Resident>>,
    designs: Designs,
    session: NpuSession,
    config: DeviceConfig,
    a_codes: Vec<i8>,
    a_scales: Vec<f32>,
    stats: GemmStats,
}

fn device_err(msg: impl std::fmt::Display) -> BackendError {
    BackendError::Device(msg.to_string())
}

impl DeviceGemm {
    /// Opens the runtime (taking the device-hold ticket on real hardware) and the designs manifest.
    pub fn open(config: &DeviceConfig) -> Result<DeviceGemm, BackendError> {
        let dir = config.designs.as_deref().ok_or_else(|| {
            device_err(
                "--gemm device|ab needs --designs DIR (a designs directory with its manifest; \
                 `npu-designs emu PACK -o DIR` writes one for the software NPU)",
            )
        })?;
        let designs = Designs::load(dir).map_err(device_err)?;
        let program = if config.program.is_empty() {
            "xdna-vl"
        } else {
            &config.program
        };
        let session = NpuSession::open(config.runtime.as_deref(), program, "GEMM backend")
            .map_err(device_err)?;
        Ok(DeviceGemm {
            weights: Vec::new(),
            designs,
            session,
            config: config.clone(),
            a_codes: Vec::new(),
            a_scales: Vec::new(),
            stats: GemmStats::default(),
        })
    }

    fn upload(&self, w: &WeightRef<'_>) -> Result<Resident, BackendError> {
        let l = &w.linear;
        let unsupported = |why: String| BackendError::Unsupported {
            backend: "device",
            weight: l.name.to_string(),
            why,
        };
        let kind = kind_of(&l.data).ok_or_else(|| {
            unsupported(
                "it is stored unquantized; device designs exist for i8 and q4 packs only (build the pack with --quant i8 or q4, or use --gemm host)".into(),
            )
        })?;
        // The designs take q4 codes row-major; the pack keeps them in panels.
        let row_major;
        let stored = match &l.data {
            LinearData::Q4 { codes, scales } => {
                row_major = quant::q4_from_panels(codes, l.n, l.k);
                LinearData::Q4 {
                    codes: &row_major,
                    scales,
                }
            }
            other => *other,
        };
        let plant = self.config.plant;
        let planted_data;
        let data = match (&stored, plant) {
            (_, PlantedLayout::None) => &stored,
            (LinearData::I8 { codes, scales }, _) => {
                planted_data = (planted(plant, codes, l.n, l.k, |c| c), Vec::new());
                &LinearData::I8 {
                    codes: &planted_data.0,
                    scales,
                }
            }
            (LinearData::Q4 { codes, scales }, _) => {
                let swapped = planted(plant, codes, l.n, l.k / 2, |b: u8| b.rotate_left(4));
                planted_data = (Vec::new(), swapped);
                &LinearData::Q4 {
                    codes: &planted_data.1,
                    scales,
                }
            }
            (other, _) => other,
        };
        let chunk_n = design_n(l.n);
        let mut tiles = Vec::new();
        for m_tile in M_TILES {
            let entry = self
                .designs
                .find(kind, l.k, chunk_n, m_tile)
                .map_err(|e| unsupported(e.to_string()))?;
            let mut chunks = Vec::new();
            for c in 0..n_chunks(l.n, chunk_n) {
                let n0 = c * chunk_n;
                let n_live = chunk_n.min(l.n - n0);
                let design = match (data, kind) {
                    (LinearData::I8 { codes, scales }, DesignKind::I8) => GemmDesign::new_i8(
                        self.session.device(),
                        entry,
                        &codes[n0 * l.k..(n0 + n_live) * l.k],
                        &scales[n0..n0 + n_live],
                        n_live,
                    ),
                    (LinearData::Q4 { codes, scales }, DesignKind::Q4) => {
                        let g = l.k / quant::Q4_GROUP;
                        GemmDesign::new_q4(
                            self.session.device(),
                            entry,
                            &codes[n0 * l.k / 2..(n0 + n_live) * l.k / 2],
                            &scales[n0 * g..(n0 + n_live) * g],
                            n_live,
                        )
                    }
                    _ => return Err(unsupported("storage and design kind disagree".into())),
                }
                .map_err(|e| device_err(format!("{}: {e}", l.name)))?;
                let mut design = design;
                if let Some(t) = self.config.run_timeout {
                    design.set_timeout(t);
                }
                chunks.push(design);
            }
            tiles.push((m_tile, chunks));
        }
        Ok(Resident {
            name: l.name.to_string(),
            n: l.n,
            k: l.k,
            chunk_n,
            tiles,
        })
    }
}

impl GemmBackend for DeviceGemm {
    fn name(&self) -> &'static str {
        "device"
    }

    fn prepare(&mut self, weights: &[WeightRef<'_>]) -> Result<(), BackendError> {
        // Upload all first: a weight that fails leaves the resident set as it was.
        let uploaded = weights
            .iter()
            .map(|w| Ok((w.id, self.upload(w)?)))
            .collect::<Result<Vec<_>, BackendError>>()?;
        for (id, r) in uploaded {
            if self.weights.len() <= id {
                self.weights.resize_with(id + 1, || None);
            }
            self.weights[id] = Some(r);
        }
        Ok(())
    }

    fn gemm(
        &mut self,
        w: &WeightRef<'_>,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        self.gemm_group(std::slice::from_ref(w), x, rows, &mut [y])
    }

    /// The input is quantized once; every design of every weight is launched before the first
    /// wait, so the runs overlap each other (and the host's bookkeeping).
    fn gemm_group(
        &mut self,
        ws: &[WeightRef<'_>],
        x: &[f32],
        rows: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), BackendError> {
        if self.config.serial && ws.len() > 1 {
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                self.gemm_group(std::slice::from_ref(w), x, rows, &mut [y])?;
            }
            return Ok(());
        }
        let t0 = Instant::now();
        // Disjoint &mut to each weight's designs, in the order of `ws`.
        let mut group: Vec<(usize, &mut Resident)> = Vec::with_capacity(ws.len());
        for (slot, r) in self.weights.iter_mut().enumerate() {
            if let Some(pos) = ws.iter().position(|w| w.id == slot) {
                if let Some(r) = r.as_mut() {
                    group.push((pos, r));
                }
            }
        }
        if group.len() != ws.len() {
            let missing = ws
                .iter()
                .find(|w| !group.iter().any(|(p, _)| ws[*p].id == w.id))
                .map_or("a weight", |w| w.linear.name);
            return Err(device_err(format!(
                "{missing} was not uploaded (prepare not called)"
            )));
        }
        group.sort_by_key(|(p, _)| *p);
        let k = group[0].1.k;
        // The one activation rule (packs::quant), row by row.
        self.a_codes.resize(rows * k, 0);
        self.a_scales.resize(rows, 0.0);
        for ((xr, cr), s) in x
            .chunks_exact(k)
            .zip(self.a_codes.chunks_exact_mut(k))
            .zip(self.a_scales.iter_mut())
        {
            *s = quant::quantize_activation_row(xr, cr);
        }
        let tile_sizes: Vec<usize> = group[0].1.tiles.iter().map(|(t, _)| *t).collect();
        let mut row0 = 0;
        let mut quantize_launch = t0.elapsed();
        let mut wait = std::time::Duration::ZERO;
        while row0 < rows {
            let m_tile = m_tile_for(rows - row0, &tile_sizes).expect("at least one tile");
            let take = m_tile.min(rows - row0);
            let a = &self.a_codes[row0 * k..(row0 + take) * k];
            let scales = &self.a_scales[row0..row0 + take];
            let t_launch = Instant::now();
            let mut pending = Vec::new();
            for (pos, r) in group.iter_mut() {
                let (name, chunk_n, r_n) = (r.name.as_str(), r.chunk_n, r.n);
                let designs = &mut r
                    .tiles
                    .iter_mut()
                    .find(|(t, _)| *t == m_tile)
                    .expect("every weight has every tile")
                    .1;
                for (c, d) in designs.iter_mut().enumerate() {
                    let run = d
                        .submit(a, take)
                        .map_err(|e| device_err(format!("{name}: {e}")))?;
                    pending.push((*pos, r_n, c * chunk_n, name, run));
                }
            }
            self.stats.launches += pending.len() as u64;
            quantize_launch += t_launch.elapsed();
            let t_wait = Instant::now();
            for (pos, n, col0, name, run) in pending {
                let out = &mut ys[pos][row0 * n + col0..];
                run.wait_scaled(scales, out, n)
                    .map_err(|e| device_err(format!("{name}: {e}")))?;
            }
            wait += t_wait.elapsed();
            row0 += take;
        }
        self.stats.gemms += ws.len() as u64;
        self.stats.rows += (rows * ws.len()) as u64;
        self.stats.quantize_launch += quantize_launch;
        self.stats.wait += wait;
        Ok(())
    }

    fn take_stats(&mut self) -> GemmStats {
        std::mem::take(&mut self.stats)
    }
}
