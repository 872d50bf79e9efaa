//! Qwen3-VL-MoE checkpoints: the experts land in the pack as ordinary linears holding the fused
//! tensors' values (both orientations), and broken MoE checkpoints are refused by name, exit 2,
//! with no pack left behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use packs::moe::{self, ExpertProj};
use packs::{LinearData, Pack, QuantKind};
use serde_json::Value;

/// A committed MoE fixture checkpoint (made by transformers: tools/hf_reference.py --moe).
fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(case)
        .join("checkpoint")
}

/// A copy of `case`'s checkpoint in a temporary directory.
pub(crate) fn copy_checkpoint(case: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(case)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

pub(crate) fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// Gives tensor `name` another shape of the same byte size in whichever file holds it.
fn reshape_tensor(dir: &Path, name: &str, shape: &[usize]) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let Some(entry) = header.get_mut(name) else {
            continue;
        };
        entry["shape"] = serde_json::json!(shape);
        let mut json = serde_json::to_vec(&header).unwrap();
        json.resize(json.len().div_ceil(8) * 8, b' ');
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.extend_from_slice(&bytes[8 + n..]);
        std::fs::write(&path, out).unwrap();
        return;
    }
    panic!("{name} not in {}", dir.display());
}

/// `packs build` on `dir`: (exit code, stderr), and whether the output directory is empty after.
fn build_cli(dir: &Path) -> (i32, String, bool) {
    let out = tempfile::tempdir().unwrap();
    let result = Command::new(env!("CARGO_BIN_EXE_packs"))
        .arg("build")
        .arg(dir)
        .args(["-o"])
        .arg(out.path().join("x.pack"))
        .args(["--quant", "q4", "-q"])
        .output()
        .unwrap();
    let empty = std::fs::read_dir(out.path()).unwrap().next().is_none();
    (
        result.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&result.stderr).into_owned(),
        empty,
    )
}

/// The f32 values of a 3-D tensor of a single-file or sharded checkpoint, as stored.
pub(crate) fn checkpoint_tensor(dir: &Path, name: &str) -> (Vec<f32>, Vec<usize>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let Some(e) = header.get(name) else { continue };
        let shape: Vec<usize> = e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let [a, b] = [0, 1].map(|i| e["data_offsets"][i].as_u64().unwrap() as usize);
        let data = &bytes[8 + n + a..8 + n + b];
        let values = match e["dtype"].as_str().unwrap() {
            "BF16" => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            "F32" => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            d => panic!("dtype {d}"),
        };
        return (values, shape);
    }
    panic!("{name} not in {}", dir.display());
}

#[test]
fn experts_hold_the_fused_tensors_values_in_both_orientations() {
    // moe-top2: the 5.x [E, 2I, H] layout; moe-top4: the hub's [E, H, 2I] (transposed).
    for (case, hub) in [("moe-top2", false), ("moe-top4", true)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pack");
        packs::build_from_hf(
            &fixture(case),
            &path,
            &packs::BuildOptions::new(QuantKind::F32),
        )
        .unwrap();
        let pack = Pack::open(&path).unwrap();
        let sem = pack.semantics().clone();
        let m = sem.moe.clone().expect("a MoE pack");
        let (h, inter) = (sem.hidden_size, m.moe_intermediate_size);
        let mut checked = 0;
        for &layer in &m.sparse_layers {
            let (gu, gu_shape) = checkpoint_tensor(&fixture(case), &moe::fused_gate_up(layer));
            let (dn, _) = checkpoint_tensor(&fixture(case), &moe::fused_down(layer));
            let expected_shape = if hub {
                [m.num_experts, h, 2 * inter]
            } else {
                [m.num_experts, 2 * inter, h]
            };
            assert_eq!(gu_shape, expected_shape, "{case}");
            // Element (n, k) of expert e's gate / up / down, as transformers reads it.
            let gate_up = |e: usize, n: usize, k: usize| {
                if hub {
                    gu[(e * h + k) * 2 * inter + n]
                } else {
                    gu[(e * 2 * inter + n) * h + k]
                }
            };
            let down = |e: usize, n: usize, k: usize| {
                if hub {
                    dn[(e * inter + k) * h + n]
                } else {
                    dn[(e * h + n) * inter + k]
                }
            };
            for e in 0..m.num_experts {
                for p in ExpertProj::ALL {
                    let l = pack.linear(&moe::expert(layer, e, p)).unwrap();
                    let LinearData::F32(w) = l.data else {
                        panic!("f32 pack")
                    };
                    for n in 0..l.n {
                        for k in 0..l.k {
                            let want = match p {
                                ExpertProj::Gate => gate_up(e, n, k),
                                ExpertProj::Up => gate_up(e, inter + n, k),
                                ExpertProj::Down => down(e, n, k),
                            };
                            assert_eq!(w[n * l.k + k], want, "{case} {}", l.name);
                        }
                    }
                    checked += 1;
                }
            }
            let router = pack.linear(&moe::router(layer)).unwrap();
            assert!(matches!(router.data, LinearData::F32(_)));
            assert_eq!((router.n, router.k), (m.num_experts, h));
        }
        println!("{case}: {checked} expert linears equal the checkpoint's fused values");
    }
}

