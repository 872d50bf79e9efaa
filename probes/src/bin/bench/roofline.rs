//! The decoder benchmark (`bench` with no subcommand): per kind, prefills of 16 to 2048 rows set
//! against the int8 peak measured in the same run, decode at ctx 0 and ctx 512 against the read
//! bandwidth beside each step, the bf16 KV cache beside the f32 one, and peak memory. A
//! mixture-of-experts shape runs [`crate::moe`] instead.

use crate::measure::{load_avg, measure_peaks, median, peak_rss_mb, reset_peak_rss, ReadProbe};
use crate::random_pack::{pack_bytes_per_token, pack_for};
use crate::report::{load, print_peak_rss, round2, round_ms};
use crate::steps::{
    decode_steps, decode_tokens, forward_with_room, prefill, prefill_prompt, prompt_for, Decode,
    PrefillRun, Prompt,
};
use crate::{refuse, Common};
use compute::kernels::Isa;
use decoder::{Decoder, KvDtype};
use packs::random::RandomShape;
use packs::{Pack, QuantKind, TensorKind};
use serde_json::{json, Map, Value};
use std::sync::Arc;

pub const DECODE_STEPS: usize = 12;
pub const LONG_CONTEXT: usize = 512;
pub const PREFILL_ROWS: [usize; 4] = [16, 128, 512, 2048];
/// Prefills timed per row count; the fastest counts, as the best of 7 passes counts for the peak
/// it is set against: a single timed prefill lets the shared host's other work into the share
/// (one binary's i8 GEMMs at 512 rows: 71% and 81% of the peak in two runs).
const PREFILL_REPS: usize = 2;

/// A forward on the host whose cache holds `rows` prompt rows and the decode steps after them.
pub fn forward_for(pack: &Arc<Pack>, threads: usize, kv: KvDtype, rows: usize) -> Decoder {
    forward_with_room(pack, threads, kv, rows.max(LONG_CONTEXT), DECODE_STEPS)
}

/// Multiply-adds of one prompt row in the decoder's linear layers (every linear of every layer:
/// q, k, v, o, gate, up, down, and a Gated DeltaNet's in and out projections; the head runs for
/// the last row only), and of the head.
fn linear_macs(pack: &Pack) -> (u64, u64) {
    let per_row = pack
        .tensors()
        .iter()
        .filter(|t| t.kind == TensorKind::Linear && t.name.starts_with(LAYERS_PREFIX))
        .map(|t| {
            let w = pack.linear(&t.name).unwrap_or_else(|e| refuse(e));
            (w.n * w.k) as u64
        })
        .sum();
    let head = pack.head();
    (per_row, (head.n * head.k) as u64)
}

/// The decoder layers' tensors (`packs::names::layer_prefix`).
const LAYERS_PREFIX: &str = "model.language_model.layers.";

