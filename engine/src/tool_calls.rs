//! Tool calls as Qwen's chat templates ask for them (Hermes' format): each call is
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, several calls one after another
//! separated by a newline. Here: the grammar that makes the model call (OpenAI's `tool_choice`
//! `required` or a named function, by constrained decoding), the parser that reads calls out of
//! an answer (all or nothing: any malformed call leaves the whole answer as text), and the
//! stream splitter that shows text as it comes but holds back what may be a call.

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

/// The grammar of an answer that is only calls: one (`parallel` false) or more, each naming one
/// of `tools` with arguments fitting that tool's parameters schema.
pub fn calls_grammar(tools: &[FunctionTool], parallel: bool) -> Grammar {
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
    let start = if parallel {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    };
    Grammar::Lark(format!(
        "{start}\ncall: \"{CALL_OPEN}\\n\" %json{schema} \"\\n{CALL_CLOSE}\"\n"
    ))
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
/// non-strings with `tojson`), anything else a string. Anything else in the body: not a call.
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
        let parsed = match serde_json::from_str::<Value>(value) {
            Ok(v) if !v.is_string() => v,
            _ => Value::String(value.to_string()),
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
        let Grammar::Lark(one) = calls_grammar(&tools[..1], false) else {
            panic!()
        };
        assert!(one.starts_with("start: call\n"), "{one}");
        assert!(one.contains(r#""name":{"const":"get_weather"}"#), "{one}");
        let Grammar::Lark(many) = calls_grammar(&tools, true) else {
            panic!()
        };
        assert!(
            many.contains("anyOf") && many.contains(r#"{"const":"add"}"#),
            "{many}"
        );
        assert!(many.starts_with("start: call (\"\\n\" call)*"), "{many}");
    }
}
