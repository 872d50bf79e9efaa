//! `testkit::PromptInputs::open` (hybrid-inputs/1 files) on mutated fixture inputs, and what the
//! forward does with inputs it opened: rows, image rows, planes, the next rotary position, the
//! check against a model.

use std::path::Path;

use serde_json::{json, Map, Value};
use testkit::PromptInputs;

use crate::category;
use crate::input::{Base, Input};
use crate::rng::Rng;
use crate::runner::Target;

pub const FILE: &str = "inputs.safetensors";

pub struct InputsTarget {
    bases: Vec<Base>,
    semantics: packs::Semantics,
}

impl InputsTarget {
    pub fn new() -> Result<InputsTarget, String> {
        let fx = super::fixtures();
        let bases = ["chat", "bf16-sharded", "odd", "hd128"]
            .into_iter()
            .map(|name| super::file_base(name, FILE, &fx.join(name).join(FILE)))
            .collect::<Result<_, _>>()?;
        let semantics = packs::RandomShape::tiny().semantics_for(packs::QuantKind::F32, 0);
        Ok(InputsTarget { bases, semantics })
    }
}

/// The metadata: format, image_token_id, rope_delta as strings of edge integers or non-integers.
fn mutate_meta(rng: &mut Rng, m: &mut Map<String, Value>) {
    let key = rng
        .pick(&["format", "image_token_id", "rope_delta", "extra"])
        .to_string();
    let value = match rng.below(8) {
        0 => {
            m.remove(&key);
            return;
        }
        1 => json!(*rng.pick(&["hybrid-inputs/2", "", "hybrid-inputs/1 "])),
        2 => json!(*rng.pick(&[
            "",
            "abc",
            " 5 ",
            "1e3",
            "-0",
            "+7",
            "0x10",
            "99999999999999999999"
        ])),
        3 => json!(i64::MIN.to_string()),
        4 => json!((rng.interesting() as i64).to_string()),
        5 => json!(crate::json::edge_value(rng)),
        _ => json!((rng.below(200) as i64 - 100).to_string()),
    };
    m.insert(key, value);
}

impl Target for InputsTarget {
    fn name(&self) -> &'static str {
        "inputs"
    }

    fn bases(&self) -> &[Base] {
        &self.bases
    }

    fn generate(&self, rng: &mut Rng) -> Input {
        let base = rng.below(self.bases.len());
        let bytes = self.bases[base].file(FILE).expect("an inputs base");
        let mut patches = Vec::new();
        for _ in 0..rng.range(1, 2) {
            patches.extend(crate::safetensors::mutate(rng, FILE, bytes, &mutate_meta));
        }
        Input {
            base,
            patches,
            knobs: 0,
        }
    }

    fn run(&self, dir: &Path, _out: &Path, _input: &Input) -> Result<(), String> {
        let inputs = PromptInputs::open(dir.join(FILE)).map_err(|e| {
            let msg = e.msg.trim_start_matches(&*e.path.display().to_string());
            category::of_message(msg)
        })?;
        let rows = inputs.rows();
        let image_rows = inputs.image_rows();
        assert!(image_rows.iter().all(|&r| r < rows));
        let h = inputs.hybrid();
        assert_eq!(h.planes.as_ref().map(Vec::len), Some(3 * rows));
        assert_eq!(
            h.deepstack.len(),
            h.deepstack_sets * image_rows.len() * inputs.hidden
        );
        let _ = inputs.next_rotary_pos();
        let _ = inputs.check_against(&self.semantics);
        Ok(())
    }
}
