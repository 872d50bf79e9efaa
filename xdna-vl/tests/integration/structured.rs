//! Structured output and tool calls through `xdna-vl serve` on the tiny random model: constrained
//! decoding makes random weights answer JSON that parses and fits the request's schema (whole and
//! streamed, greedy and seeded, one at a time and with `--parallel`), and call a tool with
//! arguments fitting its schema (tool_choice required and named). Controls: the same requests
//! unconstrained answer no such JSON and no calls. Also: max_tokens before the JSON closes is
//! finish "length"; a schema the constraint refuses is a 400; a conversation with an assistant's
//! calls and a tool's result is answered; Ollama's `format` takes the same path;
//! `chat_template_kwargs` reach the template (a variable it is given already is a 400 naming it).

use serde_json::{json, Value};
use server::client::{self, Reply};

use crate::serve::Served;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green"]},
            "n": {"type": "integer", "minimum": 1, "maximum": 9}
        },
        "required": ["color", "n"],
        "additionalProperties": false
    })
}

fn fits(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.len() == 2)
        && matches!(v["color"].as_str(), Some("red" | "green"))
        && matches!(v["n"].as_i64(), Some(1..=9))
}

fn fits_text(text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|v| fits(&v))
}

fn body(sampling: &Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": "A color and a number, as JSON."}],
        "max_tokens": 64,
    });
    b.as_object_mut()
        .unwrap()
        .extend(sampling.as_object().unwrap().clone());
    b
}

fn with_schema(mut b: Value) -> Value {
    b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "pick", "strict": true, "schema": schema()}});
    b
}

fn ok_json(r: &Reply) -> Value {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// A streamed answer's chunks (the `[DONE]` checked and dropped).
fn chunks(served: &Served, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    let r = served.post(&body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str())
        .collect()
}

fn finish_of(chunks: &[Value]) -> Value {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).map(|ch| ch["finish_reason"].clone()))
        .rfind(|f| !f.is_null())
        .unwrap_or(Value::Null)
}

const SAMPLINGS: [&str; 4] = [
    r#"{"temperature": 0}"#,
    r#"{"temperature": 0.9, "seed": 1}"#,
    r#"{"temperature": 1.0, "seed": 2, "top_p": 0.95}"#,
    r#"{"temperature": 1.0, "seed": 3}"#,
];

