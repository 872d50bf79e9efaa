//! Verified draft windows: a greedy decode step feeding the sampled token and k drafts in one
//! forward keeps only the rows whose drafts the sampler confirms, so whatever the drafts (the
//! run's own continuation, all wrong, partly right, prompt lookup) the answer's ids and text and
//! the KV cache after it (slots, rows, rotary position, and the next turn's answer) are those of
//! the run without drafts. Control: a rollback that keeps one row too many is caught by the same
//! comparison.

use crate::common;

use common::*;
use decoder::kv::KvData;
use engine::{
    DraftAblation, Drafter, Event, Generation, Message, SamplingParams, Session, SessionOptions,
};

fn session(drafts: usize, ablation: DraftAblation) -> Session {
    let options = SessionOptions {
        context: 256,
        runtime: compute::RuntimeOptions::host(2),
        drafts,
        draft_ablation: ablation,
        ..SessionOptions::default()
    };
    let mut s = Session::new(&pack(), &assets(), &options).unwrap();
    s.set_image_encoder(Box::new(FixtureEncoder::default()));
    s
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ..SamplingParams::default()
    }
}

/// What the drafts are, given the answer of the run without drafts.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// The run's own continuation: every draft is accepted.
    Oracle,
    /// Every draft differs from the continuation.
    AllWrong,
    /// The first half of each window right, the rest wrong (and every third window all wrong).
    Partial,
}

struct Known {
    kind: Kind,
    prompt_len: usize,
    answer: Vec<u32>,
    windows: usize,
}

impl Drafter for Known {
    fn propose(&mut self, ids: &[u32], k: usize) -> Vec<u32> {
        // `ids` end with the token about to be fed: the answer's first `done` tokens.
        let done = ids.len() - self.prompt_len;
        let truth: Vec<u32> = self.answer[done.min(self.answer.len())..]
            .iter()
            .take(k)
            .copied()
            .collect();
        self.windows += 1;
        let wrong = |t: u32| if t == 0 { 1 } else { t - 1 };
        match self.kind {
            Kind::Oracle => truth,
            Kind::AllWrong => (0..k)
                .map(|i| truth.get(i).map_or(7, |&t| wrong(t)))
                .collect(),
            Kind::Partial => truth
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    if self.windows.is_multiple_of(3) || i >= k.div_ceil(2) {
                        wrong(t)
                    } else {
                        t
                    }
                })
                .collect(),
        }
    }
}

/// The filled KV rows (every layer, head, slot: K then V), the next slot and rotary position.
fn cache_state(s: &Session) -> (usize, i64, Vec<f32>) {
    let kv = s.forward().kv();
    let slots = kv.len();
    let KvData::F32(store) = &kv.data else {
        panic!("f32 cache")
    };
    let mut rows = Vec::new();
    for l in 0..kv.layers() {
        let layer = store.layer(l);
        for g in 0..store.kv_heads {
            rows.extend_from_slice(&layer.k_rows(g, slots));
            rows.extend_from_slice(layer.v_head(g, slots));
        }
    }
    (slots, s.next_rotary_pos(), rows)
}

fn generate(s: &mut Session, messages: &[Message], max_tokens: usize) -> (Generation, String) {
    generate_with(s, messages, &greedy(max_tokens))
}

fn generate_with(
    s: &mut Session,
    messages: &[Message],
    params: &SamplingParams,
) -> (Generation, String) {
    let mut streamed = String::new();
    let g = s
        .generate(messages, params, &mut |e| {
            if let Event::Text(t) = e {
                streamed.push_str(t)
            }
            true
        })
        .unwrap();
    (g, streamed)
}

/// One answer with drafts against the same without: ids, text, streamed text, the cache after
/// it, and a follow-up turn's answer and cache. `Err` names the first difference.
fn compare(
    messages: &[Message],
    max_tokens: usize,
    k: usize,
    kind: Option<Kind>,
    ablation: DraftAblation,
) -> Result<Generation, String> {
    compare_with(messages, &greedy(max_tokens), k, kind, ablation)
}

