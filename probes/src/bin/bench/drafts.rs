//! `bench drafts`: greedy decoding with verified draft windows against plain decoding. The plain
//! run's own continuation is fed as drafts (oracle drafts: every draft is accepted, the upper
//! bound of what a draft source can give), k at a time: each forward feeds the sampled token and
//! k drafts (k + 1 rows, every row's logits), the rows are walked with argmax and the cache is cut
//! after the last confirmed row, as `Session::generate` does. The ids must equal the plain run's;
//! tok/s of both and the ratio.
//!
//! `--source mtp` (a Qwen3.5 shape, given its MTP head for the run) pays for the drafts as
//! `--drafts mtp` does: before each window the head catches up over the rows the model ran and
//! chains its k steps (`engine::mtp_drafts::MtpDrafter`), then its proposals are replaced by the
//! oracle's. That is MTP drafting's speed at 100% acceptance (the head's random weights would
//! accept nothing), against which the target (>= 1.8x) is set. With `--streams N` it also
//! times the head's drafting for N conversations in steady state (each catching up over a window
//! of k + 1 rows, then chaining) at once (`engine::mtp_drafts::propose_drafts`, as `serve
//! --parallel N --drafts mtp` runs it) against the same N one at a time.

use crate::measure::{load_avg, median, secs};
use crate::random_pack::pack_for;
use crate::report::{load, round2, round_ms};
use crate::steps::{forward_with_room, tokens};
use crate::{refuse, Common};
use compute::ops::sampling::argmax;
use decoder::{Decoder, HybridInputs, KvDtype, Logits};
use engine::mtp_drafts::{propose_drafts, DraftAsk, MtpDrafter};
use packs::random::RandomShape;
use packs::QuantKind;
use serde_json::{json, Map, Value};
use std::time::Instant;

/// Prompt rows prefilled before the timed decode.
const PROMPT: usize = 32;

/// The prompt prefilled; the first token from its last row.
fn prefill(f: &mut Decoder, vocab: usize) -> u32 {
    f.reset();
    let prompt = tokens(PROMPT, vocab);
    let logits = f
        .step_batch(&prompt, 0, 0, Logits::LastRow)
        .unwrap_or_else(|e| refuse(e));
    argmax(logits)
}

/// `n` greedy tokens, one forward each after the first; (ids, seconds of the decode steps).
fn plain(f: &mut Decoder, vocab: usize, n: usize) -> (Vec<u32>, f64) {
    let mut ids = vec![prefill(f, vocab)];
    let t = Instant::now();
    while ids.len() < n {
        let slot = f.next_slot();
        let last = *ids.last().expect("one id");
        let logits = f
            .step(last, slot as i64, slot)
            .unwrap_or_else(|e| refuse(e));
        ids.push(argmax(logits));
    }
    (ids, secs(t.elapsed()))
}

/// `n` greedy tokens with `k` oracle drafts (from `truth`) per forward, the last one made wrong
/// when `reject_last` (every window then rolls back one row); (ids, seconds, forwards, seconds
/// of the forwards' GEMMs, seconds of the rollbacks).
fn drafted(
    f: &mut Decoder,
    vocab: usize,
    truth: &[u32],
    k: usize,
    reject_last: bool,
) -> (Vec<u32>, f64, usize, f64, f64) {
    let n = truth.len();
    let mut ids = vec![prefill(f, vocab)];
    let (mut forwards, mut rollback_s) = (0, 0.0);
    let _ = f.runtime().take_stats(); // the prefill's
    let t = Instant::now();
    while ids.len() < n {
        let slot = f.next_slot();
        let mut rows = vec![*ids.last().expect("one id")];
        rows.extend(truth[ids.len()..].iter().take(k.min(n - ids.len() - 1)));
        if reject_last && rows.len() > 1 {
            let last = rows.len() - 1;
            rows[last] = (rows[last] + 1) % vocab as u32;
        }
        let logits = f
            .step_batch(&rows, slot as i64, slot, Logits::AllRows)
            .unwrap_or_else(|e| refuse(e));
        forwards += 1;
        for r in 0..rows.len() {
            let token = argmax(&logits[r * vocab..][..vocab]);
            ids.push(token);
            if ids.len() == n || rows.get(r + 1) != Some(&token) {
                // Keep the rows up to this one: the next forward feeds `token` after them.
                let tr = Instant::now();
                let kept = f.truncate(slot + r + 1);
                rollback_s += secs(tr.elapsed());
                assert_eq!(
                    kept,
                    slot + r + 1,
                    "a draft window rolled back to a row it kept"
                );
                break;
            }
        }
    }
    let gemm_s = secs(f.runtime().take_stats().host);
    (ids, secs(t.elapsed()), forwards, gemm_s, rollback_s)
}

