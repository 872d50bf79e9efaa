//! The A/B backend: every GEMM on the host and on the device, the host's result used, the
//! differences counted (`--gemm ab`).

use crate::backend::{AbReport, BackendError, GemmBackend, GemmStats, WeightRef};
use crate::device::DeviceGemm;
use crate::host::HostGemm;

/// Host and device side by side: every GEMM runs on both, the host's result is used, and the
/// differences are counted.
pub struct AbGemm {
    host: HostGemm,
    device: DeviceGemm,
    scratch: Vec<f32>,
    report: AbReport,
}

impl AbGemm {
    pub fn new(host: HostGemm, device: DeviceGemm) -> AbGemm {
        AbGemm {
            host,
            device,
            scratch: Vec::new(),
            report: AbReport::default(),
        }
    }
}

impl GemmBackend for AbGemm {
    fn name(&self) -> &'static str {
        "ab"
    }

    fn prepare(&mut self, weights: &[WeightRef<'_>]) -> Result<(), BackendError> {
        self.host.prepare(weights)?;
        self.device.prepare(weights)
    }

    fn gemm(
        &mut self,
        w: &WeightRef<'_>,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        self.host.gemm(w, x, rows, y)?;
        self.scratch.resize(y.len(), 0.0);
        self.device.gemm(w, x, rows, &mut self.scratch)?;
        let mut differing = 0u64;
        for (a, b) in y.iter().zip(&self.scratch) {
            if a.to_bits() != b.to_bits() {
                differing += 1;
                self.report.max_abs_diff = self.report.max_abs_diff.max((a - b).abs());
            }
        }
        self.report.gemms += 1;
        if differing > 0 {
            self.report.differing_gemms += 1;
            self.report.differing_values += differing;
            self.report
                .first_differing
                .get_or_insert_with(|| w.linear.name.to_string());
        }
        Ok(())
    }

    fn take_stats(&mut self) -> GemmStats {
        let h = self.host.take_stats();
        let mut d = self.device.take_stats();
        d.host += h.host;
        d
    }

    fn ab_report(&self) -> Option<AbReport> {
        Some(self.report.clone())
    }
}