/// `prefill_rows`: the row counts to prefill ([`PREFILL_ROWS`] by default); [`LONG_CONTEXT`] is
/// always among them (the ctx-512 decode continues from its cache). A mixture-of-experts shape
/// has its own report ([`crate::moe::run`], 128 rows by default).
pub fn run(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    prefill_rows: Option<&[usize]>,
) -> Value {
    if shape.semantics.moe.is_some() {
        let rows = prefill_rows.unwrap_or(&[crate::moe::PREFILL_ROWS]);
        return crate::moe::run(c, shape, kinds, rows);
    }
    let prefill_rows = prefill_rows.unwrap_or(&PREFILL_ROWS);
    let packs: Vec<(QuantKind, Arc<Pack>)> =
        kinds.iter().map(|&k| (k, pack_for(c, shape, k))).collect();
    let isa = Isa::best();
    let load_start = load_avg();
    // The peaks first, on the pool's thread count, before any pack is touched.
    let peaks = measure_peaks(c.threads, isa);
    if !c.json {
        println!(
            "shape {}  threads {}  kernels {}  load average {}  (two {} MiB read passes run before every decode step; the better counts)",
            shape.name,
            c.threads,
            isa,
            load(load_start),
            256
        );
        if let Some((mix, p)) = peaks.int8 {
            println!(
                "peak {:32} {p:8.1} GMAC/s (the int8 peak prefills are set against)",
                mix.name()
            );
        }
        if let Some(p) = peaks.f32_fma {
            println!(
                "peak {:32} {p:8.1} GMAC/s",
                probes::peak::PeakMix::F32FmaYmm.name()
            );
        }
    }
    let int8_peak = peaks.int8.map(|p| p.1);
    let pct_of_peak = |gmac_s: f64| int8_peak.map(|p| round2(100.0 * gmac_s / p));
    let mut all_reads = Vec::new();
    let mut kinds_json = Map::new();
    for (kind, pack) in packs {
        let bytes = pack_bytes_per_token(&pack) as f64;
        let (macs_per_row, head_macs) = linear_macs(&pack);
        // Memory first, without the probe's buffer: warm-up, then every prefill.
        let rss_reset = reset_peak_rss();
        let mut order: Vec<usize> = prefill_rows
            .iter()
            .copied()
            .chain([LONG_CONTEXT])
            .filter(|&r| r > 0)
            .collect();
        order.sort_unstable();
        order.dedup();
        let longest = order.iter().copied().max().unwrap_or(0);
        let mut f = forward_for(&pack, c.threads, KvDtype::F32, longest);
        let kv_per_token = f.kv().bytes_per_token() as u64;
        prefill(&mut f, 16);
        let mut pj: [Map<String, Value>; 9] = Default::default();
        let mut prefill_lines = Vec::new();
        // 512 rows last: the decode at ctx 512 continues from its cache, and the bf16 cache is
        // filled with the same prompt.
        let mut ctx_prompt = None;
        order.sort_by_key(|&r| (r == LONG_CONTEXT, r));
        for rows in order {
            let prompt = prompt_for(&f, rows);
            let runs: Vec<PrefillRun> = (0..PREFILL_REPS)
                .map(|_| prefill_prompt(&mut f, &prompt))
                .collect();
            let run = *runs
                .iter()
                .min_by(|a, b| a.secs.total_cmp(&b.secs))
                .expect("reps >= 1");
            let tok_s = rows as f64 / run.secs;
            let gemm_gmac_s = (rows as u64 * macs_per_row + head_macs) as f64 / run.gemm / 1e9;
            // Tokens per second against what the peak allows: peak / MACs per row.
            let whole_gmac_s = tok_s * macs_per_row as f64 / 1e9;
            let label = match prompt.image {
                Some((h, w)) => format!("image {h}x{w}"),
                None => "text".to_string(),
            };
            let key = rows.to_string();
            let values = [
                json!(round2(tok_s)),
                json!(round2(100.0 * run.non_gemm())),
                json!(round_ms(run.gemm * 1e3)),
                json!(round2(gemm_gmac_s)),
                json!(pct_of_peak(gemm_gmac_s)),
                json!(pct_of_peak(whole_gmac_s)),
                json!(round_ms(run.attention * 1e3)),
                json!(label.clone()),
                json!(round_ms(run.delta_net * 1e3)),
            ];
            for (m, v) in pj.iter_mut().zip(values) {
                m.insert(key.clone(), v);
            }
            prefill_lines.push(format!(
                "  prefill {rows:4} rows ({label:13}) {tok_s:8.2} tok/s = {}% of peak  GEMMs {:9.1} ms {gemm_gmac_s:7.1} GMAC/s = {}% of peak  attention {:8.1} ms  DeltaNet {:8.1} ms  non-GEMM {:4.1}%",
                pct_of_peak(whole_gmac_s).map_or("?".into(), |p| p.to_string()),
                run.gemm * 1e3,
                pct_of_peak(gemm_gmac_s).map_or("?".into(), |p| p.to_string()),
                run.attention * 1e3,
                run.delta_net * 1e3,
                100.0 * run.non_gemm()
            ));
            if rows == LONG_CONTEXT {
                ctx_prompt = Some(prompt);
            }
        }
        let ctx_prompt = ctx_prompt.expect("the prefills hold LONG_CONTEXT");
        let [prefill_json, prefill_non_gemm_json, p_gemm_ms, p_gemm_gmac, p_gemm_pct, p_pct, p_attn, p_prompt, p_delta] =
            pj;
        let peak = peak_rss_mb();
        let kv_alloc = f.kv_bytes() as f64;

        let probe = ReadProbe::new(c.threads);
        // The last prefill left LONG_CONTEXT slots filled: decode there, then from an empty cache.
        let d512 = decode_steps(&mut f, DECODE_STEPS, &probe);
        f.reset();
        let d0 = decode_steps(&mut f, DECODE_STEPS, &probe);
        drop(f);

        // The bf16 KV cache: speed at the same context and its distance from the f32 cache.
        let mut fb = forward_for(&pack, c.threads, KvDtype::Bf16, LONG_CONTEXT);
        let d512b = decode_beside(&mut fb, &ctx_prompt, &d512, &probe);
        let kv_bf16_per_token = fb.kv().bytes_per_token() as u64;
        drop(fb);
        drop(probe);
        let (max_diff, top1) = compare_logits(&d512.logits, &d512b.logits);
        for d in [&d0, &d512, &d512b] {
            all_reads.extend_from_slice(&d.read);
        }

        let read = median(d0.read.clone());
        let decode_tok_s = d0.tok_s();
        let roofline = d0.roofline(bytes);
        let kv512 = (kv_per_token * LONG_CONTEXT as u64) as f64;
        let kv512b = (kv_bf16_per_token * LONG_CONTEXT as u64) as f64;
        let pack_mb = pack.file_len() as f64 / (1 << 20) as f64;
        let budget_mb = pack_mb + kv_alloc / (1 << 20) as f64 + 300.0;
        if !c.json {
            println!(
                "\n{kind}: pack {:.0} MB, {:.0} MB read per token (+ {:.0} MB of f32 KV at ctx {LONG_CONTEXT})",
                pack_mb,
                bytes / 1e6,
                kv512 / 1e6
            );
            for (label, d, extra) in [
                ("ctx 0          ", &d0, 0.0),
                ("ctx 512 f32 KV ", &d512, kv512),
                ("ctx 512 bf16 KV", &d512b, kv512b),
            ] {
                let (non_gemm_ms, attention_ms) = d.non_gemm_ms();
                println!(
                    "  decode {label} {:6.2} tok/s  {:5.1} GB/s moved  {:5.1}% of the read bandwidth beside it (median {:.1} GB/s)  non-GEMM {:4.1}% ({non_gemm_ms:.2} ms: attention {attention_ms:.2}, DeltaNet {:.2})",
                    d.tok_s(),
                    (bytes + extra) * d.tok_s() / 1e9,
                    100.0 * d.roofline(bytes + extra),
                    median(d.read.clone()),
                    100.0 * d.non_gemm(),
                    d.delta_net_ms()
                );
            }
            for line in &prefill_lines {
                println!("{line}");
            }
            println!(
                "  KV per token: f32 {} B, bf16 {} B; bf16 vs f32 cache over {} steps at ctx 512: max |dlogit| {:.2e}, same argmax {:.0}%",
                kv_per_token,
                kv_bf16_per_token,
                DECODE_STEPS,
                max_diff,
                100.0 * top1
            );
            print_peak_rss(
                peak,
                rss_reset,
                &format!("budget pack + KV + 300 MB = {budget_mb:.0} MB"),
            );
        }
        kinds_json.insert(
            kind.to_string(),
            json!({
                "decode_tok_s": round2(decode_tok_s),
                "decode_tok_s_ctx512": round2(d512.tok_s()),
                "decode_tok_s_ctx512_kv_bf16": round2(d512b.tok_s()),
                "prefill_tok_s": prefill_json,
                "prefill_reps": PREFILL_REPS,
                "prefill_non_gemm_pct": prefill_non_gemm_json,
                "prefill_prompt": p_prompt,
                "prefill_gemm_ms": p_gemm_ms,
                "prefill_gemm_gmac_s": p_gemm_gmac,
                "prefill_gemm_peak_pct": p_gemm_pct,
                "prefill_peak_pct": p_pct,
                "prefill_attention_ms": p_attn,
                "prefill_delta_net_ms": p_delta,
                "delta_net_ms_ctx0": round_ms(d0.delta_net_ms()),
                "delta_net_ms_ctx512": round_ms(d512.delta_net_ms()),
                "macs_per_row": macs_per_row,
                "roofline_pct": round2(100.0 * roofline),
                "roofline_pct_ctx512": round2(100.0 * d512.roofline(bytes + kv512)),
                "read_gb_s": round2(read),
                "gb_s_moved": round2(bytes * decode_tok_s / 1e9),
                "pack_bytes_per_token": bytes as u64,
                "non_gemm_pct_ctx0": round2(100.0 * d0.non_gemm()),
                "non_gemm_pct_ctx512": round2(100.0 * d512.non_gemm()),
                "non_gemm_pct_ctx512_kv_bf16": round2(100.0 * d512b.non_gemm()),
                "non_gemm_ms_ctx0": round_ms(d0.non_gemm_ms().0),
                "non_gemm_ms_ctx512": round_ms(d512.non_gemm_ms().0),
                "non_gemm_ms_ctx512_kv_bf16": round_ms(d512b.non_gemm_ms().0),
                "attention_ms_ctx0": round_ms(d0.non_gemm_ms().1),
                "attention_ms_ctx512": round_ms(d512.non_gemm_ms().1),
                "attention_ms_ctx512_kv_bf16": round_ms(d512b.non_gemm_ms().1),
                "kv_bytes_per_token": kv_per_token,
                "kv_bf16_bytes_per_token": kv_bf16_per_token,
                "kv_bf16_max_abs_logit_diff": max_diff,
                "kv_bf16_same_argmax": top1,
                "peak_rss_mb": peak.map(round2),
                "peak_rss_reset": rss_reset,
                "rss_budget_mb": round2(budget_mb),
                "pack_mb": round2(pack_mb),
            }),
        );
    }
    let read_gb_s = median(all_reads.clone());
    let best = all_reads.iter().copied().fold(0.0, f64::max);
    if !c.json {
        println!("\nstreaming read over the run: median {read_gb_s:.1} GB/s, best {best:.1} GB/s");
    }
    let load_end = load_avg();
    // The peak again at the end: on a shared host one ~1 s sample can land on a slow moment and
    // inflate every share, so the JSON's shares are set against the larger of the two.
    let peaks_end = measure_peaks(c.threads, isa);
    let (start, end) = (peaks.int8.map(|p| p.1), peaks_end.int8.map(|p| p.1));
    if let (Some(start), Some(end)) = (start, end) {
        if end > start {
            rescale_shares(&mut kinds_json, start / end);
        }
    }
    if !c.json {
        println!(
            "load average {} at the start, {} at the end; int8 peak {} GMAC/s at the start, {} at the end (--json sets the shares against the larger)",
            load(load_start),
            load(load_end),
            start.map_or("?".into(), |p| format!("{p:.1}")),
            end.map_or("?".into(), |p| format!("{p:.1}")),
        );
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "kernels": isa.name(),
        "peaks_gmac_s": peaks.json,
        "peaks_gmac_s_end": peaks_end.json,
        "shares_against": "the larger int8 peak of the start and the end",
        "load_avg_1m": [load_start, load_end],
        "read_gb_s": round2(read_gb_s),
        "read_gb_s_best": round2(best),
        "kinds": kinds_json,
    })
}

