//! Refusals of the checkpoint reader (`packs::build_from_hf`: config.json, the index, shard
//! headers and data, preprocessor_config.json, the template's files) that packs/tests/build_hf.rs
//! does not already plant, each on a copy of a fixture checkpoint: the message names the file, the
//! key or tensor, what was found and what was expected, and no pack is left behind. Non-finite
//! weights are refused in f32, bf16 and f16 checkpoints alike. Control: every unmodified fixture
//! builds.

use std::path::{Path, PathBuf};

use fuzz::runner::peak_rss_kib;
use packs::{build_from_hf, BuildOptions, QuantKind};
use safetensors::SafeTensors;
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// A fresh copy of a fixture checkpoint under `tmp`.
fn copy(tmp: &Path, fixture_dir: &str, as_name: &str) -> PathBuf {
    let dst = tmp.join(as_name);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(fixture_dir)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

fn build(dir: &Path) -> Result<packs::BuildReport, packs::BuildError> {
    build_from_hf(
        dir,
        &dir.join("out.pack"),
        &BuildOptions::new(QuantKind::F32),
    )
}

/// Builds `dir` and checks the refusal holds every needle and leaves no pack.
fn refuse(dir: &Path, needles: &[&str]) -> String {
    let err = build(dir).expect_err("must refuse").to_string();
    for n in needles {
        assert!(err.contains(n), "{err:?} lacks {n:?}");
    }
    assert!(
        !dir.join("out.pack").exists(),
        "a refused build leaves no pack"
    );
    err
}

/// Byte offset (in the file) and dtype of tensor `name` in the safetensors file `path`.
fn locate(path: &Path, name: &str) -> (usize, safetensors::Dtype) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    (
        t.data().as_ptr() as usize - bytes.as_ptr() as usize,
        t.dtype(),
    )
}

fn patch(path: &Path, at: usize, bytes: &[u8]) {
    let mut b = std::fs::read(path).unwrap();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, b).unwrap();
}

const FIXTURES: [(&str, &str); 4] = [
    ("chat/Qwen3-VL-tiny", "model.safetensors"),
    (
        "bf16-sharded/checkpoint",
        "model-00002-of-00003.safetensors",
    ),
    ("odd/checkpoint", "model.safetensors"),
    ("hd128/checkpoint", "model.safetensors"),
];

#[test]
fn controls_build() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (dir, _)) in FIXTURES.iter().enumerate() {
        let ck = copy(tmp.path(), dir, &format!("c{i}"));
        build(&ck).unwrap_or_else(|e| panic!("{dir}: {e}"));
    }
}

#[test]
fn config_json_refusals_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = copy(tmp.path(), "odd/checkpoint", "missing");
    std::fs::remove_file(ck.join("config.json")).unwrap();
    refuse(&ck, &["config.json", "No such file"]);

    let ck = copy(tmp.path(), "odd/checkpoint", "notjson");
    std::fs::write(ck.join("config.json"), b"{\"model_type\": \"qwen3_vl\",").unwrap();
    refuse(&ck, &["config.json", "not valid JSON", "EOF"]);

    let ck = copy(tmp.path(), "odd/checkpoint", "array");
    std::fs::write(ck.join("config.json"), b"[1, 2]").unwrap();
    refuse(
        &ck,
        &["config.json", "(top level)", "expected a JSON object"],
    );

    for (name, edit, needles) in [
        (
            "heads",
            Box::new(|v: &mut Value| v["text_config"]["num_attention_heads"] = json!("8"))
                as Box<dyn Fn(&mut Value)>,
            &[
                "text_config.num_attention_heads",
                "expected a non-negative integer",
                "\"8\"",
            ][..],
        ),
        (
            "eps",
            Box::new(|v: &mut Value| v["text_config"]["rms_norm_eps"] = json!([1e-6])),
            &["text_config.rms_norm_eps", "expected a number", "[1e-6]"][..],
        ),
        (
            "token",
            Box::new(|v: &mut Value| v["image_token_id"] = json!(-1)),
            &["image_token_id", "expected a token id, got -1"][..],
        ),
        (
            "tie",
            Box::new(|v: &mut Value| v["tie_word_embeddings"] = json!("yes")),
            &["tie_word_embeddings", "expected a boolean", "\"yes\""][..],
        ),
        (
            "theta",
            Box::new(|v: &mut Value| {
                v["text_config"]["rope_parameters"]
                    .as_object_mut()
                    .map(|r| r.remove("rope_theta"));
                v["text_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("rope_theta");
            }),
            &["rope_theta", "missing"][..],
        ),
    ] {
        let ck = copy(tmp.path(), "odd/checkpoint", name);
        edit_json(&ck.join("config.json"), edit);
        refuse(&ck, needles);
    }
}

