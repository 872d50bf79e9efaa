//! mrope_planes_probe run as a process: random packs with and without MRoPE, and bad files.

use packs::random::{write_random, RandomShape};
use packs::QuantKind;
use std::path::Path;
use std::process::Command;

fn probe(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mrope_planes_probe"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tiny(dir: &Path, mrope: bool, quant: QuantKind) -> String {
    let mut shape = RandomShape::tiny();
    if !mrope {
        shape.semantics.architecture = "qwen3".into();
        shape.semantics.mrope = false;
        shape.semantics.mrope_section = None;
        shape.semantics.mrope_interleaved = false;
        shape.semantics.deepstack_sets = 0;
    }
    let path = dir.join(format!("tiny-{mrope}-{quant}.pack"));
    write_random(&shape, quant, 3, &path).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn every_arm_passes_on_an_interleaved_pack_in_json() {
    let dir = tempfile::tempdir().unwrap();
    for quant in [QuantKind::F32, QuantKind::Q4] {
        let pack = tiny(dir.path(), true, quant);
        let (code, out, err) = probe(&[&pack, "--json"]);
        assert_eq!(code, 0, "{out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["pass"], true);
        let arms = v["arms"].as_array().unwrap();
        assert_eq!(arms.len(), 5);
        assert!(arms.iter().all(|a| a["status"] == "pass"), "{out}");
        assert_eq!(arms[0]["data"]["differing"], 0);
        assert_eq!(arms[2]["data"]["mismatches"], 0);
        assert_eq!(arms[2]["data"]["plane_counts"]["h"], 3);
    }
}

#[test]
fn a_pack_without_mrope_runs_arms_1_and_4() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny(dir.path(), false, QuantKind::F32);
    let (code, out, err) = probe(&[&pack]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("N/A").count(), 3, "{out}");
    assert_eq!(out.matches("PASS").count(), 3, "{out}"); // arms 1, 4 and the verdict
}

#[test]
fn bad_files_exit_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pack");
    let (code, _, err) = probe(&[missing.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("nope.pack"), "{err}");
    let garbage = dir.path().join("garbage.pack");
    std::fs::write(&garbage, b"not a pack at all, just bytes").unwrap();
    let (code, _, err) = probe(&[garbage.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("garbage.pack") && err.starts_with("error:"),
        "{err}"
    );
}