/// Decodes with `f` what `like` decoded, to set one KV cache beside another: `f` is prefilled with
/// `prompt` (the prompt in `like`'s cache) and fed `like`'s tokens from the same slot, so each step
/// holds the same rows at the same positions and the logits differ by the caches alone. Were each
/// cache fed its own argmax, one near-tie flipped by rounding would put every later step on other
/// tokens (the 2B shape then gave same argmax 0% and max |Δlogit| 9.9; fed alike, 83% and 0.8).
fn decode_beside(f: &mut Decoder, prompt: &Prompt, like: &Decode, probe: &ReadProbe) -> Decode {
    prefill_prompt(f, prompt);
    assert_eq!(
        f.next_slot(),
        like.first_slot,
        "the prompt fills the cache to the slot the decode set beside started at"
    );
    decode_tokens(f, &like.tokens, probe)
}

/// Multiplies every share of the int8 peak in the kinds' reports (`prefill_gemm_peak_pct`,
/// `prefill_peak_pct`) by `factor` (the start peak over a larger end peak).
fn rescale_shares(kinds: &mut Map<String, Value>, factor: f64) {
    for kind in kinds.values_mut() {
        for key in ["prefill_gemm_peak_pct", "prefill_peak_pct"] {
            if let Some(Value::Object(rows)) = kind.get_mut(key) {
                for v in rows.values_mut() {
                    if let Some(x) = v.as_f64() {
                        *v = json!(round2(x * factor));
                    }
                }
            }
        }
    }
}

