//! `bench attention`: the decoder's attention alone over a filled cache, every layer, f32 and bf16
//! caches: one decode row, or a prefill's rows set against the f32 multiply-add peaks of the run.

use crate::measure::{load_avg, median, process_cpu_secs, secs, thread_pool};
use crate::report::{kv_name, load, round2};
use crate::{refuse, Common};
use decoder::attention::AttnShape;
use decoder::KvDtype;
use packs::random::RandomShape;
use serde_json::{json, Map, Value};
use std::time::Instant;

/// The attention geometry of `shape` and a pool of the run's threads (both attention benchmarks).
fn attention_setup(c: &Common, shape: &RandomShape) -> (AttnShape, rayon::ThreadPool) {
    let sem = &shape.semantics;
    let geometry = AttnShape {
        heads: sem.num_heads,
        kv_heads: sem.num_kv_heads,
        head_dim: sem.head_dim,
    };
    (geometry, thread_pool(c.threads))
}

/// `bench attention`: `--rows 1` times a decode row, more a prefill of that many rows.
pub fn run(c: &Common, shape: &RandomShape, context: usize, rows: usize) -> Value {
    if rows == 0 {
        refuse("--rows must be at least 1 (1 times a decode row, more a prefill)");
    }
    if rows == 1 {
        decode_row(c, shape, context)
    } else {
        prefill_rows(c, shape, context, rows)
    }
}

/// One decode row over `context` filled slots, every layer, for every split of the KV heads
/// over tasks (the decoder's first; only its figures go to the JSON).
fn decode_row(c: &Common, shape: &RandomShape, context: usize) -> Value {
    use decoder::attention::attend_heads;
    use decoder::kv::{KvCache, KvData, KvElem, KvStore};
    use rayon::prelude::*;
    let sem = &shape.semantics;
    let (geometry, pool) = attention_setup(c, shape);
    let layers = sem.num_layers;
    let q: Vec<f32> = (0..geometry.q_dim())
        .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
        .collect();
    let mut out = vec![0f32; geometry.q_dim()];
    let mut result = Map::new();
    fn fill<T: KvElem>(s: &mut KvStore<T>, layers: usize, slots: usize, kv_dim: usize) {
        let row: Vec<f32> = (0..kv_dim).map(|i| ((i % 7) as f32 - 3.0) / 3.0).collect();
        for l in 0..layers {
            for slot in 0..slots {
                s.write(l, slot, &row, &row);
            }
        }
    }
    let chosen = decoder::attention::kv_heads_per_task(geometry, 1, c.threads);
    let mut splits: Vec<usize> = (1..=geometry.kv_heads)
        .filter(|n| geometry.kv_heads.is_multiple_of(*n))
        .collect();
    splits.retain(|&n| n != chosen);
    splits.insert(0, chosen);
    for (dtype, per_task) in [KvDtype::F32, KvDtype::Bf16]
        .into_iter()
        .flat_map(|d| splits.iter().map(move |&n| (d, n)))
    {
        let mut cache = KvCache::new(dtype, layers, context, geometry.kv_heads, geometry.head_dim);
        let kv_dim = geometry.kv_dim();
        let span = geometry.group() * geometry.head_dim * per_task;
        let mut times = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            pool.install(|| {
                for l in 0..layers {
                    macro_rules! run {
                        ($store:expr) => {{
                            let cache = $store.layer(l);
                            out.par_chunks_mut(span).enumerate().for_each(|(g, o)| {
                                let qs = &q[g * span..(g + 1) * span];
                                attend_heads(geometry, g * per_task, context, qs, cache, o)
                            });
                        }};
                    }
                    match &mut cache.data {
                        KvData::F32(s) => run!(s),
                        KvData::Bf16(s) => run!(s),
                    }
                }
            });
            times.push(secs(t.elapsed()));
            if times.len() == 1 {
                // First pass faults the cache in; fill it so values are realistic.
                match &mut cache.data {
                    KvData::F32(s) => fill(s, layers, context, kv_dim),
                    KvData::Bf16(s) => fill(s, layers, context, kv_dim),
                }
            }
        }
        let times = times[1..].to_vec();
        let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
        let med = median(times);
        let bytes = cache.bytes_per_token() as f64 * context as f64;
        if !c.json {
            println!(
                "attention {:?} cache, {} KV heads per task{}, {} layers x ctx {}: {:.2} ms per token (median {:.2}), {:.1} GB/s of KV",
                dtype,
                per_task,
                if per_task == chosen { " (the decoder's)" } else { "" },
                layers,
                context,
                fastest * 1e3,
                med * 1e3,
                bytes / fastest / 1e9
            );
        }
        if per_task != chosen {
            continue;
        }
        result.insert(
            kv_name(dtype).to_string(),
            json!({"ms": fastest * 1e3, "ms_median": med * 1e3, "kv_gb_s": round2(bytes / fastest / 1e9)}),
        );
    }
    json!({ "shape": shape.name, "threads": c.threads, "context": context, "attention": result })
}

