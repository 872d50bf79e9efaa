//! Where the GEMMs run (`--gemm host|device|ab`), as every front end states it.

use std::path::PathBuf;

use decoder::{BackendChoice, DeviceConfig};

use crate::error::{EngineError, Result};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmMode {
    /// Every GEMM on the CPU.
    #[default]
    Host,
    /// Every projection on the NPU runtime (real or the software NPU).
    Device,
    /// Both, compared GEMM by GEMM; the host's result is used.
    Ab,
}

#[derive(Clone, Debug, Default)]
pub struct BackendSpec {
    pub mode: GemmMode,
    /// The NPU runtime library (None: $XDNA_VL_RUNTIME, then the installed XRT shim).
    pub runtime: Option<PathBuf>,
    /// The designs directory holding manifest.json.
    pub designs: Option<PathBuf>,
}

impl BackendSpec {
    /// The forward's backend; `program` names the holder of the device ticket.
    pub fn choice(&self, program: &str) -> Result<BackendChoice> {
        if self.mode == GemmMode::Host {
            return Ok(BackendChoice::Host);
        }
        let designs = self.designs.clone().ok_or_else(|| {
            EngineError::Prompt(
                "--gemm device|ab needs --designs DIR (a designs directory with its manifest; \
                 `npu-designs emu PACK -o DIR` writes one for the software NPU)"
                    .into(),
            )
        })?;
        let config = DeviceConfig {
            runtime: self.runtime.clone(),
            designs,
            program: program.to_string(),
            ..DeviceConfig::default()
        };
        Ok(match self.mode {
            GemmMode::Ab => BackendChoice::Ab(config),
            _ => BackendChoice::Device(config),
        })
    }
}
