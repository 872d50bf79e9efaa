//! A checkpoint as transformers 5 saves a fine-tune (tests/fixtures/t5-checkpoint: the image
//! processor nested in processor_config.json, no preprocessor_config.json): `packs build` then
//! `xdna-vl run` with a picture answers as transformers does (tools/t5_checkpoint.py's greedy ids),
//! and the comparison fails when the image processor's settings are not the checkpoint's.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::root;

fn fixture() -> PathBuf {
    root().join("tests/fixtures/t5-checkpoint")
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// The checkpoint at `dir` built into an f32 pack.
fn build(dir: &Path, out: &Path) -> packs::BuildReport {
    let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
    packs::build::build_from_hf(dir, out, &opts).unwrap()
}

/// `xdna-vl run PACK --image PICTURE --prompt PROMPT --greedy --json`: exit code, JSON, stderr.
fn run_about_the_picture(pack: &Path, case: &Value) -> (i32, Value, String) {
    let picture = fixture().join(case["picture"].as_str().unwrap());
    let steps = case["steps"].as_u64().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_xdna-vl"))
        .arg("run")
        .arg(pack)
        .arg("--image")
        .arg(&picture)
        .args(["--prompt", case["prompt"].as_str().unwrap()])
        .args(["--greedy", "--json", "--max-tokens", &steps])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn copy_checkpoint(to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(fixture().join("Qwen3-VL-t5")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn a_transformers_5_checkpoint_answers_about_a_picture_as_transformers() {
    let case = json_file(&fixture().join("case.json"));
    let answer = json_file(&fixture().join("answer.json"));
    let tmp = tempfile::tempdir().unwrap();
    let pack = tmp.path().join("t5-f32.pack");
    let report = build(&fixture().join("Qwen3-VL-t5"), &pack);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let (code, v, stderr) = run_about_the_picture(&pack, &case);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(ids(&v["ids"]), ids(&answer["answer"]["greedy_ids"]), "{v}");
    assert_eq!(v["text"], answer["answer"]["text"]);
    assert_eq!(v["finish"], "eos");
    assert_eq!(v["image_tokens"], case["image_tokens"]);
    assert_eq!(v["prompt_tokens"], case["prompt_tokens"]);
}

#[test]
fn other_image_processor_settings_change_the_answer_and_none_refuse_the_picture() {
    let case = json_file(&fixture().join("case.json"));
    let answer = json_file(&fixture().join("answer.json"));
    let tmp = tempfile::tempdir().unwrap();

    // Control: a top-level min_pixels in the nested image processor (transformers lets it replace
    // size.shortest_edge) set to transformers' class default, as a reader that missed the nested
    // size would take it: the picture keeps its size, fewer image tokens, another answer.
    let dir = tmp.path().join("planted");
    copy_checkpoint(&dir);
    let path = dir.join("processor_config.json");
    let mut c = json_file(&path);
    c["image_processor"]["min_pixels"] = packs::image_processor::DEFAULT_MIN_PIXELS.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    let pack = tmp.path().join("planted.pack");
    build(&dir, &pack);
    let (code, v, stderr) = run_about_the_picture(&pack, &case);
    assert_eq!(code, 0, "{stderr}");
    assert_ne!(v["image_tokens"], case["image_tokens"], "{v}");
    assert_ne!(ids(&v["ids"]), ids(&answer["answer"]["greedy_ids"]), "{v}");

    // Without processor_config.json the pack is text-only, and a picture is refused by name.
    let dir = tmp.path().join("no-processor");
    copy_checkpoint(&dir);
    std::fs::remove_file(dir.join("processor_config.json")).unwrap();
    let pack = tmp.path().join("text.pack");
    let report = build(&dir, &pack);
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("no processor_config.json")),
        "{:?}",
        report.warnings
    );
    let (code, _, stderr) = run_about_the_picture(&pack, &case);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("has no image preprocessing settings") && stderr.contains("picture-2.png"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