/// What pays for the drafts (`bench drafts --source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// Nothing: the verified window's cost alone.
    Oracle,
    /// Oracle drafts with the last of each window wrong: every window rolls back one row (on
    /// Qwen3.5, a replay of its kept rows), the rollback's time reported.
    OracleRejectLast,
    /// The shape's MTP head, k chained steps before each window.
    Mtp,
}

/// The token rows' embeddings, `rows x hidden`.
fn embeds(f: &Decoder, ids: &[u32]) -> Vec<f32> {
    let h = f.semantics().hidden_size;
    let mut out = vec![0f32; ids.len() * h];
    for (row, &id) in out.chunks_exact_mut(h).zip(ids) {
        f.embed_row(id, row);
    }
    out
}

/// Where the MTP head's time went: all of it, its GEMMs (the fc, the layer's linears and the
/// model's head per step), and its steps (each ends in one pass over the vocabulary's head rows).
#[derive(Default)]
struct HeadTime {
    total_s: f64,
    gemm_s: f64,
    steps: usize,
}

/// [`drafted`] with the MTP head run before each window (module docs); (ids, seconds, forwards,
/// seconds of the windows' GEMMs, the head's time).
fn mtp_drafted(
    f: &mut Decoder,
    vocab: usize,
    truth: &[u32],
    k: usize,
    capacity: usize,
) -> (Vec<u32>, f64, usize, f64, HeadTime) {
    let n = truth.len();
    f.keep_last_hidden(true);
    let mut drafter = MtpDrafter::new(f, capacity, KvDtype::Bf16);
    f.reset();
    let prompt = tokens(PROMPT, vocab);
    let first = argmax(
        f.step_batch(&prompt, 0, 0, Logits::LastRow)
            .unwrap_or_else(|e| refuse(e)),
    );
    drafter.ran(0, f, &embeds(f, &prompt), &HybridInputs::text(0), &[]);
    let mut ids = vec![first];
    let (mut forwards, mut head, mut gemm_s) = (0, HeadTime::default(), 0.0);
    let _ = f.runtime().take_stats(); // the prefill's
    let mut logits = Vec::new();
    let t = Instant::now();
    while ids.len() < n {
        let slot = f.next_slot();
        let token = *ids.last().expect("one id");
        gemm_s += secs(f.runtime().take_stats().host); // the last window's forward
        let th = Instant::now();
        let proposed = drafter
            .propose(f, token, k.min(n - ids.len() - 1))
            .unwrap_or_else(|e| refuse(e));
        head.total_s += secs(th.elapsed());
        head.gemm_s += secs(f.runtime().take_stats().host);
        head.steps += proposed.len();
        let mut rows = vec![token];
        rows.extend(truth[ids.len()..].iter().take(proposed.len()));
        logits.clear();
        logits.extend_from_slice(
            f.step_batch(&rows, slot as i64, slot, Logits::AllRows)
                .unwrap_or_else(|e| refuse(e)),
        );
        forwards += 1;
        drafter.ran(
            slot,
            f,
            &embeds(f, &rows),
            &HybridInputs::text(slot as i64),
            &[],
        );
        for r in 0..rows.len() {
            let next = argmax(&logits[r * vocab..][..vocab]);
            ids.push(next);
            if ids.len() == n || rows.get(r + 1) != Some(&next) {
                let kept = f.truncate(slot + r + 1);
                assert_eq!(
                    kept,
                    slot + r + 1,
                    "a draft window rolled back to a row it kept"
                );
                drafter.truncate(slot + r + 1);
                break;
            }
        }
    }
    f.keep_last_hidden(false);
    gemm_s += secs(f.runtime().take_stats().host);
    (ids, secs(t.elapsed()), forwards, gemm_s, head)
}

/// Timed rounds of [`mtp_streams`] (the median counts).
const STREAM_ROUNDS: usize = 5;

