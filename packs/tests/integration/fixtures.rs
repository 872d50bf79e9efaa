//! Packs of every kind built from the transformers-made checkpoints under tests/fixtures/<case>/
//! checkpoint: the semantics agree with config.json and every tensor is the documented encoding
//! of the checkpoint's values.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use packs::layout;
use packs::names::{self, EMBED};
use packs::{build_from_hf, BuildOptions, Pack, QuantKind};
use serde_json::Value;

fn fixture_checkpoints() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (the transformers fixtures are part of the repo)",
                root.display()
            )
        })
        .map(|e| e.unwrap().path().join("checkpoint"))
        .filter(|p| p.join("config.json").exists())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no fixture checkpoints under {}",
        root.display()
    );
    dirs
}

/// Every tensor of every *.safetensors file in `dir`, as f32, keyed by checkpoint name.
fn checkpoint_values(dir: &Path) -> HashMap<String, Vec<f32>> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                safetensors::Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                safetensors::Dtype::F16 => data
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                _ => continue,
            };
            out.insert(name, values);
        }
    }
    out
}

#[test]
fn every_kind_builds_from_every_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    for ck in fixture_checkpoints() {
        let case = ck
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let config: Value =
            serde_json::from_slice(&std::fs::read(ck.join("config.json")).unwrap()).unwrap();
        let text = &config["text_config"];
        let values = checkpoint_values(&ck);
        for quant in QuantKind::ALL {
            let out = tmp.path().join(format!("{case}-{quant}.pack"));
            build_from_hf(&ck, &out, &BuildOptions::new(quant))
                .unwrap_or_else(|e| panic!("{case} {quant}: {e}"));
            let pack = Pack::open(&out).unwrap();
            let sem = pack.semantics();
            assert_eq!(sem.quant, quant);
            assert_eq!(
                sem.architecture,
                config["model_type"].as_str().unwrap(),
                "{case}"
            );
            assert_eq!(
                sem.vocab_size as u64,
                text["vocab_size"].as_u64().unwrap(),
                "{case}"
            );
            assert_eq!(
                sem.hidden_size as u64,
                text["hidden_size"].as_u64().unwrap(),
                "{case}"
            );
            assert_eq!(
                sem.num_layers as u64,
                text["num_hidden_layers"].as_u64().unwrap(),
                "{case}"
            );
            assert_eq!(
                sem.num_kv_heads as u64,
                text["num_key_value_heads"].as_u64().unwrap(),
                "{case}"
            );
            let rope = text
                .get("rope_parameters")
                .filter(|r| r.is_object())
                .unwrap_or(&text["rope_scaling"]);
            let section: Vec<usize> =
                serde_json::from_value(rope["mrope_section"].clone()).unwrap();
            assert_eq!(
                sem.mrope_section.map(|s| s.to_vec()),
                Some(section),
                "{case}"
            );
            assert!(sem.mrope && sem.mrope_interleaved);
            // Qwen3.5's tower has no DeepStack (the key is absent).
            let deepstack = config["vision_config"]["deepstack_visual_indexes"]
                .as_array()
                .map_or(0, Vec::len);
            assert_eq!(sem.deepstack_sets, deepstack, "{case}");
            assert_eq!(
                sem.image_token_id.map(u64::from),
                config["image_token_id"].as_u64(),
                "{case}"
            );
            assert_eq!(
                sem.vision_end_token_id.map(u64::from),
                config["vision_end_token_id"].as_u64(),
                "{case}"
            );
            // Tensor values, keyed by pack name (the hub layout is the pack layout).
            // An expert's values are its part of the fused tensor, as the checkpoint reader
            // slices it (tests/moe_pack.rs checks that slicing against the stored layout).
            let checkpoint = packs::hf::Checkpoint::open(&ck, None, true).unwrap();
            let stored: HashMap<String, Vec<f32>> = layout::weights(sem)
                .iter()
                .map(|w| match w.slice {
                    // A zero-centred norm (Qwen3.5) is stored as 1 + w.
                    None if w.stored_plus_one => (
                        w.source.clone(),
                        values[&w.source].iter().map(|v| 1.0 + v).collect(),
                    ),
                    None => (w.source.clone(), values[&w.source].clone()),
                    Some(_) => {
                        let mut v = vec![0f32; w.rows * w.cols];
                        checkpoint.read_weight(w, 0, &mut v).unwrap();
                        (w.name.clone(), v)
                    }
                })
                .collect();
            assert!(
                stored.contains_key(EMBED)
                    && stored.contains_key(&names::norm(sem.kv_layers()[0], names::Norm::QNorm))
            );
            common::check_pack(&pack, &stored);
        }
    }
}
