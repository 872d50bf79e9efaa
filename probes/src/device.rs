//! The device side of `--gemm device|ab`.

use crate::cli::GemmArgs;
use forward::BackendChoice;
use packs::Pack;

pub fn backend(args: &GemmArgs, _pack: &Pack) -> Result<BackendChoice, String> {
    Err(format!(
        "--gemm {:?} is not available yet: the device backend is not part of this build",
        args.gemm
    )
    .to_lowercase())
}
