//! Tool calls as Qwen's chat templates ask for them, in the form the checkpoint's template
//! teaches ([`CallForm`]): Hermes' JSON (Qwen3-VL), each call
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, or Qwen3.5 / Qwen3.6's
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>`;
//! several calls one after another separated by a newline. Here: the grammar that makes the model
//! call (OpenAI's `tool_choice` `required` or a named function, by constrained decoding), the
//! parser that reads calls of either form out of an answer (all or nothing: any malformed call
//! leaves the whole answer as text), and the stream splitter that shows text as it comes but holds
//! back what may be a call.

use serde_json::{json, Value};

use crate::constraint::{json_options, Grammar};

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";

/// A function the model may call: its name and its parameters' JSON schema.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub parameters: Value,
}

/// A call read out of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments object as compact JSON text (as OpenAI sends them).
    pub arguments: String,
}

/// How a checkpoint's chat template has the model write a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CallForm {
    /// Hermes' JSON object (Qwen3-VL's and the earlier Qwen templates).
    #[default]
    Json,
    /// `<function=NAME>` with a `<parameter=P>` block per argument (Qwen3.5 / Qwen3.6).
    Xml,
}

impl CallForm {
    /// The form a template's source teaches: XML when it writes `<function=` (Qwen3.5's hub
    /// template does, in its tools prompt and its rendering of earlier calls), JSON otherwise.
    pub fn of_template(source: &str) -> CallForm {
        if source.contains(FUNCTION_OPEN) {
            CallForm::Xml
        } else {
            CallForm::Json
        }
    }
}

/// The grammar of an answer that is only calls: one (`parallel` false) or more, each naming one
/// of `tools` with arguments fitting that tool's parameters schema, in `form`. The XML form
/// refuses, by tool and parameter, what its raw values cannot hold (see [`xml_call_rules`]).
pub fn calls_grammar(
    tools: &[FunctionTool],
    parallel: bool,
    form: CallForm,
) -> Result<Grammar, String> {
    let start = if parallel {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    };
    let call = match form {
        CallForm::Json => json_call_rule(tools),
        CallForm::Xml => xml_call_rules(tools)?,
    };
    Ok(Grammar::Lark(format!("{start}\n{call}")))
}

/// `call` in Hermes' JSON: one object naming a tool with its arguments.
fn json_call_rule(tools: &[FunctionTool]) -> String {
    let one_of: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut schema = if one_of.len() == 1 {
        one_of.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": one_of})
    };
    schema["x-guidance"] = json_options();
    format!("call: \"{CALL_OPEN}\\n\" %json{schema} \"\\n{CALL_CLOSE}\"\n")
}

/// String keywords a raw XML value cannot be held to (the value is written unquoted, so only
/// the grammar's free text or an enum's literals describe it).
const RAW_STRING_KEYWORDS: [&str; 4] = ["pattern", "format", "minLength", "maxLength"];

/// `call` in Qwen3.5's XML form, as its template writes a call: `<function=NAME>\n`, then per
/// argument `<parameter=P>\nVALUE\n</parameter>\n` in the order of the schema's `properties`
/// (required ones always, the others optional), then `</function>\n`. A value is what the
/// template writes: a string raw (free text up to the first `\n</parameter>\n`, or one of an
/// enum's literals), a boolean or null as Python's `str()` writes it (`True`, `None`; the
/// parser also takes `true`, `null`), anything else JSON (`tojson`) fitting its schema. Refused
/// by name: names holding `>` or a newline, a string keyword a raw value cannot be held to, a
/// type union with `string`.
fn xml_call_rules(tools: &[FunctionTool]) -> Result<String, String> {
    let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let plain = |what: &str, n: &str| {
            if n.is_empty() || n.contains(['>', '\n']) {
                Err(format!(
                    "tool {:?}: {what} {n:?} cannot be written in the <function=...> call form \
                     (a name there ends at '>')",
                    t.name
                ))
            } else {
                Ok(())
            }
        };
        plain("the name", &t.name)?;
        let empty = serde_json::Map::new();
        let properties = t.parameters["properties"].as_object().unwrap_or(&empty);
        let required: Vec<&str> = t.parameters["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut body = vec![lit(&format!("{}>\n", t.name))];
        for (j, (p, schema)) in properties.iter().enumerate() {
            plain("parameter", p)?;
            let value = xml_value(
                schema,
                &t.parameters,
                &format!("tool {:?} parameter {p:?}", t.name),
            )?;
            let rule = format!("f{i}_p{j}");
            rules.push_str(&format!(
                "{rule}: {} {value}\n",
                lit(&format!("<parameter={p}>\n"))
            ));
            body.push(if required.contains(&p.as_str()) {
                rule
            } else {
                format!("{rule}?")
            });
        }
        rules.push_str(&format!("f{i}: {}\n", body.join(" ")));
        alternatives.push(format!("f{i}"));
    }
    Ok(format!(
        "call: {} ({}) {}\n{rules}raw_value[lazy]: /(.|\\n)*\\n<\\/parameter>\\n/\n",
        lit(&format!("{CALL_OPEN}\n{FUNCTION_OPEN}")),
        alternatives.join(" | "),
        lit(&format!("</function>\n{CALL_CLOSE}")),
    ))
}

/// The grammar of one XML argument's value and its closing `\n</parameter>\n` (see
/// [`xml_call_rules`]); `root` lends its `$defs` / `definitions` to a JSON value's schema.
fn xml_value(schema: &Value, root: &Value, what: &str) -> Result<String, String> {
    let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let close = lit("\n</parameter>\n");
    let literals = |values: &[Value]| -> Option<String> {
        let strings: Option<Vec<String>> = values.iter().map(|v| v.as_str().map(lit)).collect();
        strings.map(|s| format!("({}) {close}", s.join(" | ")))
    };
    if let Some(v) = schema.get("const") {
        if let Some(l) = literals(std::slice::from_ref(v)) {
            return Ok(l);
        }
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        if let Some(l) = literals(values) {
            return Ok(l);
        }
        if values.iter().any(Value::is_string) {
            return Err(format!(
                "{what}: an enum mixing strings with other values cannot be told apart in the \
                 <function=...> call form (strings are written raw)"
            ));
        }
    }
    match schema.get("type") {
        Some(Value::String(t)) if t == "string" => {
            if let Some(k) = RAW_STRING_KEYWORDS
                .iter()
                .find(|k| schema.get(**k).is_some())
            {
                return Err(format!(
                    "{what}: the string keyword {k:?} cannot be enforced in the <function=...> \
                     call form (its values are written raw); drop it, or let the model choose \
                     (tool_choice \"auto\")"
                ));
            }
            return Ok("raw_value".into());
        }
        Some(Value::String(t)) if t == "boolean" => {
            return Ok(format!(
                "(\"True\" | \"False\" | \"true\" | \"false\") {close}"
            ));
        }
        Some(Value::String(t)) if t == "null" => {
            return Ok(format!("(\"None\" | \"null\") {close}"))
        }
        Some(Value::Array(types)) if types.iter().any(|t| t == "string") => {
            return Err(format!(
                "{what}: a type union with \"string\" cannot be told apart in the <function=...> \
                 call form (strings are written raw)"
            ))
        }
        _ => {}
    }
    let mut sub = schema.clone();
    for defs in ["$defs", "definitions"] {
        if let (Some(d), Some(obj)) = (root.get(defs), sub.as_object_mut()) {
            obj.entry(defs).or_insert_with(|| d.clone());
        }
    }
    sub["x-guidance"] = json_options();
    Ok(format!("%json{sub} {close}"))
}

/// An answer split into text and calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The text outside the calls (before the first as it was; whitespace-only pieces after it
    /// dropped). With no calls: the whole answer.
    pub text: String,
    pub calls: Vec<ParsedCall>,
}

/// Reads the calls out of `answer`. A call that does not close, whose JSON does not parse, that
/// lacks `name` (a string) or `arguments` (an object), or names none of `names`, makes the whole
/// answer text with no calls: a client then sees what the model wrote, never half a call.
pub fn parse(answer: &str, names: &[&str]) -> Parsed {
    let as_text = || Parsed {
        text: answer.to_string(),
        calls: Vec::new(),
    };
    let Some(first) = answer.find(CALL_OPEN) else {
        return as_text();
    };
    let mut text = answer[..first].to_string();
    let mut calls = Vec::new();
    let mut rest = &answer[first..];
    while let Some(open) = rest.find(CALL_OPEN) {
        let between = &rest[..open];
        if !between.trim().is_empty() {
            text.push_str(between);
        }
        let body = &rest[open + CALL_OPEN.len()..];
        let Some(close) = body.find(CALL_CLOSE) else {
            return as_text();
        };
        match parse_call(&body[..close], names) {
            Some(call) => calls.push(call),
            None => return as_text(),
        }
        rest = &body[close + CALL_CLOSE.len()..];
    }
    if rest.contains(CALL_CLOSE) {
        return as_text();
    }
    if !rest.trim().is_empty() {
        text.push_str(rest);
    }
    Parsed { text, calls }
}

fn parse_call(json: &str, names: &[&str]) -> Option<ParsedCall> {
    if json.trim_start().starts_with(FUNCTION_OPEN) {
        return parse_xml_call(json, names);
    }
    let Value::Object(call) = serde_json::from_str::<Value>(json.trim()).ok()? else {
        return None;
    };
    let name = call.get("name")?.as_str()?;
    let arguments = call.get("arguments").filter(|a| a.is_object())?;
    if !names.contains(&name) {
        return None;
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

const FUNCTION_OPEN: &str = "<function=";
const PARAMETER_OPEN: &str = "<parameter=";

/// Qwen3.5 / Qwen3.6's call form (their templates render calls so, and the models write them so):
/// `<function=NAME>` then `<parameter=P>\nVALUE\n</parameter>` per argument, `</function>`. A
/// value that parses as JSON (a number, an object, ...) is that value (the template writes
/// mappings and lists with `tojson`), `True` / `False` / `None` the JSON literals (it writes
/// those with Python's `str()`), anything else a string. Anything else in the body: not a call.
fn parse_xml_call(body: &str, names: &[&str]) -> Option<ParsedCall> {
    let body = body.trim();
    let rest = body.strip_prefix(FUNCTION_OPEN)?;
    let (name, rest) = rest.split_once('>')?;
    let mut rest = rest.strip_suffix("</function>")?.trim_start();
    if !names.contains(&name) {
        return None;
    }
    let mut arguments = serde_json::Map::new();
    while !rest.is_empty() {
        let after = rest.strip_prefix(PARAMETER_OPEN)?;
        let (param, after) = after.split_once('>')?;
        let (value, after) = after.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        // The template writes a boolean or null as Python's str() does.
        let parsed = match value {
            "True" => Value::Bool(true),
            "False" => Value::Bool(false),
            "None" => Value::Null,
            _ => match serde_json::from_str::<Value>(value) {
                Ok(v) if !v.is_string() => v,
                _ => Value::String(value.to_string()),
            },
        };
        arguments.insert(param.to_string(), parsed);
        rest = after.trim_start();
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(arguments).to_string(),
    })
}

/// Streams an answer's text while holding back what may be tool calls: from the first
/// `<tool_call>` on (and any end of the text so far that could begin one) nothing is shown until
/// [`CallSplitter::finish`] parses it.
#[derive(Debug, Default)]
pub struct CallSplitter {
    held: String,
    in_calls: bool,
}

impl CallSplitter {
    /// The text of `piece` that can be shown now.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if self.in_calls {
            return String::new();
        }
        let cut = match self.held.find(CALL_OPEN) {
            Some(i) => {
                self.in_calls = true;
                i
            }
            None => self.held.len() - open_prefix_len(&self.held),
        };
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }

    /// The held text parsed (see [`parse`]): the text still to show and the calls.
    pub fn finish(self, names: &[&str]) -> Parsed {
        parse(&self.held, names)
    }
}

/// The length of the longest end of `text` that is a proper beginning of `<tool_call>`.
fn open_prefix_len(text: &str) -> usize {
    (1..CALL_OPEN.len())
        .rev()
        .find(|&n| text.ends_with(&CALL_OPEN[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &["get_weather", "add"];

    fn call(name: &str, args: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn calls_are_read_with_the_text_around_them() {
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        assert_eq!(
            parse(one, NAMES),
            Parsed {
                text: String::new(),
                calls: vec![call("get_weather", r#"{"city":"Paris"}"#)]
            }
        );
        let two = format!(
            "Let me look.\n{one}\n<tool_call>\n{{\"name\": \"add\", \"arguments\": {{\"a\": 1, \"b\": 2}}}}\n</tool_call>\nDone."
        );
        let p = parse(&two, NAMES);
        assert_eq!(p.text, "Let me look.\n\nDone.");
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", r#"{"city":"Paris"}"#),
                call("add", r#"{"a":1,"b":2}"#)
            ]
        );
        // Control: no call, the text as it is.
        assert_eq!(parse("just text", NAMES).text, "just text");
        assert!(parse("just text", NAMES).calls.is_empty());
    }

    #[test]
    fn qwen3_5_xml_calls_are_read_as_its_template_writes_them() {
        let answer = "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=units>\n{\"t\": \"C\"}\n</parameter>\n</function>\n</tool_call>";
        let p = parse(answer, &["get_weather"]);
        assert_eq!(p.text, "Let me look.\n\n");
        assert_eq!(
            p.calls,
            vec![call(
                "get_weather",
                r#"{"city":"Paris","days":3,"units":{"t":"C"}}"#
            )]
        );
        // Controls: an unknown function, an unclosed parameter, stray text in the body.
        for bad in [
            "<tool_call>\n<function=other>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\nhello\n</function>\n</tool_call>",
        ] {
            let p = parse(bad, &["get_weather"]);
            assert!(p.calls.is_empty(), "{bad}");
            assert_eq!(p.text, bad);
        }
    }

    #[test]
    fn any_malformed_call_leaves_the_whole_answer_as_text() {
        let good = "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>";
        for bad in [
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\n</tool_call>",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": \"1, 2\"}\n</tool_call>",
            "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n[1, 2]\n</tool_call>",
            "text </tool_call>",
        ] {
            for answer in [bad.to_string(), format!("{good}\n{bad}")] {
                let p = parse(&answer, NAMES);
                assert!(p.calls.is_empty(), "{answer:?}");
                assert_eq!(p.text, answer);
            }
        }
        // Control: the good call alone parses.
        assert_eq!(parse(good, NAMES).calls, vec![call("add", "{}")]);
    }

    #[test]
    fn the_splitter_shows_text_and_holds_back_calls() {
        let answer =
            "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        // Any split into pieces shows the same text and reads the same call.
        for size in [1, 2, 3, 5, 11, answer.len()] {
            let mut s = CallSplitter::default();
            let mut shown = String::new();
            let chars: Vec<char> = answer.chars().collect();
            for piece in chars.chunks(size) {
                let piece: String = piece.iter().collect();
                let out = s.push(&piece);
                assert!(!out.contains('<'), "size {size}: {out:?}");
                shown.push_str(&out);
            }
            assert_eq!(shown, "Sure.\n", "size {size}");
            let p = s.finish(NAMES);
            assert_eq!(p.calls, vec![call("add", r#"{"a":1}"#)]);
            assert_eq!(p.text, "");
        }
        // A '<' that begins no call is shown once the text rules the call out.
        let mut s = CallSplitter::default();
        assert_eq!(s.push("a <to"), "a ");
        assert_eq!(s.push("y"), "<toy");
        assert_eq!(s.finish(NAMES).text, "");
        // A malformed call is shown at the finish, as text.
        let mut s = CallSplitter::default();
        assert_eq!(s.push("x<tool_call>{oops"), "x");
        assert_eq!(s.finish(NAMES).text, "<tool_call>{oops");
    }

    #[test]
    fn the_grammar_names_the_tools_and_their_schemas() {
        let tools = [
            FunctionTool {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            },
            FunctionTool {
                name: "add".into(),
                parameters: json!({"type": "object"}),
            },
        ];
        let Ok(Grammar::Lark(one)) = calls_grammar(&tools[..1], false, CallForm::Json) else {
            panic!()
        };
        assert!(one.starts_with("start: call\n"), "{one}");
        assert!(one.contains(r#""name":{"const":"get_weather"}"#), "{one}");
        let Ok(Grammar::Lark(many)) = calls_grammar(&tools, true, CallForm::Json) else {
            panic!()
        };
        assert!(
            many.contains("anyOf") && many.contains(r#"{"const":"add"}"#),
            "{many}"
        );
        assert!(many.starts_with("start: call (\"\\n\" call)*"), "{many}");
    }

    #[test]
    fn the_xml_grammar_writes_calls_as_qwen3_5s_template_does() {
        let tools = [FunctionTool {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "unit": {"enum": ["C", "F"]},
                "days": {"type": "integer", "minimum": 1}, "metric": {"type": "boolean"}},
                "required": ["city", "days"]}),
        }];
        let Ok(Grammar::Lark(g)) = calls_grammar(&tools, false, CallForm::Xml) else {
            panic!()
        };
        assert!(
            g.contains(r#"call: "<tool_call>\n<function=" (f0) "</function>\n</tool_call>""#),
            "{g}"
        );
        // Schema order, required ones bare, the others optional.
        assert!(
            g.contains(r#"f0: "get_weather>\n" f0_p0 f0_p1? f0_p2 f0_p3?"#),
            "{g}"
        );
        assert!(
            g.contains(r#"f0_p0: "<parameter=city>\n" raw_value"#),
            "{g}"
        );
        assert!(
            g.contains(r#"f0_p1: "<parameter=unit>\n" ("C" | "F") "\n</parameter>\n""#),
            "{g}"
        );
        assert!(g.contains(r#"%json{"type":"integer","minimum":1,"#), "{g}");
        assert!(
            g.contains(r#"("True" | "False" | "true" | "false")"#),
            "{g}"
        );
        // What a raw value cannot be held to is refused by name (control: without it, accepted).
        for (schema, refused) in [
            (json!({"type": "string", "pattern": "^a"}), "\"pattern\""),
            (json!({"type": ["string", "null"]}), "type union"),
            (json!({"enum": ["a", 1]}), "enum mixing"),
        ] {
            let bad = FunctionTool {
                name: "f".into(),
                parameters: json!({"type": "object", "properties": {"x": schema}}),
            };
            let e = calls_grammar(&[bad], false, CallForm::Xml).unwrap_err();
            assert!(e.contains(refused) && e.contains("parameter \"x\""), "{e}");
            assert!(calls_grammar(
                &[FunctionTool {
                    name: "f".into(),
                    parameters: json!({})
                }],
                false,
                CallForm::Xml
            )
            .is_ok());
        }
        let bad_name = FunctionTool {
            name: "a>b".into(),
            parameters: json!({}),
        };
        assert!(calls_grammar(&[bad_name], false, CallForm::Xml).is_err());
    }

    #[test]
    fn xml_values_take_pythons_literals_as_the_template_writes_them() {
        let answer = "<tool_call>\n<function=f>\n<parameter=a>\nTrue\n</parameter>\n<parameter=b>\nNone\n</parameter>\n<parameter=c>\nfalse\n</parameter>\n<parameter=d>\nTrue story\n</parameter>\n</function>\n</tool_call>";
        let p = parse(answer, &["f"]);
        assert_eq!(
            p.calls,
            vec![call(
                "f",
                r#"{"a":true,"b":null,"c":false,"d":"True story"}"#
            )]
        );
    }

    #[test]
    fn the_call_form_is_the_templates() {
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/engine");
        let read = |f: &str| std::fs::read_to_string(fixtures.join(f)).unwrap();
        assert_eq!(
            CallForm::of_template(&read("qwen3_5-hub.chat_template.jinja")),
            CallForm::Xml
        );
        // Control: Qwen3-VL's template teaches Hermes' JSON.
        assert_eq!(
            CallForm::of_template(&read("qwen3-vl-instruct.chat_template.jinja")),
            CallForm::Json
        );
    }
}