#[test]
fn response_format_json_schema_fits_whole_and_streamed_greedy_and_sampled() {
    let served = Served::start(&[]);
    for s in SAMPLINGS {
        let sampling: Value = serde_json::from_str(s).unwrap();
        let b = with_schema(body(&sampling));
        let j = ok_json(&served.post(&b));
        let text = j["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(fits_text(text), "{s}: {text:?}");
        assert_eq!(j["choices"][0]["finish_reason"], "stop", "{s}");
        let c = chunks(&served, b);
        assert_eq!(streamed_text(&c), text, "{s}: streamed as whole");
        assert_eq!(finish_of(&c), "stop");
        // Control: unconstrained, the same request is no such JSON (nor any JSON).
        let free = ok_json(&served.post(&body(&sampling)));
        let free = free["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(!fits_text(free), "{s}: {free:?}");
        assert!(
            serde_json::from_str::<Value>(free).is_err(),
            "{s}: {free:?}"
        );
    }
    // json_object: a JSON object, or a cut one at finish "length".
    let mut objects = 0;
    for seed in 0..4 {
        let mut b = body(&json!({"temperature": 1.0, "seed": seed, "max_tokens": 200}));
        b["response_format"] = json!({"type": "json_object"});
        let j = ok_json(&served.post(&b));
        let text = j["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('{'), "{text:?}");
        if j["choices"][0]["finish_reason"] == "stop" {
            assert!(serde_json::from_str::<Value>(text).unwrap().is_object());
            objects += 1;
        } else {
            assert_eq!(j["choices"][0]["finish_reason"], "length");
        }
    }
    assert!(objects > 0, "no json_object answer ended by itself");

    // max_tokens before the JSON closes: finish "length", the answer cut (as OpenAI's).
    let mut b = with_schema(body(&json!({"temperature": 0})));
    b["max_tokens"] = json!(3);
    let j = ok_json(&served.post(&b));
    assert_eq!(j["choices"][0]["finish_reason"], "length");
    let cut = j["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(cut).is_err(), "{cut:?}");
    assert_eq!(finish_of(&chunks(&served, b)), "length");

    // A schema the constraint refuses: a 400 naming it, and the server goes on.
    let mut b = body(&json!({}));
    b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "bad",
        "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}});
    let r = served.post(&b);
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("response_format"));
    assert!(fits_text(
        ok_json(&served.post(&with_schema(body(&json!({})))))["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    ));
    // chat_template_kwargs reach the template: the tiny Qwen3-VL template does not read
    // enable_thinking (the same greedy answer), and a variable the template is given already is
    // a 400 naming it (the engine's refusal, so the variables got there).
    let plain = ok_json(&served.post(&body(&json!({"temperature": 0}))));
    let mut b = body(&json!({"temperature": 0}));
    b["chat_template_kwargs"] = json!({"enable_thinking": false});
    let switched = ok_json(&served.post(&b));
    assert_eq!(
        switched["choices"][0]["message"]["content"],
        plain["choices"][0]["message"]["content"]
    );
    b["chat_template_kwargs"] = json!({"messages": []});
    let r = served.post(&b);
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("\"messages\""), "{message}");
    assert_eq!(served.terminate(), 0);
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "pick", "description": "Pick a color.",
            "parameters": schema()}},
        {"type": "function", "function": {"name": "count", "parameters": {"type": "object",
            "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 3}},
            "required": ["k"], "additionalProperties": false}}}
    ])
}

/// The calls of a whole answer: (name, arguments) with the arguments parsed.
fn calls_of(j: &Value) -> Vec<(String, Value)> {
    j["choices"][0]["message"]["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
                    assert_eq!(c["type"], "function");
                    let args = c["function"]["arguments"].as_str().unwrap();
                    (
                        c["function"]["name"].as_str().unwrap().to_string(),
                        serde_json::from_str(args).unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn fits_tool(name: &str, args: &Value) -> bool {
    match name {
        "pick" => fits(args),
        "count" => {
            args.as_object().is_some_and(|o| o.len() == 1)
                && matches!(args["k"].as_i64(), Some(0..=3))
        }
        _ => false,
    }
}

#[test]
fn tool_choice_required_and_named_make_fitting_calls() {
    let served = Served::start(&[]);
    for s in SAMPLINGS {
        let sampling: Value = serde_json::from_str(s).unwrap();
        for (choice, parallel) in [
            (json!("required"), false),
            (
                json!({"type": "function", "function": {"name": "count"}}),
                false,
            ),
            (
                json!({"type": "function", "function": {"name": "pick"}}),
                true,
            ),
        ] {
            let mut b = body(&sampling);
            b["max_tokens"] = json!(200);
            b["tools"] = tools();
            b["tool_choice"] = choice.clone();
            b["parallel_tool_calls"] = json!(parallel);
            let j = ok_json(&served.post(&b));
            let calls = calls_of(&j);
            let finish = &j["choices"][0]["finish_reason"];
            assert_eq!(finish, "tool_calls", "{s} {choice}: {j}");
            assert!(!calls.is_empty());
            if !parallel {
                assert_eq!(calls.len(), 1, "{s} {choice}: {j}");
            }
            for (name, args) in &calls {
                assert!(fits_tool(name, args), "{s} {choice}: {name} {args}");
                if let Some(n) = choice["function"]["name"].as_str() {
                    assert_eq!(name, n);
                }
            }
            assert!(j["choices"][0]["message"]["content"].is_null(), "{j}");
            // Streamed: the same calls, whole in one delta.tool_calls chunk, finish tool_calls.
            let c = chunks(&served, b);
            assert_eq!(streamed_text(&c), "", "{s} {choice}");
            assert_eq!(finish_of(&c), "tool_calls");
            let deltas: Vec<&Value> = c
                .iter()
                .filter_map(|ch| ch["choices"][0]["delta"].get("tool_calls"))
                .collect();
            assert_eq!(deltas.len(), 1);
            let streamed: Vec<(String, Value)> = deltas[0]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    assert_eq!(d["index"], i);
                    (
                        d["function"]["name"].as_str().unwrap().to_string(),
                        serde_json::from_str(d["function"]["arguments"].as_str().unwrap()).unwrap(),
                    )
                })
                .collect();
            assert_eq!(streamed, calls, "{s} {choice}");
        }
        // Control: tool_choice auto on random weights writes text, no calls (finish not
        // tool_calls), status 200.
        let mut b = body(&sampling);
        b["tools"] = tools();
        let j = ok_json(&served.post(&b));
        assert!(calls_of(&j).is_empty(), "{j}");
        assert_ne!(j["choices"][0]["finish_reason"], "tool_calls");
        assert!(!j["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty());
    }
    assert_eq!(served.terminate(), 0);
}

#[test]
fn a_conversation_with_calls_and_results_and_the_parallel_server() {
    let served = Served::start(&["--parallel", "2"]);
    // The assistant's call and the tool's result go back in; the answer is constrained again.
    let mut b = with_schema(body(&json!({"temperature": 0})));
    b["messages"] = json!([
        {"role": "user", "content": "Pick for me."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "pick", "arguments": "{\"color\": \"red\", \"n\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        {"role": "user", "content": "And as JSON?"}
    ]);
    b["tools"] = tools();
    let threads: Vec<_> = [
        b.clone(),
        with_schema(body(&json!({"temperature": 0.9, "seed": 9}))),
    ]
    .into_iter()
    .map(|b| {
        let addr = served.addr;
        std::thread::spawn(move || {
            client::request(
                addr,
                "POST",
                "/v1/chat/completions",
                None,
                b.to_string().as_bytes(),
            )
            .unwrap()
        })
    })
    .collect();
    for t in threads {
        let j = ok_json(&t.join().unwrap());
        let text = j["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(fits_text(text), "{text:?}");
    }
    // Ollama's format: "json" and a schema, by the same constraint.
    for format in [json!("json"), schema()] {
        let b = json!({"model": "chat-f32", "stream": false, "format": format,
            "messages": [{"role": "user", "content": "JSON please"}],
            "options": {"num_predict": 200, "temperature": 0}});
        let r = client::request(
            served.addr,
            "POST",
            "/api/chat",
            None,
            b.to_string().as_bytes(),
        )
        .unwrap();
        let j = ok_json(&r);
        let text = j["message"]["content"].as_str().unwrap();
        if format == "json" {
            if j["done_reason"] == "stop" {
                assert!(
                    serde_json::from_str::<Value>(text).unwrap().is_object(),
                    "{text:?}"
                );
            }
        } else {
            assert!(fits_text(text), "{text:?}");
        }
    }
    assert_eq!(served.terminate(), 0);
}
