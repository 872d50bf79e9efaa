//! The whole chain on a tiny random Qwen3.5 (tests/fixtures/chat-qwen3_5, made by
//! tools/qwen3_5_chat_reference.py): the checkpoint built into a pack, the pictures read from their
//! files through the Rust preprocessing and tower (no DeepStack), the chat template and tokenizer,
//! the hybrid decoder with its recurrent state. Greedy ids equal `generate`'s for a text
//! question, two pictures, and a chat's second turn on the whole history; the same with drafts.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use engine::{ChatAssets, Content, Message, Role, SamplingParams, Session, SessionOptions};
use serde_json::Value;

use crate::common::{fixtures, ids};

fn dir() -> PathBuf {
    fixtures().join("chat-qwen3_5")
}

fn answers() -> &'static Value {
    static A: OnceLock<Value> = OnceLock::new();
    A.get_or_init(|| {
        serde_json::from_str(&std::fs::read_to_string(dir().join("answer.json")).unwrap()).unwrap()
    })
}

fn pack() -> Arc<packs::Pack> {
    static PACK: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, p) = PACK.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("qwen3_5-f32.pack");
        let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
        packs::build::build_from_hf(&dir().join("Qwen3.5-tiny"), &out, &opts).unwrap();
        (tmp, out)
    });
    Arc::new(packs::Pack::open(p).unwrap())
}

/// `drafts` per step from prompt lookup, or from the MTP head with `mtp`.
fn session_with(drafts: usize, mtp: bool) -> Session {
    let options = SessionOptions {
        context: 256,
        runtime: compute::RuntimeOptions::host(2),
        drafts,
        draft_source: if mtp {
            engine::DraftSource::Mtp
        } else {
            engine::DraftSource::PromptLookup
        },
        ..SessionOptions::default()
    };
    let assets = ChatAssets::from_dir(&dir().join("Qwen3.5-tiny")).unwrap();
    Session::new(&pack(), &assets, &options).unwrap()
}

/// Drafts off, prompt lookup, the MTP head chaining 1 and 3 drafts.
const DRAFTS: [(usize, bool); 4] = [(0, false), (4, false), (1, true), (3, true)];

fn greedy() -> SamplingParams {
    SamplingParams {
        max_tokens: answers()["max_new_tokens"].as_u64().unwrap() as usize,
        ..SamplingParams::default()
    }
}

/// The run's messages with its pictures read from their files.
fn messages(s: &mut Session, run: &Value) -> Vec<Message> {
    run["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "assistant" => Role::Assistant,
                "system" => Role::System,
                _ => Role::User,
            };
            let content = match &m["content"] {
                Value::String(t) => vec![Content::Text(t.clone())],
                Value::Array(items) => items
                    .iter()
                    .map(|it| match it["type"].as_str().unwrap() {
                        "image" => Content::Image(
                            s.load_image(&dir().join(it["image"].as_str().unwrap()))
                                .unwrap(),
                        ),
                        _ => Content::Text(it["text"].as_str().unwrap().to_string()),
                    })
                    .collect(),
                other => panic!("content {other}"),
            };
            Message::new(role, content)
        })
        .collect()
}

/// The text, two-picture and second-turn runs, each greedy and then seeded sampled.
fn greedy_and_sampled(s: &mut Session) -> Vec<(Vec<Message>, SamplingParams)> {
    let sampled = SamplingParams {
        max_tokens: 12,
        temperature: 0.9,
        top_k: 40,
        seed: 7,
        ..SamplingParams::default()
    };
    let mut convs = Vec::new();
    for run in ["text", "two_images", "chat"] {
        let m = messages(s, &answers()["runs"][run]);
        convs.push((m.clone(), greedy()));
        convs.push((m, sampled.clone()));
    }
    convs
}

fn answer_of(s: &mut Session, run: &str) -> Vec<u32> {
    let run = &answers()["runs"][run];
    let msgs = messages(s, run);
    s.generate(&msgs, &greedy(), &mut |_| true).unwrap().ids
}

