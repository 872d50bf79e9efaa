//! hybrid_prompt_probe run as a process on the committed fixtures: good runs (host, device, ab on
//! the software NPU) and bad input (exit 2, naming the file and the reason).

use safetensors::{serialize_to_file, Dtype, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn probe(args: &[&str]) -> (i32, String, String) {
    probe_with(args, None)
}

/// The probe with `XDNA_VL_KERNELS` set to `kernels` (or removed).
fn probe_with(args: &[&str], kernels: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hybrid_prompt_probe"));
    cmd.args(args);
    match kernels {
        Some(k) => cmd.env("XDNA_VL_KERNELS", k),
        None => cmd.env_remove("XDNA_VL_KERNELS"),
    };
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn build(dir: &Path, case: &str, quant: &str) -> String {
    let out = dir.join(format!("{case}-{quant}.pack"));
    let opts = packs::build::BuildOptions {
        mrope_section: None,
        ..packs::build::BuildOptions::new(quant.parse().unwrap())
    };
    packs::build::build_from_hf(&fixtures().join(case).join("checkpoint"), &out, &opts).unwrap();
    out.to_string_lossy().into_owned()
}

fn fixture(case: &str, file: &str) -> String {
    fixtures()
        .join(case)
        .join(file)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_q4_pack_matches_its_reference_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build(dir.path(), "odd", "q4");
    let (code, out, err) = probe(&[
        &pack,
        &fixture("odd", "inputs.safetensors"),
        "--reference",
        &fixture("odd", "reference-q4.safetensors"),
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pass"], true);
    assert_eq!(v["first_divergence"], serde_json::Value::Null);
    assert_eq!(v["greedy_ids"], v["reference_greedy_ids"]);
    assert!(v["top1_agreement"].as_f64().unwrap() >= 0.97);
    let bound = f64::from(testkit::compare::QUANTIZED_MAX_ABS_LOGIT_DIFF);
    assert!(v["text"]["max_abs_logit_diff"].as_f64().unwrap() <= bound);
    // Control: the same q4 pack against the f32 reference fails.
    let (code, out, _) = probe(&[
        &pack,
        &fixture("odd", "inputs.safetensors"),
        "--reference",
        &fixture("odd", "reference.safetensors"),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(code, 1, "{out}");
    assert_eq!(v["pass"], false);
}

/// `libnpu_emu.so`, built next to the test binaries by the npu-emu dev-dependency.
#[test]
fn the_kernels_variable_picks_the_host_kernels_and_a_bad_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build(dir.path(), "odd", "q4");
    let args = [
        pack.as_str(),
        &fixture("odd", "inputs.safetensors"),
        "--reference",
        &fixture("odd", "reference-q4.safetensors"),
        "--json",
    ];
    let run = |kernels| {
        let (code, out, err) = probe_with(&args, kernels);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}{err}"));
        (code, v, err)
    };
    let (code, fastest, err) = run(None);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "{err}");
    // The portable path, asked for by name, gives the same logits bit for bit.
    let (code, scalar, err) = run(Some("scalar"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(scalar["kernels"], "scalar");
    assert_eq!(
        scalar["per_row_max_abs_diff"],
        fastest["per_row_max_abs_diff"]
    );
    assert_eq!(scalar["greedy_ids"], fastest["greedy_ids"]);
    // Control: a name that is no instruction set keeps the fastest path and says so.
    let (code, bogus, err) = run(Some("avx-3"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(bogus["kernels"], fastest["kernels"]);
    assert!(
        err.contains("XDNA_VL_KERNELS: unknown instruction set \"avx-3\""),
        "{err}"
    );
}

fn emu_library() -> String {
    let path = npu_sys::emu_library().unwrap_or_else(|e| panic!("{e}"));
    path.to_string_lossy().into_owned()
}

#[test]
fn gemm_ab_on_the_software_npu_is_byte_identical_and_device_matches_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    for quant in ["i8", "q4"] {
        let pack = build(dir.path(), "hd128", quant);
        let designs = dir.path().join(format!("designs-{quant}"));
        let p = packs::Pack::open(&pack).unwrap();
        let plan = npu_sys::plan::plan_pack(&p).unwrap();
        npu_sys::designs::write_emu_designs(&designs, &plan.geometries()).unwrap();
        let reference = fixture("hd128", &format!("reference-{quant}.safetensors"));
        for gemm in ["ab", "device"] {
            let (code, out, err) = probe(&[
                &pack,
                &fixture("hd128", "inputs.safetensors"),
                "--reference",
                &reference,
                "--gemm",
                gemm,
                "--runtime",
                &emu_library(),
                "--designs",
                designs.to_str().unwrap(),
                "--json",
            ]);
            assert_eq!(code, 0, "{quant} {gemm}: {out}{err}");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            if gemm == "ab" {
                assert!(v["ab_gemms"].as_u64().unwrap() > 0);
                assert_eq!(v["ab_differing"], 0, "{quant}");
                assert_eq!(v["ab_max_abs_diff"], 0.0);
            }
        }
        // Device without designs: refused by name.
        let (code, _, err) = probe(&[
            &pack,
            &fixture("hd128", "inputs.safetensors"),
            "--gemm",
            "device",
        ]);
        assert_eq!(code, 2);
        assert!(err.contains("--designs"), "{err}");
    }
}

fn write_st(path: &Path, tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>, meta: &[(&str, &str)]) {
    struct T(Dtype, Vec<usize>, Vec<u8>);
    impl View for &T {
        fn dtype(&self) -> Dtype {
            self.0
        }
        fn shape(&self) -> &[usize] {
            &self.1
        }
        fn data(&self) -> Cow<'_, [u8]> {
            Cow::Borrowed(&self.2)
        }
        fn data_len(&self) -> usize {
            self.2.len()
        }
    }
    let owned: Vec<(String, T)> = tensors
        .into_iter()
        .map(|(n, d, s, b)| (n.to_string(), T(d, s, b)))
        .collect();
    let meta: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    serialize_to_file(owned.iter().map(|(n, t)| (n.clone(), t)), Some(meta), path).unwrap();
}

/// A metadata value of a safetensors file.
fn real_meta(path: &str, key: &str) -> String {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    meta.metadata().as_ref().unwrap()[key].clone()
}

#[test]
fn bad_input_exits_2_naming_the_file_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let pack = build(dir.path(), "hd128", "f32");
    let inputs = fixture("hd128", "inputs.safetensors");
    let refuse = |args: &[&str], needles: &[&str]| {
        let (code, out, err) = probe(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.starts_with("error: "), "{err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
        }
        assert!(!err.contains("panicked"), "{err}");
    };
    // Missing files.
    refuse(
        &[&pack, "/nonexistent/inputs.safetensors"],
        &["/nonexistent/inputs.safetensors"],
    );
    refuse(
        &["/nonexistent/model.pack", &inputs],
        &["/nonexistent/model.pack"],
    );
    // A reference from another model (vocabulary mismatch).
    refuse(
        &[
            &pack,
            &inputs,
            "--reference",
            &fixture("odd", "reference.safetensors"),
        ],
        &["reference.safetensors", "another model"],
    );
    // More rows than the context holds.
    refuse(
        &[&pack, &inputs, "--context", "10"],
        &["inputs.safetensors", "--context"],
    );
    // Wrong dtype: input_ids as F32.
    let bad = dir.path().join("f32-ids.safetensors");
    write_st(
        &bad,
        vec![("input_ids", Dtype::F32, vec![2], vec![0; 8])],
        &[
            ("format", "hybrid-inputs/1"),
            ("image_token_id", "1"),
            ("rope_delta", "0"),
        ],
    );
    refuse(
        &[&pack, bad.to_str().unwrap()],
        &["f32-ids.safetensors", "input_ids", "expected I64"],
    );
    // Wrong shape: position_ids with two planes.
    let ids: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let pos: Vec<u8> = [0i64, 1, 0, 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bad = dir.path().join("two-planes.safetensors");
    write_st(
        &bad,
        vec![
            ("input_ids", Dtype::I64, vec![2], ids.clone()),
            ("position_ids", Dtype::I64, vec![2, 2], pos),
        ],
        &[
            ("format", "hybrid-inputs/1"),
            ("image_token_id", "1000"),
            ("rope_delta", "0"),
        ],
    );
    refuse(
        &[&pack, bad.to_str().unwrap()],
        &["two-planes.safetensors", "position_ids", "[3, 2]"],
    );
    // Ids outside the vocabulary.
    let big: Vec<u8> = [1i64, 99_999]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let pos: Vec<u8> = [0i64, 1, 0, 1, 0, 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bad = dir.path().join("big-id.safetensors");
    write_st(
        &bad,
        vec![
            ("input_ids", Dtype::I64, vec![2], big),
            ("position_ids", Dtype::I64, vec![3, 2], pos),
            ("image_embeds", Dtype::F32, vec![0, 128], vec![]),
            ("deepstack", Dtype::F32, vec![3, 0, 128], vec![]),
        ],
        &[
            ("format", "hybrid-inputs/1"),
            ("image_token_id", "1021"),
            ("rope_delta", "0"),
        ],
    );
    refuse(
        &[&pack, bad.to_str().unwrap()],
        &["big-id.safetensors", "99999", "outside the vocabulary"],
    );
    // A NaN in an image row (before this check it decoded garbage ids with exit 0), and an
    // infinity in a DeepStack set: refused naming the tensor and the index.
    let real_bytes = std::fs::read(&inputs).unwrap();
    let real = safetensors::SafeTensors::deserialize(&real_bytes).unwrap();
    for (name, at, needle) in [
        ("image_embeds", 3usize, "`image_embeds` holds NaN at [0, 3]"),
        ("deepstack", 1, "`deepstack` holds inf at [0, 0, 1]"),
    ] {
        let mut tensors = Vec::new();
        for (n, view) in real.tensors() {
            let mut data = view.data().to_vec();
            if n == name {
                let v = if name == "image_embeds" {
                    f32::NAN
                } else {
                    f32::INFINITY
                };
                data[at * 4..at * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            tensors.push((n, view.dtype(), view.shape().to_vec(), data));
        }
        let bad = dir.path().join(format!("non-finite-{name}.safetensors"));
        let meta: Vec<(String, String)> = [("format", "hybrid-inputs/1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain(["image_token_id", "rope_delta"].iter().map(|k| {
                let v = real_meta(&inputs, k);
                (k.to_string(), v)
            }))
            .collect();
        let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        write_st(
            &bad,
            tensors
                .iter()
                .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
                .collect(),
            &meta,
        );
        refuse(
            &[&pack, bad.to_str().unwrap()],
            &[&format!("non-finite-{name}"), needle],
        );
    }
    // Not a safetensors file at all.
    let bad = dir.path().join("garbage.safetensors");
    std::fs::write(&bad, b"\xff\xff\xff\xff\xff\xff\xff\xffgarbage").unwrap();
    refuse(&[&pack, bad.to_str().unwrap()], &["garbage.safetensors"]);
    // Control: the good inputs pass.
    let (code, out, err) = probe(&[
        &pack,
        &inputs,
        "--reference",
        &fixture("hd128", "reference.safetensors"),
    ]);
    assert_eq!(code, 0, "{out}{err}");
}