#[test]
fn layer_counts_beyond_the_tensors_held_are_refused_before_planning() {
    let tmp = tempfile::tempdir().unwrap();
    // 2^24 layers passes Semantics::validate; planning them would take tens of GB.
    let ck = copy(tmp.path(), "odd/checkpoint", "layers");
    edit_json(&ck.join("config.json"), |v| {
        v["text_config"]["num_hidden_layers"] = json!(1u64 << 24)
    });
    let before = peak_rss_kib();
    refuse(
        &ck,
        &[
            "config.json",
            "text_config.num_hidden_layers",
            "16777216 layers",
            "hold only",
        ],
    );
    assert!(
        (peak_rss_kib() - before) / 1024 < 64,
        "refusing stayed small"
    );
    let ck = copy(tmp.path(), "chat/Qwen3-VL-tiny", "depth");
    edit_json(&ck.join("config.json"), |v| {
        v["vision_config"]["depth"] = json!(1u64 << 20);
        v["vision_config"]["deepstack_visual_indexes"] = json!([0, 1]);
    });
    refuse(
        &ck,
        &["config.json", "vision_config.depth", "1048576 layers"],
    );
}

#[test]
fn oversized_json_and_assets_are_refused_before_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = copy(tmp.path(), "odd/checkpoint", "bigconfig");
    // Sparse: the size is what is checked, nothing is read.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(ck.join("config.json"))
        .unwrap();
    f.set_len(packs::hf::MAX_JSON_BYTES + 1).unwrap();
    refuse(
        &ck,
        &["config.json", "67108865 bytes", "more than the 67108864"],
    );

    let ck = copy(tmp.path(), "chat/Qwen3-VL-tiny", "bigasset");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(ck.join("tokenizer.json"))
        .unwrap();
    f.set_len(packs::build::MAX_ASSET_BYTES + 1).unwrap();
    refuse(
        &ck,
        &["tokenizer.json", "more than the 67108864 an asset may hold"],
    );

    // The template falls back to tokenizer_config.json, which must then be JSON.
    let ck = copy(tmp.path(), "chat/Qwen3-VL-tiny", "badtemplate");
    std::fs::remove_file(ck.join("chat_template.jinja")).unwrap();
    std::fs::write(ck.join("tokenizer_config.json"), b"{\"chat_template\": ").unwrap();
    refuse(&ck, &["tokenizer_config.json", "not valid JSON"]);
}

#[test]
fn index_and_shard_refusals_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let sharded = "bf16-sharded/checkpoint";
    let index = "model.safetensors.index.json";
    let embed = "model.language_model.embed_tokens.weight";

    let ck = copy(tmp.path(), sharded, "nomap");
    edit_json(&ck.join(index), |v| {
        v.as_object_mut().unwrap().remove("weight_map");
    });
    refuse(&ck, &[index, "weight_map", "missing object"]);

    let ck = copy(tmp.path(), sharded, "absent");
    edit_json(&ck.join(index), |v| {
        v["weight_map"][embed] = json!("model-00009-of-00003.safetensors")
    });
    refuse(&ck, &["model-00009-of-00003.safetensors", "No such file"]);

    // The index puts a tensor in a shard that does not hold it.
    let ck = copy(tmp.path(), sharded, "notinshard");
    edit_json(&ck.join(index), |v| {
        v["weight_map"][embed] = json!("model-00001-of-00003.safetensors")
    });
    refuse(
        &ck,
        &["model-00001-of-00003.safetensors", embed, "not there"],
    );

    // Same byte size, a dtype the build does not convert.
    let ck = copy(tmp.path(), sharded, "dtype");
    let shard = ck.join("model-00002-of-00003.safetensors");
    let text = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(text[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&text[8..8 + n]).unwrap();
    header[embed]["dtype"] = json!("I16");
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(n, b' ');
    patch(&shard, 8, &h);
    refuse(
        &ck,
        &[
            "model-00002-of-00003.safetensors",
            embed,
            "is I16, expected BF16, F16 or F32",
        ],
    );

    // A header length past the end of the shard.
    let ck = copy(tmp.path(), sharded, "hlen");
    patch(
        &ck.join("model-00003-of-00003.safetensors"),
        0,
        &u64::MAX.to_le_bytes(),
    );
    refuse(
        &ck,
        &[
            "model-00003-of-00003.safetensors",
            "not a safetensors file",
            "header length 18446744073709551615",
        ],
    );
}

