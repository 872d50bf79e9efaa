//! Packs carry the vision tower, the preprocessing facts and the assets of a hub checkpoint: the
//! tiny chat checkpoint (tests/fixtures/chat/Qwen3-VL-tiny) built and read back, and every way a
//! checkpoint's tower can be wrong refused by name.

use std::path::{Path, PathBuf};

use packs::names::visual;
use packs::{build_from_hf, BuildOptions, LinearData, Pack, QuantKind, TensorKind};
use serde_json::{json, Value};

fn tiny_checkpoint() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/Qwen3-VL-tiny")
}

/// A copy of the tiny checkpoint in a temp dir, for editing.
fn copy_checkpoint(to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(tiny_checkpoint()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn build(dir: &Path, opts: &BuildOptions) -> Result<Pack, String> {
    let out = dir.with_extension("pack");
    build_from_hf(dir, &out, opts).map_err(|e| e.to_string())?;
    Ok(Pack::open(&out).unwrap())
}

/// The checkpoint's tensor `name` as f32 values and its shape (the fixture is f32).
fn checkpoint_tensor(name: &str) -> (Vec<f32>, Vec<usize>) {
    let bytes = std::fs::read(tiny_checkpoint().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let values = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (values, t.shape().to_vec())
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

#[test]
fn the_tower_its_preprocessing_and_the_assets_are_carried() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    copy_checkpoint(&dir);
    let pack = build(&dir, &BuildOptions::new(QuantKind::F32)).unwrap();
    let sem = pack.semantics();
    let v = sem.vision.as_ref().expect("the tower");
    assert_eq!(
        (
            v.depth,
            v.hidden_size,
            v.num_heads,
            v.intermediate_size,
            v.out_hidden_size
        ),
        (2, 32, 2, 64, 64)
    );
    assert_eq!(v.deepstack_visual_indexes, vec![0, 1]);
    assert_eq!(
        (v.patch_row_len(), v.merged_hidden(), v.head_dim()),
        (1536, 128, 16)
    );
    assert_eq!(v.rope_theta, 10_000.0);
    let p = sem.preprocess.as_ref().expect("preprocessing");
    assert_eq!((p.min_pixels, p.max_pixels), (1024, 4_194_304));
    assert_eq!((p.image_mean, p.image_std), ([0.5; 3], [0.5; 3]));
    assert_eq!(
        (p.patch_size, p.merge_size, p.temporal_patch_size),
        (16, 2, 2)
    );

    // The Conv3d patch embedding is stored as the linear [hidden, C*T*P*P], the same values.
    let (conv, shape) = checkpoint_tensor(visual::PATCH_EMBED);
    assert_eq!(shape, vec![32, 3, 2, 16, 16]);
    let lin = pack.linear(visual::PATCH_EMBED).unwrap();
    assert_eq!((lin.n, lin.k), (32, 1536));
    match lin.data {
        LinearData::F32(w) => assert!(w == &conv[..]),
        other => panic!("f32 pack, {other:?}"),
    }
    // Biases, norms and the position table are f32 parameters, equal to the checkpoint.
    for name in [
        visual::POS_EMBED.to_string(),
        visual::PATCH_EMBED_BIAS.to_string(),
        visual::block(1, "norm2.bias"),
        visual::block(0, "attn.qkv.bias"),
        visual::deepstack_merger(1, "norm.weight"),
        visual::merger("norm.weight"),
    ] {
        let (want, _) = checkpoint_tensor(&name);
        assert!(pack.f32_tensor(&name).unwrap() == &want[..], "{name}");
    }
    // Control: a linear is not an f32 parameter, and a parameter is not a linear.
    assert!(pack
        .f32_tensor(&visual::block(0, "attn.qkv.weight"))
        .is_err());
    assert!(pack.linear(&visual::block(0, "attn.qkv.bias")).is_err());

    // The assets are the checkpoint's files, byte for byte.
    for file in [
        "tokenizer.json",
        "chat_template.jinja",
        "preprocessor_config.json",
    ] {
        let want = std::fs::read(tiny_checkpoint().join(file)).unwrap();
        assert_eq!(pack.asset(file), Some(&want[..]), "{file}");
    }
    assert_eq!(pack.asset("generation_config.json"), None);
    assert!(pack
        .tensors()
        .iter()
        .any(|t| t.kind == TensorKind::Asset && t.name == "__asset__.tokenizer.json"));
}

#[test]
fn vision_quant_stores_the_tower_apart_from_the_decoder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    copy_checkpoint(&dir);
    let opts = BuildOptions {
        vision_quant: Some(QuantKind::I8),
        ..BuildOptions::new(QuantKind::Q4)
    };
    let pack = build(&dir, &opts).unwrap();
    assert_eq!(
        pack.semantics().vision.as_ref().unwrap().quant,
        QuantKind::I8
    );
    assert!(matches!(
        pack.linear(&visual::block(0, "mlp.linear_fc1.weight"))
            .unwrap()
            .data,
        LinearData::I8 { .. }
    ));
    assert!(matches!(
        pack.linear(&packs::names::proj(0, packs::names::Proj::Q))
            .unwrap()
            .data,
        LinearData::Q4 { .. }
    ));
    // By default the tower follows --quant.
    let pack = build(&dir, &BuildOptions::new(QuantKind::Q4)).unwrap();
    assert!(matches!(
        pack.linear(visual::PATCH_EMBED).unwrap().data,
        LinearData::Q4 { .. }
    ));
}

#[test]
fn no_vision_and_no_preprocessor_make_a_text_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    copy_checkpoint(&dir);
    let opts = BuildOptions {
        vision: false,
        ..BuildOptions::new(QuantKind::F32)
    };
    let pack = build(&dir, &opts).unwrap();
    assert!(pack.semantics().vision.is_none() && pack.semantics().preprocess.is_none());
    assert!(pack.tensor(visual::POS_EMBED).is_none());

    std::fs::remove_file(dir.join("preprocessor_config.json")).unwrap();
    let out = dir.with_extension("pack");
    let report = build_from_hf(&dir, &out, &BuildOptions::new(QuantKind::F32)).unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("preprocessor_config.json")
                && w.contains("vision tower is left out")),
        "{:?}",
        report.warnings
    );
    assert!(Pack::open(&out).unwrap().semantics().vision.is_none());
}

