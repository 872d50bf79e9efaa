//! `xdna-vl` run as a process: `run` (streamed and --json) equals transformers' greedy answer on
//! the tiny chat checkpoint, `chat` on piped stdin keeps the conversation (the second turn reuses
//! the first) and reports bad commands and pictures without stopping, and bad input exits 2 with
//! a message naming it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::{checkpoint, pack, root};

fn cases() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/engine/cases.json")).unwrap(),
    )
    .unwrap()
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn xdna_vl(args: &[&str], stdin: Option<&[u8]>, cache: Option<&Path>) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xdna-vl"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(c) = cache {
        cmd.env("XDG_CACHE_HOME", c);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `run PACK` plus `extra` (the pack carries the checkpoint's chat files).
fn run(extra: &[&str]) -> Out {
    let pack = pack().to_string_lossy().into_owned();
    let mut args = vec!["run", pack.as_str()];
    args.extend_from_slice(extra);
    xdna_vl(&args, None, None)
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// `--drafts 4` (and `--drafts off`) give the same answer as no drafts; 16 is taken (with a
/// template variable the tiny template does not read).
#[test]
fn run_with_drafts_gives_the_same_answer() {
    let want = &cases()["runs"]["text"];
    for drafts in ["4", "off", "16", "0"] {
        let o = run(&[
            "--prompt",
            "What is a pack?",
            "--max-tokens",
            "12",
            "--json",
            "--drafts",
            drafts,
            // The tiny Qwen3-VL template reads no such variable: the same prompt and answer.
            "--chat-template-kwargs",
            r#"{"enable_thinking": false}"#,
        ]);
        assert_eq!(o.code, 0, "--drafts {drafts}: {}", o.stderr);
        let v: Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!(
            ids(&v["ids"]),
            ids(&want["greedy_ids"]),
            "--drafts {drafts}"
        );
        assert_eq!(v["text"], want["answer"]);
        let t = &v["timings"];
        assert!(
            t["decode_forwards"].as_u64() <= t["decode_steps"].as_u64(),
            "{t}"
        );
        if drafts == "off" || drafts == "0" {
            assert_eq!(t["drafts_proposed"], 0, "{t}");
        }
    }
}

#[test]
fn run_json_gives_transformers_greedy_answer() {
    let want = &cases()["runs"]["text"];
    let o = run(&[
        "--prompt",
        "What is a pack?",
        "--max-tokens",
        "12",
        "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(ids(&v["ids"]), ids(&want["greedy_ids"]));
    assert_eq!(v["text"], want["answer"]);
    assert_eq!(v["finish"], "max_tokens");
    assert_eq!(v["prompt_tokens"], 25);
    for k in ["tower_ms", "prefill_tok_s", "decode_tok_s", "ttft_ms"] {
        assert!(v["timings"][k].is_number(), "{k}: {}", o.stdout);
    }
}

#[test]
fn run_streams_the_answer_then_one_timing_line() {
    let want = cases()["runs"]["text"]["answer"]
        .as_str()
        .unwrap()
        .to_string();
    let o = run(&["--prompt", "What is a pack?", "--max-tokens", "12"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, want + "\n");
    let timing: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("prompt "))
        .collect();
    assert_eq!(timing.len(), 1, "{}", o.stderr);
    for part in [
        "prompt 25 tokens",
        "0 image",
        "tower",
        "prefill",
        "decode",
        "TTFT",
        "finish max_tokens",
    ] {
        assert!(timing[0].contains(part), "{part}: {}", timing[0]);
    }
}

#[test]
fn a_seed_gives_the_same_sampled_answer_twice() {
    let args = [
        "--prompt",
        "What is a pack?",
        "--max-tokens",
        "16",
        "--temperature",
        "1.5",
        "--json",
    ];
    let a = run(&[&args[..], &["--seed", "5"]].concat());
    let b = run(&[&args[..], &["--seed", "5"]].concat());
    let c = run(&[&args[..], &["--seed", "6"]].concat());
    let id = |o: &Out| serde_json::from_str::<Value>(&o.stdout).unwrap()["ids"].clone();
    assert_eq!(id(&a), id(&b));
    // Control: another seed, another answer.
    assert_ne!(id(&a), id(&c));
}

#[test]
fn chat_on_piped_stdin_keeps_the_conversation_and_survives_bad_lines() {
    let pack = pack().to_string_lossy().into_owned();
    let input = b"What is a pack?\n/bogus\n/image /no/such/picture.png\n\xff\xfe\nTell me more.\n/reset\nWhat is a pack?\n/exit\nnever read\n";
    let o = xdna_vl(
        &["chat", pack.as_str(), "--max-tokens", "12"],
        Some(input),
        None,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let answers: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(answers.len(), 3, "{}", o.stdout);
    let first = cases()["runs"]["text"]["answer"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(answers[0], first);
    // After /reset the same question gives the same answer again.
    assert_eq!(answers[2], first);
    assert!(
        o.stderr.contains("error: unknown command /bogus"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.contains("/no/such/picture.png: no such file"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("not UTF-8"), "{}", o.stderr);
    let timings: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("prompt "))
        .collect();
    assert_eq!(timings.len(), 3, "{}", o.stderr);
    // The second turn reused the first from the cache; the turn after /reset reused nothing.
    assert!(!timings[1].contains(" 0 reused"), "{}", timings[1]);
    assert!(timings[2].contains(" 0 reused"), "{}", timings[2]);
    assert!(!o.stdout.contains("never read"));
}

#[test]
fn the_bundled_model_answers_a_text_question_with_no_pack_given() {
    let cache = tempfile::tempdir().unwrap();
    let o = xdna_vl(
        &[
            "run",
            "--prompt",
            "What is a pack?",
            "--max-tokens",
            "12",
            "--json",
        ],
        None,
        Some(cache.path()),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(cache
        .path()
        .join("xdna-vl/qwen3-vl-tiny-f32.pack")
        .is_file());
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(ids(&v["ids"]), ids(&cases()["runs"]["text"]["greedy_ids"]));
}

fn refused(o: &Out, needle: &str) {
    assert_eq!(o.code, 2, "stdout {} stderr {}", o.stdout, o.stderr);
    assert!(o.stderr.contains(needle), "{needle:?} not in {}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
}

#[test]
fn bad_input_is_refused_by_name_with_status_2() {
    refused(
        &xdna_vl(&["run", "/no/such.pack", "--prompt", "hi"], None, None),
        "/no/such.pack: no such pack file",
    );
    refused(
        &run(&["--prompt", "hi", "--gemm", "fpga"]),
        "invalid value 'fpga'",
    );
    refused(
        &run(&["--prompt", "What is a pack?", "--ctx", "10"]),
        "25 tokens, over the context of 10",
    );
    refused(&run(&["--prompt", "  "]), "the prompt is empty");
    refused(
        &run(&["--prompt", "hi", "--image", "/no/such.png"]),
        "/no/such.png: no such file",
    );
    refused(
        &run(&["--prompt", "hi", "--temperature=-1"]),
        "temperature -1",
    );
    refused(&run(&["--prompt", "hi", "--gemm", "device"]), "--designs");
    refused(&run(&["--prompt", "hi", "--drafts", "17"]), "--drafts 17");
    refused(
        &run(&["--prompt", "hi", "--drafts", "many"]),
        "--drafts many",
    );
    refused(
        &xdna_vl(&["chat", "/no/such.pack", "--drafts=-1"], None, None),
        "--drafts -1: must be a number of draft tokens in 0..=16, mtp, mtp:N (1..=16) or off",
    );
    refused(
        &run(&["--prompt", "hi", "--drafts", "mtp:0"]),
        "--drafts mtp:0",
    );
    // The bundled Qwen3-VL pack has no MTP head: refused by name, not decoded without drafts.
    refused(
        &run(&["--prompt", "hi", "--drafts", "mtp"]),
        "has no MTP head",
    );
    refused(
        &xdna_vl(&["serve", "/no/such.pack", "--drafts", "99"], None, None),
        "--drafts 99",
    );
    // Accepted only where it applies: prompt-lookup drafts have no head to restrict.
    refused(
        &run(&["--prompt", "hi", "--drafts", "4", "--draft-vocab", "100"]),
        "--draft-vocab: applies to the MTP head's drafts only",
    );
    for bad in ["0", "lots", "-5"] {
        refused(
            &xdna_vl(
                &["chat", "/no/such.pack", &format!("--draft-vocab={bad}")],
                None,
                None,
            ),
            &format!("--draft-vocab {bad}: must be a positive number of token ids"),
        );
    }
    refused(
        &run(&["--prompt", "hi", "--chat-template-kwargs", "[1]"]),
        "--chat-template-kwargs [1]: must be a JSON object",
    );
    refused(
        &run(&[
            "--prompt",
            "hi",
            "--chat-template-kwargs",
            "{enable_thinking: false}",
        ]),
        "--chat-template-kwargs {enable_thinking: false}: not JSON",
    );
    refused(
        &run(&[
            "--prompt",
            "hi",
            "--chat-template-kwargs",
            r#"{"tools": []}"#,
        ]),
        "the extra template variable \"tools\"",
    );
    refused(
        &xdna_vl(
            &["serve", "--chat-template-kwargs", r#"{"messages": 1}"#],
            None,
            None,
        ),
        "--chat-template-kwargs: chat template: the extra template variable \"messages\"",
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("q.txt");
    std::fs::write(&bad, b"caf\xe9?").unwrap();
    refused(
        &run(&["--prompt-file", bad.to_str().unwrap()]),
        "q.txt: not UTF-8 text (invalid byte at offset 3)",
    );
    // A pack built from a checkpoint without tokenizer.json: rebuild with packs build (or --assets).
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    ] {
        std::fs::copy(checkpoint().join(f), bare.join(f)).unwrap();
    }
    let bare_pack = dir.path().join("bare.pack");
    let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
    packs::build::build_from_hf(&bare, &bare_pack, &opts).unwrap();
    let bare_pack = bare_pack.to_string_lossy().into_owned();
    refused(
        &xdna_vl(&["run", &bare_pack, "--prompt", "hi"], None, None),
        "has no tokenizer.json — rebuild the pack with `packs build`",
    );
    // Control: the same pack with the checkpoint's chat files given answers.
    let ck = checkpoint().to_string_lossy().into_owned();
    let args = [
        "run",
        &bare_pack,
        "--assets",
        &ck,
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
    ];
    let o = xdna_vl(&args, None, None);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let args = [
        "run",
        &bare_pack,
        "--assets",
        "/no/such/dir",
        "--prompt",
        "hi",
    ];
    refused(
        &xdna_vl(&args, None, None),
        "--assets /no/such/dir: no such directory",
    );
}

#[test]
fn help_explains_each_flag_with_an_example() {
    let o = xdna_vl(&["run", "--help"], None, None);
    assert_eq!(o.code, 0);
    for flag in [
        "--prompt",
        "--image",
        "--system",
        "--json",
        "--gemm",
        "--runtime",
        "--designs",
        "--threads",
        "--ctx",
        "--temperature",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--seed",
        "--max-tokens",
        "--stop",
    ] {
        assert!(o.stdout.contains(flag), "{flag} missing from --help");
    }
    assert!(o.stdout.matches("Example:").count() >= 15, "{}", o.stdout);
}

fn emu_library() -> String {
    let path = npu_sys::emu_library().unwrap_or_else(|e| panic!("{e}"));
    path.to_string_lossy().into_owned()
}

#[test]
fn gemm_ab_and_device_on_the_software_npu_answer_as_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("chat-i8.pack");
    let opts = packs::build::BuildOptions::new(packs::QuantKind::I8);
    packs::build::build_from_hf(&checkpoint(), &pack, &opts).unwrap();
    let designs = dir.path().join("designs");
    // Designs for the decoder's linears and the tower's (the session makes both resident).
    let plan = npu_sys::plan::plan_pack(&packs::Pack::open(&pack).unwrap()).unwrap();
    npu_sys::designs::write_emu_designs(&designs, &plan.geometries()).unwrap();
    let pack = pack.to_string_lossy().into_owned();
    let designs = designs.to_string_lossy().into_owned();
    let emu = emu_library();
    let answer = |gemm: &str| {
        let args = [
            "run",
            &pack,
            "--prompt",
            "What is a pack?",
            "--max-tokens",
            "8",
            "--json",
            "--gemm",
            gemm,
            "--runtime",
            &emu,
            "--designs",
            &designs,
        ];
        let o = xdna_vl(&args, None, None);
        assert_eq!(o.code, 0, "{gemm}: {}", o.stderr);
        serde_json::from_str::<Value>(&o.stdout).unwrap()
    };
    let host = answer("host");
    let ab = answer("ab");
    assert!(ab["ab"]["gemms"].as_u64().unwrap() > 0, "{ab}");
    assert_eq!(ab["ab"]["differing_gemms"], 0, "{ab}");
    assert_eq!(ab["ids"], host["ids"]);
    assert_eq!(answer("device")["ids"], host["ids"]);
}

#[test]
fn a_system_message_opens_the_prompt() {
    // The "system" fixture case: the same messages rendered and tokenized by transformers.
    let case = &cases()["cases"]["system"];
    let o = run(&[
        "--system",
        "You are a terse assistant.",
        "--prompt",
        "Say hello.",
        "--max-tokens",
        "1",
        "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["prompt_tokens"], case["ids"].as_array().unwrap().len());
    // Control: without it the prompt is shorter.
    let o = run(&["--prompt", "Say hello.", "--max-tokens", "1", "--json"]);
    let w: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(w["prompt_tokens"].as_u64() < v["prompt_tokens"].as_u64());
}

#[test]
fn a_prompt_argument_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(env!("CARGO_BIN_EXE_xdna-vl"))
        .arg("run")
        .arg(pack())
        .arg("--prompt")
        .arg(std::ffi::OsStr::from_bytes(b"caf\xe9"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid UTF-8"), "{err}");
}

#[test]
fn run_with_no_arguments_answers_the_bundled_picture_question_as_transformers() {
    // tests/fixtures/chat/answer.json: transformers' greedy answer to "Describe these pictures."
    // about picture-1.png and picture-2.png, up to <|im_end|>.
    let answer: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/chat/answer.json")).unwrap(),
    )
    .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let o = xdna_vl(&["run", "--json"], None, Some(cache.path()));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(ids(&v["ids"]), ids(&answer["answer"]["greedy_ids"]));
    assert_eq!(v["text"], answer["answer"]["text"]);
    assert_eq!(v["image_tokens"], 10);
    assert_eq!(v["finish"], "eos");
    // Streamed: the same text, then the timing line naming the image tokens and the tower.
    let o = xdna_vl(&["run"], None, Some(cache.path()));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        o.stdout,
        format!("{}\n", answer["answer"]["text"].as_str().unwrap())
    );
    assert!(
        o.stderr.contains("prompt 39 tokens (10 image"),
        "{}",
        o.stderr
    );
}

/// `xdna-vl chat` (with `extra` flags) on the chat fixture's two turns: a picture and a
/// question, then a follow-up.
fn chat_two_turns_with_a_picture(extra: &[&str]) -> Out {
    let pack = pack().to_string_lossy().into_owned();
    let picture = root().join("tests/fixtures/chat/picture-1.png");
    let input = format!(
        "/image {}\nWhat is this?\nAnd the colours?\n",
        picture.display()
    );
    let args = [&["chat", pack.as_str(), "--max-tokens", "12"], extra].concat();
    let o = xdna_vl(&args, Some(input.as_bytes()), None);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o
}

#[test]
fn chat_attaches_a_picture_and_the_second_turn_equals_transformers_on_the_whole_history() {
    let runs = &cases()["runs"];
    let o = chat_two_turns_with_a_picture(&[]);
    assert!(
        o.stderr
            .contains("attached to the next message: 4 image tokens"),
        "{}",
        o.stderr
    );
    let answers: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(answers[0], runs["chat_turn1"]["answer"].as_str().unwrap());
    assert_eq!(answers[1], runs["chat"]["answer"].as_str().unwrap());
    let timings: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("prompt "))
        .collect();
    assert!(timings[0].contains("(4 image, 0 reused)"), "{}", timings[0]);
    assert!(!timings[1].contains(" 0 reused"), "{}", timings[1]);
    assert!(timings[1].contains("tower 0.0 ms"), "{}", timings[1]);
}

/// `chat --json`: one JSON line per answer, whose ids are transformers' greedy ids of each turn
/// (the whole history for the second). Control: the two turns' ids differ, so a line printed for
/// the wrong turn is caught.
#[test]
fn chat_json_prints_each_answers_ids() {
    let runs = &cases()["runs"];
    let o = chat_two_turns_with_a_picture(&["--json"]);
    let lines: Vec<Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 2, "{}", o.stdout);
    let want = |case: &str| -> Vec<u64> {
        let ids = runs[case]["greedy_ids"].as_array().unwrap();
        ids.iter().take(12).map(|v| v.as_u64().unwrap()).collect()
    };
    let got = |i: usize| -> Vec<u64> {
        let ids = lines[i]["ids"].as_array().unwrap();
        ids.iter().map(|v| v.as_u64().unwrap()).collect()
    };
    let n0 = got(0).len();
    assert_eq!(got(0), want("chat_turn1")[..n0]);
    assert_eq!(got(1), want("chat")[..got(1).len()]);
    assert_eq!(lines[0]["text"], runs["chat_turn1"]["answer"]);
    assert_eq!(lines[0]["image_tokens"], 4);
    assert!(lines[1]["reused_tokens"].as_u64().unwrap() > 0);
    assert_ne!(got(0), got(1), "control: the turns' answers differ");
    // No timing lines: the JSON carries them.
    assert!(
        !o.stderr.lines().any(|l| l.starts_with("prompt ")),
        "{}",
        o.stderr
    );
}

#[test]
fn an_unreadable_picture_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("not-a-picture.png");
    std::fs::write(&bad, b"this is text").unwrap();
    let o = run(&["--prompt", "hi", "--image", bad.to_str().unwrap()]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("not-a-picture.png"), "{}", o.stderr);
    assert!(!o.stderr.contains("panicked"));
}

#[test]
fn a_bf16_kv_cache_is_chosen_by_flag() {
    let o = run(&[
        "--prompt",
        "What is a pack?",
        "--max-tokens",
        "4",
        "--kv",
        "bf16",
        "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["ids"].as_array().unwrap().len(), 4);
    refused(
        &run(&["--prompt", "hi", "--kv", "f16"]),
        "invalid value 'f16'",
    );
}

/// A Qwen3.5 pack (tests/fixtures/chat-qwen3_5) through the same commands: `run` with two
/// pictures gives transformers' greedy ids, with and without the MTP head's drafts (among all
/// ids, or the first 100 only).
#[test]
fn run_on_a_qwen3_5_pack_gives_transformers_answer() {
    let fx = root().join("tests/fixtures/chat-qwen3_5");
    let answers: Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("answer.json")).unwrap()).unwrap();
    let want = &answers["runs"]["two_images"];
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("q35.pack");
    let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
    packs::build::build_from_hf(&fx.join("Qwen3.5-tiny"), &pack, &opts).unwrap();
    let (p1, p2) = (fx.join("picture-1.png"), fx.join("picture-2.png"));
    for (drafts, vocab) in [
        ("off", None),
        ("mtp", None),
        ("mtp:2", Some("all")),
        ("mtp", Some("100")),
    ] {
        let mut args = vec![
            "run",
            pack.to_str().unwrap(),
            "--image",
            p1.to_str().unwrap(),
            "--image",
            p2.to_str().unwrap(),
            "--prompt",
            "Describe these pictures.",
            "--max-tokens",
            "12",
            "--json",
            "--drafts",
            drafts,
        ];
        if let Some(v) = vocab {
            args.extend(["--draft-vocab", v]);
        }
        let o = xdna_vl(&args, None, None);
        assert_eq!(o.code, 0, "--drafts {drafts}: {}", o.stderr);
        let v: Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!(
            ids(&v["ids"]),
            ids(&want["greedy_ids"]),
            "--drafts {drafts}"
        );
        if drafts != "off" {
            assert!(v["timings"]["drafts_proposed"].as_u64() > Some(0), "{v}");
        }
    }
}