fn compare_with(
    messages: &[Message],
    params: &SamplingParams,
    k: usize,
    kind: Option<Kind>,
    ablation: DraftAblation,
) -> Result<Generation, String> {
    let mut plain = session(0, DraftAblation::default());
    let (want, want_streamed) = generate_with(&mut plain, messages, params);
    let mut drafted = session(k, ablation);
    if let Some(kind) = kind {
        drafted.set_drafter(Box::new(Known {
            kind,
            prompt_len: drafted.prompt(messages).unwrap().ids.len(),
            answer: want.ids.clone(),
            windows: 0,
        }));
    }
    let (got, got_streamed) = generate_with(&mut drafted, messages, params);
    if got.ids != want.ids {
        return Err(format!("ids {:?} != {:?}", got.ids, want.ids));
    }
    if got.text != want.text || got_streamed != want_streamed || got.finish != want.finish {
        return Err(format!("text {:?} != {:?}", got.text, want.text));
    }
    let (a, b) = (cache_state(&drafted), cache_state(&plain));
    if (a.0, a.1) != (b.0, b.1) {
        return Err(format!("slot, rotary {:?} != {:?}", (a.0, a.1), (b.0, b.1)));
    }
    if a.2
        .iter()
        .map(|x| x.to_bits())
        .ne(b.2.iter().map(|x| x.to_bits()))
    {
        return Err("KV rows differ".into());
    }
    // A second turn on both (the drafted session keeps its drafter: prompt lookup from here).
    drafted.set_drafter(Box::new(engine::PromptLookup::default()));
    let mut history = messages.to_vec();
    history.push(Message::assistant(want.text.clone()));
    history.push(Message::user(vec![], "Say it again, please."));
    let (want2, _) = generate_with(&mut plain, &history, params);
    let (got2, _) = generate_with(&mut drafted, &history, params);
    if got2.ids != want2.ids || got2.reused_tokens != want2.reused_tokens {
        return Err(format!(
            "second turn ids {:?} (reused {}) != {:?} (reused {})",
            got2.ids, got2.reused_tokens, want2.ids, want2.reused_tokens
        ));
    }
    if cache_state(&drafted) != cache_state(&plain) {
        return Err("second turn's cache differs".into());
    }
    Ok(got)
}

fn text_case() -> Vec<Message> {
    messages(&cases()["cases"]["text"])
}

fn two_images() -> Vec<Message> {
    messages(&cases()["cases"]["two_images"])
}

#[test]
fn oracle_drafts_are_all_accepted_and_change_nothing_in_fewer_forwards() {
    for (msgs, max) in [(text_case(), 40), (two_images(), 40)] {
        for k in [1, 4, 16] {
            let g = compare(&msgs, max, k, Some(Kind::Oracle), DraftAblation::default())
                .unwrap_or_else(|e| panic!("k {k}: {e}"));
            let t = &g.timings;
            assert!(t.decode_steps >= 4, "{t:?}");
            assert_eq!(
                t.drafts_accepted,
                t.decode_steps - t.decode_forwards,
                "{t:?}"
            );
            assert!(t.decode_forwards < t.decode_steps, "k {k}: {t:?}");
            if k == 4 {
                // Every forward but the last fed a full window: steps <= 5 per forward.
                assert!(t.decode_forwards <= t.decode_steps.div_ceil(5) + 1, "{t:?}");
            }
        }
    }
    // Control: without drafts each step is a forward.
    let mut s = session(0, DraftAblation::default());
    let (g, _) = generate(&mut s, &text_case(), 40);
    assert_eq!(g.timings.decode_forwards, g.timings.decode_steps);
    assert_eq!(g.timings.drafts_proposed, 0);
}

#[test]
fn wrong_and_partly_right_drafts_change_nothing() {
    for msgs in [text_case(), two_images()] {
        for k in [1, 3, 4] {
            for kind in [Kind::AllWrong, Kind::Partial] {
                let g = compare(&msgs, 40, k, Some(kind), DraftAblation::default())
                    .unwrap_or_else(|e| panic!("k {k} {kind:?}: {e}"));
                let t = &g.timings;
                assert!(t.drafts_proposed > 0, "{t:?}");
                match kind {
                    Kind::AllWrong => assert_eq!(t.drafts_accepted, 0, "{t:?}"),
                    // (With k = 1 a window's half is its one draft: right but every third.)
                    _ => assert!(
                        t.drafts_accepted > 0 && (k == 1 || t.drafts_accepted < t.drafts_proposed),
                        "{t:?}"
                    ),
                }
            }
        }
    }
}

