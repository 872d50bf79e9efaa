//! Tools: OpenAI's function tools, an assistant turn's calls and a tool turn's result rendered
//! through Qwen3-VL Instruct's own template (worked by hand from the template's rules); the calls
//! grammar makes the tiny random model call a tool with arguments fitting its schema, and the
//! parser reads the call back. Controls: without tools the template writes no `# Tools` block;
//! without the grammar the model writes no call.

use crate::common;

use common::*;
use engine::tool_calls::{calls_grammar, parse, CallForm, FunctionTool};
use engine::{
    ChatTemplate, FinishReason, Generation, Message, PromptAblation, PromptBuilder, SamplingParams,
    Session, TemplateInputs, ToolCall,
};
use serde_json::{json, Value};

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green"]},
                "n": {"type": "integer", "minimum": 1, "maximum": 9}
            },
            "required": ["color", "n"],
            "additionalProperties": false
        }
    }})
}

#[test]
fn tools_calls_and_results_render_through_qwens_template() {
    let src =
        std::fs::read_to_string(fixtures().join("engine/qwen3-vl-instruct.chat_template.jinja"))
            .unwrap();
    let real = ChatTemplate::new(&src, None).unwrap();
    let f = engine::ChatFormat::new(&assets()).unwrap();
    let b = PromptBuilder {
        tokenizer: &f.tokenizer,
        template: &real,
        merge: 2,
        ablation: PromptAblation::default(),
    };
    let mut assistant = Message::assistant("");
    assistant.tool_calls = vec![ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: r#"{"color":"red","n":3}"#.into(),
    }];
    let messages = vec![
        Message::user(Vec::new(), "Weather?"),
        assistant,
        Message::tool("call_1", "sunny"),
    ];
    let text = b
        .render_with(&messages, &TemplateInputs::tools(&[weather_tool()]))
        .unwrap();
    let want = concat!(
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        r#"{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "#,
        r#""parameters": {"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer", "minimum": 1, "maximum": 9}}, "#,
        r#""required": ["color", "n"], "additionalProperties": false}}}"#,
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within ",
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n",
        "</tool_call><|im_end|>\n",
        "<|im_start|>user\nWeather?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"color\": \"red\", \"n\": 3}}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    );
    assert_eq!(text, want);
    // Control: without tools, no tools block (the rest as before).
    let plain = b.render(&messages).unwrap();
    assert!(!plain.contains("# Tools"), "{plain}");
    assert!(plain.starts_with("<|im_start|>user\nWeather?"), "{plain}");
}

/// A fresh answer to `question` with `tool` shown, under `p` (its grammar).
fn shown(s: &mut Session, question: &[Message], tool: &Value, p: &SamplingParams) -> Generation {
    s.reset();
    s.generate_with(
        question,
        &TemplateInputs::tools(std::slice::from_ref(tool)),
        p,
        &mut |_| true,
    )
    .unwrap()
}

/// [`shown`], ended by the model.
fn call_once(
    s: &mut Session,
    question: &[Message],
    tool: &Value,
    p: &SamplingParams,
) -> Generation {
    let g = shown(s, question, tool, p);
    assert!(
        matches!(g.finish, FinishReason::Eos(_)),
        "{:?} {:?}",
        g.finish,
        g.text
    );
    g
}

