//! `engine::template::ChatTemplate`: the checkpoint's chat template compiled and rendered with a
//! conversation, both mutated: the template's text byte by byte and with Jinja constructs spliced
//! in (loops, recursion, huge repetitions, unknown names, raise_exception), the messages as JSON
//! (roles, contents and parts of other types, deep nesting).

use std::path::Path;

use engine::template::ChatTemplate;

use crate::category;
use crate::input::{Base, FilePatch, Input, Patch};
use crate::rng::Rng;
use crate::runner::Target;

pub const TEMPLATE: &str = "chat_template.jinja";
pub const MESSAGES: &str = "messages.json";

const MESSAGES_JSON: &str = r#"[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"image","image":"picture-1.png"},{"type":"text","text":"Describe this picture."}]},{"role":"assistant","content":"A square."},{"role":"user","content":[{"type":"text","text":"And the colour?"}]}]"#;

/// Jinja fragments spliced into templates.
const SNIPPETS: [&str; 24] = [
    "{% for i in range(100000) %}{{ i }}{% endfor %}",
    "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
    "{{ 'ab' * 1000000 }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{{ raise_exception('refused') }}",
    "{{ messages[0]['content'] | tojson }}",
    "{{ messages | tojson(indent=4) }}",
    "{{ strftime_now('%Y-%m-%d %Q %%') }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "{{ messages[0].content.split('a') }}",
    "{{ messages[99].content }}",
    "{{ (messages | first).content[0].text.upper() }}",
    "{% if %}",
    "{{ 1 / 0 }}",
    "{{ range(99999999) | list | length }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ '%s' % 1 }}",
    "{{ x.y.z }}",
    "{% include 'other' %}",
    "{% for m in messages %}{% break %}{% endfor %}",
    "{{ '' | indent(999999) }}",
    "{{ messages | map(attribute='role') | join(', ') }}",
    "{{ bos_token ~ eos_token }}",
    "{% endfor %}",
];

pub struct TemplateTarget {
    bases: Vec<Base>,
    tokenizer_config: serde_json::Value,
    /// Each base's template compiled with and without the tokenizer config: inputs that mutate
    /// only the messages render these.
    compiled: Vec<[ChatTemplate; 2]>,
}

impl TemplateTarget {
    pub fn new() -> Result<TemplateTarget, String> {
        let fx = super::fixtures();
        let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let mut bases = Vec::new();
        for (name, path) in [
            ("tiny", fx.join("chat/Qwen3-VL-tiny/chat_template.jinja")),
            (
                "qwen3-vl-instruct",
                fx.join("engine/qwen3-vl-instruct.chat_template.jinja"),
            ),
        ] {
            bases.push(Base {
                name: name.into(),
                files: vec![
                    (TEMPLATE.into(), read(&path)?),
                    (MESSAGES.into(), MESSAGES_JSON.as_bytes().to_vec()),
                ],
            });
        }
        let tc = read(&fx.join("chat/Qwen3-VL-tiny/tokenizer_config.json"))?;
        let tokenizer_config = serde_json::from_slice(&tc).map_err(|e| e.to_string())?;
        let mut compiled = Vec::new();
        for b in &bases {
            let text = std::str::from_utf8(b.file(TEMPLATE).expect("a template"))
                .map_err(|e| e.to_string())?;
            let with =
                ChatTemplate::new(text, Some(&tokenizer_config)).map_err(|e| e.to_string())?;
            let without = ChatTemplate::new(text, None).map_err(|e| e.to_string())?;
            compiled.push([without, with]);
        }
        Ok(TemplateTarget {
            bases,
            tokenizer_config,
            compiled,
        })
    }
}

fn splice(rng: &mut Rng, template: &[u8]) -> Vec<u8> {
    let mut out = template.to_vec();
    // At a tag boundary most of the time, so the result still parses.
    let bounds: Vec<usize> = (0..out.len())
        .filter(|&i| i == 0 || out[i - 1] == b'}')
        .collect();
    let at = if rng.chance(3, 4) && !bounds.is_empty() {
        *rng.pick(&bounds)
    } else {
        rng.below(out.len() + 1)
    };
    let snippet = rng.pick(&SNIPPETS).as_bytes().to_vec();
    out.splice(at..at, snippet);
    out
}

impl Target for TemplateTarget {
    fn name(&self) -> &'static str {
        "template"
    }

    fn bases(&self) -> &[Base] {
        &self.bases
    }

    fn generate(&self, rng: &mut Rng) -> Input {
        let base = rng.below(self.bases.len());
        let b = &self.bases[base];
        let mut patches = Vec::new();
        let which = rng.below(10);
        if which < 6 {
            let t = b.file(TEMPLATE).expect("a template");
            let new = if rng.chance(1, 2) {
                splice(rng, t)
            } else {
                crate::bytes::mutate(rng, t, 0..t.len())
            };
            patches.push(FilePatch {
                file: TEMPLATE.into(),
                patch: Patch::Replace(new),
            });
        }
        if which >= 4 {
            let m = b.file(MESSAGES).expect("messages");
            let mut new = m.to_vec();
            for _ in 0..rng.range(1, 3) {
                new = crate::json::mutate_text(rng, &new);
            }
            patches.push(FilePatch {
                file: MESSAGES.into(),
                patch: Patch::Replace(new),
            });
        }
        Input {
            base,
            patches,
            knobs: rng.next_u64(),
        }
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn run(&self, _dir: &Path, _out: &Path, input: &Input) -> Result<(), String> {
        // The input's version of a file: its replacement, else the base's.
        let read = |f: &str| -> Result<&[u8], String> {
            let patched = input.patches.iter().rev().find(|p| p.file == f);
            match patched.map(|p| &p.patch) {
                Some(Patch::Replace(b)) => Ok(b.as_slice()),
                Some(_) => Err(format!("{f}: only replaced, never patched")),
                None => Ok(self.bases[input.base].file(f).expect("a base file")),
            }
        };
        let template = std::str::from_utf8(read(TEMPLATE)?)
            .map_err(|_| "template is not UTF-8".to_string())?;
        let messages: serde_json::Value = serde_json::from_slice(read(MESSAGES)?).map_err(|e| {
            format!(
                "messages not JSON: {}",
                category::of_message(&e.to_string())
            )
        })?;
        let with_tc = !input.knobs.is_multiple_of(4);
        let fresh;
        let t = if input.patches.iter().any(|p| p.file == TEMPLATE) {
            let tc = with_tc.then_some(&self.tokenizer_config);
            fresh = ChatTemplate::new(template, tc)
                .map_err(|e| format!("compile: {}", category::of_message(&e.to_string())))?;
            &fresh
        } else {
            &self.compiled[input.base][usize::from(with_tc)]
        };
        t.render(&messages, input.knobs.is_multiple_of(2))
            .map(|_| ())
            .map_err(|e| format!("render: {}", category::of_message(&e.to_string())))
    }
}
