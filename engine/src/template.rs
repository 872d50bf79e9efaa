//! The checkpoint's own chat template, rendered as transformers renders it: Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, Python's string and dict methods (pycompat),
//! `raise_exception`, a `tojson` that writes what Python's `json.dumps` writes, and the variables
//! transformers passes (`messages`, `tools`, `documents`, `add_generation_prompt` and the
//! tokenizer's special tokens).

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use crate::error::{EngineError, Result};
use crate::tool_calls::CallForm;

const NAME: &str = "chat_template";

/// Special-token fields of `tokenizer_config.json` transformers' `special_tokens_map` passes.
const SPECIAL_TOKEN_FIELDS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// What the chat template is given besides the messages and the generation prompt: OpenAI's
/// function tools (none passes `None`, as transformers does) and extra variables, as transformers'
/// `apply_chat_template(**kwargs)` passes them (a request's `chat_template_kwargs`; Qwen3.5's
/// template reads `enable_thinking`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateInputs {
    pub tools: Vec<serde_json::Value>,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

impl TemplateInputs {
    /// Only `tools`.
    pub fn tools(tools: &[serde_json::Value]) -> TemplateInputs {
        TemplateInputs {
            tools: tools.to_vec(),
            ..TemplateInputs::default()
        }
    }

    /// Refuses an extra variable the template is given already (transformers raises on them:
    /// `render() got multiple values for keyword argument`); the special tokens may be replaced,
    /// as transformers lets them.
    pub fn check(&self) -> Result<()> {
        match self.kwargs.keys().find(|k| GIVEN.contains(&k.as_str())) {
            Some(k) => Err(EngineError::Template(format!(
                "the extra template variable {k:?} is one the template is given already \
                 ({}); drop it",
                GIVEN.join(", ")
            ))),
            None => Ok(()),
        }
    }
}

/// The variables every render gives the template (besides the special tokens).
const GIVEN: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

pub struct ChatTemplate {
    env: Environment<'static>,
    /// bos/eos/unk/pad strings, as the template sees them.
    special_tokens: Vec<(&'static str, String)>,
    call_form: CallForm,
    thinks: bool,
}

impl ChatTemplate {
    /// Compiles `source`; `tokenizer_config` gives the special-token variables.
    pub fn new(source: &str, tokenizer_config: Option<&serde_json::Value>) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", |format: String| -> String {
            strftime(&format, now_utc())
        });
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| EngineError::Template(format!("does not compile: {e:#}")))?;
        let special_tokens = SPECIAL_TOKEN_FIELDS
            .iter()
            .filter_map(|&field| {
                let v = tokenizer_config?.get(field)?;
                // Either a string or an AddedToken object {"content": ...}.
                let s = v
                    .as_str()
                    .or_else(|| v.get("content").and_then(|c| c.as_str()))?;
                Some((field, s.to_string()))
            })
            .collect();
        Ok(ChatTemplate {
            env,
            special_tokens,
            call_form: CallForm::of_template(source),
            // Qwen3.5's and Qwen3's templates write and read `<think>` blocks; Qwen3-VL
            // Instruct's do not.
            thinks: source.contains("<think>"),
        })
    }

    /// The form this template has the model write tool calls in.
    pub fn call_form(&self) -> CallForm {
        self.call_form
    }

    /// The template has a thinking model reason in `<think>` blocks (Ollama's "thinking"
    /// capability).
    pub fn thinks(&self) -> bool {
        self.thinks
    }

    /// The prompt text of `messages` (JSON as transformers' messages: role, content as a string or a
    /// list of `{"type": "text", "text": ...}` / `{"type": "image", ...}` items).
    pub fn render(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(messages, &TemplateInputs::default(), add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `inputs` (tools as transformers'
    /// `apply_chat_template(tools=...)` passes them, extra variables as its `**kwargs`).
    pub fn render_with(
        &self,
        messages: &serde_json::Value,
        inputs: &TemplateInputs,
        add_generation_prompt: bool,
    ) -> Result<String> {
        inputs.check()?;
        let tools = &inputs.tools;
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| EngineError::Template(e.to_string()))?;
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(messages)),
            (
                "tools",
                if tools.is_empty() {
                    Value::from(())
                } else {
                    Value::from_serialize(tools)
                },
            ),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        for (k, v) in &self.special_tokens {
            if !inputs.kwargs.contains_key(*k) {
                ctx.push((k, Value::from(v.as_str())));
            }
        }
        for (k, v) in &inputs.kwargs {
            ctx.push((k, Value::from_serialize(v)));
        }
        let ctx: Value = ctx.into_iter().collect();
        tmpl.render(ctx)
            .map_err(|e| EngineError::Template(format!("rendering failed: {e:#}")))
    }
}

