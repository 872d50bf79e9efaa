//! The GEMM backend seam: every projection and the head go through one of these.
//!
//! `y[rows x n] = x[rows x k] · Wᵀ` where W is a pack's linear weight ([n x k], row-major). The host
//! backend runs the kernels on the CPU; the device backend dispatches the same bytes to the NPU.

use crate::kernels::Products;
use packs::Linear;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{0}")]
    Device(String),
    #[error("the {backend} backend cannot run {weight}: {why}")]
    Unsupported {
        backend: &'static str,
        weight: String,
        why: String,
    },
}

/// Where one backend's time went (for `--profile`).
#[derive(Clone, Debug, Default)]
pub struct GemmStats {
    pub gemms: u64,
    pub launches: u64,
    pub rows: u64,
    pub quantize_launch: Duration,
    pub wait: Duration,
    pub readback: Duration,
    pub host: Duration,
}

/// A weight the forward will multiply by: its index in the forward's weight table, its view, and
/// the arithmetic of its products when it is stored bf16 (chosen when it was registered).
pub struct WeightRef<'a> {
    pub id: usize,
    pub linear: Linear<'a>,
    pub products: Products,
}

impl<'a> WeightRef<'a> {
    /// A weight with f32 products (the arithmetic of every weight not registered otherwise).
    pub fn new(id: usize, linear: Linear<'a>) -> WeightRef<'a> {
        WeightRef {
            id,
            linear,
            products: Products::F32,
        }
    }
}

pub trait GemmBackend: Send {
    fn name(&self) -> &'static str;

    /// Called with weights before their first use (device backends upload them here). It may be
    /// called again with more weights — the vision tower's after the decoder's, under ids of their
    /// own — and each call adds to what is resident; an id given again replaces its weight.
    fn prepare(&mut self, _weights: &[WeightRef<'_>]) -> Result<(), BackendError> {
        Ok(())
    }

    /// `y[rows x n] = x[rows x k] · Wᵀ`.
    fn gemm(
        &mut self,
        w: &WeightRef<'_>,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError>;

    /// Several weights applied to the same input (q/k/v, gate/up): `ys[i] = x · ws[i]ᵀ`. A device
    /// backend quantizes the input once and keeps every run in flight before it waits.
    fn gemm_group(
        &mut self,
        ws: &[WeightRef<'_>],
        x: &[f32],
        rows: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), BackendError> {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            self.gemm(w, x, rows, y)?;
        }
        Ok(())
    }

    /// With `--gemm ab`: how host and device compared so far.
    fn ab_report(&self) -> Option<AbReport> {
        None
    }

    /// Counters since the last `take_stats`.
    fn take_stats(&mut self) -> GemmStats {
        GemmStats::default()
    }
}

/// What `--gemm ab` found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AbReport {
    pub gemms: u64,
    /// GEMMs with at least one differing value.
    pub differing_gemms: u64,
    /// Values that differ at all (bitwise).
    pub differing_values: u64,
    pub max_abs_diff: f32,
    /// The first weight that differed.
    pub first_differing: Option<String>,
}
