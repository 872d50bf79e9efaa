//! `bench decode`: decode steps at chosen contexts, per kind and KV cache type, each context's time
//! per token against ctx 0's beside what the bytes a step reads predict.

use crate::measure::{load_avg, median, ReadProbe};
use crate::random_pack::{pack_bytes_per_token, pack_for};
use crate::report::{kv_name, load, round2, round_ms};
use crate::steps::{decode_steps, forward_with_room, prefill, Decode};
use crate::{refuse, Common};
use compute::kernels::Isa;
use decoder::KvDtype;
use packs::random::RandomShape;
use packs::QuantKind;
use serde_json::{json, Map, Value};

/// Qwen3-VL's `max_position_embeddings` (the 2B and 30B-A3B hub configs' text_config; Qwen3.5's
/// is the same): packs do not record it.
const MAX_POSITIONS: usize = 262_144;
/// Issue 19's long-context target: decode at this context with the bf16 KV cache at most this
/// many times ctx 0's time per token.
const TARGET_CTX: usize = 4096;
const TARGET_RATIO: f64 = 1.15;

/// What `bench decode` measures, checked before any pack is touched.
struct Plan {
    /// Ascending, deduplicated, starting at 0.
    ctxs: Vec<usize>,
    kvs: Vec<KvDtype>,
    steps: usize,
}

/// Bytes one token will occupy in a `kv` cache of `shape` (K and V of every layer), before
/// any is made: what the memory check needs.
/// Rows prefilled once before timing, to fault the pack in and fill the cache.
const FAULT_IN_ROWS: usize = 16;

fn kv_bytes_per_token(shape: &RandomShape, kv: KvDtype) -> usize {
    let s = &shape.semantics;
    let elem = match kv {
        KvDtype::F32 => 4,
        KvDtype::Bf16 => 2,
    };
    2 * s.num_layers * s.num_kv_heads * s.head_dim * elem
}

/// MemAvailable from /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Plan {
    fn parse(
        shape: &RandomShape,
        ctx: &[String],
        kv: &[String],
        steps: usize,
    ) -> Result<Plan, String> {
        let named = |list: &[String]| -> Vec<String> {
            list.iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let ctx = named(ctx);
        if ctx.is_empty() {
            return Err("--ctx names no context".into());
        }
        let mut ctxs = vec![0];
        for s in &ctx {
            let n: usize = s
                .parse()
                .map_err(|_| format!("--ctx: {s:?} is not a number of cache slots"))?;
            ctxs.push(n);
        }
        ctxs.sort_unstable();
        ctxs.dedup();
        let kv = named(kv);
        if kv.is_empty() {
            return Err("--kv names no KV cache type (expected f32, bf16)".into());
        }
        let mut kvs: Vec<KvDtype> = Vec::new();
        for s in &kv {
            let d: KvDtype = s.parse().map_err(|e| format!("--kv: {e}"))?;
            if !kvs.contains(&d) {
                kvs.push(d);
            }
        }
        if steps == 0 {
            return Err("--steps must be at least 1".into());
        }
        let longest = *ctxs.last().expect("ctx 0 at least");
        if longest + steps > MAX_POSITIONS {
            return Err(format!(
                "--ctx {longest}: with {steps} decode steps the positions reach {}, beyond the model's {MAX_POSITIONS} (max_position_embeddings)",
                longest + steps
            ));
        }
        if let Some(avail) = mem_available() {
            for &d in &kvs {
                let need = (kv_bytes_per_token(shape, d) * (longest + steps)) as u64;
                if need > avail {
                    return Err(format!(
                        "--ctx {longest}: the {} KV cache of {} needs {:.1} GB, only {:.1} GB of memory is available",
                        kv_name(d),
                        shape.name,
                        need as f64 / 1e9,
                        avail as f64 / 1e9
                    ));
                }
            }
        }
        Ok(Plan { ctxs, kvs, steps })
    }
}

/// `bench decode`: the plan checked before any pack is touched, then run.
pub fn run(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    ctx: &[String],
    kv: &[String],
    steps: usize,
) -> Value {
    let plan = Plan::parse(shape, ctx, kv, steps).unwrap_or_else(|e| refuse(e));
    bench(c, shape, kinds, &plan)
}

