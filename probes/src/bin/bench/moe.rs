//! The decoder benchmark on a mixture-of-experts shape.

use crate::measure::{median, peak_rss_mb, reset_peak_rss, ReadProbe};
use crate::random_pack::pack_for;
use crate::report::{print_peak_rss, round2};
use crate::roofline::{forward_for, DECODE_STEPS};
use crate::steps::{decode_steps, prefill, PrefillRun};
use crate::Common;
use compute::kernels::Isa;
use decoder::KvDtype;
use packs::random::RandomShape;
use packs::{QuantKind, TensorKind};
use serde_json::{json, Map, Value};

/// Prompt rows of the MoE report's prefill unless `--prefill-rows` names others.
pub const PREFILL_ROWS: usize = 128;

/// A mixture-of-experts shape: decode reads only the routed experts, so the bytes a step reads are
/// measured (the experts the router picked, counted by the forward) rather than the pack's linears.
/// Prefills of each of `prefill_rows` (the median of two).
pub fn run(c: &Common, shape: &RandomShape, kinds: &[QuantKind], prefill_rows: &[usize]) -> Value {
    if prefill_rows.is_empty() || prefill_rows.contains(&0) {
        crate::refuse("--prefill-rows: every row count must be at least 1");
    }
    let sem = &shape.semantics;
    let moe = sem.moe.clone().expect("a MoE shape");
    let isa = Isa::best();
    if !c.json {
        println!(
            "shape {}  threads {}  kernels {}  ({} layers, {} experts, top-{}, expert intermediate {})",
            shape.name,
            c.threads,
            isa,
            sem.num_layers,
            moe.num_experts,
            moe.top_k,
            moe.moe_intermediate_size
        );
    }
    // Parameters a token uses: attention, norms, routers, head, and top-k experts per sparse layer.
    let h = sem.hidden_size as u64;
    let expert_params = 3 * h * moe.moe_intermediate_size as u64;
    let sparse = moe.sparse_layers.len() as u64;
    let mut kinds_json = Map::new();
    for &kind in kinds {
        let pack = pack_for(c, shape, kind);
        let is_expert = |name: &str| name.contains(".mlp.experts.");
        let weights = pack.tensors().iter().filter(|t| {
            matches!(
                t.kind,
                TensorKind::Linear | TensorKind::Scales | TensorKind::Norm
            )
        });
        let (mut dense_bytes, mut expert_bytes, mut dense_params) = (0u64, 0u64, 0u64);
        for t in weights {
            if is_expert(&t.name) {
                expert_bytes += t.len;
            } else {
                dense_bytes += t.len;
                if t.kind != TensorKind::Scales {
                    dense_params += t.shape.iter().product::<usize>() as u64
                        * if t.dtype == packs::Dtype::U8 { 2 } else { 1 };
                }
            }
        }
        let per_expert = expert_bytes as f64 / (sparse * moe.num_experts as u64) as f64;
        let active_params = dense_params + sparse * moe.top_k as u64 * expert_params;
        let total_params = dense_params + sparse * moe.num_experts as u64 * expert_params;

        let rss_reset = reset_peak_rss();
        let most = prefill_rows.iter().copied().max().unwrap_or(0);
        let mut f = forward_for(&pack, c.threads, KvDtype::F32, most);
        prefill(&mut f, 16);
        // Per row count: (rows, seconds, expert runs of one prefill).
        let prefills: Vec<(usize, f64, u64)> = prefill_rows
            .iter()
            .map(|&rows| {
                let runs: Vec<PrefillRun> = (0..2).map(|_| prefill(&mut f, rows)).collect();
                f.take_moe_stats();
                prefill(&mut f, rows);
                let expert_runs = f.take_moe_stats().expert_runs;
                (
                    rows,
                    median(runs.iter().map(|r| r.secs).collect()),
                    expert_runs,
                )
            })
            .collect();
        let peak = peak_rss_mb();

        let probe = ReadProbe::new(c.threads);
        f.reset();
        f.take_moe_stats();
        let d = decode_steps(&mut f, DECODE_STEPS, &probe);
        let stats = f.take_moe_stats();
        drop(f);
        drop(probe);
        let runs_per_token = stats.expert_runs as f64 / DECODE_STEPS as f64;
        let bytes = dense_bytes as f64 + runs_per_token * per_expert;
        let pack_mb = pack.file_len() as f64 / (1 << 20) as f64;
        if !c.json {
            println!(
                "\n{kind}: pack {pack_mb:.0} MB; parameters {:.0} M in all, {:.0} M active per token ({:.1}%)",
                total_params as f64 / 1e6,
                active_params as f64 / 1e6,
                100.0 * active_params as f64 / total_params as f64
            );
            println!(
                "  decode ctx 0 {:6.2} tok/s  {:.1} expert runs per token ({} sparse layers x top-{})  {:.1} MB read per token = {:.3} B per active parameter ({:.1}% of the pack's weights)  {:5.1}% of the read bandwidth beside it (median {:.1} GB/s)",
                d.tok_s(),
                runs_per_token,
                sparse,
                moe.top_k,
                bytes / 1e6,
                bytes / active_params as f64,
                100.0 * bytes / (dense_bytes + expert_bytes) as f64,
                100.0 * d.roofline(bytes),
                median(d.read.clone())
            );
            for &(rows, secs, expert_runs) in &prefills {
                println!(
                    "  prefill {rows} rows {:8.2} tok/s  ({expert_runs} expert runs: each routed expert read once per batch, at most {} of {})",
                    rows as f64 / secs,
                    sparse * moe.num_experts as u64,
                    rows as u64 * sparse * moe.top_k as u64
                );
            }
            print_peak_rss(
                peak,
                rss_reset,
                &format!("the pack is mapped: {pack_mb:.0} MB"),
            );
        }
        kinds_json.insert(
            kind.to_string(),
            json!({
                "decode_tok_s": round2(d.tok_s()),
                "expert_runs_per_token": round2(runs_per_token),
                "bytes_read_per_token": bytes as u64,
                "active_params": active_params,
                "total_params": total_params,
                "bytes_per_active_param": bytes / active_params as f64,
                "roofline_pct": round2(100.0 * d.roofline(bytes)),
                "read_gb_s": round2(median(d.read.clone())),
                "prefill_tok_s": prefills
                    .iter()
                    .map(|&(rows, secs, _)| (rows.to_string(), json!(round2(rows as f64 / secs))))
                    .collect::<Map<_, _>>(),
                "prefill_expert_runs": prefills
                    .iter()
                    .map(|&(rows, _, runs)| (rows.to_string(), json!(runs)))
                    .collect::<Map<_, _>>(),
                "peak_rss_mb": peak.map(round2),
                "peak_rss_reset": rss_reset,
                "pack_mb": round2(pack_mb),
            }),
        );
    }
    json!({ "shape": shape.name, "threads": c.threads, "kernels": isa.name(), "kinds": kinds_json })
}