#[test]
fn prompt_lookup_drafts_on_a_repeat_prompt_change_nothing() {
    let msgs = vec![Message::user(
        vec![],
        "Repeat this text exactly: the pack holds the weights, the pack holds the tokenizer, \
         the pack holds the chat template, and the pack holds the tower.",
    )];
    for k in [2, 4, 8] {
        let g = compare(&msgs, 48, k, None, DraftAblation::default())
            .unwrap_or_else(|e| panic!("k {k}: {e}"));
        assert!(g.timings.drafts_proposed > 0, "{:?}", g.timings);
        eprintln!("k {k}: {:?}", g.timings);
    }
}

/// Control: a rollback that keeps a rejected draft's row is caught by the same comparison.
#[test]
fn a_rollback_keeping_one_row_too_many_is_caught() {
    let bad = DraftAblation {
        keep_one_row_too_many: true,
    };
    for msgs in [text_case(), two_images()] {
        for kind in [Kind::AllWrong, Kind::Partial] {
            let caught = compare(&msgs, 40, 4, Some(kind), bad).unwrap_err();
            eprintln!("{kind:?}: {caught}");
        }
    }
}

/// Drafts that are always the same tokens.
struct Fixed;

impl Drafter for Fixed {
    fn propose(&mut self, _: &[u32], k: usize) -> Vec<u32> {
        vec![11; k]
    }
}

/// Sampled answers take drafts by the speculative acceptance rule (its distribution is checked
/// in `sampling::tests`): the same seed gives the same answer, drafts near the sampled text are
/// taken (fewer forwards than tokens), and the cache after the answer is the one a run without
/// drafts leaves for the same ids. Control: a drafter proposing a rare token gets nothing taken.
#[test]
fn sampled_answers_take_drafts_by_the_acceptance_rule() {
    // A sharp distribution: the greedy continuation is drafted and mostly taken.
    let params = SamplingParams {
        temperature: 0.05,
        seed: 3,
        max_tokens: 20,
        ..SamplingParams::default()
    };
    let msgs = text_case();
    let mut plain = session(0, DraftAblation::default());
    let want = plain.generate(&msgs, &greedy(20), &mut |_| true).unwrap();
    let prompt_len = plain.prompt(&msgs).unwrap().ids.len();
    let run = || {
        let mut s = session(4, DraftAblation::default());
        s.set_drafter(Box::new(Known {
            kind: Kind::Oracle,
            prompt_len,
            answer: want.ids.clone(),
            windows: 0,
        }));
        let g = s.generate(&msgs, &params, &mut |_| true).unwrap();
        (g, cache_state(&s))
    };
    let (a, state_a) = run();
    let (b, _) = run();
    assert_eq!(a.ids, b.ids, "the same seed, another answer");
    println!("{:?}", a.timings);
    assert!(a.timings.drafts_accepted > 0, "{:?}", a.timings);
    assert!(a.timings.decode_forwards < a.timings.decode_steps);
    // The cache holds exactly the prompt and the answer's fed ids (a rollback left nothing of
    // a rejected draft): the next slot is prompt + answer - 1 (the last id is never fed).
    assert_eq!(state_a.0, prompt_len + a.ids.len() - 1);
    // Control: drafts of a token the model gives little mass are (nearly) never taken.
    let mut s = session(4, DraftAblation::default());
    s.set_drafter(Box::new(Fixed));
    let g = s.generate(&msgs, &params, &mut |_| true).unwrap();
    assert!(g.timings.drafts_proposed > 0);
    assert!(
        g.timings.drafts_accepted * 4 < g.timings.drafts_proposed,
        "{:?}",
        g.timings
    );
}

/// Penalties on the answer so far (repetition, frequency, presence) see the same history with
/// drafts: the window's rows are sampled one by one in order. Control: the penalties change the
/// answer (so they are at work in the comparison).
#[test]
fn penalties_see_the_same_history_with_drafts() {
    let params = SamplingParams {
        repetition_penalty: 1.3,
        frequency_penalty: 0.5,
        presence_penalty: 0.4,
        ..greedy(40)
    };
    for msgs in [text_case(), two_images()] {
        for kind in [
            Some(Kind::Oracle),
            Some(Kind::Partial),
            Some(Kind::AllWrong),
            None,
        ] {
            let g = compare_with(&msgs, &params, 4, kind, DraftAblation::default())
                .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            if kind.is_some() {
                assert!(g.timings.drafts_proposed > 0, "{:?}", g.timings);
            }
        }
    }
    let mut s = session(0, DraftAblation::default());
    let (plain, _) = generate(&mut s, &text_case(), 40);
    let (penalised, _) = generate_with(&mut s, &text_case(), &params);
    assert_ne!(plain.ids, penalised.ids);
}
