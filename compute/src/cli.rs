//! The runtime flags every front end takes (`--gemm --runtime --designs --threads`), once.

use std::path::PathBuf;

use crate::runtime::{default_threads, device_config, GemmChoice, RuntimeOptions};

#[derive(Clone, Debug, clap::Args)]
pub struct RuntimeArgs {
    /// Where the matrix products run. Example: --gemm device --designs designs/
    #[arg(long, value_enum, default_value = "host")]
    pub gemm: GemmChoice,
    /// The NPU runtime library (default: $XDNA_VL_RUNTIME, then the installed XRT shim).
    /// Example: --runtime /opt/xilinx/xrt/lib/libxrt_coreutil.so
    #[arg(long, value_name = "LIB")]
    pub runtime: Option<PathBuf>,
    /// The designs directory holding manifest.json (`npu-designs`), for --gemm device|ab.
    /// Example: --designs designs/
    #[arg(long, value_name = "DIR")]
    pub designs: Option<PathBuf>,
    /// Threads for the CPU work. Example: --threads 8
    #[arg(long, default_value_t = default_threads())]
    pub threads: usize,
}

impl RuntimeArgs {
    /// The runtime these flags ask for; `program` names the holder of the device ticket.
    pub fn options(&self, program: &str) -> RuntimeOptions {
        RuntimeOptions {
            threads: self.threads,
            gemm: self.gemm,
            device: device_config(self.runtime.clone(), self.designs.clone(), program),
        }
    }
}
