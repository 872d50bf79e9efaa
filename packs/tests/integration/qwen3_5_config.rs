//! Qwen3.5 config keys the pack could otherwise read past: a config without the attention's
//! output gate is refused by name; an MTP head with embeddings of its own (which packs do not
//! carry) is left out with a warning. Control: the fixture as it is builds with its head. A MoE
//! checkpoint's head (its MLP routed) is carried from fused or per-expert tensors, and refused by
//! name when one is missing.

use std::path::Path;

use packs::build::{build_from_hf, BuildOptions};
use packs::moe::{self, ExpertProj};
use packs::{LinearData, QuantKind};
use serde_json::{json, Value};

use crate::moe_pack::{checkpoint_tensor, copy_checkpoint, edit_config};

fn build(dir: &std::path::Path) -> Result<(packs::BuildReport, packs::Pack), String> {
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("q35.pack");
    let report =
        build_from_hf(dir, &path, &BuildOptions::new(QuantKind::F32)).map_err(|e| e.to_string())?;
    Ok((report, packs::Pack::open(&path).unwrap()))
}

fn carries_mtp(pack: &packs::Pack) -> bool {
    pack.semantics().delta_net.as_ref().is_some_and(|d| d.mtp)
}

#[test]
fn attn_output_gate_false_is_refused_and_dedicated_mtp_embeddings_leave_the_head_out() {
    let dir = copy_checkpoint("q35-odd");
    let (_, pack) = build(dir.path()).unwrap();
    assert!(carries_mtp(&pack), "control: the fixture's head is carried");

    edit_config(dir.path(), |v| {
        v["text_config"]["attn_output_gate"] = false.into()
    });
    let Err(e) = build(dir.path()) else {
        panic!("a config without the gate built");
    };
    assert!(e.contains("text_config.attn_output_gate: false"), "{e}");

    let dir = copy_checkpoint("q35-odd");
    edit_config(dir.path(), |v| {
        v["text_config"]["mtp_use_dedicated_embeddings"] = true.into()
    });
    let (report, pack) = build(dir.path()).unwrap();
    assert!(!carries_mtp(&pack));
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("mtp_use_dedicated_embeddings")),
        "{:?}",
        report.warnings
    );
}

/// One tensor of a safetensors file: (name, dtype, shape, bytes).
type StTensor = (String, String, Vec<usize>, Vec<u8>);
/// A file's tensors in file order.
type StTensors = Vec<StTensor>;

fn read_st(path: &Path) -> StTensors {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut out: Vec<(usize, StTensor)> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, e)| {
            let [a, b] = [0, 1].map(|i| e["data_offsets"][i].as_u64().unwrap() as usize);
            let shape = e["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let dtype = e["dtype"].as_str().unwrap().to_string();
            (
                a,
                (
                    k.clone(),
                    dtype,
                    shape,
                    bytes[8 + n + a..8 + n + b].to_vec(),
                ),
            )
        })
        .collect();
    out.sort_by_key(|t| t.0);
    out.into_iter().map(|t| t.1).collect()
}

