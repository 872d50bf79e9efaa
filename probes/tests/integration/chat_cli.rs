//! hybrid_prompt_probe --tokenizer on the committed chat fixture (tests/fixtures/chat, made by
//! tools/test_chain.sh: a tiny random Qwen3-VL with a trained byte-level BPE tokenizer, its inputs
//! from tools/hybrid_input.py, and transformers' greedy ids and text in answer.json). The probe's ids
//! and text equal transformers', the answer stops at <|im_end|> (id taken from the tokenizer), and a
//! bad tokenizer is refused by name.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn chat() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat")
}

fn file(name: &str) -> String {
    chat().join(name).to_string_lossy().into_owned()
}

fn tokenizer() -> String {
    file("Qwen3-VL-tiny/tokenizer.json")
}

/// transformers' answer: greedy ids and text up to <|im_end|>, and all reference steps.
struct Expected {
    ids: Vec<u64>,
    text: String,
    all_ids: Vec<u64>,
    all_text: String,
    end_of_turn: u64,
}

fn expected() -> Expected {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(chat().join("answer.json")).unwrap())
            .unwrap();
    let ids = |x: &Value| -> Vec<u64> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    Expected {
        ids: ids(&v["answer"]["greedy_ids"]),
        text: v["answer"]["text"].as_str().unwrap().to_string(),
        all_ids: ids(&v["all"]["greedy_ids"]),
        all_text: v["all"]["text"].as_str().unwrap().to_string(),
        end_of_turn: v["end_of_turn_id"].as_u64().unwrap(),
    }
}

fn build_pack(dir: &Path) -> String {
    let out = dir.join("chat-f32.pack");
    let opts = packs::build::BuildOptions {
        mrope_section: None,
        ..packs::build::BuildOptions::new(packs::QuantKind::F32)
    };
    packs::build::build_from_hf(&chat().join("Qwen3-VL-tiny"), &out, &opts).unwrap();
    out.to_string_lossy().into_owned()
}