/// The head's drafting for `n` conversations in steady state: each drafter has read the prompt
/// and catches up over its last k + 1 rows (a window's), then chains k - 1 rows; at once against
/// one at a time, alternated round by round. (ms at once, ms one at a time), medians.
fn mtp_streams(f: &mut Decoder, vocab: usize, k: usize, n: usize, capacity: usize) -> (f64, f64) {
    let h = f.semantics().hidden_size;
    f.keep_last_hidden(true);
    let token = prefill(f, vocab);
    let prompt = tokens(PROMPT, vocab);
    let (hidden, rows) = (f.last_hidden().to_vec(), embeds(f, &prompt));
    f.keep_last_hidden(false);
    let from = PROMPT - (k + 1);
    let mut drafters: Vec<MtpDrafter> = (0..n)
        .map(|_| {
            let mut d = MtpDrafter::new(f, capacity, KvDtype::Bf16);
            let read = (&hidden[..from * h], &[][..]);
            d.ran_rows(0, read, &rows[..from * h], &HybridInputs::text(0));
            d.propose(f, token, 1).unwrap_or_else(|e| refuse(e));
            d
        })
        .collect();
    // Back to the window's rows pending: what a decode step leaves.
    let window = |d: &mut MtpDrafter| {
        d.ran_rows(
            from,
            (&[], &hidden[from * h..PROMPT * h]),
            &rows[from * h..],
            &HybridInputs::text(from as i64),
        )
    };
    let (mut together, mut apart) = (Vec::new(), Vec::new());
    for round in 0..=STREAM_ROUNDS {
        drafters.iter_mut().for_each(window);
        let t = Instant::now();
        let mut asks: Vec<DraftAsk<'_>> = drafters
            .iter_mut()
            .map(|drafter| DraftAsk { drafter, token, k })
            .collect();
        let all = propose_drafts(f, &mut asks).unwrap_or_else(|e| refuse(e));
        let t_together = secs(t.elapsed());
        drafters.iter_mut().for_each(window);
        let t = Instant::now();
        let each: Vec<Vec<u32>> = drafters
            .iter_mut()
            .map(|d| d.propose(f, token, k).unwrap_or_else(|e| refuse(e)))
            .collect();
        let t_apart = secs(t.elapsed());
        if all != each || all.iter().any(|d| d.len() != k) {
            refuse("the head's drafts at once differ from one at a time");
        }
        // Round 0 warms the caches and the pool.
        if round > 0 {
            together.push(t_together * 1e3);
            apart.push(t_apart * 1e3);
        }
    }
    (median(together), median(apart))
}

