//! `build_from_hf` on synthetic hub checkpoints: every kind, both rope spellings, sharded, bf16,
//! f16, text-only; every refusal of a bad config or checkpoint; atomic output.

use crate::common;

use std::path::Path;

use common::{HfSpec, RopeSpelling};
use packs::names::{self, EMBED, LM_HEAD};
use packs::quant::QuantKind;
use packs::{build_from_hf, BuildError, BuildOptions, LinearData, Pack};
use safetensors::Dtype as StDtype;
use serde_json::json;

fn build(dir: &Path, out: &Path, quant: QuantKind) -> Result<packs::BuildReport, BuildError> {
    build_from_hf(dir, out, &BuildOptions::new(quant))
}

#[test]
fn builds_every_kind_from_a_single_file_rope_parameters_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let spec = HfSpec::default();
    let stored = common::write_checkpoint(&ck, &spec);
    for quant in QuantKind::ALL {
        let out = tmp.path().join(format!("m-{quant}.pack"));
        let report = build(&ck, &out, quant).unwrap();
        let pack = Pack::open(&out).unwrap();
        assert_eq!(report.file_len, pack.file_len());
        assert_eq!(
            pack.semantics(),
            &common::expected_semantics(&spec, quant, &ck)
        );
        common::check_pack(&pack, &stored);
        if quant.is_integer() {
            // The tied head is quantized from the checkpoint's f32 embedding values.
            assert_eq!(pack.head().name, LM_HEAD);
        } else {
            assert_eq!(pack.head().name, EMBED);
        }
    }
}

#[test]
fn builds_a_sharded_bf16_rope_scaling_untied_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let spec = HfSpec {
        dtype: StDtype::BF16,
        shards: 3,
        spelling: RopeSpelling::RopeScaling,
        tied: false,
        ..HfSpec::default()
    };
    let stored = common::write_checkpoint(&ck, &spec);
    assert!(ck.join("model.safetensors.index.json").exists());
    for quant in QuantKind::ALL {
        let out = tmp.path().join(format!("m-{quant}.pack"));
        build(&ck, &out, quant).unwrap();
        let pack = Pack::open(&out).unwrap();
        assert_eq!(
            pack.semantics(),
            &common::expected_semantics(&spec, quant, &ck)
        );
        common::check_pack(&pack, &stored);
        assert_eq!(pack.head().name, LM_HEAD, "an untied head is always stored");
    }
    // bf16 -> f32 is exact and bf16 -> bf16 is the identity: the bf16 pack holds the checkpoint's bits.
    let pack = Pack::open(tmp.path().join("m-bf16.pack")).unwrap();
    let LinearData::Bf16(w) = pack.linear(&names::proj(1, names::Proj::Up)).unwrap().data else {
        panic!("bf16 pack holds bf16 linears")
    };
    assert!(w
        .iter()
        .zip(&stored[&names::proj(1, names::Proj::Up)])
        .all(|(a, b)| a.to_f32() == *b));
}

#[test]
fn builds_f16_and_text_only_and_head_dim_free_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "f16",
            HfSpec {
                dtype: StDtype::F16,
                ..HfSpec::default()
            },
        ),
        (
            "text",
            HfSpec {
                text_only: true,
                spelling: RopeSpelling::RopeScaling,
                tied: false,
                ..HfSpec::default()
            },
        ),
        // No head_dim in the config, and hidden/heads (64/4 = 16) is not the trained head_dim (32):
        // it comes from the q_norm length, as the weights say.
        (
            "nohd",
            HfSpec {
                write_head_dim: false,
                head_dim: 32,
                section: Some(json!([6, 5, 5])),
                ..HfSpec::default()
            },
        ),
    ];
    for (name, spec) in cases {
        let ck = tmp.path().join(name);
        let stored = common::write_checkpoint(&ck, &spec);
        let out = tmp.path().join(format!("{name}.pack"));
        build(&ck, &out, QuantKind::Q4).unwrap();
        let pack = Pack::open(&out).unwrap();
        let mut expected = common::expected_semantics(&spec, QuantKind::Q4, &ck);
        if name == "nohd" {
            expected.mrope_section = Some([6, 5, 5]);
        }
        assert_eq!(pack.semantics(), &expected, "{name}");
        common::check_pack(&pack, &stored);
    }
}