fn probe(pack: &str, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hybrid_prompt_probe"))
        .arg(pack)
        .arg(file("inputs.safetensors"))
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn ids_of(v: &Value) -> Vec<u64> {
    v["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn the_fixture_answer_ends_at_im_end_before_the_reference_does() {
    // What the other tests lean on: transformers' answer stops early, the reference goes on.
    let e = expected();
    assert_eq!(*e.ids.last().unwrap(), e.end_of_turn);
    assert!(e.ids.len() >= 3 && e.ids.len() < e.all_ids.len());
    assert_eq!(e.all_ids[..e.ids.len()], e.ids[..]);
    assert!(e.all_text.starts_with(&e.text) && e.all_text != e.text);
}

#[test]
fn against_the_reference_the_ids_and_text_equal_transformers_and_stop_at_im_end() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(dir.path());
    let e = expected();
    let (code, out, err) = probe(
        &pack,
        &[
            "--tokenizer",
            &tokenizer(),
            "--reference",
            &file("reference.safetensors"),
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    assert_eq!(v["pass"], true);
    assert_eq!(ids_of(&v), e.ids);
    assert_eq!(v["reference_greedy_ids"], v["greedy_ids"]);
    assert_eq!(v["answer"]["text"], e.text.as_str());
    assert_eq!(v["answer"]["reference_text"], e.text.as_str());
    assert_eq!(v["answer"]["stop"], "im_end");
    assert!(v["max_abs_logit_diff"].as_f64().unwrap() <= 1e-3);
    // The text-only control is still reported under "text".
    assert_eq!(v["text"]["top1_agreement"], 1.0);

    // Control: --decode N compares all N reference steps, past <|im_end|>.
    let n = e.all_ids.len().to_string();
    let (code, out, err) = probe(
        &pack,
        &[
            "--tokenizer",
            &tokenizer(),
            "--reference",
            &file("reference.safetensors"),
            "--decode",
            &n,
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    assert_eq!(ids_of(&v), e.all_ids);
    assert_eq!(v["answer"]["text"], e.all_text.as_str());
    assert_eq!(v["answer"]["stop"], "steps");
}

#[test]
fn free_running_the_answer_equals_transformers_and_streams() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(dir.path());
    let e = expected();
    let (code, out, err) = probe(&pack, &["--tokenizer", &tokenizer(), "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    assert_eq!(ids_of(&v), e.ids);
    assert_eq!(v["answer"]["text"], e.text.as_str());
    assert_eq!(v["answer"]["stop"], "im_end");

    // As text: the answer line holds exactly transformers' text.
    let (code, out, err) = probe(&pack, &["--tokenizer", &tokenizer()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("answer: {}\n", e.text)), "{out}");
    assert!(out.contains("stop: im_end"), "{out}");

    // Control: --decode N runs N steps, past <|im_end|>, with the text of all of them.
    let n = e.all_ids.len().to_string();
    let (code, out, _) = probe(
        &pack,
        &["--tokenizer", &tokenizer(), "--decode", &n, "--json"],
    );
    assert_eq!(code, 0);
    let v = json(&out);
    assert_eq!(ids_of(&v), e.all_ids);
    assert_eq!(v["answer"]["text"], e.all_text.as_str());
    assert_eq!(v["answer"]["stop"], "steps");

    // Control: without --tokenizer nothing stops the answer (the default 8 ids) and no text.
    let (code, out, _) = probe(&pack, &["--json"]);
    assert_eq!(code, 0);
    let v = json(&out);
    assert_eq!(ids_of(&v), e.all_ids[..8]);
    assert!(v.get("answer").is_none(), "{v}");
}

/// The fixture's tokenizer.json with `edit` applied, written into `dir`.
fn edited_tokenizer(dir: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> String {
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(tokenizer()).unwrap()).unwrap();
    edit(&mut v);
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    p.to_string_lossy().into_owned()
}

fn added_token<'a>(v: &'a mut Value, content: &str) -> &'a mut Value {
    v["added_tokens"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|t| t["content"] == content)
        .unwrap()
}

#[test]
fn the_stop_id_is_the_tokenizers_own() {
    // Planted: a tokenizer in which <|im_end|> and the answer's second token trade ids. The model
    // is unchanged, so its second token is now this tokenizer's end of turn: the answer stops there.
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(dir.path());
    let e = expected();
    let second = e.ids[1];
    let swapped = edited_tokenizer(dir.path(), "swapped.json", |v| {
        let vocab = v["model"]["vocab"].as_object_mut().unwrap();
        let word = vocab
            .iter()
            .find(|(_, id)| id.as_u64() == Some(second))
            .map(|(w, _)| w.clone())
            .unwrap();
        vocab.insert(word, e.end_of_turn.into());
        // A token in the model's vocabulary keeps its id when added (the added_tokens id is not
        // what `tokenizers` goes by).
        vocab.insert("<|im_end|>".into(), second.into());
        added_token(v, "<|im_end|>")["id"] = second.into();
    });
    let (code, out, err) = probe(&pack, &["--tokenizer", &swapped, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    assert_eq!(ids_of(&v), e.ids[..2]);
    assert_eq!(v["answer"]["stop"], "im_end");
}

#[test]
fn a_bad_tokenizer_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build_pack(dir.path());
    let missing = dir.path().join("none/tokenizer.json");
    let missing = missing.to_string_lossy();
    let (code, _, err) = probe(&pack, &["--tokenizer", &missing]);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("{missing}: cannot read the tokenizer")),
        "{err}"
    );

    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{\"model\": 3}").unwrap();
    let (code, _, err) = probe(&pack, &["--tokenizer", &garbage.to_string_lossy()]);
    assert_eq!(code, 2);
    assert!(err.contains("garbage.json: not a tokenizer.json"), "{err}");

    let no_end = edited_tokenizer(dir.path(), "no-end.json", |v| {
        added_token(v, "<|im_end|>")["content"] = "<|im_stop|>".into();
    });
    let (code, _, err) = probe(&pack, &["--tokenizer", &no_end]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no-end.json: has no <|im_end|> token"),
        "{err}"
    );

    // A tokenizer for the hub model: <|im_end|> at 151645, beyond the tiny pack's 512 rows.
    let hub_ids = edited_tokenizer(dir.path(), "hub-ids.json", |v| {
        v["model"]["vocab"]["<|im_end|>"] = 151645.into();
        added_token(v, "<|im_end|>")["id"] = 151645.into();
    });
    let (code, _, err) = probe(&pack, &["--tokenizer", &hub_ids]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "hub-ids.json: <|im_end|> is id 151645, outside the pack's vocabulary (0..512)"
        ),
        "{err}"
    );
}
