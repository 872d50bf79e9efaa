//! `npu-designs` on random tiny packs: the plan, a software-NPU designs directory, its coverage
//! check, and every design verified against the oracle through the software NPU.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use npu_sys::designs::MANIFEST_FILE;
use packs::{write_random, QuantKind, RandomShape};

const NPU_DESIGNS: &str = env!("CARGO_BIN_EXE_npu-designs");

fn npu_designs(args: &[&str]) -> Output {
    Command::new(NPU_DESIGNS).args(args).output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn tiny_pack(dir: &Path, quant: QuantKind) -> String {
    let path = dir.join(format!("tiny-{quant}.pack"));
    write_random(&RandomShape::tiny(), quant, 5, &path).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn plan_emu_check_and_verify_a_q4_pack() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny_pack(dir.path(), QuantKind::Q4);
    let out = npu_designs(&["plan", &pack]);
    let plan = text(&out);
    assert!(out.status.success(), "{plan}");
    // tiny: hidden 64, q 4x16, kv 2x16, intermediate 128, vocab 256, two layers; the pack
    // stores a quantized head.
    assert!(plan.contains("q_proj x2, o_proj x2"), "{plan}");
    assert!(plan.contains("k_proj x2, v_proj x2"), "{plan}");
    assert!(plan.contains("gate_proj x2, up_proj x2"), "{plan}");
    assert!(plan.contains("lm_head x1"), "{plan}");
    assert!(plan.contains("10 designs to build"), "{plan}");

    let json = npu_designs(&["plan", &pack, "--json"]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["shapes"].as_array().unwrap().len(), 5);

    let designs = dir.path().join("designs");
    let designs_arg = designs.to_str().unwrap();
    let out = npu_designs(&["emu", &pack, "-o", designs_arg]);
    assert!(out.status.success(), "{}", text(&out));
    let out = npu_designs(&["check", designs_arg, "--pack", &pack]);
    assert!(
        out.status.success() && text(&out).contains("covers every geometry"),
        "{}",
        text(&out)
    );

    let emu = common::emu_library();
    let out = npu_designs(&[
        "verify",
        designs_arg,
        "--runtime",
        emu.to_str().unwrap(),
        "--rows",
        "5",
    ]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert_eq!(report.matches("byte-identical").count(), 10, "{report}");

    // Drop one design from the manifest: the pack is no longer covered, and the gap is named.
    let manifest_path = designs.join(MANIFEST_FILE);
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    let entries = manifest["designs"].as_array_mut().unwrap();
    let position = entries
        .iter()
        .position(|e| e["name"] == "q4_m128_k128_n64")
        .unwrap();
    entries.remove(position);
    std::fs::write(
        &manifest_path,
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let out = npu_designs(&["check", designs_arg, "--pack", &pack]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("error: no design for q4 M128 K128 N64"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_i8_pack_plans_i8_designs_and_an_f32_pack_none() {
    let dir = tempfile::tempdir().unwrap();
    let i8_pack = tiny_pack(dir.path(), QuantKind::I8);
    let plan = text(&npu_designs(&["plan", &i8_pack]));
    assert!(
        plan.lines().filter(|l| l.starts_with("i8")).count() == 5,
        "{plan}"
    );
    let f32_pack = tiny_pack(dir.path(), QuantKind::F32);
    let plan = text(&npu_designs(&["plan", &f32_pack]));
    assert!(plan.contains("0 designs to build"), "{plan}");
    assert!(plan.contains("q_proj x2 (stored unquantized"), "{plan}");
}

#[test]
fn bad_inputs_exit_2_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = npu_designs(&["plan", dir.path().join("none.pack").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("error:") && text(&out).contains("none.pack"),
        "{}",
        text(&out)
    );
    let out = npu_designs(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains(MANIFEST_FILE), "{}", text(&out));
}
