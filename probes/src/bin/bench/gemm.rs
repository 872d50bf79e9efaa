//! `bench gemm`: each GEMM of the shape alone, GEMV and batched, per instruction set, against the
//! read bandwidth and the multiply-add peaks measured beside it; and a token's decode GEMVs in the
//! decoder's order.

use crate::measure::{measure_peaks, median, read_bandwidth, secs, thread_pool, ReadProbe};
use crate::random_pack::pack_for;
use crate::report::round2;
use crate::{refuse, Common};
use compute::kernels::{Isa, Kernels};
use compute::HostGemm;
use compute::{GemmBackend, WeightRef};
use packs::random::RandomShape;
use packs::{Pack, QuantKind};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The distinct GEMM shapes of a decoder layer (timed on the first-named weight of each: q, k,
/// gate, down) plus the head: (label, weight names of every layer). The label's `n x k` is added
/// from the pack, so it names the shape being timed.
fn gemm_shapes(layers: usize) -> Vec<(&'static str, Vec<String>)> {
    use packs::names::{proj, Proj};
    let per_layer = |p: Proj| (0..layers).map(|l| proj(l, p)).collect::<Vec<_>>();
    vec![
        ("q/o ", per_layer(Proj::Q)),
        ("k/v ", per_layer(Proj::K)),
        ("gate/up", per_layer(Proj::Gate)),
        ("down", per_layer(Proj::Down)),
    ]
}

/// The peak a batched GEMM of `kind` on `isa` is set against: f32 FMA for f32 and bf16 weights,
/// else the int8 peak of [`measure_peaks`] (on AVX2 the faster of the two integer mixes). `None`
/// for the scalar kernels or a mix the CPU lacks.
fn gemm_peak(threads: usize, isa: Isa, kind: QuantKind) -> Option<f64> {
    use probes::peak::PeakMix;
    match (isa, kind) {
        (Isa::Scalar, _) => None,
        (_, QuantKind::F32 | QuantKind::Bf16) => PeakMix::F32FmaYmm.measure(threads, 3),
        _ => measure_peaks(threads, isa).int8.map(|p| p.1),
    }
}

/// Most rows `bench gemm` times the head at.
const HEAD_MAX_ROWS: usize = 128;

/// `bench gemm`: `--isa` (every usable instruction set when empty) and `--rows` checked before any
/// pack is touched.
pub fn run(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    rows: &[usize],
    isa: &[String],
) -> Value {
    let isas: Vec<Isa> = if isa.is_empty() {
        Isa::available()
            .into_iter()
            .filter(|i| i.is_usable())
            .collect()
    } else {
        isa.iter()
            .map(|i| {
                let isa: Isa = i.parse().unwrap_or_else(|e| refuse(format!("--isa: {e}")));
                match isa.self_check() {
                    None => refuse(format!("--isa: this CPU cannot run {isa}")),
                    Some(Err(why)) => refuse(format!("--isa: the {isa} kernels {why}")),
                    Some(Ok(())) => {}
                }
                isa
            })
            .collect()
    };
    if rows.is_empty() || rows.contains(&0) {
        refuse("--rows: every row count must be at least 1");
    }
    if shape.semantics.delta_net.is_some() {
        // Refused before its pack is made (1.4 GB for qwen3.5-2b q4).
        refuse(format!(
            "bench gemm times Qwen3-VL's linears (q/k/v/o, gate/up, down); shape {} is a Qwen3.5 \
             one: bench decode --shape {} times its decode, GEMMs and the rest",
            shape.name, shape.name
        ));
    }
    bench(c, shape, kinds, rows, &isas)
}

fn bench(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    rows: &[usize],
    isas: &[Isa],
) -> Value {
    let pool = Arc::new(thread_pool(c.threads));
    let mut out = Map::new();
    let read_gb_s = read_bandwidth(c.threads);
    if !c.json {
        println!("streaming read {read_gb_s:.1} GB/s ({} threads)", c.threads);
    }
    for &kind in kinds {
        let pack = pack_for(c, shape, kind);
        let layers = pack.semantics().num_layers;
        let mut kind_json = Vec::new();
        if !c.json {
            println!("\n{kind} ({} threads)", c.threads);
        }
        let mut shapes: Vec<(String, Vec<WeightRef<'_>>)> = gemm_shapes(layers)
            .into_iter()
            .map(|(label, names)| {
                let refs: Vec<WeightRef<'_>> = names
                    .iter()
                    .enumerate()
                    .map(|(id, n)| WeightRef::new(id, pack.linear(n).unwrap_or_else(|e| refuse(e))))
                    .collect();
                let (n, k) = refs.first().map_or((0, 0), |w| (w.linear.n, w.linear.k));
                (format!("{label} {n}x{k}"), refs)
            })
            .collect();
        let head = pack.head();
        shapes.push((
            format!("head {}x{}", head.n, head.k),
            vec![WeightRef::new(0, head)],
        ));
        for &isa in isas {
            let kernels = Kernels::new(isa).expect("usable: checked above");
            let mut host = HostGemm::with_kernels(pool.clone(), kernels);
            for (label, weights) in &shapes {
                let mut batches = vec![1];
                batches.extend(rows.iter().copied().filter(|&r| r > 1));
                for batch in batches {
                    if isa == Isa::Scalar && batch > 1 {
                        continue; // minutes per shape; the GEMV ratio tells the story
                    }
                    if label.starts_with("head") && batch > HEAD_MAX_ROWS {
                        continue; // seconds per call; a prefill runs the head for one row
                    }
                    // A batched case is compute-bound: it is set against the peak of the mixes
                    // its kernels run, sampled just before and just after it (the larger: on a
                    // shared host the rate moves within seconds).
                    let sample = || {
                        (batch > 1)
                            .then(|| gemm_peak(c.threads, isa, kind))
                            .flatten()
                    };
                    let peak_before = sample();
                    let (fast, med) = time_gemm(&mut host, weights, batch);
                    let peak = peak_before.into_iter().chain(sample()).reduce(f64::max);
                    let (n, k) = (weights[0].linear.n, weights[0].linear.k);
                    let bytes = weight_bytes(&weights[0]) as f64;
                    let gb_s = bytes / fast / 1e9;
                    let gmac_s = (n * k * batch) as f64 / fast / 1e9;
                    let peak_pct = peak.map(|p| 100.0 * gmac_s / p);
                    if !c.json {
                        println!(
                            "  {:10} {:18} rows {:4}  {:8.3} ms (median {:8.3})  {:6.1} GB/s ({:3.0}% of read)  {:7.1} GMAC/s{}",
                            isa.name(),
                            label,
                            batch,
                            fast * 1e3,
                            med * 1e3,
                            gb_s,
                            100.0 * gb_s / read_gb_s,
                            gmac_s,
                            peak.map_or(String::new(), |p| format!(
                                " ({:3.0}% of the {p:.1} GMAC/s peak beside it)",
                                100.0 * gmac_s / p
                            ))
                        );
                    }
                    kind_json.push(json!({
                        "isa": isa.name(), "gemm": label, "rows": batch,
                        "ms": fast * 1e3, "ms_median": med * 1e3,
                        "gb_s": round2(gb_s), "read_pct": round2(100.0 * gb_s / read_gb_s),
                        "gmac_s": round2(gmac_s),
                        "peak_gmac_s": peak.map(round2), "peak_pct": peak_pct.map(round2),
                    }));
                }
            }
        }
        for &isa in isas.iter().filter(|&&i| i != Isa::Scalar) {
            let kernels = Kernels::new(isa).expect("usable: checked above");
            let (t, ratio, read, part) = gemv_sequence(&pool, kernels, &pack, c.threads, 12);
            let ms = part.map(|p| round2(p * 1e3));
            if !c.json {
                println!(
                    "  {:10} decode GEMVs of a token  {:8.3} ms  {:5.1}% of the read bandwidth beside it ({read:.1} GB/s); \
                     q/k/v {} o {} gate/up {} down {} head {} ms",
                    isa.name(),
                    t * 1e3,
                    100.0 * ratio,
                    ms[0],
                    ms[1],
                    ms[2],
                    ms[3],
                    ms[4]
                );
            }
            kind_json.push(json!({
                "isa": isa.name(), "gemm": "decode sequence", "rows": 1, "ms": t * 1e3,
                "read_pct": round2(100.0 * ratio), "read_gb_s": round2(read),
                "ms_qkv_o_gateup_down_head": ms,
            }));
        }
        out.insert(kind.to_string(), Value::Array(kind_json));
    }
    json!({ "shape": shape.name, "threads": c.threads, "read_gb_s": round2(read_gb_s), "gemm": out })
}

/// The decoder's GEMVs of one token in its order and grouping (q/k/v, o, gate/up, down per layer,
/// then the head), run from a pool thread as the decoder does, over `steps` tokens: median seconds
/// per token, median of `moved GB/s / read GB/s just before` ([`ReadProbe::beside`]), median read GB/s, and
/// median seconds per token spent in q/k/v, o, gate/up, down and the head.
fn gemv_sequence(
    pool: &Arc<rayon::ThreadPool>,
    kernels: Kernels,
    pack: &Pack,
    threads: usize,
    steps: usize,
) -> (f64, f64, f64, [f64; 5]) {
    use packs::names::{proj, Proj};
    let layers = pack.semantics().num_layers;
    let wref = |name: String| WeightRef::new(0, pack.linear(&name).unwrap_or_else(|e| refuse(e)));
    let groups: Vec<Vec<WeightRef<'_>>> = (0..layers)
        .flat_map(|l| {
            [
                vec![Proj::Q, Proj::K, Proj::V],
                vec![Proj::O],
                vec![Proj::Gate, Proj::Up],
                vec![Proj::Down],
            ]
            .into_iter()
            .map(move |ps| ps.into_iter().map(|p| wref(proj(l, p))).collect())
        })
        .chain(std::iter::once(vec![WeightRef::new(0, pack.head())]))
        .collect();
    let bytes: u64 = groups.iter().flatten().map(weight_bytes).sum();
    let mut outs: Vec<Vec<Vec<f32>>> = groups
        .iter()
        .map(|g| g.iter().map(|w| vec![0f32; w.linear.n]).collect())
        .collect();
    let mut host = HostGemm::with_kernels(pool.clone(), kernels);
    let probe = ReadProbe::new(threads);
    let (mut times, mut ratios, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    let mut parts: Vec<[f64; 5]> = Vec::new();
    for step in 0..steps + 1 {
        // Every group's input differs (as in the decoder, where only q/k/v and gate/up share one),
        // so no GEMM reuses the last prepared activations; made before the clock starts.
        let xs: Vec<Vec<f32>> = groups
            .iter()
            .enumerate()
            .map(|(gi, g)| {
                (0..g[0].linear.k)
                    .map(|i| ((i * 37 + step * 7 + gi) % 101) as f32 / 50.0 - 1.0)
                    .collect()
            })
            .collect();
        let read = probe.beside();
        let t = Instant::now();
        let mut per = [0f64; 5];
        pool.install(|| {
            for (gi, ((g, out), x)) in groups.iter().zip(outs.iter_mut()).zip(&xs).enumerate() {
                let tg = Instant::now();
                let mut ys: Vec<&mut [f32]> = out.iter_mut().map(|y| y.as_mut_slice()).collect();
                host.gemm_group(g, x, 1, &mut ys)
                    .unwrap_or_else(|e| refuse(e));
                per[if gi == groups.len() - 1 { 4 } else { gi % 4 }] += secs(tg.elapsed());
            }
        });
        let dt = secs(t.elapsed());
        if step > 0 {
            // The first token warms up the pool and the buffers.
            times.push(dt);
            parts.push(per);
            ratios.push(bytes as f64 / dt / 1e9 / read);
            reads.push(read);
        }
    }
    let part = std::array::from_fn(|i| median(parts.iter().map(|p| p[i]).collect()));
    (median(times), median(ratios), median(reads), part)
}

/// Cycles through `weights` (one per layer, so the working set is far beyond the caches) with a
/// fresh input each call: (fastest and median seconds per GEMM). The fastest call is the figure
/// least disturbed by other processes.
fn time_gemm(host: &mut HostGemm, weights: &[WeightRef<'_>], rows: usize) -> (f64, f64) {
    let (n, k) = (weights[0].linear.n, weights[0].linear.k);
    let mut x: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let mut y = vec![0f32; rows * n];
    // Warm-up pass over every weight.
    for w in weights {
        host.gemm(w, &x, rows, &mut y).unwrap_or_else(|e| refuse(e));
    }
    let budget = Duration::from_millis(if rows == 1 { 600 } else { 2000 });
    let t = Instant::now();
    let mut times = Vec::new();
    while t.elapsed() < budget || times.len() < weights.len().min(4) {
        let i = times.len() % x.len();
        x[i] += 1e-3; // a new input: quantization is part of every call
        let t1 = Instant::now();
        host.gemm(&weights[times.len() % weights.len()], &x, rows, &mut y)
            .unwrap_or_else(|e| refuse(e));
        times.push(secs(t1.elapsed()));
    }
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    (fastest, median(times))
}

fn weight_bytes(w: &WeightRef<'_>) -> u64 {
    use packs::LinearData;
    (match w.linear.data {
        LinearData::F32(v) => std::mem::size_of_val(v),
        LinearData::Bf16(v) => std::mem::size_of_val(v),
        LinearData::I8 { codes, scales } => codes.len() + std::mem::size_of_val(scales),
        LinearData::Q4 { codes, scales } => codes.len() + std::mem::size_of_val(scales),
    }) as u64
}