fn bench(c: &Common, shape: &RandomShape, kinds: &[QuantKind], plan: &Plan) -> Value {
    let isa = Isa::best();
    let load_start = load_avg();
    let longest = *plan.ctxs.last().expect("ctx 0 at least");
    if !c.json {
        println!(
            "shape {}  threads {}  kernels {}  {} decode steps per context (median counts)  load average {}",
            shape.name,
            c.threads,
            isa,
            plan.steps,
            load(load_start)
        );
    }
    let mut all_reads = Vec::new();
    let mut kinds_json = Map::new();
    let mut target_json = Map::new();
    for &kind in kinds {
        let pack = pack_for(c, shape, kind);
        let weights = pack_bytes_per_token(&pack) as f64;
        if !c.json {
            println!(
                "\n{kind}: {:.0} MB of weights{} read per token from the pack",
                weights / 1e6,
                if shape.semantics.moe.is_some() {
                    " (the routed experts' expected share)"
                } else {
                    ""
                }
            );
        }
        let mut kv_json = Map::new();
        for &kv in &plan.kvs {
            let mut f =
                forward_with_room(&pack, c.threads, kv, longest.max(FAULT_IN_ROWS), plan.steps);
            let kv_token = f.kv().bytes_per_token() as f64;
            // Faults the pack in, and fills the cache once, to the largest context.
            prefill(&mut f, FAULT_IN_ROWS);
            let fill = (longest > 0).then(|| prefill(&mut f, longest).secs);
            let probe = ReadProbe::new(c.threads);
            let mut runs: Vec<(usize, Decode)> = Vec::new();
            for &ctx in plan.ctxs.iter().rev() {
                if f.truncate(ctx) != ctx {
                    // A recurrent (Qwen3.5) state cannot go back: prefill the context again.
                    prefill(&mut f, ctx);
                }
                runs.push((ctx, decode_steps(&mut f, plan.steps, &probe)));
            }
            drop(probe);
            drop(f);
            runs.reverse();
            let base_ms = 1e3 / runs[0].1.tok_s();
            if !c.json {
                println!(
                    "  {} KV ({kv_token:.0} B per token){}",
                    kv_name(kv),
                    fill.map_or(String::new(), |s| format!(
                        ": filled to {longest} by one prefill of {longest} rows in {s:.1} s"
                    ))
                );
            }
            let mut ctx_json = Map::new();
            for (ctx, d) in &runs {
                all_reads.extend_from_slice(&d.read);
                let ms = 1e3 / d.tok_s();
                let ratio = ms / base_ms;
                let kv_bytes = kv_token * *ctx as f64;
                // Bandwidth-bound, a step's time grows with the bytes it reads.
                let predicted = (weights + kv_bytes) / weights;
                let roofline = 100.0 * d.roofline(weights + kv_bytes);
                let (non_gemm_ms, attention_ms) = d.non_gemm_ms();
                let delta_net_ms = d.delta_net_ms();
                let target =
                    (*ctx == TARGET_CTX && kv == KvDtype::Bf16).then_some(ratio <= TARGET_RATIO);
                if !c.json {
                    println!(
                        "    ctx {ctx:6}: {ms:8.2} ms/token {:7.2} tok/s  ctx{ctx}/ctx0 x{ratio:.3}  bandwidth predicts x{predicted:.3}  ({:.0} MB of KV per step; {roofline:.1}% of the read bandwidth beside it, median {:.1} GB/s; non-GEMM {non_gemm_ms:.2} ms: attention {attention_ms:.2}, DeltaNet {delta_net_ms:.2}){}",
                        d.tok_s(),
                        kv_bytes / 1e6,
                        median(d.read.clone()),
                        target.map_or(String::new(), |ok| format!(
                            "  issue 19 target <= x{TARGET_RATIO} at {TARGET_CTX} (bf16 KV): {}",
                            if ok { "meets" } else { "misses" }
                        ))
                    );
                }
                if let Some(ok) = target {
                    target_json.insert(
                        kind.to_string(),
                        json!({ "ratio": round_ms(ratio), "meets": ok, "bandwidth_ratio": round_ms(predicted) }),
                    );
                }
                ctx_json.insert(
                    ctx.to_string(),
                    json!({
                        "ms_per_token": round_ms(ms),
                        "tok_s": round2(d.tok_s()),
                        "ratio_to_ctx0": round_ms(ratio),
                        "bandwidth_ratio": round_ms(predicted),
                        "kv_bytes_per_step": kv_bytes as u64,
                        "roofline_pct": round2(roofline),
                        "read_gb_s": round2(median(d.read.clone())),
                        "attention_ms": round_ms(attention_ms),
                        "non_gemm_ms": round_ms(non_gemm_ms),
                        "delta_net_ms": round_ms(delta_net_ms),
                    }),
                );
            }
            kv_json.insert(
                kv_name(kv).into(),
                json!({
                    "kv_bytes_per_token": kv_token as u64,
                    "fill_prefill_s": fill.map(round_ms),
                    "ctx": ctx_json,
                }),
            );
        }
        kinds_json.insert(
            kind.to_string(),
            json!({ "pack_bytes_per_token": weights as u64, "kv": kv_json }),
        );
    }
    let load_end = load_avg();
    if !c.json {
        println!(
            "\nstreaming read over the run: median {:.1} GB/s; load average {} at the start, {} at the end",
            median(all_reads.clone()),
            load(load_start),
            load(load_end)
        );
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "kernels": isa.name(),
        "steps": plan.steps,
        "ctx": plan.ctxs,
        "max_positions": MAX_POSITIONS,
        "read_gb_s": round2(median(all_reads)),
        "load_avg_1m": [load_start, load_end],
        "long_context_target": {
            "ctx": TARGET_CTX,
            "kv": "bf16",
            "max_ratio": TARGET_RATIO,
            "kinds": target_json,
        },
        "kinds": kinds_json,
    })
}
