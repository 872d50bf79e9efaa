//! The device side of `--gemm device|ab`: the runtime and designs the arguments name.

use crate::cli::{GemmArgs, GemmMode};
use forward::{AbReport, BackendChoice, DeviceConfig, Forward};
use packs::Pack;

pub fn backend(args: &GemmArgs, _pack: &Pack) -> Result<BackendChoice, String> {
    let designs = args.designs.clone().ok_or_else(|| {
        "--gemm device|ab needs --designs DIR (a designs directory with its manifest; \
         `npu-designs emu PACK -o DIR` writes one for the software NPU)"
            .to_string()
    })?;
    let config = DeviceConfig {
        runtime: args.runtime.clone(),
        designs,
        program: std::env::args()
            .next()
            .unwrap_or_else(|| "xdna-vl probe".into()),
        ..DeviceConfig::default()
    };
    Ok(match args.gemm {
        GemmMode::Ab => BackendChoice::Ab(config),
        _ => BackendChoice::Device(config),
    })
}

/// The A/B counters of a forward running `--gemm ab`, as JSON fields.
pub fn ab_json(fwd: &Forward) -> serde_json::Value {
    match fwd.backend().ab_report() {
        Some(AbReport {
            gemms,
            differing_gemms,
            differing_values,
            max_abs_diff,
            first_differing,
        }) => serde_json::json!({
            "ab_gemms": gemms,
            "ab_differing": differing_gemms,
            "ab_differing_values": differing_values,
            "ab_max_abs_diff": max_abs_diff,
            "ab_first_differing": first_differing,
        }),
        None => serde_json::json!({}),
    }
}
