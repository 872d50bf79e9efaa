//! What the host gives in this run, measured beside the benchmarks: streaming read bandwidth,
//! multiply-add peaks, load average, memory and CPU time; and the timing helpers every benchmark
//! shares.

use crate::refuse;
use crate::report::round2;
use compute::kernels::Isa;
use probes::peak::PeakMix;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A streaming-read bandwidth probe: `threads` threads summing a buffer far larger than the caches
/// (256 MiB, eight times a 32 MiB L3).
pub struct ReadProbe {
    buf: Vec<u64>,
    threads: usize,
}

impl ReadProbe {
    pub fn new(threads: usize) -> ReadProbe {
        ReadProbe::of_bytes(256 << 20, threads)
    }

    /// A probe over `bytes` (tests use a small one: they time nothing).
    pub fn of_bytes(bytes: usize, threads: usize) -> ReadProbe {
        let words = bytes / 8;
        ReadProbe {
            buf: (0..words as u64).collect(),
            threads,
        }
    }

    /// The read bandwidth to set beside the step that follows: the better of two passes, as a
    /// single pass dips at random (by up to 40% here) and would inflate that step's share of the
    /// roofline.
    pub fn beside(&self) -> f64 {
        self.pass().max(self.pass())
    }

    /// One pass over the buffer: GB/s.
    fn pass(&self) -> f64 {
        let per = self.buf.len().div_ceil(self.threads);
        let t = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .buf
                .chunks(per)
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        (self.buf.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9
    }
}

/// Streaming read bandwidth: best of 8 passes.
pub fn read_bandwidth(threads: usize) -> f64 {
    let probe = ReadProbe::new(threads);
    (0..8).map(|_| probe.pass()).fold(0.0, f64::max)
}

fn sum_words(part: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for c in part.chunks_exact(8) {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().fold(0, |a, &b| a.wrapping_add(b))
}

/// The peaks a prefill is set against, measured in this run on every thread of the pool: the
/// int8 multiply-add mix the kernels run for many rows on `isa`, and f32 FMA.
pub struct Peaks {
    pub int8: Option<(PeakMix, f64)>,
    pub f32_fma: Option<f64>,
    pub json: Value,
}

pub fn measure_peaks(threads: usize, isa: Isa) -> Peaks {
    // AVX2 prefills run two mixes (q4: `vpmaddubsw`; i8: `vpmaddwd` on i16 codes): the int8 peak is
    // the faster of the two in this run, so no kind is flattered by the slower one.
    let int8_mixes: &[PeakMix] = match isa {
        Isa::Avx512Vnni => &[PeakMix::I8VnniZmm],
        _ => &[PeakMix::I8Avx2Ymm, PeakMix::I8MaddwdYmm],
    };
    let int8 = int8_mixes
        .iter()
        .filter_map(|&m| m.measure(threads, 7).map(|r| (m, r)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let int8_mix = int8.map_or(int8_mixes[0], |p| p.0);
    let f32_fma = PeakMix::F32FmaYmm.measure(threads, 7);
    let json = json!({
        "int8_mix": int8_mix.name(),
        "int8_gmac_s": int8.map(|p| round2(p.1)),
        "f32_fma_mix": PeakMix::F32FmaYmm.name(),
        "f32_fma_gmac_s": f32_fma.map(round2),
    });
    Peaks {
        int8,
        f32_fma,
        json,
    }
}

/// The 1-minute load average (other processes share the cores).
pub fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// This process's peak resident set (VmHWM) in MiB.
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Restart the VmHWM count (Linux: write 5 to clear_refs); false when the kernel refuses.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// CPU seconds (user + system) of every thread of this process so far, from `/proc/self/stat`
/// (ticks of 10 ms).
pub fn process_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// A pool of the run's `threads` (the GEMM and attention benchmarks fork on it).
pub fn thread_pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap_or_else(|e| refuse(format!("cannot start the thread pool: {e}")))
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