/// Edits a copied checkpoint to plant one mistake.
type Plant = Box<dyn Fn(&Path)>;

/// Every broken tower is refused by name, and no pack is left behind.
#[test]
fn a_broken_tower_is_refused_by_name() {
    let cases: Vec<(&str, Plant, Vec<&str>)> = vec![
        (
            "no depth",
            Box::new(|d: &Path| {
                edit_json(&d.join("config.json"), |c| {
                    c["vision_config"].as_object_mut().unwrap().remove("depth");
                })
            }),
            vec!["vision_config.depth", "missing"],
        ),
        (
            "taps past the last block",
            Box::new(|d: &Path| {
                edit_json(&d.join("config.json"), |c| {
                    c["vision_config"]["deepstack_visual_indexes"] = json!([0, 2])
                })
            }),
            vec!["deepstack_visual_indexes holds 2", "last block 1"],
        ),
        (
            "another activation",
            Box::new(|d: &Path| {
                edit_json(&d.join("config.json"), |c| {
                    c["vision_config"]["hidden_act"] = json!("quick_gelu")
                })
            }),
            vec!["hidden_act", "quick_gelu", "gelu_pytorch_tanh"],
        ),
        (
            "a position table that is not square",
            Box::new(|d: &Path| {
                edit_json(&d.join("config.json"), |c| {
                    c["vision_config"]["num_position_embeddings"] = json!(60)
                })
            }),
            vec!["num_position_embeddings 60", "square"],
        ),
        (
            "preprocessor patch size against the tower's",
            Box::new(|d: &Path| {
                edit_json(&d.join("preprocessor_config.json"), |c| {
                    c["patch_size"] = json!(14)
                })
            }),
            vec!["patch_size = 14", "tower's 16"],
        ),
        (
            "a zero std",
            Box::new(|d: &Path| {
                edit_json(&d.join("preprocessor_config.json"), |c| {
                    c["image_std"] = json!([0.5, 0.0, 0.5])
                })
            }),
            vec!["image_std", "non-zero"],
        ),
        (
            "min pixels above max",
            Box::new(|d: &Path| {
                edit_json(&d.join("preprocessor_config.json"), |c| {
                    c["size"] = json!({"shortest_edge": 5000, "longest_edge": 4000})
                })
            }),
            vec!["shortest_edge", "5000", "4000"],
        ),
        (
            "a missing block tensor",
            Box::new(|d: &Path| drop_tensor(d, "model.visual.blocks.1.mlp.linear_fc2.bias")),
            vec!["model.visual.blocks.1.mlp.linear_fc2.bias", "missing"],
        ),
        (
            "a patch embedding of another shape",
            Box::new(|d: &Path| {
                edit_json(&d.join("config.json"), |c| {
                    c["vision_config"]["patch_size"] = json!(8)
                });
                edit_json(&d.join("preprocessor_config.json"), |c| {
                    c["patch_size"] = json!(8)
                });
            }),
            vec![
                visual::PATCH_EMBED,
                "[32, 3, 2, 16, 16]",
                "[32, 3, 2, 8, 8]",
            ],
        ),
    ];
    for (what, plant, needles) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ck");
        copy_checkpoint(&dir);
        plant(&dir);
        let out = dir.with_extension("pack");
        let err = build_from_hf(&dir, &out, &BuildOptions::new(QuantKind::F32))
            .map(|_| ())
            .expect_err(what)
            .to_string();
        for n in needles {
            assert!(err.contains(n), "{what}: {err:?} lacks {n:?}");
        }
        assert!(!out.exists(), "{what}: a pack was left behind");
        // Control: the same checkpoint builds as a text pack without the tower, except when the
        // decoder's own tensors are what is broken (none here).
        let opts = BuildOptions {
            vision: false,
            ..BuildOptions::new(QuantKind::F32)
        };
        build_from_hf(&dir, &out, &opts).unwrap_or_else(|e| panic!("{what}: text pack: {e}"));
    }
}

#[test]
fn a_q4_tower_needs_k_in_groups_of_32() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    copy_checkpoint(&dir);
    let pack = build(&dir, &BuildOptions::new(QuantKind::F32)).unwrap();
    let mut sem = pack.semantics().clone();
    // intermediate 48 would be the K of linear_fc2: not a multiple of 32.
    let v = sem.vision.as_mut().unwrap();
    v.intermediate_size = 48;
    v.quant = QuantKind::Q4;
    let err = sem.validate().unwrap_err().to_string();
    assert!(
        err.contains("intermediate_size = 48") && err.contains("--vision-quant i8"),
        "{err}"
    );
    // Control: the same tower in i8 is fine.
    sem.vision.as_mut().unwrap().quant = QuantKind::I8;
    sem.validate().unwrap();
}

/// Rewrites model.safetensors without tensor `name`.
fn drop_tensor(dir: &Path, name: &str) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != name)
        .collect();
    safetensors::serialize_to_file(kept, None, &path).unwrap();
}
