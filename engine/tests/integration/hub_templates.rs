//! The hub's chat templates (Qwen3-VL Instruct's, Qwen3.5's) rendered by our Jinja as
//! transformers renders them: `tests/fixtures/engine/hub-templates.json`
//! (`tools/template_reference.py`): pictures, a system prompt, a chat whose assistant turns carry
//! `<think>` reasoning (Qwen3.5's template strips it before the last question), tools with calls
//! and results, a message set the template refuses by its own `raise_exception`, and Qwen3.5's
//! `enable_thinking` off and on (`chat_template_kwargs`). Control: each case's text under the
//! other template differs, so a renderer that ignored the file would fail; the thinking switch
//! dropped from the variables renders Qwen3.5's thinking-off case as thinking on.

use crate::common::fixtures;
use engine::{ChatTemplate, TemplateInputs};
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
    assert_eq!(checked, 48);
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
