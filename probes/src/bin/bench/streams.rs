//! `bench streams`: N conversations decoded in one forward (`Decoder::step_sequences`), against
//! one: aggregate and per-stream tok/s, and the share of the read roofline (a step reads every
//! weight once for all N, plus each stream's KV rows).

use crate::measure::{load_avg, median, ReadProbe};
use crate::random_pack::{pack_bytes_per_token, pack_for};
use crate::report::{load, round2, round_ms};
use crate::steps::{decode_sequences, forward_with_room, prefill_sequences};
use crate::{refuse, Common};
use decoder::KvDtype;
use packs::random::RandomShape;
use packs::QuantKind;
use serde_json::{json, Map, Value};

/// Prompt rows each stream holds before its decode steps are timed.
const PROMPT: usize = 32;

/// Timed decode steps per stream count in one round: the counts take turns, a round of each at a
/// time, so that a slow spell of the machine (the one-stream step swung 38-53 ms between runs a
/// minute apart, PERF.md "Chunk-major q4 panels") falls on every count alike instead of on the
/// one measured then, and the ratios to one stream keep less of it.
const ROUND_STEPS: usize = 4;

/// Stream counts from `--streams`: positive, ascending, deduplicated.
fn parse_streams(list: &[String]) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for s in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match s.parse::<usize>() {
            Ok(n) if (1..=64).contains(&n) => out.push(n),
            _ => return Err(format!("--streams: {s:?} is not a stream count in 1..=64")),
        }
    }
    if out.is_empty() {
        return Err("--streams names no stream count (e.g. --streams 1,2,4,8)".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

pub fn run(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    streams: &[String],
    steps: usize,
) -> Value {
    let counts = parse_streams(streams).unwrap_or_else(|e| refuse(e));
    if steps == 0 {
        refuse("--steps 0: at least one decode step must be timed");
    }
    let probe = ReadProbe::new(c.threads);
    let mut kinds_json = Map::new();
    if !c.json {
        println!(
            "shape {}  threads {}  {steps} decode steps per stream count, {ROUND_STEPS} a turn (median counts)  load {}",
            shape.name,
            c.threads,
            load(load_avg())
        );
    }
    for &kind in kinds {
        let pack = pack_for(c, shape, kind);
        let weight_bytes = pack_bytes_per_token(&pack) as f64;
        let most = *counts.last().expect("one count at least");
        let mut f = forward_with_room(&pack, c.threads, KvDtype::Bf16, PROMPT, steps + 1);
        let capacity = PROMPT + steps + 8;
        let mut caches: Vec<_> = (0..most)
            .map(|_| f.new_cache(capacity, KvDtype::Bf16))
            .collect();
        let kv_row = caches[0].bytes_per_token() as f64;
        let mut rows = Map::new();
        let mut one_stream = None;
        if !c.json {
            println!(
                "\n{kind}: {:.0} MB of weights read per step",
                weight_bytes / 1e6
            );
        }
        // Per count: the step times and the read probe beside them, gathered round by round.
        let mut timed: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); counts.len()];
        let rounds = steps.div_ceil(ROUND_STEPS);
        for round in 0..rounds {
            let round_steps = ROUND_STEPS.min(steps - round * ROUND_STEPS);
            for (&n, (times, reads)) in counts.iter().zip(timed.iter_mut()) {
                // Each stream its own prompt, prefilled together; then the round's timed steps.
                let mut next = prefill_sequences(&mut f, &mut caches[..n], PROMPT);
                for step in 0..round_steps {
                    reads.push(probe.beside());
                    let pos = (PROMPT + step) as i64;
                    let (s, t, _) = decode_sequences(&mut f, &mut caches[..n], &next, pos, None);
                    times.push(s);
                    next = t;
                }
            }
        }
        for (&n, (times, reads)) in counts.iter().zip(timed) {
            let step_s = median(times.clone());
            let aggregate = n as f64 / step_s;
            let per_stream = 1.0 / step_s;
            // What one step reads: the weights once, each stream's KV rows so far.
            let kv_bytes = n as f64 * (PROMPT + ROUND_STEPS / 2) as f64 * kv_row;
            let read = median(reads);
            let roofline = (weight_bytes + kv_bytes) / step_s / 1e9 / read;
            if n == 1 {
                one_stream = Some(aggregate);
            }
            let vs_one = one_stream.map(|one: f64| aggregate / one);
            if !c.json {
                println!(
                    "  {n:>2} streams: {:>7.2} ms/step  aggregate {aggregate:>7.2} tok/s  per stream {per_stream:>6.2} tok/s  {:>5.1}% of the read roofline ({read:.1} GB/s){}",
                    step_s * 1e3,
                    roofline * 100.0,
                    vs_one.map_or(String::new(), |r| format!("  x{r:.2} one stream's"))
                );
            }
            rows.insert(
                n.to_string(),
                json!({
                    "ms_per_step": round_ms(step_s * 1e3),
                    "aggregate_tok_s": round2(aggregate),
                    "per_stream_tok_s": round2(per_stream),
                    "roofline_pct": round2(roofline * 100.0),
                    "read_gb_s": round2(read),
                    "x_one_stream": vs_one.map(round2),
                }),
            );
        }
        kinds_json.insert(kind.to_string(), Value::Object(rows));
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "steps": steps,
        "prompt_rows": PROMPT,
        "kinds": kinds_json,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_streams;

    #[test]
    fn stream_counts_are_checked() {
        assert_eq!(
            parse_streams(&["4".into(), "1".into(), "4".into()]).unwrap(),
            vec![1, 4]
        );
        assert!(parse_streams(&["0".into()]).unwrap_err().contains("\"0\""));
        assert!(parse_streams(&[]).is_err());
    }
}