/// Seconds since the Unix epoch as (year, month, day, hour, minute, second), UTC.
fn now_utc() -> (i64, u32, u32, u32, u32, u32) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    civil(secs)
}

/// Days-from-civil inverted (Howard Hinnant's algorithm): the calendar date of a Unix time.
fn civil(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// The `strftime` codes chat templates use, in UTC (transformers' `strftime_now` is Python's
/// `datetime.now().strftime`, in the local zone): %Y %m %d %H %M %S %b %B %%; other codes are
/// kept as written.
fn strftime(format: &str, (y, mo, d, h, mi, s): (i64, u32, u32, u32, u32, u32)) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{mo:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('B') => out.push_str(MONTHS[mo as usize - 1]),
            Some('b') => out.push_str(&MONTHS[mo as usize - 1][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Python's `json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys)` (transformers
/// replaces Jinja's HTML-escaping `tojson` with this).
fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(
        &value,
        &mut out,
        indent,
        0,
        sort_keys.unwrap_or(false),
        ensure_ascii.unwrap_or(false),
    )?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &Value,
    out: &mut String,
    indent: Option<usize>,
    depth: usize,
    sort_keys: bool,
    ascii: bool,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let (item_sep, key_sep) = if indent.is_some() {
        (",", ": ")
    } else {
        (", ", ": ")
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(f) = v.as_i64() {
                out.push_str(&f.to_string())
            } else {
                let f = f64::try_from(v.clone())?;
                // Python writes 1.0, not 1.
                let s = format!("{f:?}");
                out.push_str(&s)
            }
        }
        ValueKind::String => write_json_string(v.as_str().unwrap_or_default(), out, ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, out, indent, depth + 1, sort_keys, ascii)?;
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json_string(&k.to_string(), out, ascii);
                out.push_str(key_sep);
                write_json(&v.get_item(k)?, out, indent, depth + 1, sort_keys, ascii)?;
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot write a {} as JSON", v.kind()),
            ))
        }
    }
    Ok(())
}

fn write_json_string(s: &str, out: &mut String, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> String {
        let t = ChatTemplate::new(src, None).unwrap();
        t.render(&ctx, false).unwrap()
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let out = render(
            "{{ messages | tojson }}",
            serde_json::json!({"b": [1, 2.5, "é<\"x\">"], "a": null, "c": true}),
        );
        // Python: json.dumps({"b": [1, 2.5, "é<\"x\">"], "a": None, "c": True}, ensure_ascii=False):
        // the keys in the order given, as Python's dicts keep them (serde_json keeps insertion
        // order with `preserve_order`, which llguidance turns on for the workspace).
        assert_eq!(out, r#"{"b": [1, 2.5, "é<\"x\">"], "a": null, "c": true}"#);
        // Control: compact JSON (serde_json's, minijinja's) lacks Python's spaces.
        let compact = serde_json::to_string(&serde_json::json!({"a": null, "c": true})).unwrap();
        assert_eq!(compact, r#"{"a":null,"c":true}"#);
        assert!(!out.contains(&compact[1..10]));
    }

    #[test]
    fn strftime_writes_the_calendar_date() {
        // 2024-02-29 13:05:09 UTC = 1709211909 (a leap day).
        let t = civil(1_709_211_909);
        assert_eq!(t, (2024, 2, 29, 13, 5, 9));
        assert_eq!(
            strftime("%d %b %Y, %B %H:%M:%S %%", t),
            "29 Feb 2024, February 13:05:09 %"
        );
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        // The template function renders today's year.
        let year = render("{{ strftime_now('%Y') }}", serde_json::json!([]));
        assert_eq!(year, now_utc().0.to_string());
    }

    #[test]
    fn raise_exception_fails_the_rendering_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('no system role here') }}", None).unwrap();
        let e = t
            .render(&serde_json::json!([]), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no system role here"), "{e}");
    }

    #[test]
    fn python_string_methods_and_trimmed_blocks_render() {
        let src = "{%- for m in messages %}\n  {%- if m.startswith('a') %}{{ m.upper() }}{% endif %}\n{%- endfor %}\n";
        let out = render(src, serde_json::json!(["ab", "cd", "ax"]));
        assert_eq!(out, "ABAX");
    }
}
