//! The scheduler answers several conversations at once, each exactly as a session answers it
//! alone: pictures (the Rust tower), a system turn, a multi-turn chat, greedy and seeded
//! sampling, started at different moments so prompts prefill (in 4-row slices) between the
//! others' decode rows. Clients that go away at random moments cost the others nothing, and the
//! pool gets every cache back. Controls: a different seed changes a sampled answer; the alone
//! answers are transformers' where the fixture has its ids.

use crate::common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use engine::{
    Event, FinishReason, Message, SamplingParams, Scheduler, SchedulerAblation, SchedulerHandle,
    SchedulerOptions,
};

fn greedy() -> SamplingParams {
    SamplingParams {
        max_tokens: 12,
        ..SamplingParams::default()
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        max_tokens: 12,
        temperature: 0.9,
        top_k: 40,
        seed,
        ..SamplingParams::default()
    }
}

/// Every fixture conversation, greedy and sampled.
fn conversations() -> Vec<(String, Vec<Message>, SamplingParams)> {
    let mut out = Vec::new();
    for name in ["text", "one_image", "two_images", "system", "chat"] {
        let m = messages(&cases()["cases"][name]);
        out.push((format!("{name} greedy"), m.clone(), greedy()));
        out.push((format!("{name} sampled"), m, sampled(7)));
    }
    out
}

/// (ids, text) of each conversation answered alone by a fresh session.
fn alone(convs: &[(String, Vec<Message>, SamplingParams)]) -> Vec<(Vec<u32>, String)> {
    let mut s = tower_session();
    convs
        .iter()
        .map(|(_, m, p)| {
            s.reset();
            let g = s.generate(m, p, &mut |_| true).unwrap();
            (g.ids, g.text)
        })
        .collect()
}

fn start(parallel: usize) -> SchedulerHandle {
    let options = SchedulerOptions {
        parallel,
        prefill_chunk: 4,
        drafts: 0,
    };
    Scheduler::start(tower_session(), options).unwrap().0
}

