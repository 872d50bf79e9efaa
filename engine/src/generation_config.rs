//! `generation_config.json`: the checkpoint's end-of-sequence ids and recommended sampling.

use crate::error::{EngineError, Result};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// `source` names the pack or directory in errors.
    pub fn from_json(v: &serde_json::Value, source: &str) -> Result<GenerationConfig> {
        let bad = |field: &str, what: &str| EngineError::Asset {
            name: format!("{source}: generation_config.json"),
            what: format!("`{field}` {what}"),
        };
        let float = |field: &str| -> Result<Option<f32>> {
            match v.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(|f| Some(f as f32))
                    .ok_or_else(|| bad(field, &format!("is {x}, expected a number"))),
            }
        };
        let uint = |field: &str| -> Result<Option<usize>> {
            match v.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| bad(field, &format!("is {x}, expected a non-negative integer"))),
            }
        };
        let eos_token_ids = match v.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64().map(|n| n as u32).ok_or_else(|| {
                        bad("eos_token_id", &format!("holds {x}, expected token ids"))
                    })
                })
                .collect::<Result<_>>()?,
            Some(x) => vec![x.as_u64().ok_or_else(|| {
                bad(
                    "eos_token_id",
                    &format!("is {x}, expected a token id or a list"),
                )
            })? as u32],
        };
        Ok(GenerationConfig {
            eos_token_ids,
            do_sample: v.get("do_sample").and_then(|x| x.as_bool()),
            temperature: float("temperature")?,
            top_k: uint("top_k")?,
            top_p: float("top_p")?,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            max_new_tokens: uint("max_new_tokens")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    #[test]
    fn a_hub_generation_config_gives_eos_ids_and_sampling() {
        // The shape of Qwen3-VL-*-Instruct's generation_config.json.
        let v = serde_json::json!({
            "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
            "eos_token_id": [151645, 151643], "top_k": 20, "top_p": 0.8,
            "repetition_penalty": 1.0, "temperature": 0.7
        });
        let gc = GenerationConfig::from_json(&v, "x").unwrap();
        assert_eq!(gc.eos_token_ids, vec![151645, 151643]);
        let p = SamplingParams::from_generation_config(&gc);
        assert_eq!((p.temperature, p.top_k, p.top_p), (0.7, 20, 0.8));
        // Control: without do_sample the recommendation is greedy.
        let mut v2 = v.clone();
        v2["do_sample"] = serde_json::json!(false);
        let p2 =
            SamplingParams::from_generation_config(&GenerationConfig::from_json(&v2, "x").unwrap());
        assert!(p2.is_greedy());
    }

    #[test]
    fn a_bad_field_is_refused_by_name() {
        let e = GenerationConfig::from_json(&serde_json::json!({"top_k": "many"}), "m.pack")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m.pack: generation_config.json") && e.contains("`top_k`"),
            "{e}"
        );
        let e = GenerationConfig::from_json(&serde_json::json!({"eos_token_id": [1, "x"]}), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`eos_token_id`"), "{e}");
    }
}
