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

fn session(drafts: usize) -> Session {
    let options = SessionOptions {
        context: 256,
        runtime: compute::RuntimeOptions::host(2),
        drafts,
        ..SessionOptions::default()
    };
    let assets = ChatAssets::from_dir(&dir().join("Qwen3.5-tiny")).unwrap();
    Session::new(&pack(), &assets, &options).unwrap()
}

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

fn answer_of(s: &mut Session, run: &str) -> Vec<u32> {
    let run = &answers()["runs"][run];
    let msgs = messages(s, run);
    s.generate(&msgs, &greedy(), &mut |_| true).unwrap().ids
}

#[test]
fn text_and_two_pictures_give_transformers_greedy_ids() {
    let runs = &answers()["runs"];
    for drafts in [0, 4] {
        let mut s = session(drafts);
        for run in ["text", "two_images"] {
            assert_eq!(
                answer_of(&mut s, run),
                ids(&runs[run]["greedy_ids"]),
                "{run} (drafts {drafts})"
            );
        }
    }
}

#[test]
fn a_second_chat_turn_on_the_whole_history_gives_transformers_ids() {
    let runs = &answers()["runs"];
    for drafts in [0, 4] {
        let mut s = session(drafts);
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
        // The recurrent state after turn 1's prompt was kept: turn 2 resumes there (the picture
        // is in it, so the tower does not run), not from nothing.
        let turn1_rows = runs["chat_turn1"]["prompt_rows"].as_u64().unwrap() as usize;
        assert_eq!(g2.reused_tokens, turn1_rows, "drafts {drafts}");
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