/// `bench attention --rows N`: the prefill attention of N rows after `context` filled slots, every
/// layer, through the decoder's own parallel split ([`decoder::attention::attend_rows_parallel`]).
fn prefill_rows(c: &Common, shape: &RandomShape, context: usize, rows: usize) -> Value {
    use decoder::attention::attend_rows_parallel;
    use decoder::kv::{KvCache, KvData};
    use probes::peak::PeakMix;
    let sem = &shape.semantics;
    let (geometry, pool) = attention_setup(c, shape);
    let layers = sem.num_layers;
    let load_start = load_avg();
    let fma_peak = PeakMix::F32FmaYmm.measure(c.threads, 7);
    let mul_add_peak = PeakMix::F32MulAddYmm.measure(c.threads, 7);
    // q·k and p·v: one multiply-add each per element of every attended slot, head and layer.
    let slots: u64 = (0..rows as u64).map(|i| context as u64 + i + 1).sum();
    let macs = 2 * slots * (geometry.heads * geometry.head_dim * layers) as u64;
    let q_dim = geometry.q_dim();
    let q: Vec<f32> = (0..rows * q_dim)
        .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
        .collect();
    let mut out = vec![0f32; rows * q_dim];
    let kv_dim = geometry.kv_dim();
    let row: Vec<f32> = (0..kv_dim).map(|i| ((i % 7) as f32 - 3.0) / 3.0).collect();
    if !c.json {
        println!(
            "shape {}  threads {}  load average {}  attention prefill {rows} rows after {context} slots, {layers} layers: {:.2} GMAC",
            shape.name,
            c.threads,
            load(load_start),
            macs as f64 / 1e9
        );
        for (mix, p) in [
            (PeakMix::F32FmaYmm, fma_peak),
            (PeakMix::F32MulAddYmm, mul_add_peak),
        ] {
            if let Some(p) = p {
                println!("peak {:32} {p:8.1} GMAC/s", mix.name());
            }
        }
    }
    let pct = |gmac_s: f64, peak: Option<f64>| peak.map(|p| round2(100.0 * gmac_s / p));
    let mut result = Map::new();
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let slots_needed = context + rows;
        let mut cache = KvCache::new(
            dtype,
            layers,
            slots_needed,
            geometry.kv_heads,
            geometry.head_dim,
        );
        // Every slot written (faults the cache in; the prefill's own K/V writes are not timed).
        for l in 0..layers {
            for slot in 0..slots_needed {
                match &mut cache.data {
                    KvData::F32(s) => s.write(l, slot, &row, &row),
                    KvData::Bf16(s) => s.write(l, slot, &row, &row),
                }
            }
        }
        // At least two passes and a second of them; the fastest counts.
        let mut times = Vec::new();
        let mut cpu_times = Vec::new();
        let started = Instant::now();
        while times.len() < 2 || (started.elapsed().as_secs_f64() < 1.0 && times.len() < 20) {
            let t = Instant::now();
            let cpu = process_cpu_secs();
            for l in 0..layers {
                match &cache.data {
                    KvData::F32(s) => attend_rows_parallel(
                        &pool,
                        geometry,
                        s.layer(l),
                        context,
                        rows,
                        &q,
                        &mut out,
                    ),
                    KvData::Bf16(s) => attend_rows_parallel(
                        &pool,
                        geometry,
                        s.layer(l),
                        context,
                        rows,
                        &q,
                        &mut out,
                    ),
                }
            }
            times.push(secs(t.elapsed()));
            if let (Some(a), Some(b)) = (cpu, process_cpu_secs()) {
                cpu_times.push(b - a);
            }
        }
        let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
        let med = median(times);
        let gmac_s = macs as f64 / fastest / 1e9;
        // On a loaded machine: the rate this run's CPU time would give on `threads` idle cores.
        let cpu = cpu_times.iter().copied().fold(f64::INFINITY, f64::min);
        let cpu_gmac_s =
            (cpu > 0.0 && cpu.is_finite()).then(|| macs as f64 * c.threads as f64 / cpu / 1e9);
        if !c.json {
            println!(
                "attention {:?} cache, prefill {rows} rows after {context} slots, {layers} layers: {:.1} ms (median {:.1}), {gmac_s:.1} GMAC/s = {}% of the f32 FMA peak, {}% of the f32 mul+add peak; CPU time {:.1} ms = {} GMAC/s on {} idle cores",
                dtype,
                fastest * 1e3,
                med * 1e3,
                pct(gmac_s, fma_peak).map_or("?".into(), |p| p.to_string()),
                pct(gmac_s, mul_add_peak).map_or("?".into(), |p| p.to_string()),
                cpu * 1e3,
                cpu_gmac_s.map_or("?".into(), |g| format!("{g:.1}")),
                c.threads,
            );
        }
        result.insert(
            kv_name(dtype).to_string(),
            json!({
                "ms": fastest * 1e3,
                "ms_median": med * 1e3,
                "gmac_s": round2(gmac_s),
                "f32_fma_peak_pct": pct(gmac_s, fma_peak),
                "f32_mul_add_peak_pct": pct(gmac_s, mul_add_peak),
                "cpu_ms": cpu.is_finite().then_some(cpu * 1e3),
                "cpu_gmac_s": cpu_gmac_s.map(round2),
            }),
        );
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "context": context,
        "rows": rows,
        "macs": macs,
        "peaks_gmac_s": {
            "f32_fma_gmac_s": fma_peak.map(round2),
            "f32_mul_add_gmac_s": mul_add_peak.map(round2),
        },
        "attention": result,
    })
}

