//! The device side of `--gemm ab`: the host/device comparison as JSON fields (the backend itself is
//! chosen by `engine::BackendSpec`, see `cli::backend`).

use decoder::{AbReport, Forward};

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