#[test]
fn text_and_two_pictures_give_transformers_greedy_ids() {
    let runs = &answers()["runs"];
    for (drafts, mtp) in DRAFTS {
        let mut s = session_with(drafts, mtp);
        for run in ["text", "two_images"] {
            assert_eq!(
                answer_of(&mut s, run),
                ids(&runs[run]["greedy_ids"]),
                "{run} (drafts {drafts}, mtp {mtp})"
            );
        }
    }
}

#[test]
fn a_second_chat_turn_on_the_whole_history_gives_transformers_ids() {
    let runs = &answers()["runs"];
    for (drafts, mtp) in DRAFTS {
        let mut s = session_with(drafts, mtp);
        let turn1 = messages(&mut s, &runs["chat_turn1"]).remove(0);
        let g1 = s.chat(turn1, &greedy(), &mut |_| true).unwrap();
        assert_eq!(g1.ids, ids(&runs["chat_turn1"]["greedy_ids"]));
        let g2 = s
            .chat(
                Message::user(vec![], "And the colours?"),
                &greedy(),
                &mut |_| true,
            )
            .unwrap();
        assert_eq!(
            g2.ids,
            ids(&runs["chat"]["greedy_ids"]),
            "turn 2 (drafts {drafts})"
        );
        // The recurrent state before turn 1's last prompt row was kept: turn 2 resumes there (the picture
        // is in it, so the tower does not run), not from nothing.
        let turn1_rows = runs["chat_turn1"]["prompt_rows"].as_u64().unwrap() as usize;
        assert_eq!(g2.reused_tokens, turn1_rows - 1, "drafts {drafts}");
        assert_eq!(g2.timings.tower, std::time::Duration::ZERO);
    }
}

/// Control: draft windows that keep one row too many (the recurrent state after a rejected
/// draft) give other ids: the drafted runs above can fail.
#[test]
fn control_a_window_keeping_a_rejected_row_changes_the_answer() {
    let options = SessionOptions {
        context: 256,
        runtime: compute::RuntimeOptions::host(2),
        drafts: 4,
        draft_ablation: engine::DraftAblation {
            keep_one_row_too_many: true,
        },
        ..SessionOptions::default()
    };
    let assets = ChatAssets::from_dir(&dir().join("Qwen3.5-tiny")).unwrap();
    let mut s = Session::new(&pack(), &assets, &options).unwrap();
    let runs = &answers()["runs"];
    let differing = ["text", "two_images"]
        .iter()
        .filter(|run| answer_of(&mut s, run) != ids(&runs[**run]["greedy_ids"]))
        .count();
    assert!(differing >= 1, "the planted rollback went unnoticed");
}

#[test]
fn mtp_drafts_are_proposed_and_a_pack_without_the_head_is_refused() {
    let mut s = session_with(3, true);
    let run = &answers()["runs"]["two_images"];
    let msgs = messages(&mut s, run);
    let g = s.generate(&msgs, &greedy(), &mut |_| true).unwrap();
    println!(
        "MTP drafts: {} proposed, {} accepted, {} forwards for {} steps",
        g.timings.drafts_proposed,
        g.timings.drafts_accepted,
        g.timings.decode_forwards,
        g.timings.decode_steps
    );
    assert!(g.timings.drafts_proposed > 0, "the head proposed nothing");
    // The head's cache is one more attention layer per conversation, in serve's budget too.
    let plain = session_with(3, false).kv_bytes_per_sequence();
    let layers = s.forward().kv().layers();
    assert_eq!(s.kv_bytes_per_sequence(), plain / layers * (layers + 1));
    // A Qwen3-VL pack has no head: refused by name, not decoded without drafts.
    let options = SessionOptions {
        draft_source: engine::DraftSource::Mtp,
        drafts: 3,
        runtime: compute::RuntimeOptions::host(2),
        ..SessionOptions::default()
    };
    let vl = crate::common::pack();
    let e = Session::new(&vl, &crate::common::assets(), &options)
        .err()
        .expect("a pack without an MTP head took --drafts mtp")
        .to_string();
    assert!(e.contains("no MTP head"), "{e}");
}

