//! A GEMM design with its weights resident on the device: B is uploaded once, then each launch
//! takes up to `m_tile` rows of int8 activations and returns C = A x B^T for the live columns.

use std::time::Duration;

use half::bf16;
use packs::quant::{finish_i8, finish_q4};

use crate::designs::DesignEntry;
use crate::device::{Buffer, Design, Device, DeviceError, Run, RunError};
use crate::geometry::{ArgGroup, DesignKind, Geometry, Q4_GROUP};
use crate::runtime::CallError;

/// How long a launch may take before it counts as timed out, unless set otherwise. Generous: the
/// software NPU computes a prefill tile of a real model on one CPU core in the dev profile.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum GemmError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("design {design} ({geometry}): {message}")]
    Shape {
        design: String,
        geometry: Geometry,
        message: String,
    },
    #[error("design {design} ({geometry}): {source}")]
    Sync {
        design: String,
        geometry: Geometry,
        source: CallError,
    },
}

/// A loaded design, its buffers, and its resident weights.
pub struct GemmDesign {
    // Field order is drop order: buffers before the design they belong to.
    a: Buffer,
    b: Buffer,
    c: Buffer,
    design: Design,
    /// Rows of B that hold weights; the rest (up to the design's N) are zero padding.
    n_live: usize,
    /// Per-output-row weight scales of an i8 design (the host applies them).
    w_scales: Option<Vec<f32>>,
    timeout: Duration,
}

impl GemmDesign {
    /// An int8 design with weights `codes` [n_live x K] and per-row scales [n_live];
    /// `n_live` <= the design's N (the rest of B is zero).
    pub fn new_i8(
        device: &Device,
        entry: &DesignEntry,
        codes: &[i8],
        scales: &[f32],
        n_live: usize,
    ) -> Result<GemmDesign, GemmError> {
        let g = entry.geometry;
        let shape = |message: String| GemmError::Shape {
            design: entry.name.clone(),
            geometry: g,
            message,
        };
        if g.kind != DesignKind::I8 {
            return Err(shape("an i8 GEMM needs an i8 design".into()));
        }
        check_n_live(g, n_live).map_err(&shape)?;
        if codes.len() != n_live * g.k || scales.len() != n_live {
            return Err(shape(format!(
                "weights have {} codes and {} scales, expected {n_live} x {} = {} and {n_live}",
                codes.len(),
                scales.len(),
                g.k,
                n_live * g.k
            )));
        }
        let mut gemm = GemmDesign::load(device, entry, n_live)?;
        let bytes = gemm.b.as_mut_slice();
        for (dst, &code) in bytes.iter_mut().zip(codes) {
            *dst = code as u8;
        }
        bytes[codes.len()..].fill(0);
        gemm.w_scales = Some(scales.to_vec());
        gemm.upload_b()?;
        Ok(gemm)
    }

    /// A q4 design with weights in the pack's q4 layout: `codes` [n_live x K/2] and `scales`
    /// [n_live x K/32]; `n_live` <= the design's N (the rest of B is zero).
    pub fn new_q4(
        device: &Device,
        entry: &DesignEntry,
        codes: &[u8],
        scales: &[bf16],
        n_live: usize,
    ) -> Result<GemmDesign, GemmError> {
        let g = entry.geometry;
        let shape = |message: String| GemmError::Shape {
            design: entry.name.clone(),
            geometry: g,
            message,
        };
        if g.kind != DesignKind::Q4 {
            return Err(shape("a q4 GEMM needs a q4 design".into()));
        }
        check_n_live(g, n_live).map_err(&shape)?;
        let (codes_len, scales_len) = (n_live * (g.k / 2), n_live * (g.k / Q4_GROUP));
        if codes.len() != codes_len || scales.len() != scales_len {
            return Err(shape(format!(
                "weights have {} code bytes and {} scales, expected {codes_len} and {scales_len}",
                codes.len(),
                scales.len()
            )));
        }
        let mut gemm = GemmDesign::load(device, entry, n_live)?;
        let scales_at = g.q4_scales_offset();
        let bytes = gemm.b.as_mut_slice();
        let (code_bytes, scale_bytes) = bytes.split_at_mut(scales_at);
        code_bytes[..codes_len].copy_from_slice(codes);
        code_bytes[codes_len..].fill(0);
        for (dst, scale) in scale_bytes.chunks_exact_mut(2).zip(scales) {
            dst.copy_from_slice(&scale.to_bits().to_le_bytes());
        }
        scale_bytes[scales_len * 2..].fill(0);
        gemm.upload_b()?;
        Ok(gemm)
    }