#[test]
fn preprocessor_config_refusals_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let pre = "preprocessor_config.json";
    for (name, key, value, needles) in [
        // 2^32 + 3 once passed for 3 (bicubic) through `as u32`.
        (
            "resample",
            "resample",
            json!(4294967299u64),
            &["resample", "4294967299", "not a PIL filter code"][..],
        ),
        (
            "std",
            "image_std",
            json!([0.5, 0.0, 0.5]),
            &["image_std", "finite and non-zero"][..],
        ),
        (
            "patch",
            "patch_size",
            json!(14),
            &["patch_size = 14", "differs from the tower's 16"][..],
        ),
        (
            "mean",
            "image_mean",
            json!([0.5, "x", 0.5]),
            &["image_mean", "expected three numbers"][..],
        ),
    ] {
        let ck = copy(tmp.path(), "chat/Qwen3-VL-tiny", name);
        edit_json(&ck.join(pre), |v| v[key] = value);
        let err = refuse(&ck, needles);
        assert!(
            err.contains(pre) || err.contains("preprocessor_config"),
            "{err}"
        );
    }
}

/// Rewrites every tensor of the f32 safetensors file `path` as F16.
fn to_f16(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32);
            let data = t
                .data()
                .chunks_exact(4)
                .flat_map(|b| {
                    half::f16::from_f32(f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes()
                })
                .collect();
            (n, t.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F16, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn non_finite_weights_are_refused_in_f32_bf16_and_f16_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let down = "model.language_model.layers.1.mlp.down_proj.weight";
    let cases: [(&str, &str, &str, bool); 3] = [
        ("f32", "odd/checkpoint", "model.safetensors", false),
        (
            "bf16",
            "bf16-sharded/checkpoint",
            "model-00001-of-00003.safetensors",
            false,
        ),
        ("f16", "odd/checkpoint", "model.safetensors", true),
    ];
    for (kind, dir, file, make_f16) in cases {
        // Control: the checkpoint (converted to f16 where asked) builds.
        let good = copy(tmp.path(), dir, &format!("{kind}-good"));
        if make_f16 {
            to_f16(&good.join(file));
        }
        let shard = (0..).map(|_| ()).take(1).fold(PathBuf::new(), |_, _| {
            // The shard that holds the tensor.
            std::fs::read_dir(&good)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| {
                    p.extension().is_some_and(|x| x == "safetensors")
                        && SafeTensors::deserialize(&std::fs::read(p).unwrap())
                            .unwrap()
                            .tensor(down)
                            .is_ok()
                })
                .unwrap()
        });
        let shard_name = shard.file_name().unwrap().to_owned();
        let _ = file;
        build(&good).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let cols = SafeTensors::deserialize(&std::fs::read(&shard).unwrap())
            .unwrap()
            .tensor(down)
            .unwrap()
            .shape()[1];
        for (i, value) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
            .into_iter()
            .enumerate()
        {
            let ck = copy(tmp.path(), dir, &format!("{kind}-{i}"));
            if make_f16 {
                to_f16(&ck.join(file));
            }
            let shard = ck.join(&shard_name);
            let (at, dtype) = locate(&shard, down);
            let elem = 3 * cols + 5; // row 3
            let bytes = match dtype {
                safetensors::Dtype::F32 => value.to_le_bytes().to_vec(),
                safetensors::Dtype::BF16 => half::bf16::from_f32(value).to_le_bytes().to_vec(),
                safetensors::Dtype::F16 => half::f16::from_f32(value).to_le_bytes().to_vec(),
                other => panic!("{other:?}"),
            };
            patch(&shard, at + elem * bytes.len(), &bytes);
            let shown = format!("{value}");
            let shard_shown = shard_name.to_string_lossy().into_owned();
            refuse(&ck, &[&shard_shown, down, "row 3", "non-finite", &shown]);
        }
    }
}
