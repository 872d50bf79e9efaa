//! What both probes share on the command line: opening a pack, choosing the GEMM backend, exit codes.

use decoder::{BackendChoice, Forward, ForwardOptions};
use packs::Pack;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Exit status: every arm passed.
pub const EXIT_PASS: i32 = 0;
/// Exit status: a comparison or arm failed.
pub const EXIT_FAIL: i32 = 1;
/// Exit status: bad input (a file, an argument) — nothing was compared.
pub const EXIT_BAD_INPUT: i32 = 2;

/// Prints `error: ...` and exits with status 2.
pub fn refuse(msg: impl std::fmt::Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(EXIT_BAD_INPUT)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmMode {
    /// Every GEMM on the CPU.
    Host,
    /// Every projection on the NPU runtime (real or the software NPU).
    Device,
    /// Both, compared GEMM by GEMM; the host result is used.
    Ab,
}

#[derive(Clone, Debug, clap::Args)]
pub struct GemmArgs {
    /// Where the projections run.
    #[arg(long, value_enum, default_value = "host")]
    pub gemm: GemmMode,
    /// The NPU runtime library (default: $XDNA_VL_RUNTIME, then the installed XRT shim).
    #[arg(long, value_name = "LIB")]
    pub runtime: Option<PathBuf>,
    /// The designs directory holding manifest.json (see `npu-designs`).
    #[arg(long, value_name = "DIR")]
    pub designs: Option<PathBuf>,
    /// Threads for the host pool.
    #[arg(long, default_value_t = default_threads())]
    pub threads: usize,
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn open_pack(path: &Path) -> Arc<Pack> {
    match Pack::open(path) {
        Ok(p) => Arc::new(p),
        Err(e) => refuse(e),
    }
}

impl GemmArgs {
    /// The arguments as the engine states a backend (the one statement every front end shares).
    pub fn spec(&self) -> engine::BackendSpec {
        engine::BackendSpec {
            mode: match self.gemm {
                GemmMode::Host => engine::GemmMode::Host,
                GemmMode::Device => engine::GemmMode::Device,
                GemmMode::Ab => engine::GemmMode::Ab,
            },
            runtime: self.runtime.clone(),
            designs: self.designs.clone(),
        }
    }
}

/// The backend the arguments ask for (`engine::BackendSpec::choice`); the program's name holds the
/// device ticket.
pub fn backend(args: &GemmArgs) -> Result<BackendChoice, String> {
    let program = std::env::args()
        .next()
        .unwrap_or_else(|| "xdna-vl probe".into());
    args.spec().choice(&program).map_err(|e| e.to_string())
}

/// A forward over `pack` with `capacity` slots and the arguments' backend; refusals exit 2.
pub fn forward(pack: &Arc<Pack>, args: &GemmArgs, capacity: usize) -> Forward {
    let choice = backend(args).unwrap_or_else(|e| refuse(e));
    let options = ForwardOptions {
        capacity,
        threads: args.threads,
        ..ForwardOptions::default()
    };
    Forward::new(pack, choice, options).unwrap_or_else(|e| refuse(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(gemm: GemmMode, designs: Option<&str>) -> GemmArgs {
        GemmArgs {
            gemm,
            runtime: Some(PathBuf::from("/lib/runtime.so")),
            designs: designs.map(PathBuf::from),
            threads: 1,
        }
    }

    #[test]
    fn the_probes_backend_is_the_engines_statement() {
        assert!(matches!(
            backend(&args(GemmMode::Host, None)),
            Ok(BackendChoice::Host)
        ));
        match backend(&args(GemmMode::Ab, Some("/d"))) {
            Ok(BackendChoice::Ab(c)) => {
                assert_eq!(c.designs, PathBuf::from("/d"));
                assert_eq!(c.runtime, Some(PathBuf::from("/lib/runtime.so")));
            }
            _ => panic!("--gemm ab did not give the A/B backend"),
        }
        assert!(matches!(
            backend(&args(GemmMode::Device, Some("/d"))),
            Ok(BackendChoice::Device(_))
        ));
        // Control: the device without designs is refused, with the engine's message.
        let Err(e) = backend(&args(GemmMode::Device, None)) else {
            panic!("--gemm device without --designs was accepted");
        };
        assert!(e.contains("needs --designs DIR"), "{e}");
    }
}