/// Two decodes' logits step by step: (max |Δlogit| over every step, share of steps whose argmax
/// agrees).
fn compare_logits(a: &[Vec<f32>], b: &[Vec<f32>]) -> (f64, f64) {
    let mut max = 0f64;
    let mut agree = 0;
    for (x, y) in a.iter().zip(b) {
        for (p, q) in x.iter().zip(y) {
            max = max.max((p - q).abs() as f64);
        }
        agree +=
            usize::from(compute::ops::sampling::argmax(x) == compute::ops::sampling::argmax(y));
    }
    (max, agree as f64 / a.len().max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shares of the peak are scaled and nothing else is: a GMAC/s figure beside them keeps
    /// its value (control), so a rescale cannot pass by touching every number.
    #[test]
    fn a_larger_end_peak_scales_only_the_shares() {
        let mut kinds = Map::new();
        kinds.insert(
            "q4".into(),
            json!({
                "prefill_gemm_peak_pct": {"512": 100.0, "2048": 80.0},
                "prefill_peak_pct": {"512": 90.0},
                "prefill_gemm_gmac_s": {"512": 36.0},
            }),
        );
        rescale_shares(&mut kinds, 0.5);
        let q4 = &kinds["q4"];
        assert_eq!(q4["prefill_gemm_peak_pct"]["512"], json!(50.0));
        assert_eq!(q4["prefill_gemm_peak_pct"]["2048"], json!(40.0));
        assert_eq!(q4["prefill_peak_pct"]["512"], json!(45.0));
        assert_eq!(q4["prefill_gemm_gmac_s"]["512"], json!(36.0));
    }

    /// The bf16 cache set beside the f32 one on the tiny shape decodes the f32 cache's prompt and
    /// tokens from the same slot, so over a long decode its argmax agrees on at least 90% of the
    /// steps and its logits stay close. 128 steps, as a dozen rarely flip a near-tie on this
    /// shape: fed its own argmax instead, the bf16 cache left the f32 tokens at step 14 and agreed
    /// on 14% of the steps. Control: the same tokens after another prompt (the 2048-row picture)
    /// agree far less, so the bound tells like from unlike.
    #[test]
    fn the_bf16_cache_decodes_the_f32_cache_prompt_and_tokens() {
        use crate::steps::forward_with_room;
        use packs::random::write_random;
        const STEPS: usize = 128;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-q4.pack");
        let shape = RandomShape::named("tiny").unwrap();
        write_random(&shape, QuantKind::Q4, 1, &path).unwrap();
        let pack = Arc::new(Pack::open(&path).unwrap());
        let probe = ReadProbe::of_bytes(1 << 16, 1);
        let mut f = forward_with_room(&pack, 2, KvDtype::F32, LONG_CONTEXT, STEPS);
        let prompt = prompt_for(&f, LONG_CONTEXT);
        assert!(prompt.image.is_some(), "ctx 512 is an image prompt");
        prefill_prompt(&mut f, &prompt);
        let f32_decode = decode_steps(&mut f, STEPS, &probe);
        let mut fb = forward_with_room(&pack, 2, KvDtype::Bf16, 2048, STEPS);
        let bf16_decode = decode_beside(&mut fb, &prompt, &f32_decode, &probe);
        assert_eq!(bf16_decode.first_slot, LONG_CONTEXT);
        assert_eq!(bf16_decode.first_slot, f32_decode.first_slot);
        assert_eq!(bf16_decode.tokens, f32_decode.tokens);
        let (max_diff, same_argmax) = compare_logits(&f32_decode.logits, &bf16_decode.logits);
        assert!(
            same_argmax >= 0.9 && max_diff < 0.25,
            "same argmax {same_argmax}, max |dlogit| {max_diff}"
        );

        let other = prompt_for(&fb, 2048);
        prefill_prompt(&mut fb, &other);
        let elsewhere = decode_tokens(&mut fb, &f32_decode.tokens, &probe);
        let (max_other, same_other) = compare_logits(&f32_decode.logits, &elsewhere.logits);
        assert!(
            same_other < 0.5 && max_other > 0.5,
            "after another prompt: same argmax {same_other}, max |dlogit| {max_other}"
        );
    }
}
