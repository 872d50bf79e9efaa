//! The figures as the tables and the JSON give them.

use decoder::KvDtype;

pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Milliseconds to the microsecond.
pub fn round_ms(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A load average as the tables print it ([`crate::measure::load_avg`]; `?` when unknown).
pub fn load(l: Option<f64>) -> String {
    l.map_or("?".into(), |l| format!("{l:.2}"))
}

/// A KV cache type as the CLI and the JSON name it.
pub fn kv_name(kv: KvDtype) -> &'static str {
    match kv {
        KvDtype::F32 => "f32",
        KvDtype::Bf16 => "bf16",
    }
}

/// The report's peak-RSS line: `about` says what the figure holds when VmHWM was reset for the run.
pub fn print_peak_rss(peak: Option<f64>, rss_reset: bool, about: &str) {
    match peak {
        Some(p) if rss_reset => println!("  peak RSS {p:.0} MB ({about})"),
        Some(p) => println!("  peak RSS {p:.0} MB (process-wide: VmHWM could not be reset)"),
        None => println!("  peak RSS unavailable (no /proc/self/status)"),
    }
}
