//! tests/c/chat_run.c: the chat entry from C asks the bundled tiny checkpoint (built into an f32
//! pack) about its two pictures, by path, and gets transformers' greedy answer (tests/fixtures/
//! engine/cases.json, run "two_images": ids 482 472 252 357 500, "anksson\u{FFFD}ud"), streamed and
//! in its buffer; bad arguments come back as status codes naming what was wrong.

use crate::common;

use common::Link;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

fn chat_dir() -> PathBuf {
    common::crate_dir().join("../tests/fixtures/chat")
}

/// transformers' greedy answer to the two pictures and "Describe these pictures.".
const TRANSFORMERS_ANSWER: &str = "anksson\u{FFFD}ud";

fn build_pack(dir: &Path) -> PathBuf {
    let out = dir.join("chat-f32.pack");
    let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
    packs::build::build_from_hf(&chat_dir().join("Qwen3-VL-tiny"), &out, &opts).unwrap();
    out
}

/// Runs chat_run.c; returns its "answer" line and the whole stdout.
fn ask(exe: &Path, pack: &Path, missing: &Path, pictures: &[&str]) -> (String, String) {
    let pictures: Vec<PathBuf> = pictures.iter().map(|p| chat_dir().join(p)).collect();
    let mut args: Vec<&OsStr> = vec![
        pack.as_os_str(),
        OsStr::new("Describe these pictures."),
        missing.as_os_str(),
    ];
    args.extend(pictures.iter().map(|p| p.as_os_str()));
    let out = common::run(exe, &args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let line = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("chat_run printed no {key:?}:\n{stdout}"))
            .to_string()
    };
    let answer = line("answer ");
    assert_eq!(line("streamed "), answer, "streamed pieces vs buffer");
    assert_eq!(
        line("needed ").parse::<usize>().unwrap(),
        answer.len() + 1,
        "reported size"
    );
    let checks: usize = line("ok ").trim_end_matches(" checks").parse().unwrap();
    assert!(checks >= 40, "only {checks} checks ran:\n{stdout}");
    (answer, stdout)
}

#[test]
fn c_asks_about_two_pictures_by_path_and_gets_transformers_answer() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(dir.path());
    let missing = dir.path().join("no-such-picture.png");
    for link in [Link::Dynamic, Link::Static] {
        let exe = common::compile("chat_run.c", dir.path(), link);
        let (answer, stdout) = ask(&exe, &pack, &missing, &["picture-1.png", "picture-2.png"]);
        println!("{link:?}:\n{stdout}");
        assert_eq!(answer, TRANSFORMERS_ANSWER, "{link:?}");
        // The callback stopped after its first piece: a strict prefix of the answer.
        let stopped = stdout
            .lines()
            .find_map(|l| l.strip_prefix("stopped "))
            .unwrap();
        assert!(
            !stopped.is_empty()
                && TRANSFORMERS_ANSWER.starts_with(stopped)
                && stopped != TRANSFORMERS_ANSWER
        );
    }
    // Control: the pictures matter — the first picture alone gets another answer.
    let exe = common::compile("chat_run.c", dir.path(), Link::Dynamic);
    let (one, _) = ask(&exe, &pack, &missing, &["picture-1.png"]);
    assert_ne!(one, TRANSFORMERS_ANSWER, "one picture answered like two");
}

/// The same C program on a Qwen3.5 pack (the tiny hybrid checkpoint of
/// tests/fixtures/chat-qwen3_5): the pack says the family, the C side does not change, and the
/// answer is transformers' (its answer.json, run "two_images"). Control: one picture answers
/// otherwise.
#[test]
fn c_asks_a_qwen3_5_pack_about_two_pictures_and_gets_transformers_answer() {
    let fixture = common::crate_dir().join("../tests/fixtures/chat-qwen3_5");
    let answers: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("answer.json")).unwrap())
            .unwrap();
    let run = &answers["runs"]["two_images"];
    assert_eq!(
        run["messages"][0]["content"][2]["text"],
        "Describe these pictures."
    );
    let want = run["answer"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("qwen3_5-f32.pack");
    let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
    packs::build::build_from_hf(&fixture.join("Qwen3.5-tiny"), &pack, &opts).unwrap();
    let missing = dir.path().join("no-such-picture.png");
    let exe = common::compile("chat_run.c", dir.path(), Link::Dynamic);
    let ask = |pictures: &[&str]| {
        let pictures: Vec<PathBuf> = pictures.iter().map(|p| fixture.join(p)).collect();
        let mut args: Vec<&OsStr> = vec![
            pack.as_os_str(),
            OsStr::new("Describe these pictures."),
            missing.as_os_str(),
        ];
        args.extend(pictures.iter().map(|p| p.as_os_str()));
        let out = common::run(&exe, &args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("answer "))
            .unwrap_or_else(|| panic!("chat_run printed no answer:\n{stdout}"))
            .to_string()
    };
    assert_eq!(ask(&["picture-1.png", "picture-2.png"]), want);
    assert_ne!(
        ask(&["picture-1.png"]),
        want,
        "one picture answered like two"
    );
}