fn build_err(spec: &HfSpec, override_section: Option<[usize; 3]>) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    common::write_checkpoint(&ck, spec);
    let out = tmp.path().join("out.pack");
    let opts = BuildOptions {
        mrope_section: override_section,
        ..packs::build::BuildOptions::new(QuantKind::F32)
    };
    let err = build_from_hf(&ck, &out, &opts)
        .expect_err("build must be refused")
        .to_string();
    assert!(!out.exists(), "a refused build leaves no pack");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "and no temp file"
    );
    err
}

#[test]
fn missing_mrope_section_is_refused_unless_stated() {
    for spelling in [RopeSpelling::RopeParameters, RopeSpelling::RopeScaling] {
        let spec = HfSpec {
            section: None,
            spelling,
            ..HfSpec::default()
        };
        let err = build_err(&spec, None);
        assert!(
            err.contains("mrope_section is missing") && err.contains("--mrope-section"),
            "{err}"
        );
        let key = if spelling == RopeSpelling::RopeScaling {
            "rope_scaling"
        } else {
            "rope_parameters"
        };
        assert!(err.contains(key), "{err}");

        // Stated explicitly, it builds.
        let tmp = tempfile::tempdir().unwrap();
        let ck = tmp.path().join("ck");
        common::write_checkpoint(&ck, &spec);
        let out = tmp.path().join("out.pack");
        let opts = BuildOptions {
            mrope_section: Some([2, 3, 3]),
            ..BuildOptions::new(QuantKind::Bf16)
        };
        build_from_hf(&ck, &out, &opts).unwrap();
        assert_eq!(
            Pack::open(&out).unwrap().semantics().mrope_section,
            Some([2, 3, 3])
        );
    }
    // An override contradicting the config is refused; one agreeing with it is fine.
    let err = build_err(&HfSpec::default(), Some([4, 2, 2]));
    assert!(
        err.contains("[3, 3, 2]") && err.contains("[4, 2, 2]"),
        "{err}"
    );
    // An override that is too large for head_dim 16 is refused.
    let err = build_err(
        &HfSpec {
            section: None,
            ..HfSpec::default()
        },
        Some([24, 20, 20]),
    );
    assert!(
        err.contains("--mrope-section") && err.contains("head_dim/2 = 8"),
        "{err}"
    );
}

#[test]
fn bad_mrope_sections_are_refused_quoting_them() {
    for (section, quoted) in [
        (json!([3, 3]), "[3,3]"),
        (json!([3, -1, 2]), "[3,-1,2]"),
        (json!([3, 3.5, 2]), "[3,3.5,2]"),
        (json!("24,20,20"), "\"24,20,20\""),
        (json!([6, 6, 6]), "[6, 6, 6]"), // sums to 18 > head_dim/2 = 8
    ] {
        let spec = HfSpec {
            section: Some(section),
            spelling: RopeSpelling::RopeScaling,
            ..HfSpec::default()
        };
        let err = build_err(&spec, None);
        assert!(
            err.contains(quoted) && err.contains("mrope_section"),
            "{err}"
        );
    }
}

