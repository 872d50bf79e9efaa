//! What both probes share on the command line: opening a pack, choosing the GEMM backend, exit codes.

use compute::cli::RuntimeArgs;
use compute::Runtime;
use decoder::{Decoder, DecoderOptions};
use packs::Pack;
use std::path::Path;
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

pub fn open_pack(path: &Path) -> Arc<Pack> {
    match Pack::open(path) {
        Ok(p) => Arc::new(p),
        Err(e) => refuse(e),
    }
}

/// The runtime the arguments ask for; the program's name holds the device ticket.
pub fn runtime(args: &RuntimeArgs) -> Result<Runtime, String> {
    let program = std::env::args()
        .next()
        .unwrap_or_else(|| "xdna-vl probe".into());
    Runtime::new(&args.options(&program)).map_err(|e| e.to_string())
}

/// A decoder over `pack` with `capacity` slots on the arguments' runtime; refusals exit 2.
pub fn forward(pack: &Arc<Pack>, args: &RuntimeArgs, capacity: usize) -> Decoder {
    let runtime = runtime(args).unwrap_or_else(|e| refuse(e));
    let options = DecoderOptions {
        capacity,
        ..DecoderOptions::default()
    };
    Decoder::new(pack, &runtime, options).unwrap_or_else(|e| refuse(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    use compute::GemmChoice;
    use std::path::PathBuf;

    fn args(gemm: GemmChoice, designs: Option<&str>) -> RuntimeArgs {
        RuntimeArgs {
            gemm,
            runtime: Some(PathBuf::from("/lib/runtime.so")),
            designs: designs.map(PathBuf::from),
            threads: 1,
        }
    }

    #[test]
    fn the_probes_backend_is_the_runtimes_statement() {
        let host = args(GemmChoice::Host, None).options("probe");
        assert_eq!((host.gemm, host.threads), (GemmChoice::Host, 1));
        let ab = args(GemmChoice::Ab, Some("/d")).options("probe");
        assert_eq!(ab.gemm, GemmChoice::Ab);
        assert_eq!(ab.device.designs, Some(PathBuf::from("/d")));
        assert_eq!(ab.device.runtime, Some(PathBuf::from("/lib/runtime.so")));
        assert_eq!(ab.device.program, "probe");
        assert!(runtime(&args(GemmChoice::Host, None)).is_ok());
        // Control: the device without designs is refused, with the runtime's message.
        let Err(e) = runtime(&args(GemmChoice::Device, None)) else {
            panic!("--gemm device without --designs was accepted");
        };
        assert!(e.contains("needs --designs DIR"), "{e}");
    }
}