/// `--draft-vocab`: MTP drafts chosen among the first 256 of the 512 ids still give
/// transformers' greedy ids (the model verifies every draft). Control: the same drafts with
/// windows that keep a rejected row give other ids, so the drafted windows are checked.
#[test]
fn mtp_drafts_among_the_first_ids_only_leave_the_answer_unchanged() {
    let runs = &answers()["runs"];
    let assets = ChatAssets::from_dir(&dir().join("Qwen3.5-tiny")).unwrap();
    let session = |keep_one_row_too_many| {
        let options = SessionOptions {
            context: 256,
            runtime: compute::RuntimeOptions::host(2),
            drafts: 3,
            draft_source: engine::DraftSource::Mtp,
            mtp_vocab: Some(256),
            draft_ablation: engine::DraftAblation {
                keep_one_row_too_many,
            },
            ..SessionOptions::default()
        };
        Session::new(&pack(), &assets, &options).unwrap()
    };
    let mut s = session(false);
    for run in ["text", "two_images"] {
        let msgs = messages(&mut s, &runs[run]);
        let g = s.generate(&msgs, &greedy(), &mut |_| true).unwrap();
        assert_eq!(g.ids, ids(&runs[run]["greedy_ids"]), "{run}");
        assert!(g.timings.drafts_proposed > 0, "{run}: no drafts proposed");
    }
    let mut wrong = session(true);
    let differing = ["text", "two_images"]
        .iter()
        .filter(|run| answer_of(&mut wrong, run) != ids(&runs[**run]["greedy_ids"]))
        .count();
    assert!(differing >= 1, "the planted rollback went unnoticed");
}