    fn load(device: &Device, entry: &DesignEntry, n_live: usize) -> Result<GemmDesign, GemmError> {
        let design = device.load_design(entry)?;
        Ok(GemmDesign {
            a: design.alloc(ArgGroup::A)?,
            b: design.alloc(ArgGroup::B)?,
            c: design.alloc(ArgGroup::C)?,
            design,
            n_live,
            w_scales: None,
            timeout: DEFAULT_RUN_TIMEOUT,
        })
    }

    fn sync_error(&self, source: CallError) -> GemmError {
        GemmError::Sync {
            design: self.design.name().to_string(),
            geometry: self.design.geometry(),
            source,
        }
    }

    fn upload_b(&mut self) -> Result<(), GemmError> {
        self.b.sync_to_device().map_err(|e| self.sync_error(e))
    }

    pub fn design(&self) -> &Design {
        &self.design
    }

    pub fn geometry(&self) -> Geometry {
        self.design.geometry()
    }

    /// Output columns that hold results (the design's N minus padding).
    pub fn n_live(&self) -> usize {
        self.n_live
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn shape_error(&self, message: String) -> GemmError {
        GemmError::Shape {
            design: self.design.name().to_string(),
            geometry: self.design.geometry(),
            message,
        }
    }

    /// Writes `rows` rows of A (zeroing the rest of the tile) and syncs it to the device.
    fn load_a(&mut self, a: &[i8], rows: usize) -> Result<(), GemmError> {
        let g = self.geometry();
        if rows == 0 || rows > g.m_tile {
            return Err(
                self.shape_error(format!("{rows} rows of A, the tile holds 1..={}", g.m_tile))
            );
        }
        if a.len() != rows * g.k {
            return Err(self.shape_error(format!(
                "A has {} values, expected {rows} rows x {} = {}",
                a.len(),
                g.k,
                rows * g.k
            )));
        }
        let bytes = self.a.as_mut_slice();
        for (dst, &code) in bytes.iter_mut().zip(a) {
            *dst = code as u8;
        }
        bytes[a.len()..].fill(0);
        self.a.sync_to_device().map_err(|e| self.sync_error(e))
    }

    /// Uploads `rows` rows of A and launches; the returned run is finished with one of its
    /// `wait_*` methods. Host work can go on meanwhile.
    pub fn submit(&mut self, a: &[i8], rows: usize) -> Result<PendingGemm<'_>, GemmError> {
        self.load_a(a, rows)?;
        let GemmDesign {
            a,
            b,
            c,
            design,
            n_live,
            w_scales,
            timeout,
        } = self;
        let run = design.start(a, b, c)?;
        Ok(PendingGemm {
            run,
            design,
            rows,
            n_live: *n_live,
            w_scales: w_scales.as_deref(),
            timeout: *timeout,
        })
    }

    /// i8 only: the exact int32 accumulators, out[r * out_stride + j] for r < rows, j < n_live.
    pub fn run_i32(
        &mut self,
        a: &[i8],
        rows: usize,
        out: &mut [i32],
        out_stride: usize,
    ) -> Result<(), GemmError> {
        self.submit(a, rows)?.wait_i32(out, out_stride)
    }

    /// q4 only: the per-row sums of scaled group dots (no activation scale).
    pub fn run_f32(
        &mut self,
        a: &[i8],
        rows: usize,
        out: &mut [f32],
        out_stride: usize,
    ) -> Result<(), GemmError> {
        self.submit(a, rows)?.wait_f32(out, out_stride)
    }