/// Answers every conversation on its own thread, thread i starting `i * stagger` ms late.
fn together(
    h: &SchedulerHandle,
    convs: &[(String, Vec<Message>, SamplingParams)],
    stagger: u64,
) -> Vec<(Vec<u32>, String)> {
    let barrier = Arc::new(Barrier::new(convs.len()));
    std::thread::scope(|scope| {
        let threads: Vec<_> = convs
            .iter()
            .enumerate()
            .map(|(i, (_, m, p))| {
                let (h, barrier) = (h.clone(), barrier.clone());
                scope.spawn(move || {
                    barrier.wait();
                    std::thread::sleep(Duration::from_millis(i as u64 * stagger));
                    let g = h.generate(m, p, &mut |_| true).unwrap();
                    (g.ids, g.text)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn every_conversation_beside_others_is_its_answer_alone() {
    let convs = conversations();
    let want = alone(&convs);
    // Anchors: the alone answers are transformers' where the fixture has them.
    let runs = &cases()["runs"];
    assert_eq!(want[0].0, ids(&runs["text"]["greedy_ids"]));
    assert_eq!(want[4].0, ids(&runs["two_images"]["greedy_ids"]));
    // Control: the seed matters (a sampled answer is not the greedy one by accident).
    assert_ne!(want[0].0, want[1].0, "text: sampled equals greedy");
    let h = start(3);
    for stagger in [0, 7] {
        let got = together(&h, &convs, stagger);
        for ((name, _, _), (w, g)) in convs.iter().zip(want.iter().zip(&got)) {
            assert_eq!(w, g, "{name} (stagger {stagger} ms)");
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.free_caches(), 3, "every cache back in the pool");
    assert_eq!(
        h.most_at_once(),
        3,
        "the forwards ran three conversations at once"
    );
}

/// The answer, or (`leave_after` = Some(n)) the client leaving after n pieces of text (at the
/// start for 0).
fn answer_or_leave(
    h: &SchedulerHandle,
    m: &[Message],
    p: &SamplingParams,
    leave_after: Option<usize>,
) -> engine::Generation {
    let mut pieces = 0;
    h.generate(m, p, &mut |e| match (e, leave_after) {
        (Event::Text(_), Some(n)) => {
            pieces += 1;
            pieces <= n
        }
        (Event::Started { .. }, Some(0)) => false,
        _ => true,
    })
    .unwrap()
}

#[test]
fn clients_that_leave_cost_the_others_nothing() {
    let convs = conversations();
    let want = alone(&convs);
    let h = start(4);
    // Round 1: every other client leaves after a few pieces of text (0..3, by index), or at the
    // start; the rest must still get their alone answers.
    let barrier = Arc::new(Barrier::new(convs.len()));
    let outcomes: Vec<Option<(Vec<u32>, String)>> = std::thread::scope(|scope| {
        let threads: Vec<_> = convs
            .iter()
            .enumerate()
            .map(|(i, (_, m, p))| {
                let (h, barrier) = (h.clone(), barrier.clone());
                scope.spawn(move || {
                    barrier.wait();
                    std::thread::sleep(Duration::from_millis((i as u64 * 5) % 17));
                    let leave_after = (i % 2 == 1).then_some(i % 4);
                    let g = answer_or_leave(&h, m, p, leave_after);
                    match leave_after {
                        Some(_) => {
                            assert_eq!(g.finish, FinishReason::Cancelled, "client {i}");
                            None
                        }
                        None => Some((g.ids, g.text)),
                    }
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (i, o) in outcomes.iter().enumerate() {
        if let Some(got) = o {
            assert_eq!(got, &want[i], "{} beside leaving clients", convs[i].0);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.free_caches(), 4, "the pool has all its caches back");
    // Round 2: afterwards every answer is still its alone answer.
    let got = together(&h, &convs, 3);
    assert_eq!(got, want);
}

/// A finished conversation's rows stay in its cache: a later prompt that starts the same way (the
/// same picture, the same question again) reuses them, and its answer is its answer alone. The
/// reuse is measured (`reused_tokens`) so the check cannot pass by prefilling everything.
#[test]
fn a_later_prompt_reuses_a_finished_conversations_rows_and_answers_the_same() {
    let names = ["one_image", "one_image", "chat", "two_images", "text"];
    let convs: Vec<(String, Vec<Message>, SamplingParams)> = names
        .iter()
        .map(|n| (n.to_string(), messages(&cases()["cases"][*n]), greedy()))
        .collect();
    let want = alone(&convs);
    let h = start(2);
    let mut reused = Vec::new();
    for ((name, m, p), (w, _)) in convs.iter().zip(&want) {
        let g = h.generate(m, p, &mut |_| true).unwrap();
        assert_eq!(&g.ids, w, "{name}");
        reused.push(g.reused_tokens);
    }
    println!("reused rows: {reused:?}");
    // "one_image" again reuses all but the last row of its prompt; "chat" starts with the
    // picture "one_image" showed.
    let one_image_rows = PromptBuilderRows::rows(&convs[0].1);
    assert_eq!(reused[1], one_image_rows - 1, "{reused:?}");
    assert!(reused[2] > 0, "{reused:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.free_caches(), 2);
}

/// The prompt rows of a conversation, as a session builds them.
struct PromptBuilderRows;

impl PromptBuilderRows {
    fn rows(m: &[Message]) -> usize {
        tower_session().prompt(m).unwrap().rows()
    }
}

/// A picture another request sent a moment ago is not encoded again (the tower's rows are kept
/// by the picture's identity), here behind a different prefix, so the cached rows are used, not a
/// pooled cache's: the answer is its answer alone and the tower's time is zero. Control: a new
/// picture runs the tower.
#[test]
fn a_picture_seen_a_moment_ago_is_not_encoded_again() {
    let first = messages(&cases()["cases"]["one_image"]);
    let mut again = vec![Message::system("You are a terse assistant.".to_string())];
    again.extend(first.iter().cloned());
    let two = messages(&cases()["cases"]["two_images"]);
    let want = alone(&[
        ("again".into(), again.clone(), greedy()),
        ("two".into(), two.clone(), greedy()),
    ]);
    let h = start(1);
    let g = h.generate(&first, &greedy(), &mut |_| true).unwrap();
    assert!(
        g.timings.tower > Duration::ZERO,
        "the first request runs the tower"
    );
    let g = h.generate(&again, &greedy(), &mut |_| true).unwrap();
    assert_eq!(g.ids, want[0].0);
    // Another prefix: the pooled rows end long before the picture (`<|im_start|>` at most).
    assert!(g.reused_tokens <= 1, "{}", g.reused_tokens);
    assert_eq!(
        g.timings.tower,
        Duration::ZERO,
        "picture-1 was encoded again"
    );
    // Control: picture-2 is new (picture-1's rows are reused beside it).
    let g = h.generate(&two, &greedy(), &mut |_| true).unwrap();
    assert_eq!(g.ids, want[1].0);
    assert!(g.timings.tower > Duration::ZERO);
}

/// Draft windows in the scheduler (`serve --parallel N --drafts K`): each sequence's window rows
/// share the forward with the others' rows, and every answer is what a session with the same
/// drafts gives alone (greedy: the ids without drafts too; sampled: the same draws, since the
/// windows and the acceptance rule are the session's). Drafts were taken: fewer forwards.
#[test]
fn draft_windows_beside_others_answer_as_a_session_with_drafts() {
    let convs = conversations();
    let plain = alone(&convs);
    let mut s = tower_session();
    s.set_drafts(4);
    let with_drafts: Vec<(Vec<u32>, String)> = convs
        .iter()
        .map(|(_, m, p)| {
            s.reset();
            let g = s.generate(m, p, &mut |_| true).unwrap();
            (g.ids, g.text)
        })
        .collect();
    for (((name, _, p), a), b) in convs.iter().zip(&plain).zip(&with_drafts) {
        if p.temperature == 0.0 {
            assert_eq!(a, b, "{name}: greedy ids changed by drafts");
        }
    }
    let options = SchedulerOptions {
        parallel: 3,
        prefill_chunk: 4,
        drafts: 4,
    };
    let h = Scheduler::start(tower_session(), options).unwrap().0;
    let got = together(&h, &convs, 3);
    for ((name, _, _), (w, g)) in convs.iter().zip(with_drafts.iter().zip(&got)) {
        assert_eq!(w, g, "{name}");
    }
    // Prompt lookup on the repeat-prone tiny model: some drafts were taken.
    let g = h.generate(&convs[0].1, &greedy(), &mut |_| true).unwrap();
    println!("{:?}", g.timings);
    assert!(g.timings.drafts_proposed > 0, "{:?}", g.timings);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.free_caches(), 3);
}

/// Load for a bounded time across 8 streams: rounds of every conversation at once, each client
/// starting and leaving at seeded random moments (half stay to the end), and one client per round
/// whose prompt does not fit the context (refused by name, beside the others). Afterwards the pool
/// has all its caches back and every answer is still its answer alone. Controls: clients did leave
/// and the refusal did happen in every round, and the forwards did run many conversations at once
/// (so the claim was exercised, not passed by running them one by one).
#[test]
fn clients_dropped_at_random_moments_across_8_streams_cost_the_others_nothing() {
    const PARALLEL: usize = 8;
    let convs = conversations();
    let want = alone(&convs);
    let h = start(PARALLEL);
    // A prompt longer than the 256-token context.
    let too_long = vec![Message::new(
        engine::Role::User,
        vec![engine::Content::Text("many words ".repeat(400))],
    )];
    let mut rng = 0x5eed_0034_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let t0 = std::time::Instant::now();
    let (mut rounds, mut left) = (0, 0);
    while rounds < 2 || (t0.elapsed() < Duration::from_secs(2) && rounds < 8) {
        // Per client: start delay (ms) and when it leaves (None: stays; Some(n): after n pieces).
        let plan: Vec<(u64, Option<usize>)> = (0..convs.len())
            .map(|_| (next(4), (next(2) == 0).then(|| next(4) as usize)))
            .collect();
        let barrier = Arc::new(Barrier::new(convs.len() + 1));
        let (outcomes, refused) = std::thread::scope(|scope| {
            let threads: Vec<_> = convs
                .iter()
                .zip(&plan)
                .map(|((_, m, p), &(delay, leave_after))| {
                    let (h, barrier) = (h.clone(), barrier.clone());
                    scope.spawn(move || {
                        barrier.wait();
                        std::thread::sleep(Duration::from_millis(delay));
                        let g = answer_or_leave(&h, m, p, leave_after);
                        (leave_after, g.finish, g.ids, g.text)
                    })
                })
                .collect();
            let (h2, too_long, barrier) = (h.clone(), &too_long, barrier.clone());
            let failing = scope.spawn(move || {
                barrier.wait();
                std::thread::sleep(Duration::from_millis(5));
                h2.generate(too_long, &greedy(), &mut |_| true)
            });
            let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            (outcomes, failing.join().unwrap())
        });
        let err = refused.expect_err("a prompt past the context is refused");
        assert!(
            err.to_string().contains("context"),
            "the refusal names the context: {err}"
        );
        for (i, (leave_after, finish, ids, text)) in outcomes.into_iter().enumerate() {
            match leave_after {
                Some(_) if finish == FinishReason::Cancelled => left += 1,
                // A client that meant to leave after more pieces than its answer had stays.
                _ => assert_eq!(
                    (&ids, &text),
                    (&want[i].0, &want[i].1),
                    "{} beside leaving clients (round {rounds})",
                    convs[i].0
                ),
            }
        }
        rounds += 1;
    }
    eprintln!(
        "{rounds} rounds, {left} clients left, at most {} at once",
        h.most_at_once()
    );
    assert!(
        left >= rounds,
        "clients left in every round ({left} in {rounds} rounds)"
    );
    // 8 in every run here (load 6-8); 6 leaves room for a slow machine's start-up spread.
    assert!(
        h.most_at_once() >= 6,
        "the forwards ran at most {} conversations at once",
        h.most_at_once()
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        h.free_caches(),
        PARALLEL,
        "the pool has all its caches back"
    );
    // Afterwards every answer is still its answer alone.
    assert_eq!(together(&h, &convs, 3), want);
}

/// A named conversation with its sampling.
type Conversation = (String, Vec<Message>, SamplingParams);

/// Prompts that start as a running conversation does: the same picture and question again, the
/// same system prompt and picture with another question, the same system prompt alone.
fn sharing_conversations() -> (Vec<Message>, Vec<Conversation>) {
    let system = Message::system("You are a terse assistant.");
    let picture = || image("picture-1.png");
    let holder = vec![
        system.clone(),
        Message::user(vec![picture()], "What is in this picture?"),
    ];
    let asks = vec![
        ("the same".to_string(), holder.clone(), greedy()),
        (
            "another question".to_string(),
            vec![
                system.clone(),
                Message::user(vec![picture()], "Which colours are there?"),
            ],
            greedy(),
        ),
        (
            "the system prompt".to_string(),
            vec![system, Message::user(vec![], "Say hello.")],
            greedy(),
        ),
    ];
    (holder, asks)
}

/// Each of `asks` answered by a new scheduler of two sequences while `holder` is being answered
/// beside it (on its own scheduler: an earlier ask's finished cache would hold the prefix too):
/// (ids, text, prompt rows copied from a running sequence).
fn asked_beside_a_running_one(
    ablation: SchedulerAblation,
    holder: &[Message],
    asks: &[(String, Vec<Message>, SamplingParams)],
) -> Vec<(Vec<u32>, String, usize)> {
    let options = SchedulerOptions {
        parallel: 2,
        prefill_chunk: 4,
        drafts: 0,
    };
    asks.iter()
        .map(|ask| {
            let h = Scheduler::start_ablated(tower_session(), options, ablation)
                .unwrap()
                .0;
            let g = ask_beside(&h, holder, (&ask.1, &ask.2));
            let got = (g.ids, g.text, g.timings.copied_tokens);
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(h.free_caches(), 2, "every cache back in the pool");
            got
        })
        .collect()
}

/// A prompt that starts as a running conversation does copies the running one's rows (K/V
/// slots, the picture's rows by its hash) instead of prefilling them, and its answer is its
/// answer alone. The copies are counted (`copied_tokens`: the same prompt copies all but its
/// last row), so the check cannot pass by prefilling. Control: a copy one row short (the last
/// copied slot keeps what the cache held) changes an answer.
#[test]
fn a_prompt_starting_as_a_running_one_copies_its_rows_and_answers_the_same() {
    let (holder, asks) = sharing_conversations();
    let want = alone(&asks);
    let rows: Vec<usize> = asks
        .iter()
        .map(|(_, m, _)| PromptBuilderRows::rows(m))
        .collect();
    let got = asked_beside_a_running_one(SchedulerAblation::default(), &holder, &asks);
    let copied: Vec<usize> = got.iter().map(|g| g.2).collect();
    println!("prompt rows {rows:?}, copied {copied:?}");
    for ((name, _, _), ((w, wt), (g, gt, _))) in asks.iter().zip(want.iter().zip(&got)) {
        assert_eq!((w, wt), (g, gt), "{name}");
    }
    assert_eq!(
        copied[0],
        rows[0] - 1,
        "the same prompt: all but its last row"
    );
    // Past the system turn and the picture; only the system turn.
    assert!(copied[1] > 20 && copied[1] < rows[1] - 1, "{copied:?}");
    assert!(copied[2] > 5 && copied[2] < rows[2] - 1, "{copied:?}");

    // Control: the same asks with copies one row short.
    let ablation = SchedulerAblation {
        copy_one_row_short: true,
        ..SchedulerAblation::default()
    };
    let short = asked_beside_a_running_one(ablation, &holder, &asks);
    let caught: Vec<&str> = asks
        .iter()
        .zip(want.iter().zip(&short))
        .filter(|(_, (w, s))| w.0 != s.0)
        .map(|((name, _, _), _)| name.as_str())
        .collect();
    println!("a copy one row short changed: {caught:?}");
    assert!(!caught.is_empty(), "a copy one row short went unnoticed");
}

/// (ids, text, prompt rows prefilled) of `copies` clients sending `ask` at the same moment to a
/// scheduler that prefills one row per step (so the first prompt is still prefilling when the
/// others arrive).
fn asked_together(
    ablation: SchedulerAblation,
    ask: &Conversation,
    copies: usize,
) -> Vec<(Vec<u32>, String, usize)> {
    let options = SchedulerOptions {
        parallel: copies,
        prefill_chunk: 1,
        drafts: 0,
    };
    let h = Scheduler::start_ablated(tower_session(), options, ablation)
        .unwrap()
        .0;
    let barrier = Arc::new(Barrier::new(copies));
    let got = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..copies)
            .map(|_| {
                let (h, barrier) = (h.clone(), barrier.clone());
                scope.spawn(move || {
                    barrier.wait();
                    let g = h.generate(&ask.1, &ask.2, &mut |_| true).unwrap();
                    (g.ids, g.text, g.timings.prefilled_tokens)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.free_caches(), copies, "every cache back in the pool");
    got
}

/// The same picture and question from three clients at the same moment: one prefills the
/// prompt, the other two wait for its rows and copy them (each prefills only the last row, which
/// a prompt always computes), and every answer is the answer alone. Control: admitted at once
/// without the wait, the others prefill the shared rows beside the first (more than one row each
/// in some round).
#[test]
fn prompts_arriving_together_prefill_their_shared_rows_once() {
    let (_, asks) = sharing_conversations();
    let ask = &asks[0];
    let want = alone(std::slice::from_ref(ask)).remove(0);
    let rows = PromptBuilderRows::rows(&ask.1);
    let got = asked_together(SchedulerAblation::default(), ask, 3);
    let mut prefilled: Vec<usize> = got.iter().map(|g| g.2).collect();
    prefilled.sort();
    println!("prompt rows {rows}, prefilled {prefilled:?}");
    for g in &got {
        assert_eq!((&g.0, &g.1), (&want.0, &want.1));
    }
    assert_eq!(prefilled, [1, 1, rows], "one prefill, two copies");

    // Control: without the wait (arrival is a race, so up to 3 rounds).
    let ablation = SchedulerAblation {
        no_prefix_wait: true,
        ..SchedulerAblation::default()
    };
    let caught = (0..3).any(|_| {
        let got = asked_together(ablation, ask, 3);
        for g in &got {
            assert_eq!((&g.0, &g.1), (&want.0, &want.1), "answers never change");
        }
        got.iter().filter(|g| g.2 > 1).count() > 1
    });
    assert!(
        caught,
        "prompts admitted at once never prefilled beside each other"
    );
}