/// `serve --parallel`: Qwen3.5 conversations beside each other (each sequence with its own
/// recurrent state, prompts prefilled in 4-row slices between the others' decode rows) answer
/// as alone, and the pool gets every cache back.
#[test]
fn conversations_beside_each_other_answer_as_alone() {
    use engine::{Scheduler, SchedulerOptions};
    let runs = &answers()["runs"];
    let mut s = session_with(0, false);
    let convs = greedy_and_sampled(&mut s);
    let alone: Vec<Vec<u32>> = convs
        .iter()
        .map(|(m, p)| {
            s.reset();
            s.generate(m, p, &mut |_| true).unwrap().ids
        })
        .collect();
    assert_eq!(alone[2], ids(&runs["two_images"]["greedy_ids"]));
    assert_ne!(
        alone[0], alone[1],
        "control: the sampled answer is not the greedy one"
    );
    let options = SchedulerOptions {
        parallel: 3,
        prefill_chunk: 4,
        drafts: 0,
    };
    let h = Scheduler::start(session_with(0, false), options).unwrap().0;
    let got: Vec<Vec<u32>> = std::thread::scope(|scope| {
        let threads: Vec<_> = convs
            .iter()
            .enumerate()
            .map(|(i, (m, p))| {
                let h = h.clone();
                scope.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(3 * i as u64));
                    h.generate(m, p, &mut |_| true).unwrap().ids
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(got, alone);
    // Again one after another: each prompt finds its earlier rows in a pooled cache (the
    // recurrent state kept after that prompt) and answers the same.
    let mut reused = 0;
    for ((m, p), want) in convs.iter().zip(&alone) {
        let g = h.generate(m, p, &mut |_| true).unwrap();
        assert_eq!(&g.ids, want);
        reused += g.reused_tokens;
    }
    assert!(reused > 0, "no prompt state was reused");
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(h.free_caches(), 3);
    // With draft windows (each rolls its recurrent state back to its kept rows): the greedy
    // answers are unchanged.
    let options = SchedulerOptions {
        drafts: 4,
        ..options
    };
    let h = Scheduler::start(session_with(0, false), options).unwrap().0;
    for ((m, p), want) in convs.iter().zip(&alone).step_by(2) {
        assert_eq!(p.temperature, 0.0);
        assert_eq!(&h.generate(m, p, &mut |_| true).unwrap().ids, want);
    }
}

/// `serve --parallel --drafts mtp`: each conversation's MTP head drafts from its own rows of the
/// shared forward. Six conversations (greedy and seeded sampled) submitted at once answer as each
/// does alone in the scheduler, greedy ones as transformers, and each proposes the very drafts it
/// proposes alone. Control: drafters reading the forward's first rows propose other drafts (the
/// greedy answers stay right: the model checks every draft).
#[test]
fn mtp_drafts_beside_each_other_are_each_conversations_own() {
    let runs = &answers()["runs"];
    let convs = greedy_and_sampled(&mut session_with(0, false));
    let start = |first_rows| mtp_scheduler(6, first_rows);
    let answer = |h: &engine::SchedulerHandle, (m, p): &(Vec<Message>, SamplingParams)| {
        h.generate(m, p, &mut |_| true).unwrap().ids
    };
    // Each conversation alone: its ids and its drafts (prompt ids, drafts proposed).
    let (alone, mut drafted): (Vec<_>, Vec<_>) = convs
        .iter()
        .map(|c| {
            let h = start(false);
            let ids = answer(&h, c);
            (ids, h.recorded_drafts().remove(0))
        })
        .unzip();
    drafted.sort();
    for (run, a) in ["text", "two_images"].iter().zip(alone.iter().step_by(2)) {
        assert_eq!(a, &ids(&runs[*run]["greedy_ids"]), "{run}");
    }
    assert!(drafted.iter().all(|(_, d)| !d.is_empty()), "no MTP drafts");
    // All six submitted at once: the answers, every conversation's drafts, and how many shared
    // a forward.
    let together = |first_rows| {
        let h = start(first_rows);
        let go = std::sync::Barrier::new(convs.len());
        let answers: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = convs
                .iter()
                .map(|c| {
                    let (h, go) = (h.clone(), &go);
                    scope.spawn(move || {
                        go.wait();
                        answer(&h, c)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut d = h.recorded_drafts();
        d.sort();
        (answers, d, h.most_at_once())
    };
    for _ in 0..3 {
        let (answers, d, _) = together(false);
        assert_eq!(answers, alone);
        assert_eq!(d, drafted, "the drafts beside others are not those alone");
    }
    // The control needs conversations side by side: a sequence alone reads its own rows.
    let (answers, wrong, _) = (0..5)
        .map(|_| together(true))
        .find(|(_, _, most)| *most >= 3)
        .expect("three conversations never shared a forward");
    for (w, a) in answers.iter().zip(&alone).step_by(2) {
        assert_eq!(w, a, "the model checks every draft");
    }
    assert_ne!(
        wrong, drafted,
        "drafters reading another's rows went unnoticed"
    );
}

/// `serve --parallel`: a Qwen3.5 prompt that starts as a running conversation copies the running
/// one's rows only up to a prompt state it kept (the DeltaNet state cannot be cut elsewhere):
/// the same two pictures and question again copy all but the last row, K/V and recurrent state,
/// and give transformers' ids; another question on the same pictures parts before that state
/// and is prefilled (nothing copied), with its answer alone.
#[test]
fn a_prompt_starting_as_a_running_one_copies_up_to_its_prompt_state() {
    use engine::{Scheduler, SchedulerOptions};
    let runs = &answers()["runs"];
    let mut s = session_with(0, false);
    let holder = messages(&mut s, &runs["two_images"]);
    let mut other = holder.clone();
    let last = other.last_mut().unwrap();
    *last.content.last_mut().unwrap() = Content::Text("Which colours are there?".into());
    let asks = [holder.clone(), other];
    let alone: Vec<Vec<u32>> = asks
        .iter()
        .map(|m| {
            s.reset();
            s.generate(m, &greedy(), &mut |_| true).unwrap().ids
        })
        .collect();
    assert_eq!(alone[0], ids(&runs["two_images"]["greedy_ids"]));
    let rows = s.prompt(&asks[0]).unwrap().rows();
    let options = SchedulerOptions {
        parallel: 2,
        prefill_chunk: 4,
        drafts: 0,
    };
    let mut copied = Vec::new();
    for (ask, want) in asks.iter().zip(&alone) {
        // A scheduler per ask: an earlier ask's finished cache would hold the prefix too.
        let h = Scheduler::start(session_with(0, false), options).unwrap().0;
        let got = crate::common::ask_beside(&h, &holder, (ask, &greedy()));
        assert_eq!(&got.ids, want);
        copied.push(got.timings.copied_tokens);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(h.free_caches(), 2);
    }
    assert_eq!(copied, vec![rows - 1, 0]);
}

/// Greedy ids after a text prompt on a Qwen3.5 pack, decoded in verified windows with up to
/// `drafts` MTP drafts per window (none: one row per forward), and how many drafts were proposed
/// and kept. With `keep_rejected`, a window whose draft was rejected keeps that row (the control).
fn greedy_with_mtp_drafts(
    pack: &Arc<packs::Pack>,
    prompt: &[u32],
    n: usize,
    drafts: usize,
    keep_rejected: bool,
) -> (Vec<u32>, usize, usize) {
    use decoder::{Decoder, DecoderOptions, HybridInputs, KvDtype, Logits};
    let runtime = compute::Runtime::host(2).unwrap();
    let capacity = 128;
    let mut f = Decoder::new(
        pack,
        &runtime,
        DecoderOptions {
            capacity,
            ..DecoderOptions::default()
        },
    )
    .unwrap();
    f.keep_last_hidden(true);
    let mut head = engine::mtp_drafts::MtpDrafter::new(&f, capacity, KvDtype::F32);
    let h = f.semantics().hidden_size;
    let vocab = f.semantics().vocab_size;
    let embeds = |f: &Decoder, ids: &[u32]| {
        let mut out = vec![0.0; ids.len() * h];
        for (row, &id) in out.chunks_exact_mut(h).zip(ids) {
            f.embed_row(id, row);
        }
        out
    };
    let argmax = |x: &[f32]| (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b }) as u32;
    let logits = f.step_batch(prompt, 0, 0, Logits::LastRow).unwrap();
    let mut ids = vec![argmax(logits)];
    let e = embeds(&f, prompt);
    head.ran(0, &f, &e, &HybridInputs::text(0), &[]);
    let (mut pos, mut proposed, mut kept_drafts) = (prompt.len() as i64, 0, 0);
    while ids.len() < n {
        let token = *ids.last().unwrap();
        let d = head.propose(&mut f, token, drafts).unwrap();
        proposed += d.len();
        let slot = f.next_slot();
        let mut rows = vec![token];
        rows.extend_from_slice(&d);
        let window = f
            .step_batch(&rows, pos, slot, Logits::AllRows)
            .unwrap()
            .to_vec();
        let e = embeds(&f, &rows);
        head.ran(slot, &f, &e, &HybridInputs::text(pos), &[]);
        // Row r's argmax follows rows[..=r]; the draft after it stands while it equals it.
        let mut r = 0;
        loop {
            let next = argmax(&window[r * vocab..(r + 1) * vocab]);
            ids.push(next);
            if r < d.len() && d[r] == next && ids.len() < n {
                r += 1;
                kept_drafts += 1;
            } else {
                break;
            }
        }
        let mut keep = slot + r + 1;
        if keep_rejected && keep < f.next_slot() {
            keep += 1;
        }
        if keep < f.next_slot() {
            assert_eq!(f.truncate(keep), keep);
            head.truncate(keep);
        }
        pos += (keep - slot) as i64;
    }
    ids.truncate(n);
    (ids, proposed, kept_drafts)
}

/// A Qwen3.5-MoE pack's MTP head (tests/fixtures/q35-moe-mtp: its layer's MLP routed) drafts for
/// verified windows: greedy ids with 1 and 3 drafts per window equal the ids without drafts.
/// Control: windows that keep a rejected draft's row give other ids.
#[test]
fn moe_mtp_drafts_leave_greedy_ids_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("q35-moe-mtp.pack");
    let checkpoint = fixtures().join("q35-moe-mtp/checkpoint");
    let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
    packs::build::build_from_hf(&checkpoint, &path, &opts).unwrap();
    let pack = Arc::new(packs::Pack::open(&path).unwrap());
    assert!(pack.semantics().moe.is_some() && pack.semantics().delta_net.as_ref().unwrap().mtp);
    let prompt = [3, 17, 42, 5, 99, 120, 7, 64, 11, 150, 31, 8];
    let n = 24;
    let (plain, proposed, _) = greedy_with_mtp_drafts(&pack, &prompt, n, 0, false);
    assert_eq!(proposed, 0);
    for drafts in [1, 3] {
        let (ids, proposed, kept) = greedy_with_mtp_drafts(&pack, &prompt, n, drafts, false);
        println!("{drafts} MTP drafts per window: {proposed} proposed, {kept} kept");
        assert!(proposed > 0, "the head proposed nothing");
        assert_eq!(ids, plain, "{drafts} drafts per window");
    }
    let (ids, _, _) = greedy_with_mtp_drafts(&pack, &prompt, n, 3, true);
    assert_ne!(ids, plain, "a kept rejected row went unnoticed");
}

/// A drafter that read one prompt and resumes at its kept prompt state for another prompt
/// starting the same way (`serve --drafts mtp` reusing a pooled cache, a chat's next turn) drafts
/// as one that read the other prompt whole: same drafts, same head output bits. The head's row
/// before the state read the old prompt's next embedding; it is run again from the kept row.
/// Control: without the kept row the resumed head keeps that stale row and its output differs.
#[test]
fn the_mtp_head_resumes_at_a_kept_prompt_state_as_if_it_read_the_prompt_whole() {
    use decoder::{Decoder, HybridInputs, KvDtype, Logits};
    use engine::mtp_drafts::MtpDrafter;
    let mut f = head_decoder();
    let h = f.semantics().hidden_size;
    let shared = [3u32, 17, 42, 5, 99, 120, 7];
    let r = shared.len();
    let first: Vec<u32> = [&shared[..], &[64, 11, 150, 31]].concat();
    let second: Vec<u32> = [&shared[..], &[8, 77, 23]].concat();
    let rows_of = |f: &mut Decoder, ids: &[u32]| {
        f.reset();
        f.step_batch(ids, 0, 0, Logits::LastRow).unwrap();
        let mut e = vec![0.0; ids.len() * h];
        for (row, &id) in e.chunks_exact_mut(h).zip(ids) {
            f.embed_row(id, row);
        }
        (f.last_hidden().to_vec(), e)
    };
    let (mut hidden1, embeds1) = rows_of(&mut f, &first);
    let (hidden2, embeds2) = rows_of(&mut f, &second);
    // The shared rows' hidden states as the second prompt's (the model's part is not under test).
    hidden1[..r * h].copy_from_slice(&hidden2[..r * h]);
    let (t1, t2, k) = (5u32, 9u32, 3);
    let text = HybridInputs::text;
    // Whole: the second prompt read at once.
    let mut whole = MtpDrafter::new(&f, 64, KvDtype::F32);
    whole.ran_rows(0, (&hidden2, &[]), &embeds2, &text(0));
    let want = whole.propose(&mut f, t2, k).unwrap();
    let want_out = f.mtp_hidden().to_vec();
    assert_eq!(want.len(), k);
    let resumed = |f: &mut Decoder, keep: bool| {
        let mut d = MtpDrafter::new(f, 64, KvDtype::F32);
        d.ran_rows(0, (&hidden1, &[]), &embeds1, &text(0));
        if keep {
            // The model's prompt state after the shared rows but the last one.
            d.keep_row_before(r);
        }
        d.propose(f, t1, k).unwrap();
        let resumes = d.resumes_at(r);
        d.ran_rows(
            r,
            (&hidden2[r * h..], &[]),
            &embeds2[r * h..],
            &text(r as i64),
        );
        let drafts = d.propose(f, t2, k).unwrap();
        (resumes, drafts, f.mtp_hidden().to_vec())
    };
    let (resumes, drafts, out) = resumed(&mut f, true);
    assert!(resumes);
    assert_eq!(drafts, want, "the resumed head's drafts");
    assert_eq!(out, want_out, "the resumed head's output row");
    let (resumes, _, stale) = resumed(&mut f, false);
    assert!(!resumes, "control: no kept row, no exact resume");
    assert_ne!(stale, want_out, "control: the stale row went unnoticed");
    // A copy of the first drafter's rows up to the state (a prompt copying a running one's rows)
    // drafts the same; before the head ran them (mid-prefill) as well as after.
    for run_first in [true, false] {
        let mut src = MtpDrafter::new(&f, 64, KvDtype::F32);
        src.ran_rows(0, (&hidden1, &[]), &embeds1, &text(0));
        src.keep_row_before(r);
        if run_first {
            src.propose(&mut f, t1, k).unwrap();
        }
        let mut copy = MtpDrafter::new(&f, 64, KvDtype::F32);
        assert!(copy.copy_prefix(&src, r));
        copy.ran_rows(
            r,
            (&hidden2[r * h..], &[]),
            &embeds2[r * h..],
            &text(r as i64),
        );
        assert_eq!(copy.propose(&mut f, t2, k).unwrap(), want);
        assert_eq!(f.mtp_hidden(), &want_out[..], "the copy's output row");
        if run_first {
            // Control: one row short of the state is no exact resume, and is refused.
            assert!(!copy.copy_prefix(&src, r - 1));
        }
    }
}

/// `serve --parallel --drafts mtp`: a chat's second turn reuses the first turn's pooled cache up
/// to its prompt state (the head's drafter travels with the cache and resumes there), gives
/// transformers' ids, and proposes the drafts it proposes when its whole history is prefilled in
/// a fresh scheduler. Control: the first turn's reuse is measured (nothing to reuse: 0 rows). The
/// drafts' ids on this tiny model do not tell a stale head row apart (tried): the head's exact
/// resume, bit for bit and with its control, is the drafter test above.
#[test]
fn mtp_drafts_in_serve_reuse_a_pooled_prompt_state() {
    let runs = &answers()["runs"];
    let mut s = session_with(0, false);
    let turn1 = messages(&mut s, &runs["chat_turn1"]);
    let turn2 = messages(&mut s, &runs["chat"]);
    let start = || mtp_scheduler(2, false);
    let h = start();
    let g1 = h.generate(&turn1, &greedy(), &mut |_| true).unwrap();
    assert_eq!(g1.ids, ids(&runs["chat_turn1"]["greedy_ids"]));
    assert_eq!(g1.reused_tokens, 0, "control: a first turn reuses nothing");
    let g2 = h.generate(&turn2, &greedy(), &mut |_| true).unwrap();
    assert_eq!(g2.ids, ids(&runs["chat"]["greedy_ids"]), "turn 2");
    let turn1_rows = runs["chat_turn1"]["prompt_rows"].as_u64().unwrap() as usize;
    assert_eq!(
        g2.reused_tokens,
        turn1_rows - 1,
        "turn 2 resumes at turn 1's state"
    );
    assert!(g2.timings.drafts_proposed > 0, "no MTP drafts in turn 2");
    let resumed = h.recorded_drafts().remove(1);
    let fresh = start();
    let g = fresh.generate(&turn2, &greedy(), &mut |_| true).unwrap();
    assert_eq!(g.reused_tokens, 0);
    assert_eq!(
        resumed,
        fresh.recorded_drafts().remove(0),
        "turn 2's drafts"
    );
}

/// `serve --parallel --drafts mtp`: a prompt starting as a running conversation's copies its rows
/// up to its prompt state with the head's rows (`MtpDrafter::copy_prefix`), gives transformers'
/// ids and proposes the drafts it proposes alone.
#[test]
fn mtp_drafts_copy_a_running_prompt_state_with_the_heads_rows() {
    let runs = &answers()["runs"];
    let mut s = session_with(0, false);
    let holder = messages(&mut s, &runs["two_images"]);
    let rows = s.prompt(&holder).unwrap().rows();
    let start = || mtp_scheduler(2, false);
    let alone = start();
    let want = alone.generate(&holder, &greedy(), &mut |_| true).unwrap();
    assert_eq!(want.ids, ids(&runs["two_images"]["greedy_ids"]));
    let h = start();
    let got = crate::common::ask_beside(&h, &holder, (&holder, &greedy()));
    assert_eq!(got.ids, want.ids);
    assert_eq!(
        got.timings.copied_tokens,
        rows - 1,
        "the running prompt's state copied"
    );
    // The ask finished first (the holder leaves after it).
    assert_eq!(
        h.recorded_drafts().remove(0),
        alone.recorded_drafts().remove(0),
        "the drafts after a copy"
    );
}

/// A scheduler of `parallel` conversations with 3 MTP drafts a window and prompt slices of 4 rows,
/// recording every conversation's drafts; with `mtp_reads_the_first_rows`, the planted mistake.
fn mtp_scheduler(parallel: usize, mtp_reads_the_first_rows: bool) -> engine::SchedulerHandle {
    use engine::{Scheduler, SchedulerAblation, SchedulerOptions};
    let options = SchedulerOptions {
        parallel,
        prefill_chunk: 4,
        drafts: 3,
    };
    let ablation = SchedulerAblation {
        mtp_reads_the_first_rows,
        record_drafts: true,
        ..SchedulerAblation::default()
    };
    Scheduler::start_ablated(session_with(3, true), options, ablation)
        .unwrap()
        .0
}

/// `propose_drafts` over asks of different lengths (as `serve` meets them: a window near the
/// context's end asks fewer, a constrained answer none) gives each ask the drafts it gets alone:
/// none for k 0, the first of them for k 1, all three for k 3, and a drafter with nothing to catch
/// up over none. Control: the chained drafts are not the first one repeated.
#[test]
fn mtp_drafts_for_asks_of_different_lengths_are_each_asks_own() {
    use decoder::{Decoder, HybridInputs, KvDtype, Logits};
    use engine::mtp_drafts::{propose_drafts, DraftAsk, MtpDrafter};
    let mut f = head_decoder();
    let h = f.semantics().hidden_size;
    let prompt = [3u32, 17, 42, 5, 99, 120, 7, 64];
    f.step_batch(&prompt, 0, 0, Logits::LastRow).unwrap();
    let hidden = f.last_hidden().to_vec();
    let mut embeds = vec![0.0; prompt.len() * h];
    for (row, &id) in embeds.chunks_exact_mut(h).zip(&prompt) {
        f.embed_row(id, row);
    }
    let read = |f: &Decoder| {
        let mut d = MtpDrafter::new(f, 64, KvDtype::F32);
        d.ran_rows(0, (&hidden, &[]), &embeds, &HybridInputs::text(0));
        d
    };
    let token = 9;
    let alone = read(&f).propose(&mut f, token, 3).unwrap();
    assert_eq!(alone.len(), 3);
    assert!(
        alone[1..].iter().any(|&d| d != alone[0]),
        "control: the chain repeats its first draft ({alone:?})"
    );
    let mut drafters: Vec<MtpDrafter> = (0..3).map(|_| read(&f)).collect();
    // The last one has nothing to catch up over: it has drafted already.
    drafters[2].propose(&mut f, token, 1).unwrap();
    let [a, b, c] = &mut drafters[..] else {
        unreachable!()
    };
    let mut asks = [
        DraftAsk {
            drafter: a,
            token,
            k: 0,
        },
        DraftAsk {
            drafter: b,
            token,
            k: 1,
        },
        DraftAsk {
            drafter: c,
            token,
            k: 3,
        },
    ];
    let got = propose_drafts(&mut f, &mut asks).unwrap();
    assert_eq!(got, vec![vec![], alone[..1].to_vec(), vec![]]);
    let mut fresh: Vec<MtpDrafter> = (0..2).map(|_| read(&f)).collect();
    let [a, b] = &mut fresh[..] else {
        unreachable!()
    };
    let mut asks = [
        DraftAsk {
            drafter: a,
            token,
            k: 3,
        },
        DraftAsk {
            drafter: b,
            token,
            k: 1,
        },
    ];
    let got = propose_drafts(&mut f, &mut asks).unwrap();
    assert_eq!(got, vec![alone.clone(), alone[..1].to_vec()]);
}

/// The Qwen3.5 fixture's decoder (64 slots, 2 threads) keeping every row's final hidden state,
/// as the MTP head reads them.
fn head_decoder() -> decoder::Decoder {
    let runtime = compute::Runtime::host(2).unwrap();
    let options = decoder::DecoderOptions {
        capacity: 64,
        ..decoder::DecoderOptions::default()
    };
    let mut f = decoder::Decoder::new(&pack(), &runtime, options).unwrap();
    f.keep_last_hidden(true);
    f
}
