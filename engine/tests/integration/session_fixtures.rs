//! The session on the tiny chat checkpoint built into an f32 pack, against transformers'
//! `generate(do_sample=False)`: a text question, the two-picture question (image rows from
//! transformers' tower, tests/fixtures/engine/images.safetensors), and a chat whose second turn
//! reuses the cached first turn and equals transformers run on the whole history.

use crate::common;

use common::*;
use engine::{Event, FinishReason, Message, SamplingParams, Session, SessionOptions};

fn session() -> Session {
    session_with(FixtureEncoder::default())
}

fn session_with(encoder: FixtureEncoder) -> Session {
    let options = SessionOptions {
        context: 256,
        runtime: compute::RuntimeOptions::host(2),
        ..SessionOptions::default()
    };
    let mut s = Session::new(&pack(), &assets(), &options).unwrap();
    s.set_image_encoder(Box::new(encoder));
    s
}

fn greedy() -> SamplingParams {
    SamplingParams {
        max_tokens: cases()["max_new_tokens"].as_u64().unwrap() as usize,
        ..SamplingParams::default()
    }
}

fn run(case: &str) -> (Vec<u32>, String, engine::Generation) {
    let mut s = session();
    let mut streamed = String::new();
    let g = s
        .generate(&messages(&cases()["cases"][case]), &greedy(), &mut |e| {
            if let Event::Text(t) = e {
                streamed.push_str(t)
            }
            true
        })
        .unwrap();
    (g.ids.clone(), streamed, g)
}

#[test]
fn greedy_text_answer_equals_transformers() {
    let want = &cases()["runs"]["text"];
    let (ids_got, streamed, g) = run("text");
    assert_eq!(ids_got, ids(&want["greedy_ids"]));
    assert_eq!(g.text, want["answer"].as_str().unwrap());
    assert_eq!(streamed, g.text, "the streamed pieces add up to the answer");
    assert_eq!(g.finish, FinishReason::MaxTokens);
    assert_eq!(g.image_tokens, 0);
}

#[test]
fn greedy_two_picture_answer_equals_transformers() {
    let want = &cases()["runs"]["two_images"];
    let (ids_got, streamed, g) = run("two_images");
    assert_eq!(ids_got, ids(&want["greedy_ids"]));
    assert_eq!(g.text, want["answer"].as_str().unwrap());
    assert_eq!(streamed, g.text);
    assert_eq!(g.finish, FinishReason::Eos(500));
    assert_eq!(g.image_tokens, 10);
    assert_eq!(g.prompt_tokens, 39);
}