#[test]
fn quantized_packs_keep_the_router_f32() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pack");
    packs::build_from_hf(
        &fixture("moe-top2"),
        &path,
        &packs::BuildOptions::new(QuantKind::Q4),
    )
    .unwrap();
    let pack = Pack::open(&path).unwrap();
    let m = pack.semantics().moe.clone().unwrap();
    assert_eq!(m.sparse_layers, [0, 2]);
    assert_eq!(
        (m.num_experts, m.top_k, m.moe_intermediate_size),
        (6, 2, 32)
    );
    assert!(m.norm_topk_prob);
    let router = pack.linear(&moe::router(0)).unwrap();
    assert!(matches!(router.data, LinearData::F32(_)));
    let expert = pack.linear(&moe::expert(2, 5, ExpertProj::Down)).unwrap();
    assert!(matches!(expert.data, LinearData::Q4 { .. }));
    // Layer 1 is dense (mlp_only_layers): its MLP is the ordinary one, no router.
    assert!(pack
        .linear(&packs::names::proj(1, packs::names::Proj::Gate))
        .is_ok());
    assert!(pack.linear(&moe::router(1)).is_err());
}

/// A planted mistake in a checkpoint copy.
type Plant = dyn Fn(&Path);

#[test]
fn broken_moe_checkpoints_are_refused_by_name_with_no_pack_left() {
    // Control: the unmodified copy builds.
    let ok = copy_checkpoint("moe-top2");
    let (code, stderr, empty) = build_cli(ok.path());
    assert_eq!(code, 0, "{stderr}");
    assert!(!empty);

    let cases: Vec<(&str, Box<Plant>, &str)> = vec![
        (
            "no expert count",
            Box::new(|d| {
                edit_config(d, |v| {
                    let t = v["text_config"].as_object_mut().unwrap();
                    t.remove("num_local_experts");
                    t.remove("num_experts");
                })
            }),
            "text_config.num_experts: missing",
        ),
        (
            "no top-k",
            Box::new(|d| {
                edit_config(d, |v| {
                    v["text_config"]
                        .as_object_mut()
                        .unwrap()
                        .remove("num_experts_per_tok");
                })
            }),
            "text_config.num_experts_per_tok: missing",
        ),
        (
            "top-k above the expert count",
            Box::new(|d| edit_config(d, |v| v["text_config"]["num_experts_per_tok"] = 7.into())),
            "top_k (num_experts_per_tok) 7 is more than num_experts 6",
        ),
        (
            "norm_topk_prob false",
            Box::new(|d| edit_config(d, |v| v["text_config"]["norm_topk_prob"] = false.into())),
            "text_config.norm_topk_prob: false",
        ),
        (
            "fused expert tensor of the wrong shape",
            Box::new(|d| {
                reshape_tensor(
                    d,
                    "model.language_model.layers.2.mlp.experts.gate_up_proj",
                    &[3, 128, 96],
                )
            }),
            "fused expert tensor model.language_model.layers.2.mlp.experts.gate_up_proj has shape [3, 128, 96], expected [6, 64, 96]",
        ),
        (
            "router of the wrong size",
            Box::new(|d| {
                reshape_tensor(
                    d,
                    "model.language_model.layers.0.mlp.gate.weight",
                    &[3, 192],
                )
            }),
            "tensor model.language_model.layers.0.mlp.gate.weight has shape [3, 192], expected [6, 96]",
        ),
    ];
    for (what, plant, needle) in cases {
        let dir = copy_checkpoint("moe-top2");
        plant(dir.path());
        let (code, stderr, empty) = build_cli(dir.path());
        println!("{what}: exit {code}: {}", stderr.trim());
        assert_eq!(code, 2, "{what}: {stderr}");
        assert!(stderr.contains(needle), "{what}: {stderr}");
        assert!(empty, "{what}: a partial pack was left behind");
    }
}

#[test]
fn the_reduced_30b_shape_is_a_valid_moe_plan() {
    let shape = packs::RandomShape::named("qwen3-vl-30b-a3b-reduced").unwrap();
    let sem = shape.semantics_for(QuantKind::Q4, 1);
    sem.validate().unwrap();
    let m = sem.moe.clone().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.moe_intermediate_size),
        (128, 8, 768)
    );
    assert_eq!(
        (sem.hidden_size, sem.num_heads, sem.num_kv_heads),
        (2048, 32, 4)
    );
    let plan = packs::layout::weights(&sem);
    let experts = plan.iter().filter(|w| w.slice.is_some()).count();
    assert_eq!(experts, sem.num_layers * 128 * 3);
    // Control: a dense layer's MLP is absent from every sparse layer.
    assert!(!plan
        .iter()
        .any(|w| w.name == packs::names::proj(0, packs::names::Proj::Gate)));
}