#[test]
fn the_calls_grammar_makes_random_weights_call_the_tool() {
    let tool = weather_tool();
    let tools = [FunctionTool {
        name: "get_weather".into(),
        parameters: tool["function"]["parameters"].clone(),
    }];
    let mut s = tower_session();
    let question = vec![Message::user(Vec::new(), "Weather?")];
    for (temperature, seed) in [(0.0, 0), (0.9, 1), (0.9, 2)] {
        let mut p = SamplingParams {
            max_tokens: 160,
            temperature,
            top_k: 40,
            seed,
            grammar: Some(calls_grammar(&tools, false, CallForm::Json).unwrap()),
            ..SamplingParams::default()
        };
        let g = call_once(&mut s, &question, &tool, &p);
        let parsed = parse(&g.text, &["get_weather"]);
        assert_eq!(parsed.calls.len(), 1, "{:?}", g.text);
        assert_eq!(parsed.text, "");
        let args: Value = serde_json::from_str(&parsed.calls[0].arguments).unwrap();
        assert!(
            matches!(args["color"].as_str(), Some("red" | "green")),
            "{args}"
        );
        assert!(matches!(args["n"].as_i64(), Some(1..=9)), "{args}");
        // Control: without the grammar, no call.
        p.grammar = None;
        let free = shown(&mut s, &question, &tool, &p);
        assert!(
            parse(&free.text, &["get_weather"]).calls.is_empty(),
            "{:?}",
            free.text
        );
    }
}

#[test]
fn the_xml_calls_grammar_makes_random_weights_call_in_qwen3_5s_form() {
    // Values the random model can close: an enum, an integer, a boolean, an object (a free
    // string ends only at "\n</parameter>\n", which random weights rarely write: its rule is
    // compiled below and its text checked in the unit tests).
    let parameters = json!({"type": "object", "properties": {
        "color": {"enum": ["red", "green"]},
        "n": {"type": "integer", "minimum": 1, "maximum": 9},
        "metric": {"type": "boolean"},
        "at": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 3}},
               "required": ["x"], "additionalProperties": false}},
        "required": ["color", "n", "metric", "at"], "additionalProperties": false});
    let tool = json!({"type": "function", "function": {"name": "paint", "parameters": parameters}});
    let tools = [FunctionTool {
        name: "paint".into(),
        parameters,
    }];
    let grammar = calls_grammar(&tools, false, CallForm::Xml).unwrap();
    let mut s = tower_session();
    let question = vec![Message::user(Vec::new(), "Paint?")];
    for (temperature, seed) in [(0.0, 0), (0.9, 1), (0.9, 2)] {
        let p = SamplingParams {
            max_tokens: 400,
            temperature,
            top_k: 40,
            seed,
            grammar: Some(grammar.clone()),
            ..SamplingParams::default()
        };
        let g = call_once(&mut s, &question, &tool, &p);
        assert!(
            g.text
                .starts_with("<tool_call>\n<function=paint>\n<parameter=color>\n"),
            "{:?}",
            g.text
        );
        let parsed = parse(&g.text, &["paint"]);
        assert_eq!(parsed.calls.len(), 1, "{:?}", g.text);
        let args: Value = serde_json::from_str(&parsed.calls[0].arguments).unwrap();
        assert!(
            matches!(args["color"].as_str(), Some("red" | "green")),
            "{args}"
        );
        assert!(matches!(args["n"].as_i64(), Some(1..=9)), "{args}");
        assert!(args["metric"].is_boolean(), "{args}");
        assert!(matches!(args["at"]["x"].as_i64(), Some(0..=3)), "{args}");
        // Control: the JSON form's grammar makes a Hermes call, not this one.
        let mut json_form = p.clone();
        json_form.grammar = Some(calls_grammar(&tools, false, CallForm::Json).unwrap());
        let other = shown(&mut s, &question, &tool, &json_form);
        assert!(
            other.text.starts_with("<tool_call>\n{\"name\": \"paint\""),
            "{:?}",
            other.text
        );
    }
    // A free string's lazy rule compiles (llguidance would refuse a malformed one by name).
    let with_string = [FunctionTool {
        name: "say".into(),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
    }];
    let p = SamplingParams {
        max_tokens: 4,
        grammar: Some(calls_grammar(&with_string, true, CallForm::Xml).unwrap()),
        ..SamplingParams::default()
    };
    s.reset();
    let g = s
        .generate_with(&question, &TemplateInputs::default(), &p, &mut |_| true)
        .unwrap();
    assert!(
        "<tool_call>\n<function=say>\n".starts_with(&g.text)
            || g.text.starts_with("<tool_call>\n<function=say>\n"),
        "{:?}",
        g.text
    );
}
