//! `packs::build_from_hf` on mutated hub checkpoints (config.json, model.safetensors.index.json,
//! shard headers and data, preprocessor_config.json, the chat template's files), built from the
//! fixture checkpoints; a pack it builds must open. One input in four is built whole (every
//! tensor read, checked finite, converted), the others stop after `Checkpoint::open`.

use std::path::Path;

use packs::{BuildOptions, Pack, QuantKind};
use serde_json::{json, Map, Value};

use crate::category;
use crate::input::{Base, FilePatch, Input, Patch};
use crate::json;
use crate::rng::Rng;
use crate::runner::Target;

pub struct CheckpointTarget {
    bases: Vec<Base>,
}

impl CheckpointTarget {
    pub fn new() -> Result<CheckpointTarget, String> {
        let fx = super::fixtures();
        let bases = [
            ("chat", "chat/Qwen3-VL-tiny"),
            ("bf16-sharded", "bf16-sharded/checkpoint"),
            ("odd", "odd/checkpoint"),
            ("hd128", "hd128/checkpoint"),
        ]
        .into_iter()
        .map(|(name, dir)| super::dir_base(name, &fx.join(dir)))
        .collect::<Result<_, _>>()?;
        Ok(CheckpointTarget { bases })
    }
}

fn generic_meta(rng: &mut Rng, m: &mut Map<String, Value>) {
    let mut v = Value::Object(std::mem::take(m));
    json::mutate_value(rng, &mut v);
    if let Value::Object(x) = v {
        *m = x;
    }
}

/// The index's weight_map: shards renamed, escaping the directory, missing, or of another type.
fn mutate_index(rng: &mut Rng, text: &[u8]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<Value>(text) else {
        return json::mutate_text(rng, text);
    };
    let Some(map) = v.get_mut("weight_map").and_then(Value::as_object_mut) else {
        return json::mutate_text(rng, text);
    };
    if rng.chance(1, 2) && !map.is_empty() {
        let keys: Vec<String> = map.keys().cloned().collect();
        let k = rng.pick(&keys).clone();
        let shard = map[&k].as_str().unwrap_or_default().to_string();
        let new = match rng.below(7) {
            0 => json!(format!("../{shard}")),
            1 => json!("model-99999-of-00003.safetensors"),
            2 => json!(""),
            3 => json!("config.json"),
            4 => json!("."),
            5 => {
                map.remove(&k);
                return serde_json::to_vec(&v).expect("a Value serializes");
            }
            _ => json::edge_value(rng),
        };
        map.insert(k, new);
        serde_json::to_vec(&v).expect("a Value serializes")
    } else {
        json::mutate_text(rng, text)
    }
}

impl Target for CheckpointTarget {
    fn name(&self) -> &'static str {
        "checkpoint"
    }

    fn bases(&self) -> &[Base] {
        &self.bases
    }

    fn generate(&self, rng: &mut Rng) -> Input {
        let base = rng.below(self.bases.len());
        let b = &self.bases[base];
        let mut patches = Vec::new();
        for _ in 0..if rng.chance(1, 5) { 2 } else { 1 } {
            let (file, bytes) = {
                // Weighted: the config and the shards most, then the index and the rest.
                let shards: Vec<&(String, Vec<u8>)> = b
                    .files
                    .iter()
                    .filter(|(n, _)| n.ends_with(".safetensors"))
                    .collect();
                match rng.below(20) {
                    0..=7 => b
                        .files
                        .iter()
                        .find(|(n, _)| n == "config.json")
                        .expect("a config"),
                    8..=15 => *rng.pick(&shards),
                    _ => rng.pick(&b.files),
                }
            };
            if rng.chance(1, 40) {
                patches.push(FilePatch {
                    file: file.clone(),
                    patch: Patch::Delete,
                });
                continue;
            }
            if file.ends_with(".safetensors") {
                patches.extend(crate::safetensors::mutate(rng, file, bytes, &generic_meta));
                continue;
            }
            let new = match file.as_str() {
                "model.safetensors.index.json" => mutate_index(rng, bytes),
                f if f.ends_with(".json") => json::mutate_text(rng, bytes),
                _ => crate::bytes::mutate(rng, bytes, 0..bytes.len()),
            };
            patches.push(FilePatch {
                file: file.clone(),
                patch: Patch::Replace(new),
            });
        }
        let mut knobs = rng.next_u64();
        if patches.iter().any(|p| matches!(&p.patch, Patch::Write { offset, bytes } if *offset > 8 && bytes.len() <= 8)) {
            // A planted value in a shard's data only matters to a whole build.
            knobs &= !(3 << 40);
        }
        Input {
            base,
            patches,
            knobs,
        }
    }

    fn run(&self, dir: &Path, out: &Path, input: &Input) -> Result<(), String> {
        let k = input.knobs;
        let quant = match k % 8 {
            0 => QuantKind::Bf16,
            1 => QuantKind::I8,
            2 => QuantKind::Q4,
            _ => QuantKind::F32,
        };
        let opts = BuildOptions {
            vision: !(k >> 3).is_multiple_of(10),
            vision_quant: (k >> 8).is_multiple_of(4).then_some(QuantKind::I8),
            mrope_section: match (k >> 12) % 32 {
                0 => Some([24, 20, 20]),
                1 => Some([(k >> 20) as usize % 70, 2, 2]),
                _ => None,
            },
            ..BuildOptions::new(quant)
        };
        if !(k >> 40).is_multiple_of(4) {
            // Three inputs in four stop at the reader (config, index, every shard header, the
            // plan's tensors checked); the fourth builds, reading and converting every tensor.
            return packs::hf::Checkpoint::open(dir, opts.mrope_section, opts.vision)
                .map(|_| ())
                .map_err(|e| category::of(&packs::BuildError::from(e)));
        }
        let pack_path = out.join("m.pack");
        packs::build_from_hf(dir, &pack_path, &opts).map_err(|e| category::of(&e))?;
        let pack = Pack::open(&pack_path)
            .unwrap_or_else(|e| panic!("a pack packs built does not open: {e}"));
        super::pack::exercise(&pack);
        Ok(())
    }
}