fn write_st(path: &Path, tensors: &StTensors) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let a = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            json!({ "dtype": dtype, "shape": shape, "data_offsets": [a, data.len()] }),
        );
    }
    let mut json = serde_json::to_vec(&Value::Object(header)).unwrap();
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// Lets the checkpoint's index map `removed` no more and `added` to the MTP file.
fn reindex(dir: &Path, removed: &[String], added: &[String]) {
    let path = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let map = v["weight_map"].as_object_mut().unwrap();
    for name in removed {
        assert!(map.remove(name).is_some(), "{name} not in the index");
    }
    for name in added {
        map.insert(name.clone(), MTP_FILE.into());
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

const MTP_FILE: &str = "model-mtp.safetensors";

/// Rewrites the head's fused experts (`[E, 2I, H]`, `[E, H, I]`) as one tensor per expert and
/// linear (`mlp.experts.{e}.gate_proj.weight`, ...), the other layout hub checkpoints use.
fn split_mtp_experts(dir: &Path) {
    let path = dir.join(MTP_FILE);
    let prefix = packs::names::mtp::LAYER;
    let (gate_up, down) = (moe::fused_gate_up_in(prefix), moe::fused_down_in(prefix));
    let mut tensors = read_st(&path);
    let take = |tensors: &mut StTensors, name: &str| {
        let i = tensors.iter().position(|t| t.0 == name).unwrap();
        tensors.remove(i)
    };
    let (_, dtype, gu_shape, gu) = take(&mut tensors, &gate_up);
    let (_, _, dn_shape, dn) = take(&mut tensors, &down);
    let [e, two_i, h] = gu_shape[..] else {
        panic!()
    };
    let inter = two_i / 2;
    assert_eq!(dn_shape, [e, h, inter]);
    let size = gu.len() / (e * two_i * h);
    let mut added = Vec::new();
    for ex in 0..e {
        let block = &gu[ex * two_i * h * size..(ex + 1) * two_i * h * size];
        let (g, u) = block.split_at(inter * h * size);
        let d = &dn[ex * h * inter * size..(ex + 1) * h * inter * size];
        for (p, bytes, shape) in [
            (ExpertProj::Gate, g, [inter, h]),
            (ExpertProj::Up, u, [inter, h]),
            (ExpertProj::Down, d, [h, inter]),
        ] {
            let name = moe::expert_in(prefix, ex, p);
            tensors.push((name.clone(), dtype.clone(), shape.to_vec(), bytes.to_vec()));
            added.push(name);
        }
    }
    write_st(&path, &tensors);
    reindex(dir, &[gate_up, down], &added);
}

/// Takes tensor `name` out of the MTP file and the index.
fn drop_mtp_tensor(dir: &Path, name: &str) {
    let path = dir.join(MTP_FILE);
    let mut tensors = read_st(&path);
    let before = tensors.len();
    tensors.retain(|t| t.0 != name);
    assert_eq!(tensors.len() + 1, before, "{name}");
    write_st(&path, &tensors);
    reindex(dir, &[name.to_string()], &[]);
}

/// Every linear of the MTP layer's routed MLP, as f32 values.
fn mtp_moe_linears(pack: &packs::Pack) -> Vec<(String, Vec<f32>)> {
    let prefix = packs::names::mtp::LAYER;
    let m = pack.semantics().moe.clone().unwrap();
    let mut names = vec![moe::router_in(prefix), moe::shared_expert_gate_in(prefix)];
    for p in ExpertProj::ALL {
        names.push(moe::shared_expert_in(prefix, p));
        names.extend((0..m.num_experts).map(|e| moe::expert_in(prefix, e, p)));
    }
    names
        .into_iter()
        .map(|name| {
            let l = pack.linear(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let LinearData::F32(w) = l.data else {
                panic!("{name}: not f32")
            };
            (name, w.to_vec())
        })
        .collect()
}

/// q35-moe-mtp (tools/hf_reference.py): a Qwen3.5-MoE checkpoint whose MTP layer routes its MLP.
/// The head is carried, its experts holding the fused tensors' values; stored per expert instead
/// it gives the same pack values; a head missing any of its tensors is refused by that name.
/// Control: the fixture's model layers store their experts per expert, so the fused reading
/// here is the head's own.
#[test]
fn a_moe_checkpoints_mtp_head_is_carried_fused_or_per_expert_and_refused_when_incomplete() {
    let dir = copy_checkpoint("q35-moe-mtp");
    let (report, fused) = build(dir.path()).unwrap();
    assert!(carries_mtp(&fused), "the MoE head was left out");
    assert!(
        !report.warnings.iter().any(|w| w.contains("mtp")),
        "{:?}",
        report.warnings
    );
    let prefix = packs::names::mtp::LAYER;
    let (gu, gu_shape) = checkpoint_tensor(dir.path(), &moe::fused_gate_up_in(prefix));
    let (dn, dn_shape) = checkpoint_tensor(dir.path(), &moe::fused_down_in(prefix));
    let (e, h, inter) = (4, 64, 32);
    assert_eq!(
        (gu_shape, dn_shape),
        (vec![e, 2 * inter, h], vec![e, h, inter])
    );
    for ex in 0..e {
        for p in ExpertProj::ALL {
            let l = fused.linear(&moe::expert_in(prefix, ex, p)).unwrap();
            let LinearData::F32(w) = l.data else {
                panic!("f32 pack")
            };
            let (first, len) = match p {
                ExpertProj::Gate => (ex * 2 * inter * h, inter * h),
                ExpertProj::Up => (ex * 2 * inter * h + inter * h, inter * h),
                ExpertProj::Down => (ex * h * inter, h * inter),
            };
            let src = if p == ExpertProj::Down { &dn } else { &gu };
            assert_eq!(w, &src[first..first + len], "{}", l.name);
        }
    }
    let fused_values = mtp_moe_linears(&fused);

    let per_expert = copy_checkpoint("q35-moe-mtp");
    split_mtp_experts(per_expert.path());
    let (_, split) = build(per_expert.path()).unwrap();
    assert!(carries_mtp(&split));
    assert_eq!(mtp_moe_linears(&split), fused_values);

    let plants: [(&str, bool); 4] = [
        ("mtp.layers.0.mlp.shared_expert_gate.weight", false),
        ("mtp.layers.0.mlp.gate.weight", false),
        ("mtp.layers.0.mlp.experts.down_proj", false),
        ("mtp.layers.0.mlp.experts.2.up_proj.weight", true),
    ];
    for (name, split_first) in plants {
        let dir = copy_checkpoint("q35-moe-mtp");
        if split_first {
            split_mtp_experts(dir.path());
        }
        drop_mtp_tensor(dir.path(), name);
        let Err(e) = build(dir.path()) else {
            panic!("a head without {name} built");
        };
        println!("without {name}: {e}");
        assert!(e.contains(&format!("tensor {name} is missing")), "{e}");
    }
}