#[test]
fn a_second_chat_turn_reuses_the_first_and_equals_transformers_on_the_whole_history() {
    let runs = &cases()["runs"];
    let mut s = session();
    let turn1 = messages(&runs["chat_turn1"]);
    let g1 = s
        .chat(turn1.into_iter().next().unwrap(), &greedy(), &mut |_| true)
        .unwrap();
    assert_eq!(g1.ids, ids(&runs["chat_turn1"]["greedy_ids"]));
    assert_eq!(g1.text, runs["chat_turn1"]["answer"].as_str().unwrap());
    let cached_after_turn1 = s.next_slot();
    let g2 = s
        .chat(
            Message::user(vec![], "And the colours?"),
            &greedy(),
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(g2.ids, ids(&runs["chat"]["greedy_ids"]));
    assert_eq!(g2.text, runs["chat"]["answer"].as_str().unwrap());
    // The whole history's prompt is the "chat" case; the first turn's rows came from the cache
    // (up to where the re-rendered answer first tokenizes differently from the generated ids).
    assert_eq!(
        g2.prompt_tokens,
        ids(&cases()["cases"]["chat"]["ids"]).len()
    );
    assert!(g2.reused_tokens >= 24, "reused {} rows", g2.reused_tokens);
    assert!(g2.reused_tokens <= cached_after_turn1);
    assert_eq!(
        g2.reused_tokens + g2.timings.prefilled_tokens,
        g2.prompt_tokens
    );
    assert_eq!(s.history().len(), 4);
}

#[test]
fn a_fresh_session_on_the_whole_history_gives_the_same_second_turn() {
    // The same answer with nothing reused: prefix reuse changes the work, not the result.
    let (ids_got, _, g) = run("chat");
    assert_eq!(g.reused_tokens, 0);
    assert_eq!(ids_got, ids(&cases()["runs"]["chat"]["greedy_ids"]));
}

#[test]
fn a_changed_picture_is_not_reused_from_the_cache() {
    let encoder = FixtureEncoder::default();
    let mut s = session_with(encoder.clone());
    let ask = |img: engine::Image| vec![Message::user(vec![img], "What is this?")];
    s.generate(&ask(image("picture-1.png")), &greedy(), &mut |_| true)
        .unwrap();
    assert_eq!(encoder.encoded(), 1);
    // The same picture again: everything but the last row comes from the cache, no tower run.
    let again = s
        .generate(&ask(image("picture-1.png")), &greedy(), &mut |_| true)
        .unwrap();
    assert_eq!(again.reused_tokens, again.prompt_tokens - 1);
    assert_eq!(encoder.encoded(), 1);
    // Same grid, same ids, one pixel changed: the cache is reused only up to the picture's
    // first row and the picture is encoded again.
    let mut other = picture("picture-1.png").patches.clone();
    other.values[0] += 1.0;
    let changed = engine::Image::new("picture-1-changed", other);
    let first_image_row = s.prompt(&ask(changed.clone())).unwrap().images[0]
        .span
        .first_row;
    let g = s.generate(&ask(changed), &greedy(), &mut |_| true).unwrap();
    assert_eq!(g.reused_tokens, first_image_row);
    assert_eq!(encoder.encoded(), 2);
}

#[test]
fn a_stop_string_ends_the_answer_before_it() {
    let want = cases()["runs"]["text"]["answer"].as_str().unwrap();
    let mut s = session();
    let params = SamplingParams {
        stop: vec!["oks".into()],
        ..greedy()
    };
    let mut streamed = String::new();
    let g = s
        .generate(&messages(&cases()["cases"]["text"]), &params, &mut |e| {
            if let Event::Text(t) = e {
                streamed.push_str(t)
            }
            true
        })
        .unwrap();
    assert_eq!(g.finish, FinishReason::Stop("oks".into()));
    assert_eq!(g.text, want.strip_suffix("oks").unwrap());
    assert_eq!(streamed, g.text);
}

#[test]
fn a_full_context_ends_the_answer_and_an_oversized_prompt_is_refused() {
    let options = |context| SessionOptions {
        context,
        runtime: compute::RuntimeOptions::host(1),
        ..SessionOptions::default()
    };
    let text = messages(&cases()["cases"]["text"]);
    // 25 prompt rows in 27 slots: two tokens are fed, the third sampled, then the cache is full.
    let mut s = Session::new(&pack(), &assets(), &options(27)).unwrap();
    let g = s.generate(&text, &greedy(), &mut |_| true).unwrap();
    assert_eq!(g.finish, FinishReason::ContextFull);
    assert_eq!(
        g.ids,
        ids(&cases()["runs"]["text"]["greedy_ids"])[..3].to_vec()
    );
    assert_eq!(s.next_slot(), 27);
    let mut s = Session::new(&pack(), &assets(), &options(24)).unwrap();
    let e = s
        .generate(&text, &greedy(), &mut |_| true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the prompt is 25 tokens, over the context of 24 tokens"),
        "{e}"
    );
}

#[test]
fn the_session_keeps_the_slot_and_rotary_position_after_an_image() {
    let mut s = session();
    let case = &cases()["cases"]["two_images"];
    let g = s
        .generate(&messages(case), &greedy(), &mut |_| true)
        .unwrap();
    // Prompt rows + the tokens fed (all but the last sampled one).
    let fed = g.ids.len() - 1;
    assert_eq!(s.next_slot(), 39 + fed);
    // Rotary position = slot + rope delta (-5 for this prompt): smaller than the slot.
    assert_eq!(
        s.next_rotary_pos(),
        (39 + fed) as i64 + case["rope_delta"].as_i64().unwrap()
    );
}

#[test]
fn the_pack_carries_the_checkpoints_chat_files() {
    let from_pack = engine::assets::from_pack(&pack()).unwrap();
    let from_dir = assets();
    assert_eq!(from_pack.tokenizer_json, from_dir.tokenizer_json);
    assert_eq!(from_pack.chat_template, from_dir.chat_template);
    assert_eq!(from_pack.tokenizer_config, from_dir.tokenizer_config);
    // And a session opened from the pack alone answers as transformers does.
    let options = SessionOptions {
        context: 64,
        runtime: compute::RuntimeOptions::host(1),
        ..SessionOptions::default()
    };
    let mut s = Session::open(pack_path(), None, &options).unwrap();
    let g = s
        .generate(&messages(&cases()["cases"]["text"]), &greedy(), &mut |_| {
            true
        })
        .unwrap();
    assert_eq!(g.ids, ids(&cases()["runs"]["text"]["greedy_ids"]));
}

#[test]
fn a_false_from_the_callback_cancels_at_the_next_token() {
    let mut s = session();
    let mut started = None;
    let mut pieces = 0;
    let g = s
        .generate(
            &messages(&cases()["cases"]["text"]),
            &greedy(),
            &mut |e| match e {
                Event::Started { prompt_tokens, .. } => {
                    started = Some(prompt_tokens);
                    true
                }
                Event::Text(_) => {
                    pieces += 1;
                    false
                }
            },
        )
        .unwrap();
    assert_eq!(started, Some(25));
    assert_eq!(pieces, 1);
    assert_eq!(g.finish, FinishReason::Cancelled);
    assert_eq!(g.ids.len(), 1, "nothing decoded after the cancel");
    // The session goes on: the next answer is transformers' again.
    let again = s
        .generate(&messages(&cases()["cases"]["text"]), &greedy(), &mut |_| {
            true
        })
        .unwrap();
    assert_eq!(again.ids, ids(&cases()["runs"]["text"]["greedy_ids"]));
}
