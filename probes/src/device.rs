//! The device side of `--gemm ab`: the host/device comparison as JSON fields (the backend itself is
//! chosen by the runtime's flags, see `cli::runtime`).

use compute::AbReport;
use decoder::Decoder;

/// The A/B counters of a forward running `--gemm ab`, as JSON fields.
pub fn ab_json(fwd: &Decoder) -> serde_json::Value {
    match fwd.runtime().ab_report() {
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