/// The peak the tower's attention with `operands` on `path` is set against: the multiply-add
/// instruction of its kernel (`compute::attention`).
pub fn tower_attention_peak(
    path: compute::attention::AttnPath,
    operands: compute::attention::Operands,
) -> Option<probes::peak::PeakMix> {
    use compute::attention::{AttnPath, Operands};
    use probes::peak::PeakMix;
    match (operands, path) {
        (Operands::Bf16, _) if operands.has_simd() => Some(PeakMix::Bf16DotZmm),
        (Operands::Bf16, _) | (_, AttnPath::Scalar) => None,
        (Operands::F32, AttnPath::Avx512) => Some(PeakMix::F32FmaZmm),
        (Operands::F32, AttnPath::Avx2) => Some(PeakMix::F32FmaYmm),
    }
}

/// `bench attention --segment N`: the vision tower's attention alone over one image of `n`
/// patches, every block (`compute::attention::segments`, as the tower calls it), f32 operands
/// and (where the CPU has AVX-512 BF16) bf16 ones, q·kᵀ and p·V counted as one multiply-add per
/// element, against the in-run peak of each kernel's instruction.
pub fn tower(c: &Common, shape: &RandomShape, n: usize) -> Value {
    use compute::attention::segments::{attend_segments, SegmentScratch};
    use compute::attention::{AttnPath, Operands};
    let Some(v) = shape.with_tower().and_then(|s| s.semantics.vision.clone()) else {
        refuse(format!("shape {} has no vision tower", shape.name))
    };
    if n == 0 {
        refuse("--segment must be at least 1 patch");
    }
    let (heads, d, depth) = (v.num_heads, v.head_dim(), v.depth);
    let hidden = heads * d;
    let pool = thread_pool(c.threads);
    let load_start = load_avg();
    let path = AttnPath::best();
    let macs = 2 * (n as u64).pow(2) * (hidden * depth) as u64;
    let qkv: Vec<f32> = (0..n * 3 * hidden)
        .map(|i| ((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 1.5)
        .collect();
    let mut out = vec![0f32; n * hidden];
    let mut scratch = SegmentScratch::default();
    let mut result = Map::new();
    for operands in [Operands::F32, Operands::Bf16] {
        if operands == Operands::Bf16 && !operands.has_simd() {
            continue;
        }
        let mix = tower_attention_peak(path, operands);
        let peak = mix.and_then(|m| m.measure(c.threads, 7));
        let mut times = Vec::new();
        let mut cpu_times = Vec::new();
        let started = Instant::now();
        while times.len() < 2 || (started.elapsed().as_secs_f64() < 1.0 && times.len() < 10) {
            let t = Instant::now();
            let cpu = process_cpu_secs();
            pool.install(|| {
                for _ in 0..depth {
                    attend_segments(&qkv, heads, d, &[(0, n)], operands, &mut scratch, &mut out);
                }
            });
            times.push(secs(t.elapsed()));
            if let (Some(a), Some(b)) = (cpu, process_cpu_secs()) {
                cpu_times.push(b - a);
            }
        }
        let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
        let gmac_s = macs as f64 / fastest / 1e9;
        let pct = peak.map(|p| round2(100.0 * gmac_s / p));
        // On a loaded machine: the rate this run's CPU time would give on `threads` idle cores.
        let cpu = cpu_times.iter().copied().fold(f64::INFINITY, f64::min);
        let cpu_gmac_s =
            (cpu > 0.0 && cpu.is_finite()).then(|| macs as f64 * c.threads as f64 / cpu / 1e9);
        if !c.json {
            println!(
                "shape {} tower attention, {operands:?} operands: {n} patches, {heads} heads of {d}, {depth} blocks, path {path}: {:.1} ms (median {:.1}), {gmac_s:.1} GMAC/s = {}% of {} {} GMAC/s; CPU time {:.1} ms = {} GMAC/s on {} idle cores; load average {}",
                shape.name,
                fastest * 1e3,
                median(times) * 1e3,
                pct.map_or("?".into(), |p| p.to_string()),
                mix.map_or("-", |m| m.name()),
                peak.map_or("?".into(), |p| format!("{p:.1}")),
                cpu * 1e3,
                cpu_gmac_s.map_or("?".into(), |g| format!("{g:.1}")),
                c.threads,
                load(load_avg()),
            );
        }
        result.insert(
            format!("{operands:?}").to_lowercase(),
            json!({
                "ms": fastest * 1e3,
                "gmac_s": round2(gmac_s),
                "peak": mix.map(|m| m.name()),
                "peak_gmac_s": peak.map(round2),
                "peak_pct": pct,
                "cpu_gmac_s": cpu_gmac_s.map(round2),
            }),
        );
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "patches": n,
        "path": path.name(),
        "operands": result,
        "load_avg_1m": [load_start, load_avg()],
    })
}
