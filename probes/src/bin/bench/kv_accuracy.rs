//! `bench kv-accuracy`: the bf16 KV cache's accuracy cost, on the transformers fixtures: each
//! case's packs replayed with the f32 and the bf16 cache, each against the reference.

use crate::report::kv_name;
use crate::{refuse, Common};
use compute::Runtime;
use decoder::{Decoder, DecoderOptions, KvDtype};
use packs::{Pack, QuantKind};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn run(c: &Common, fixtures: &Path) -> Value {
    use testkit::reference::file_name as reference_name;
    use testkit::{replay, Reference};
    let Ok(entries) = std::fs::read_dir(fixtures) else {
        refuse(format!(
            "cannot read the fixtures directory {}",
            fixtures.display()
        ))
    };
    let mut cases: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("checkpoint").is_dir() && p.join("inputs.safetensors").is_file())
        .collect();
    cases.sort();
    if cases.is_empty() {
        refuse(format!(
            "{} holds no case (a directory with checkpoint/ and inputs.safetensors)",
            fixtures.display()
        ));
    }
    let mut out = Vec::new();
    for case in cases {
        let name = case
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let inputs = testkit::PromptInputs::open(case.join("inputs.safetensors"))
            .unwrap_or_else(|e| refuse(format!("{}: {e}", case.display())));
        for kind in [QuantKind::F32, QuantKind::I8, QuantKind::Q4] {
            let ref_path = case.join(reference_name(kind));
            if !ref_path.is_file() {
                continue;
            }
            let reference = Reference::open(&ref_path).unwrap_or_else(|e| refuse(format!("{e:?}")));
            let pack_path = c.pack_dir.join(format!("fixture-{name}-{kind}.pack"));
            let opts = packs::build::BuildOptions {
                mrope_section: None,
                ..packs::build::BuildOptions::new(kind)
            };
            packs::build::build_from_hf(&case.join("checkpoint"), &pack_path, &opts)
                .unwrap_or_else(|e| refuse(format!("{}: build {kind}: {e}", case.display())));
            let pack = Arc::new(Pack::open(&pack_path).unwrap_or_else(|e| refuse(e)));
            let mut row = Map::new();
            row.insert("case".into(), json!(name));
            row.insert("kind".into(), json!(kind.to_string()));
            for dtype in [KvDtype::F32, KvDtype::Bf16] {
                let options = DecoderOptions {
                    capacity: inputs.rows() + 64,
                    kv_dtype: dtype,
                    ..DecoderOptions::default()
                };
                let runtime = Runtime::host(c.threads).unwrap_or_else(|e| refuse(e));
                let mut f = Decoder::new(&pack, &runtime, options).unwrap_or_else(|e| refuse(e));
                let r = replay(&mut f, &inputs, &reference, |_, _, _, _| {})
                    .unwrap_or_else(|e| refuse(format!("{}: {e}", case.display())));
                let key = kv_name(dtype).to_string();
                row.insert(
                    key.clone(),
                    json!({
                        "max_abs_logit_diff": r.max_abs_logit_diff(),
                        "decode_max_abs_logit_diff": r.decode.max_abs_diff(),
                        "top1": r.top1_agreement(),
                        "cosine": r.cosine,
                    }),
                );
                if !c.json {
                    println!(
                        "{name:14} {kind:4} {key:4} KV: vs reference max |dlogit| {:.3e} (decode steps {:.3e}), top-1 {:.4}, cosine {:.8}",
                        r.max_abs_logit_diff(),
                        r.decode.max_abs_diff(),
                        r.top1_agreement(),
                        r.cosine
                    );
                }
            }
            let _ = std::fs::remove_file(&pack_path);
            out.push(Value::Object(row));
        }
    }
    json!({ "kv_accuracy": out })
}
