//! `server::api::parse_chat_body`: the body of POST /v1/chat/completions, from valid requests
//! (tools, tool calls and messages, response formats among them) mutated field by field and byte
//! by byte.

use std::path::Path;

use crate::category;
use crate::input::{Base, FilePatch, Input, Patch};
use crate::rng::Rng;
use crate::runner::Target;

pub const FILE: &str = "body.json";

/// The cap `xdna-vl serve` applies to max_tokens.
const MAX_TOKENS_CAP: usize = 512;

const BODIES: [&str; 8] = [
    r#"{"model":"qwen3-vl","messages":[{"role":"user","content":"Hello"}]}"#,
    r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}],"max_tokens":64,"temperature":0.7,"top_p":0.9,"top_k":20,"seed":5}"#,
    r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}],"stream":true,"stream_options":{"include_usage":true},"stop":["\n\n","END"]}"#,
    r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"file.png"},{"type":"text","text":"what?"}]}],"max_completion_tokens":9999,"min_p":0.05,"repetition_penalty":1.1,"frequency_penalty":0.5,"presence_penalty":-0.5,"n":1}"#,
    r#"{"messages":[{"role":"user","content":"x"}],"stop":"STOP","temperature":0,"stream":false}"#,
    r#"{"model":null,"messages":[{"role":"developer","content":"rules"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"seed":18446744073709551615}"#,
    r#"{"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false}"#,
    r#"{"messages":[{"role":"user","content":"json"}],"response_format":{"type":"json_schema","json_schema":{"name":"pick","strict":true,"schema":{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"]}}},"tool_choice":"none","tools":[],"logprobs":false}"#,
];

pub struct ChatBodyTarget {
    bases: Vec<Base>,
}

impl ChatBodyTarget {
    pub fn new() -> ChatBodyTarget {
        let bases = BODIES
            .iter()
            .enumerate()
            .map(|(i, b)| Base {
                name: format!("body{i}"),
                files: vec![(FILE.into(), b.as_bytes().to_vec())],
            })
            .collect();
        ChatBodyTarget { bases }
    }
}

impl Default for ChatBodyTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for ChatBodyTarget {
    fn name(&self) -> &'static str {
        "chat-body"
    }

    fn bases(&self) -> &[Base] {
        &self.bases
    }

    fn generate(&self, rng: &mut Rng) -> Input {
        let base = rng.below(self.bases.len());
        let mut bytes = self.bases[base].files[0].1.clone();
        for _ in 0..rng.range(1, 3) {
            bytes = crate::json::mutate_text(rng, &bytes);
        }
        Input {
            base,
            patches: vec![FilePatch {
                file: FILE.into(),
                patch: Patch::Replace(bytes),
            }],
            knobs: 0,
        }
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn run(&self, dir: &Path, _out: &Path, input: &Input) -> Result<(), String> {
        // In memory: the server hands the parser the body bytes, no file is involved.
        let file;
        let body = match input.patches.first().map(|p| &p.patch) {
            Some(Patch::Replace(b)) => b,
            _ => {
                file = std::fs::read(dir.join(FILE)).map_err(|e| e.to_string())?;
                &file
            }
        };
        let b = server::api::parse_chat_body(body, MAX_TOKENS_CAP)
            .map_err(|e| category::of_message(&e.message))?;
        // What the engine is handed must be in range: never more tokens than the cap, no
        // non-finite sampling parameter, at least one message.
        let s = &b.sampling;
        assert!(
            s.max_tokens.is_none_or(|m| m <= MAX_TOKENS_CAP),
            "{:?}",
            s.max_tokens
        );
        for v in [
            s.temperature,
            s.top_p,
            s.min_p,
            s.repetition_penalty,
            s.frequency_penalty,
            s.presence_penalty,
        ]
        .into_iter()
        .flatten()
        {
            assert!(v.is_finite(), "a sampling parameter is {v}");
        }
        assert!(!b.messages.is_empty());
        Ok(())
    }
}
