//! `bench join`: a new conversation's time to its first token when it joins running decodes, as
//! `xdna-vl serve --parallel` schedules it (engine/src/scheduler.rs: every step one decode row per
//! running sequence and the next slice of at most `--prefill-chunk` rows of the new prompt),
//! against the same prompt alone in the same slices. The target: within 1.3x of alone
//! with 3 others decoding. Also what the join costs the others: their ms per token while it lasts.

use crate::measure::{load_avg, median, secs};
use crate::random_pack::pack_for;
use crate::report::{load, round2, round_ms};
use crate::steps::{decode_sequences, forward_with_room, prefill_sequences, tokens};
use crate::{refuse, Common};
use decoder::{Decoder, KvCache, KvDtype, Logits, SequenceStep, StepInput};
use packs::random::RandomShape;
use packs::QuantKind;
use serde_json::{json, Map, Value};
use std::time::Instant;

/// Prompt rows each running conversation holds before the join.
const RUNNING_PROMPT: usize = 32;

/// The target ratio (joined / alone) of the sequences issue.
const TARGET: f64 = 1.3;

/// One step: the running conversations' decode rows (`next`, at `pos`) and, if any, the joining
/// prompt's slice `rows` from `start` (its last row's logits, as the scheduler asks): the
/// time, the running conversations' next tokens, and the slice's last row's next token.
fn tick(
    f: &mut Decoder,
    running: &mut [KvCache],
    next: &[u32],
    pos: i64,
    joining: Option<(&mut KvCache, &[u32], i64)>,
) -> (f64, Vec<u32>, Option<u32>) {
    let extra = joining.map(|(cache, rows, start)| SequenceStep {
        cache,
        input: StepInput::Tokens {
            tokens: rows,
            start_pos: start,
        },
        logits: Logits::LastRow,
    });
    decode_sequences(f, running, next, pos, extra)
}

pub fn run(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    prompt_rows: usize,
    chunk: usize,
    others: usize,
) -> Value {
    if prompt_rows == 0 || chunk == 0 {
        refuse("--prompt-rows and --prefill-chunk must be at least 1");
    }
    if !(1..=15).contains(&others) {
        refuse(format!("--others {others}: 1 to 15 running conversations"));
    }
    let slices = prompt_rows.div_ceil(chunk);
    if !c.json {
        println!(
            "shape {}  threads {}  a {prompt_rows}-row prompt in {slices} slices of <= {chunk} rows, joining {others} decoding conversations, against alone  load {}",
            shape.name,
            c.threads,
            load(load_avg())
        );
    }
    let mut kinds_json = Map::new();
    for &kind in kinds {
        let pack = pack_for(c, shape, kind);
        let capacity = RUNNING_PROMPT.max(prompt_rows) + slices + 16;
        let mut f = forward_with_room(&pack, c.threads, KvDtype::Bf16, capacity, 0);
        let vocab = f.semantics().vocab_size;
        let prompt = {
            let mut t = tokens(prompt_rows, vocab);
            t.rotate_left(7 % prompt_rows);
            t
        };
        let mut joining = f.new_cache(capacity, KvDtype::Bf16);
        let mut running: Vec<KvCache> = (0..others)
            .map(|_| f.new_cache(capacity, KvDtype::Bf16))
            .collect();

        // Alone: the slices one after another, nothing beside them (twice: the first faults the
        // pack in).
        let mut alone_s = f64::INFINITY;
        let mut alone_first = 0;
        for _ in 0..2 {
            joining.reset();
            let t = Instant::now();
            for (i, rows) in prompt.chunks(chunk).enumerate() {
                let (_, _, first) = tick(
                    &mut f,
                    &mut [],
                    &[],
                    0,
                    Some((&mut joining, rows, (i * chunk) as i64)),
                );
                if let Some(id) = first {
                    alone_first = id;
                }
            }
            alone_s = alone_s.min(secs(t.elapsed()));
        }

        // The running conversations: their prompts, then decode steps before the join (timed:
        // their pace alone).
        let mut next = prefill_sequences(&mut f, &mut running, RUNNING_PROMPT);
        let mut pos = RUNNING_PROMPT as i64;
        let mut before = Vec::new();
        for _ in 0..4 {
            let (s, t, _) = tick(&mut f, &mut running, &next, pos, None);
            before.push(s);
            next = t;
            pos += 1;
        }

        // The join: every step the others' rows and the next slice.
        joining.reset();
        let mut during = Vec::new();
        let mut joined_first = 0;
        let t = Instant::now();
        for (i, rows) in prompt.chunks(chunk).enumerate() {
            let (s, t, first) = tick(
                &mut f,
                &mut running,
                &next,
                pos,
                Some((&mut joining, rows, (i * chunk) as i64)),
            );
            during.push(s);
            next = t;
            pos += 1;
            if let Some(id) = first {
                joined_first = id;
            }
        }
        let joined_s = secs(t.elapsed());
        if joined_first != alone_first {
            refuse(format!(
                "{kind}: the joining prompt's first token {joined_first} differs from its token alone {alone_first}"
            ));
        }
        let ratio = joined_s / alone_s;
        let (before_ms, during_ms) = (median(before) * 1e3, median(during) * 1e3);
        if !c.json {
            println!(
                "{kind}: first token alone {:.1} ms, beside {others} {:.1} ms: x{ratio:.2} (target <= x{TARGET}: {})  the others' step {before_ms:.1} ms before the join, {during_ms:.1} ms during it",
                alone_s * 1e3,
                joined_s * 1e3,
                if ratio <= TARGET { "meets" } else { "misses" }
            );
        }
        kinds_json.insert(
            kind.to_string(),
            json!({
                "alone_ms": round_ms(alone_s * 1e3),
                "joined_ms": round_ms(joined_s * 1e3),
                "x_alone": round2(ratio),
                "meets_target": ratio <= TARGET,
                "others_step_ms_before": round_ms(before_ms),
                "others_step_ms_during": round_ms(during_ms),
            }),
        );
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "prompt_rows": prompt_rows,
        "prefill_chunk": chunk,
        "others": others,
        "target_x_alone": TARGET,
        "kinds": kinds_json,
    })
}