#[test]
fn bad_configs_and_checkpoints_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.pack");
    let fresh = |name: &str, spec: &HfSpec| {
        let ck = tmp.path().join(name);
        common::write_checkpoint(&ck, spec);
        ck
    };
    let edit_config = |ck: &Path, f: &dyn Fn(&mut serde_json::Value)| {
        let p = ck.join("config.json");
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    };
    let refuse = |ck: &Path, quant: QuantKind, needles: &[&str]| {
        let err = build(ck, &out, quant).expect_err("must refuse").to_string();
        for n in needles {
            assert!(err.contains(n), "{err:?} lacks {n:?}");
        }
        assert!(!out.exists());
    };

    let ck = fresh("yarn", &HfSpec::default());
    edit_config(&ck, &|v| {
        v["text_config"]["rope_parameters"]["rope_type"] = json!("yarn")
    });
    refuse(&ck, QuantKind::F32, &["rope_type", "yarn"]);

    let ck = fresh("contig", &HfSpec::default());
    edit_config(&ck, &|v| {
        v["text_config"]["rope_parameters"]["mrope_interleaved"] = json!(false)
    });
    refuse(&ck, QuantKind::F32, &["mrope_interleaved"]);

    let ck = fresh("llama", &HfSpec::default());
    edit_config(&ck, &|v| v["model_type"] = json!("llama"));
    refuse(&ck, QuantKind::F32, &["model_type", "llama"]);

    let ck = fresh("nohidden", &HfSpec::default());
    edit_config(&ck, &|v| {
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("hidden_size");
    });
    refuse(&ck, QuantKind::F32, &["text_config.hidden_size", "missing"]);

    let ck = fresh("nodeepstack", &HfSpec::default());
    edit_config(&ck, &|v| v["vision_config"] = json!({}));
    refuse(
        &ck,
        QuantKind::F32,
        &["vision_config.deepstack_visual_indexes"],
    );

    // Tensors: a missing one, a wrongly shaped one (config disagrees with the weights).
    let ck = fresh("untied", &HfSpec::default());
    edit_config(&ck, &|v| v["tie_word_embeddings"] = json!(false));
    refuse(&ck, QuantKind::F32, &["lm_head.weight", "missing"]);

    let ck = fresh("shape", &HfSpec::default());
    edit_config(&ck, &|v| v["text_config"]["intermediate_size"] = json!(128));
    refuse(
        &ck,
        QuantKind::F32,
        &["mlp.gate_proj.weight", "[96, 64]", "[128, 64]"],
    );

    // q4 needs every K to be a multiple of 32.
    let ck = fresh(
        "k48",
        &HfSpec {
            hidden: 48,
            head_dim: 12,
            section: Some(json!([2, 2, 2])),
            ..HfSpec::default()
        },
    );
    build(&ck, &out, QuantKind::I8).unwrap();
    std::fs::remove_file(&out).unwrap();
    refuse(&ck, QuantKind::Q4, &["hidden_size", "48", "multiple of 32"]);

    // No weights at all; a truncated shard.
    let ck = fresh("noweights", &HfSpec::default());
    std::fs::remove_file(ck.join("model.safetensors")).unwrap();
    refuse(&ck, QuantKind::F32, &["model.safetensors"]);
    let ck = fresh(
        "trunc",
        &HfSpec {
            shards: 2,
            ..HfSpec::default()
        },
    );
    let shard = ck.join("model-00002-of-00002.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    refuse(
        &ck,
        QuantKind::F32,
        &["model-00002-of-00002.safetensors", "outside"],
    );

    // An index naming a shard outside the directory.
    let ck = fresh(
        "escape",
        &HfSpec {
            shards: 2,
            ..HfSpec::default()
        },
    );
    let index = ck.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index)
        .unwrap()
        .replace("model-00001-of-00002", "../model-00001-of-00002");
    std::fs::write(&index, text).unwrap();
    refuse(
        &ck,
        QuantKind::F32,
        &["weight_map", "../model-00001-of-00002"],
    );
}

#[test]
fn non_finite_weights_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    common::write_checkpoint(&ck, &HfSpec::default());
    // Plant a NaN in the first value of the final norm (f32 checkpoint: patch the bytes).
    let bytes = std::fs::read(ck.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let norm = st.tensor(names::FINAL_NORM).unwrap();
    let offset = norm.data().as_ptr() as usize - bytes.as_ptr() as usize;
    let mut patched = bytes.clone();
    patched[offset..offset + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(ck.join("model.safetensors"), patched).unwrap();
    let out = tmp.path().join("out.pack");
    let err = build(&ck, &out, QuantKind::Bf16).unwrap_err().to_string();
    assert!(
        err.contains(names::FINAL_NORM) && err.contains("non-finite"),
        "{err}"
    );
    assert!(!out.exists());
}

/// `packs build --no-vision` with a tower option is refused by name (the option would be
/// ignored), and nothing is written; control: the same options without `--no-vision` build.
#[test]
fn a_tower_option_beside_no_vision_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    common::write_checkpoint(&ck, &HfSpec::default());
    let run = |args: &[&str], out: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_packs"))
            .arg("build")
            .arg(&ck)
            .arg("-o")
            .arg(out)
            .args(["--quant", "f32", "-q"])
            .args(args)
            .output()
            .unwrap()
    };
    for option in [["--vision-quant", "bf16"], ["--vision-products", "f32"]] {
        let out = tmp.path().join("refused.pack");
        let mut args = vec!["--no-vision"];
        args.extend(option);
        let r = run(&args, &out);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(
            !r.status.success(),
            "{option:?} beside --no-vision was taken"
        );
        assert!(
            err.contains("--no-vision") && err.contains(option[0]),
            "{option:?}: {err}"
        );
        assert!(
            !out.exists(),
            "{option:?}: a refused build wrote {}",
            out.display()
        );
    }
    // Control: the options themselves are fine when the tower is built.
    let out = tmp.path().join("built.pack");
    let r = run(
        &["--vision-quant", "bf16", "--vision-products", "f32"],
        &out,
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(out.exists());
}