pub fn run(
    c: &Common,
    shape: &RandomShape,
    kinds: &[QuantKind],
    (k, mtp_vocab): (usize, Option<usize>),
    (tokens_n, streams): (usize, usize),
    source: Source,
) -> Value {
    if !(1..=engine::MAX_DRAFTS).contains(&k) {
        refuse(format!(
            "--k {k}: draft tokens per forward must be in 1..={}",
            engine::MAX_DRAFTS
        ));
    }
    if tokens_n < 2 {
        refuse(format!(
            "--tokens {tokens_n}: at least 2 tokens (one decode step) are needed"
        ));
    }
    let with_head;
    let shape = match source {
        Source::Oracle | Source::OracleRejectLast => shape,
        Source::Mtp => {
            let mut s = shape.clone();
            match s.semantics.delta_net.as_mut() {
                Some(d) => d.mtp = true,
                None => refuse(format!(
                    "--source mtp: shape {} has no MTP head (it is a Qwen3.5 family's: \
                     --shape qwen3.5-2b or qwen3.5-0.8b)",
                    shape.name
                )),
            }
            // Its own pack file: the bench shape's pack has no head.
            s.name = Box::leak(format!("{}-mtp", shape.name).into_boxed_str());
            with_head = s;
            &with_head
        }
    };
    let mut kinds_json = Map::new();
    if !c.json {
        println!(
            "shape {}  threads {}  {tokens_n} greedy tokens, {} drafts k = {k}  load {}",
            shape.name,
            c.threads,
            match source {
                Source::Oracle => "oracle",
                Source::OracleRejectLast => "oracle (the last one wrong)",
                Source::Mtp => "MTP-paid oracle",
            },
            load(load_avg())
        );
    }
    for &kind in kinds {
        let pack = pack_for(c, shape, kind);
        let mut f = forward_with_room(&pack, c.threads, KvDtype::Bf16, PROMPT, tokens_n + k + 2);
        let vocab = f.semantics().vocab_size;
        let (truth, plain_s) = plain(&mut f, vocab, tokens_n);
        let (ids, drafted_s, forwards, gemm_s, head, rollback_s) = match source {
            Source::Oracle | Source::OracleRejectLast => {
                let reject_last = source == Source::OracleRejectLast;
                let (ids, s, n, g, r) = drafted(&mut f, vocab, &truth, k, reject_last);
                (ids, s, n, g, HeadTime::default(), r)
            }
            Source::Mtp => {
                let covered = match mtp_vocab {
                    Some(ids) => f.set_mtp_vocab(ids).unwrap_or_else(|e| refuse(e)),
                    None => vocab,
                };
                if !c.json {
                    println!("  the MTP head's logits cover the first {covered} of {vocab} ids");
                }
                let (ids, s, n, g, h) =
                    mtp_drafted(&mut f, vocab, &truth, k, PROMPT + tokens_n + k + 8);
                (ids, s, n, g, h, 0.0)
            }
        };
        let head_streams = (source == Source::Mtp && streams > 1).then(|| {
            let (together, apart) = mtp_streams(&mut f, vocab, k, streams, PROMPT + k + 8);
            if !c.json {
                println!(
                    "  the head's drafts for {streams} conversations: {together:.1} ms at once, {apart:.1} ms one at a time (x{:.2}), drafts identical",
                    apart / together
                );
            }
            json!({
                "streams": streams,
                "ms_at_once": round_ms(together),
                "ms_one_at_a_time": round_ms(apart),
                "x_one_at_a_time": round2(apart / together),
            })
        });
        let same = ids == truth;
        let steps = (tokens_n - 1) as f64;
        let (plain_tok_s, drafted_tok_s) = (steps / plain_s, steps / drafted_s);
        if !c.json {
            println!(
                "{kind}: plain {plain_tok_s:>7.2} tok/s ({:.1} ms/token)  drafts k={k} {drafted_tok_s:>7.2} tok/s in {forwards} forwards ({:.1} ms/forward, {:.1} of them outside GEMMs and the MTP head, {:.2} the rollback; {:.1} the MTP head: {:.1} its GEMMs over {:.1} steps)  x{:.2}  ids {}",
                plain_s / steps * 1e3,
                drafted_s / forwards as f64 * 1e3,
                (drafted_s - gemm_s - head.total_s) / forwards as f64 * 1e3,
                rollback_s / forwards as f64 * 1e3,
                head.total_s / forwards as f64 * 1e3,
                head.gemm_s / forwards as f64 * 1e3,
                head.steps as f64 / forwards as f64,
                drafted_tok_s / plain_tok_s,
                if same { "identical" } else { "DIFFER" }
            );
        }
        kinds_json.insert(
            kind.to_string(),
            json!({
                "plain_tok_s": round2(plain_tok_s),
                "drafts_tok_s": round2(drafted_tok_s),
                "x_plain": round2(drafted_tok_s / plain_tok_s),
                "forwards": forwards,
                "ms_per_forward": round_ms(drafted_s / forwards as f64 * 1e3),
                "non_gemm_ms_per_forward": round_ms((drafted_s - gemm_s - head.total_s) / forwards as f64 * 1e3),
                "rollback_ms_per_forward": round_ms(rollback_s / forwards as f64 * 1e3),
                "mtp_ms_per_forward": round_ms(head.total_s / forwards as f64 * 1e3),
                "mtp_gemm_ms_per_forward": round_ms(head.gemm_s / forwards as f64 * 1e3),
                "mtp_steps_per_forward": round2(head.steps as f64 / forwards as f64),
                "mtp_streams": head_streams,
                "ids_identical": same,
            }),
        );
        if !same {
            refuse(format!(
                "{kind}: the drafted ids differ from the plain run's"
            ));
        }
    }
    json!({
        "shape": shape.name,
        "threads": c.threads,
        "k": k,
        "source": format!("{source:?}").to_lowercase(),
        "mtp_vocab": mtp_vocab,
        "tokens": tokens_n,
        "prompt_rows": PROMPT,
        "kinds": kinds_json,
    })
}
