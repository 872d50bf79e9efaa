//! The hub's chat templates (Qwen3-VL Instruct's, Qwen3.5's) rendered by our Jinja as
//! transformers renders them: `tests/fixtures/engine/hub-templates.json`
//! (`tools/template_reference.py`): pictures, a system prompt, a chat whose assistant turns carry
//! `<think>` reasoning (Qwen3.5's template strips it before the last question), assistant turns
//! with a `reasoning_content` field (rendered from engine `Message`s too), tools with calls
//! and results, a message set the template refuses by its own `raise_exception`, and Qwen3.5's
//! `enable_thinking` off and on (`chat_template_kwargs`). Control: each case's text under the
//! other template differs, so a renderer that ignored the file would fail; the thinking switch
//! dropped from the variables renders Qwen3.5's thinking-off case as thinking on.

use crate::common::fixtures;
use engine::{ChatTemplate, Content, Message, Role, TemplateInputs, ToolCall};
use serde_json::Value;

fn reference() -> Value {
    let path = fixtures().join("engine/hub-templates.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn template(file: &str) -> ChatTemplate {
    let dir = fixtures().join("chat/Qwen3-VL-tiny");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let src = std::fs::read_to_string(fixtures().join("engine").join(file)).unwrap();
    ChatTemplate::new(&src, Some(&config)).unwrap()
}

fn render(t: &ChatTemplate, case: &Value, generation: bool) -> Result<String, String> {
    let inputs = TemplateInputs {
        tools: case["tools"].as_array().cloned().unwrap_or_default(),
        kwargs: case["kwargs"].as_object().cloned().unwrap_or_default(),
    };
    t.render_with(&case["messages"], &inputs, generation)
        .map_err(|e| e.to_string())
}

#[test]
fn hub_templates_render_as_transformers_renders_them() {
    let doc = reference();
    let templates = doc["templates"].as_object().unwrap();
    assert_eq!(templates.len(), 2);
    let mut checked = 0;
    for (name, t) in templates {
        let tmpl = template(t["file"].as_str().unwrap());
        for (case_name, case) in t["cases"].as_object().unwrap() {
            for (key, generation) in [("generation", true), ("no_generation", false)] {
                let want = &case[key];
                let got = render(&tmpl, case, generation);
                match (want.get("text"), got) {
                    (Some(text), Ok(got)) => {
                        assert_eq!(got, text.as_str().unwrap(), "{name} {case_name} {key}")
                    }
                    (None, Err(e)) => {
                        let msg = want["error"].as_str().unwrap();
                        assert!(e.contains(msg), "{name} {case_name} {key}: {e}")
                    }
                    (want, got) => panic!("{name} {case_name} {key}: want {want:?}, got {got:?}"),
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 52);
}

#[test]
fn control_the_other_template_renders_every_case_differently() {
    let doc = reference();
    let t = &doc["templates"];
    let vl = template(t["qwen3-vl-instruct"]["file"].as_str().unwrap());
    for (case_name, case) in t["qwen3_5"]["cases"].as_object().unwrap() {
        let Some(text) = case["generation"].get("text") else {
            continue;
        };
        let other = render(&vl, case, true).unwrap();
        assert_ne!(other, text.as_str().unwrap(), "{case_name}");
    }
}

#[test]
fn extra_template_variables_switch_qwen3_5s_thinking_and_given_ones_are_refused() {
    let doc = reference();
    let q35 = &doc["templates"]["qwen3_5"];
    let t = template(q35["file"].as_str().unwrap());
    let case = &q35["cases"]["thinking_off"];
    let off = case["generation"]["text"].as_str().unwrap();
    assert!(off.ends_with("<think>\n\n</think>\n\n"), "{off:?}");
    // Control: without the variable the template thinks.
    let mut dropped = case.clone();
    dropped["kwargs"] = serde_json::json!({});
    let on = render(&t, &dropped, true).unwrap();
    assert_ne!(on, off);
    assert!(on.ends_with("<think>\n"), "{on:?}");
    // A variable the template is given already is refused by name, as transformers refuses it.
    for given in ["messages", "tools", "documents", "add_generation_prompt"] {
        let mut bad = case.clone();
        bad["kwargs"] = serde_json::json!({ given: true });
        let e = render(&t, &bad, true).unwrap_err();
        assert!(e.contains(&format!("{given:?}")), "{given}: {e}");
    }
}

/// The fixture's messages as the engine's (text turns, calls, results, reasoning), rendered
/// through `Message::to_template_json` as `xdna-vl serve` renders a request's history.
fn engine_messages(case: &Value, keep_reasoning: bool) -> Value {
    let messages: Vec<Message> = case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                _ => Role::System,
            };
            let text = m["content"].as_str().unwrap().to_string();
            Message {
                tool_calls: m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| ToolCall {
                        id: c["id"].as_str().unwrap().into(),
                        name: c["function"]["name"].as_str().unwrap().into(),
                        arguments: c["function"]["arguments"].to_string(),
                    })
                    .collect(),
                tool_call_id: m["tool_call_id"].as_str().map(String::from),
                reasoning_content: m["reasoning_content"]
                    .as_str()
                    .filter(|_| keep_reasoning)
                    .map(String::from),
                ..Message::new(role, vec![Content::Text(text)])
            }
        })
        .collect();
    Value::Array(messages.iter().map(Message::to_template_json).collect())
}

#[test]
fn an_assistant_turns_reasoning_renders_as_transformers_renders_it() {
    let doc = reference();
    let q35 = &doc["templates"]["qwen3_5"];
    let t = template(q35["file"].as_str().unwrap());
    let case = &q35["cases"]["reasoning_field"];
    let want = case["generation"]["text"].as_str().unwrap();
    assert!(
        want.contains("<think>\nThe user wants the weather.\n</think>\n\nLet me look."),
        "{want}"
    );
    let mut ours = case.clone();
    ours["messages"] = engine_messages(case, true);
    assert_eq!(render(&t, &ours, true).unwrap(), want);
    // Control: without the field the template writes an empty think block there.
    ours["messages"] = engine_messages(case, false);
    let without = render(&t, &ours, true).unwrap();
    assert_ne!(without, want);
    assert!(
        without.contains("<think>\n\n</think>\n\nLet me look."),
        "{without}"
    );
}

/// Whether a template has the model reason in `<think>` blocks (Ollama's "thinking"
/// capability): Qwen3.5's hub template does, Qwen3-VL Instruct's does not. Control: nor does
/// the tiny checkpoint's.
#[test]
fn templates_say_whether_they_think() {
    assert!(template("qwen3_5-hub.chat_template.jinja").thinks());
    assert!(!template("qwen3-vl-instruct.chat_template.jinja").thinks());
    let dir = fixtures().join("chat/Qwen3-VL-tiny");
    let tiny = ChatTemplate::new(
        &std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap(),
        None,
    )
    .unwrap();
    assert!(!tiny.thinks());
}
