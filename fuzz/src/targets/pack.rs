//! `packs::Pack::open` on mutated packs, and every accessor of a pack it opens.

use std::path::Path;

use packs::{BuildOptions, Embedding, LinearData, Pack, QuantKind, TensorKind};
use serde_json::{json, Map, Value};

use crate::category;
use crate::input::{Base, FilePatch, Input};
use crate::json;
use crate::rng::Rng;
use crate::runner::Target;

pub const FILE: &str = "m.pack";

pub struct PackTarget {
    bases: Vec<Base>,
}

impl PackTarget {
    /// Bases: packs of every kind built from the fixtures (the chat checkpoint with its tower and
    /// assets, f32 and q4), plus a random tiny pack; written under `work`.
    pub fn new(work: &Path) -> Result<PackTarget, String> {
        let fx = super::fixtures();
        std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
        let builds: [(&str, &str, QuantKind, Option<QuantKind>); 4] = [
            ("chat-f32", "chat/Qwen3-VL-tiny", QuantKind::F32, None),
            (
                "chat-q4",
                "chat/Qwen3-VL-tiny",
                QuantKind::Q4,
                Some(QuantKind::I8),
            ),
            ("odd-i8", "odd/checkpoint", QuantKind::I8, None),
            (
                "bf16-sharded-bf16",
                "bf16-sharded/checkpoint",
                QuantKind::Bf16,
                None,
            ),
        ];
        let mut bases = Vec::new();
        for (name, dir, quant, vision_quant) in builds {
            let out = work.join(format!("{name}.pack"));
            let opts = BuildOptions {
                vision_quant,
                ..BuildOptions::new(quant)
            };
            packs::build_from_hf(&fx.join(dir), &out, &opts).map_err(|e| format!("{name}: {e}"))?;
            bases.push(super::file_base(name, FILE, &out)?);
        }
        let out = work.join("random-q4.pack");
        packs::write_random(&packs::RandomShape::tiny(), QuantKind::Q4, 1, &out)
            .map_err(|e| e.to_string())?;
        bases.push(super::file_base("random-q4", FILE, &out)?);
        Ok(PackTarget { bases })
    }
}

/// `__metadata__` of a pack: its semantics (a JSON document in a string) and format.
fn mutate_meta(rng: &mut Rng, m: &mut Map<String, Value>) {
    match rng.below(10) {
        0 => {
            m.insert(
                "format".into(),
                json!(*rng.pick(&["xdna-vl-pack/4", "xdna-vl-pack/6", "", "xdna-vl-pack/5 "])),
            );
        }
        1 => {
            let k = rng.pick(&["format", "semantics"]).to_string();
            m.remove(&k);
        }
        2 => {
            let k = rng.pick(&["format", "semantics"]).to_string();
            m.insert(k, json::edge_value(rng));
        }
        _ => json::mutate_embedded(rng, m, "semantics"),
    }
}

impl Target for PackTarget {
    fn name(&self) -> &'static str {
        "pack"
    }

    fn bases(&self) -> &[Base] {
        &self.bases
    }

    fn generate(&self, rng: &mut Rng) -> Input {
        let base = rng.below(self.bases.len());
        let bytes = self.bases[base].file(FILE).expect("a pack base");
        let mut patches: Vec<FilePatch> = Vec::new();
        if rng.chance(1, 4) {
            // The semantics decide what open() plans and checks: mutate them often.
            patches.extend(crate::safetensors::mutate_metadata(
                rng,
                FILE,
                bytes,
                &mutate_meta,
            ));
        } else {
            for _ in 0..rng.range(1, 2) {
                patches.extend(crate::safetensors::mutate(rng, FILE, bytes, &mutate_meta));
            }
        }
        Input {
            base,
            patches,
            knobs: 0,
        }
    }

    fn run(&self, dir: &Path, _out: &Path, _input: &Input) -> Result<(), String> {
        let pack = Pack::open(dir.join(FILE)).map_err(|e| category::of(&e))?;
        exercise(&pack);
        Ok(())
    }
}

/// Every accessor of an opened pack, on every tensor by its role: open() promised they cannot
/// fail, and that each slice has the length its shape says.
pub fn exercise(pack: &Pack) {
    let sem = pack.semantics();
    match pack.embedding() {
        Embedding::F32(w) => assert_eq!(w.len(), sem.vocab_size * sem.hidden_size),
        Embedding::Bf16(w) => assert_eq!(w.len(), sem.vocab_size * sem.hidden_size),
    }
    let head = pack.head();
    assert_eq!((head.n, head.k), (sem.vocab_size, sem.hidden_size));
    for t in pack.tensors() {
        match t.kind {
            TensorKind::Linear => {
                let l = pack.linear(&t.name).expect("a linear of an opened pack");
                let (values, scales) = match l.data {
                    LinearData::F32(w) => (w.len(), None),
                    LinearData::Bf16(w) => (w.len(), None),
                    LinearData::I8 { codes, scales } => (codes.len(), Some((scales.len(), l.n))),
                    LinearData::Q4 { codes, scales } => (
                        codes.len() * 2,
                        Some((scales.len(), l.n * l.k / packs::quant::Q4_GROUP)),
                    ),
                };
                assert_eq!(values, l.n * l.k, "{}", t.name);
                if let Some((got, want)) = scales {
                    assert_eq!(got, want, "scales of {}", t.name);
                }
            }
            TensorKind::Norm => {
                let n = pack.norm(&t.name).expect("a norm of an opened pack");
                assert_eq!(n.len() as u64 * 4, t.len);
            }
            TensorKind::Param => {
                pack.f32_tensor(&t.name).expect("a param of an opened pack");
            }
            TensorKind::Asset => {
                let file = t.name.trim_start_matches(packs::names::ASSET_PREFIX);
                let a = pack.asset(file).expect("an asset of an opened pack");
                assert_eq!(a.len() as u64, t.len);
            }
            TensorKind::Embedding | TensorKind::Scales | TensorKind::Extra => {
                assert!(pack.bytes(&t.name).is_ok());
            }
        }
    }
}