    /// The finished product: i8 applies `packs::quant::finish_i8(acc, a_scales[r], w_scale[j])`,
    /// q4 `packs::quant::finish_q4(sum, a_scales[r])`.
    pub fn run_scaled(
        &mut self,
        a: &[i8],
        a_scales: &[f32],
        rows: usize,
        out: &mut [f32],
        out_stride: usize,
    ) -> Result<(), GemmError> {
        self.submit(a, rows)?.wait_scaled(a_scales, out, out_stride)
    }
}

fn check_n_live(g: Geometry, n_live: usize) -> Result<(), String> {
    if n_live == 0 || n_live > g.n {
        return Err(format!(
            "{n_live} weight rows, the design holds 1..={}",
            g.n
        ));
    }
    Ok(())
}

/// A launched GEMM. Dropping it without waiting frees the run; nothing is written anywhere.
pub struct PendingGemm<'a> {
    run: Run<'a>,
    design: &'a Design,
    rows: usize,
    n_live: usize,
    w_scales: Option<&'a [f32]>,
    timeout: Duration,
}

impl PendingGemm<'_> {
    fn shape_error(&self, message: String) -> GemmError {
        GemmError::Shape {
            design: self.design.name().to_string(),
            geometry: self.design.geometry(),
            message,
        }
    }

    fn check(&self, kind: DesignKind, out_len: usize, out_stride: usize) -> Result<(), GemmError> {
        let geometry = self.design.geometry();
        if geometry.kind != kind {
            return Err(self.shape_error(format!("this output form is for {kind} designs")));
        }
        let needed = (self.rows - 1) * out_stride + self.n_live;
        if out_stride < self.n_live || out_len < needed {
            return Err(self.shape_error(format!(
                "output of {out_len} values with row stride {out_stride} cannot hold {} rows of {}",
                self.rows, self.n_live
            )));
        }
        Ok(())
    }

    /// Waits; on completion calls `emit(row, col, c_bytes)` for every live element. On failure
    /// nothing is emitted.
    fn finish(self, mut emit: impl FnMut(usize, usize, [u8; 4])) -> Result<(), GemmError> {
        let n = self.design.geometry().n;
        let (rows, n_live) = (self.rows, self.n_live);
        let c = self.run.wait(self.timeout)?;
        let bytes = c.as_slice();
        for row in 0..rows {
            let row_bytes = &bytes[row * n * 4..(row * n + n_live) * 4];
            for (col, value) in row_bytes.chunks_exact(4).enumerate() {
                emit(row, col, [value[0], value[1], value[2], value[3]]);
            }
        }
        Ok(())
    }

    pub fn wait_i32(self, out: &mut [i32], out_stride: usize) -> Result<(), GemmError> {
        self.check(DesignKind::I8, out.len(), out_stride)?;
        self.finish(|r, j, v| out[r * out_stride + j] = i32::from_le_bytes(v))
    }

    pub fn wait_f32(self, out: &mut [f32], out_stride: usize) -> Result<(), GemmError> {
        self.check(DesignKind::Q4, out.len(), out_stride)?;
        self.finish(|r, j, v| out[r * out_stride + j] = f32::from_le_bytes(v))
    }

    pub fn wait_scaled(
        self,
        a_scales: &[f32],
        out: &mut [f32],
        out_stride: usize,
    ) -> Result<(), GemmError> {
        let kind = self.design.geometry().kind;
        self.check(kind, out.len(), out_stride)?;
        if a_scales.len() != self.rows {
            return Err(self.shape_error(format!(
                "{} activation scales for {} rows",
                a_scales.len(),
                self.rows
            )));
        }
        match (kind, self.w_scales) {
            (DesignKind::I8, Some(w_scales)) => self.finish(|r, j, v| {
                out[r * out_stride + j] = finish_i8(i32::from_le_bytes(v), a_scales[r], w_scales[j])
            }),
            (DesignKind::Q4, _) => self.finish(|r, j, v| {
                out[r * out_stride + j] = finish_q4(f32::from_le_bytes(v), a_scales[r])
            }),
            (DesignKind::I8, None) => Err(self.shape_error("i8 weight scales are missing".into())),
        }
    }
}
