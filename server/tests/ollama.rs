//! Ollama's API over real HTTP on loopback, with the scripted engine standing in for the model:
//! every route's JSON as Ollama's Python client parses it (the shapes its `_types.py` reads,
//! committed in fixtures/ollama_python_types.json: CI runs no Python), whole and streamed as
//! newline-delimited JSON, images, `options` onto the engine's sampling, refusals by name in
//! Ollama's error shape, the key, the queue, the body limit and a client that leaves.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{request, Running, ANSWER_TIME, PNG, PROMPT_TIME};
use serde_json::{json, Map, Value};
use server::chat::{Message, Part, Role, Sampling};
use server::client::Reply;
use server::{MediaPolicy, ServeOptions};

/// The response models of Ollama's Python client, as the fixture records them.
struct PythonTypes {
    models: Map<String, Value>,
}

impl PythonTypes {
    fn load() -> PythonTypes {
        let v: Value =
            serde_json::from_str(include_str!("fixtures/ollama_python_types.json")).unwrap();
        PythonTypes {
            models: v["models"].as_object().unwrap().clone(),
        }
    }

    /// How `v` differs from what the client's model `name` reads (empty: the client parses it).
    fn mismatches(&self, name: &str, v: &Value) -> Vec<String> {
        let mut out = Vec::new();
        self.check(name, Some(v), name, &mut out);
        out
    }

    fn check(&self, spec: &str, v: Option<&Value>, at: &str, out: &mut Vec<String>) {
        let (base, absent_ok, null_ok) = if let Some(b) = spec.strip_suffix('?') {
            (b, true, true)
        } else if let Some(b) = spec.strip_suffix("|null") {
            (b, false, true)
        } else {
            (spec, false, false)
        };
        let v = match v {
            None if absent_ok => return,
            None => return out.push(format!("{at}: missing ({spec})")),
            Some(Value::Null) if null_ok => return,
            Some(v) => v,
        };
        let fits = match base {
            "str" => v.is_string(),
            "int" => v.is_i64() || v.is_u64(),
            "bool" => v.is_boolean(),
            "datetime" => v.as_str().is_some_and(is_rfc3339),
            "map" => v.is_object(),
            "any" => true,
            list if list.starts_with('[') => {
                let item = &list[1..list.len() - 1];
                match v.as_array() {
                    Some(items) => {
                        for (i, x) in items.iter().enumerate() {
                            self.check(item, Some(x), &format!("{at}[{i}]"), out);
                        }
                        true
                    }
                    None => false,
                }
            }
            model => match v.as_object() {
                Some(obj) => {
                    let mut name = Some(model);
                    while let Some(n) = name {
                        let fields = self.models[n].as_object().unwrap();
                        for (key, spec) in fields.iter().filter(|(k, _)| !k.starts_with('_')) {
                            let spec = spec.as_str().unwrap();
                            self.check(spec, obj.get(key), &format!("{at}.{key}"), out);
                        }
                        name = fields.get("_extends").and_then(Value::as_str);
                    }
                    true
                }
                None => false,
            },
        };
        if !fits {
            out.push(format!("{at}: {v} is not {spec}"));
        }
    }
}

/// `2023-08-04T19:22:45.499127Z` or with an offset, as pydantic's datetime takes it.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |mut r: std::ops::Range<usize>| r.all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    let head = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !head {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if !(1..=9).contains(&n) {
            return false;
        }
        rest = &frac[n..];
    }
    rest == "Z"
        || (rest.len() == 6
            && (rest.starts_with('+') || rest.starts_with('-'))
            && rest.as_bytes()[3] == b':')
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, None, body.to_string().as_bytes())
}

fn start(options: ServeOptions) -> Running {
    Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..options
        },
        Duration::ZERO,
    )
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The text of a streamed answer, its lines checked one by one against the client's model.
fn streamed(types: &PythonTypes, model: &str, reply: &Reply) -> (String, Vec<Value>) {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.header("content-type"), Some("application/x-ndjson"));
    let lines = reply.ndjson();
    for l in &lines {
        assert_eq!(types.mismatches(model, l), Vec::<String>::new(), "{l}");
    }
    let text = lines
        .iter()
        .map(|l| {
            l.get("message")
                .map_or(&l["response"], |m| &m["content"])
                .as_str()
                .unwrap()
        })
        .collect();
    (text, lines)
}

/// The last object's counts and times, as Ollama words them, from the scripted engine's.
fn assert_done(done: &Value, reason: &str, prompt_tokens: u64, answer_tokens: u64) {
    assert_eq!(done["done"], true, "{done}");
    assert_eq!(done["done_reason"], reason, "{done}");
    assert!(
        done["created_at"].as_str().is_some_and(is_rfc3339),
        "{done}"
    );
    assert_eq!(done["prompt_eval_count"], prompt_tokens, "{done}");
    assert_eq!(done["eval_count"], answer_tokens, "{done}");
    assert_eq!(
        done["prompt_eval_duration"],
        PROMPT_TIME.as_nanos() as u64,
        "{done}"
    );
    assert_eq!(
        done["eval_duration"],
        ANSWER_TIME.as_nanos() as u64,
        "{done}"
    );
    assert_eq!(done["load_duration"], 0, "{done}");
    // The request's own time in the server: more than nothing, less than the test's minute.
    let total = done["total_duration"].as_u64().unwrap();
    assert!(total > 0 && total < 60_000_000_000, "{done}");
}

#[test]
fn every_route_is_what_the_python_client_reads() {
    let types = PythonTypes::load();
    let server = start(ServeOptions::default());
    let addr = server.addr;

    let tags = request(addr, "GET", "/api/tags", None, b"");
    assert_eq!(tags.status, 200);
    let tags = tags.json();
    assert_eq!(
        types.mismatches("ListResponse", &tags),
        Vec::<String>::new()
    );
    let listed = &tags["models"][0];
    assert_eq!(
        (&listed["name"], &listed["model"]),
        (&json!("tiny:latest"), &json!("tiny:latest"))
    );
    assert_eq!(listed["size"], 1234);
    assert_eq!(listed["modified_at"], "2023-11-14T22:13:20.000000Z");
    assert_eq!(listed["details"]["family"], "qwen3_vl");
    assert_eq!(listed["capabilities"], json!(["completion", "vision"]));

    // /api/show by either name the client may use, and by `name` as older clients send it.
    for body in [
        json!({"model": "tiny:latest"}),
        json!({"model": "tiny"}),
        json!({"name": "tiny"}),
    ] {
        let show = post(addr, "/api/show", &body);
        assert_eq!(show.status, 200, "{body}");
        let show = show.json();
        assert_eq!(
            types.mismatches("ShowResponse", &show),
            Vec::<String>::new()
        );
        assert_eq!(show["model_info"]["qwen3_vl.context_length"], 400);
        assert_eq!(show["capabilities"], json!(["completion", "vision"]));
    }
    let version = request(addr, "GET", "/api/version", None, b"").json();
    assert!(
        version["version"]
            .as_str()
            .is_some_and(|v| v.split('.').count() == 3),
        "{version}"
    );

    // Answers, whole and streamed, on both routes.
    let chat = json!({"model": "tiny:latest", "messages": [{"role": "user", "content": "hello"}],
                      "stream": false});
    let whole = post(addr, "/api/chat", &chat);
    assert_eq!(whole.status, 200);
    assert!(whole
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let whole = whole.json();
    assert_eq!(
        types.mismatches("ChatResponse", &whole),
        Vec::<String>::new()
    );
    let generate = json!({"model": "tiny:latest", "prompt": "hello", "stream": false});
    let whole_generate = post(addr, "/api/generate", &generate).json();
    assert_eq!(
        types.mismatches("GenerateResponse", &whole_generate),
        Vec::<String>::new()
    );
    let mut chat_streamed = chat.clone();
    chat_streamed["stream"] = json!(true);
    streamed(
        &types,
        "ChatResponse",
        &post(addr, "/api/chat", &chat_streamed),
    );
    let mut generate_streamed = generate.clone();
    generate_streamed.as_object_mut().unwrap().remove("stream");
    streamed(
        &types,
        "GenerateResponse",
        &post(addr, "/api/generate", &generate_streamed),
    );

    // Errors: `{"error": "..."}`, which the client raises as ResponseError(error).
    let refused = post(
        addr,
        "/api/chat",
        &json!({"model": "llama3.2", "messages": []}),
    );
    assert_eq!(refused.status, 404);
    assert_eq!(
        types.mismatches("Error", &refused.json()),
        Vec::<String>::new()
    );

    // Control: the check fails where the client would (a chat answer without its message, a
    // duration that is not an integer, a date that is not one, an error that is an object).
    let mut broken = whole.clone();
    broken.as_object_mut().unwrap().remove("message");
    broken["total_duration"] = json!("12ms");
    assert_eq!(
        types.mismatches("ChatResponse", &broken).len(),
        2,
        "{broken}"
    );
    let mut broken_tags = tags.clone();
    broken_tags["models"][0]["modified_at"] = json!("yesterday");
    assert_eq!(types.mismatches("ListResponse", &broken_tags).len(), 1);
    let openai_error = json!({"error": {"message": "no"}});
    assert_eq!(types.mismatches("Error", &openai_error).len(), 1);
    assert_eq!(
        types.mismatches("ShowResponse", &json!({})).len(),
        1,
        "model_info is required"
    );
    server.stop().unwrap();
}

#[test]
fn chat_and_generate_answer_whole_and_streamed_alike() {
    let types = PythonTypes::load();
    let server = start(ServeOptions::default());
    let addr = server.addr;
    for (path, model, body) in [
        (
            "/api/chat",
            "ChatResponse",
            json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}),
        ),
        (
            "/api/generate",
            "GenerateResponse",
            json!({"model": "tiny", "prompt": "hello"}),
        ),
    ] {
        // No "stream": Ollama streams.
        let (text, lines) = streamed(&types, model, &post(addr, path, &body));
        assert_eq!(text, "echo(0): hello", "{path}");
        assert_eq!(lines.len(), 15, "{path}: 14 pieces and the last object");
        assert!(lines[..14].iter().all(|l| l["done"] == false), "{path}");
        assert_done(lines.last().unwrap(), "stop", 5, 14);
        // Answered with the model as the client named it (here without the tag).
        assert!(lines.iter().all(|l| l["model"] == "tiny"), "{path}");

        let mut whole_body = body.clone();
        whole_body["model"] = json!("tiny:latest");
        whole_body["stream"] = json!(false);
        let whole = post(addr, path, &whole_body).json();
        let answer = whole
            .get("message")
            .map_or(&whole["response"], |m| &m["content"]);
        assert_eq!(answer, "echo(0): hello", "{path}: {whole}");
        assert_done(&whole, "stop", 5, 14);
        assert_eq!(whole["model"], "tiny:latest");
        if path == "/api/chat" {
            assert_eq!(whole["message"]["role"], "assistant");
        }

        // num_predict: done_reason "length".
        whole_body["options"] = json!({"num_predict": 3});
        let short = post(addr, path, &whole_body).json();
        let answer = short
            .get("message")
            .map_or(&short["response"], |m| &m["content"]);
        assert_eq!(answer, "ech", "{path}");
        assert_done(&short, "length", 5, 3);
    }
    // Nothing to answer: "load", and the engine is not asked.
    let asked = server.requests().len();
    let load = post(addr, "/api/chat", &json!({"model": "tiny", "messages": []})).json();
    assert_eq!(
        (&load["done"], &load["done_reason"]),
        (&json!(true), &json!("load"))
    );
    assert_eq!(
        types.mismatches("ChatResponse", &load),
        Vec::<String>::new()
    );
    let load = post(addr, "/api/generate", &json!({"model": "tiny"})).json();
    assert_eq!(
        (&load["response"], &load["done_reason"]),
        (&json!(""), &json!("load"))
    );
    assert_eq!(server.requests().len(), asked);
    // Control: a prompt is answered, so the engine is asked.
    post(
        addr,
        "/api/generate",
        &json!({"model": "tiny", "prompt": "x", "stream": false}),
    );
    assert_eq!(server.requests().len(), asked + 1);
    server.stop().unwrap();
}

#[test]
fn images_are_base64_and_go_through_the_media_checks() {
    let server = start(ServeOptions {
        media: MediaPolicy {
            max_bytes: 64,
            ..MediaPolicy::default()
        },
        ..ServeOptions::default()
    });
    let addr = server.addr;
    let chat = |images: Value| {
        json!({"model": "tiny", "stream": false, "messages": [
            {"role": "user", "content": "what?", "images": images}]})
    };
    let r = post(addr, "/api/chat", &chat(json!([b64(PNG), b64(PNG)])));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["message"]["content"], "echo(2): what?");
    // The images reach the engine before the text, as bytes.
    let sent = server.requests().pop().unwrap();
    assert!(matches!(&sent.messages[0].parts[..],
        [Part::Image { bytes: a, .. }, Part::Image { bytes: b, .. }, Part::Text(t)]
        if a == PNG && b == PNG && t == "what?"));
    let r = post(
        addr,
        "/api/generate",
        &json!({"model": "tiny", "prompt": "what?", "images": [b64(PNG)], "stream": false}),
    );
    assert_eq!(r.json()["response"], "echo(1): what?");

    let mut big = PNG.to_vec();
    big.resize(1000, 0);
    for (images, needle) in [
        (
            json!(["@@@"]),
            "messages[0].images[0]: the base64 data does not decode",
        ),
        (json!([b64(b"GIF89a no png")]), "not an image"),
        (
            json!([b64(&big)]),
            "1000 bytes, more than the 64 an image may have",
        ),
        (json!([7]), "messages[0].images[0] must be a base64 string"),
    ] {
        let r = post(addr, "/api/chat", &chat(images.clone()));
        assert_eq!(r.status, 400, "{images}");
        let e = r.json();
        assert!(
            e["error"].as_str().unwrap().contains(needle),
            "{images}: {e}"
        );
        assert_eq!(e.as_object().unwrap().len(), 1, "Ollama's shape: {e}");
    }
    // Streamed, a picture the engine cannot read is still a 400 before any line.
    let mut body = chat(json!([b64(b"GIF89a")]));
    body["stream"] = json!(true);
    assert_eq!(post(addr, "/api/chat", &body).status, 400);
    let r = post(
        addr,
        "/api/chat",
        &json!({"model": "tiny", "messages": [
            {"role": "assistant", "content": "x", "images": [b64(PNG)]}]}),
    );
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("user messages only"));
    server.stop().unwrap();
}

#[test]
fn options_reach_the_engine_as_its_sampling() {
    let server = start(ServeOptions {
        max_tokens_cap: 100,
        ..ServeOptions::default()
    });
    let addr = server.addr;
    let options = json!({"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.05,
        "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.25, "seed": 7,
        "num_predict": 40, "stop": ["\n\n", "User:"]});
    let r = post(
        addr,
        "/api/chat",
        &json!({"model": "tiny", "stream": false, "options": options, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "echo"},
            {"role": "user", "content": "again"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let expected = Sampling {
        max_tokens: Some(40),
        temperature: Some(0.7),
        top_p: Some(0.8),
        top_k: Some(20),
        min_p: Some(0.05),
        repetition_penalty: Some(1.1),
        frequency_penalty: Some(0.25),
        presence_penalty: Some(0.5),
        seed: Some(7),
        stop: vec!["\n\n".into(), "User:".into()],
    };
    let sent = server.requests().pop().unwrap();
    assert_eq!(sent.sampling, expected);
    let text = |role, t: &str| Message::new(role, vec![Part::Text(t.into())]);
    assert_eq!(
        sent.messages,
        vec![
            text(Role::System, "be brief"),
            text(Role::User, "hi"),
            text(Role::Assistant, "echo"),
            text(Role::User, "again")
        ]
    );

    // /api/generate: the same options; `system` is a system message before the prompt.
    let r = post(
        addr,
        "/api/generate",
        &json!({"model": "tiny", "stream": false, "options": options, "system": "be brief",
                "prompt": "hi"}),
    );
    assert_eq!(r.status, 200);
    let sent = server.requests().pop().unwrap();
    assert_eq!(sent.sampling, expected);
    assert_eq!(
        sent.messages,
        vec![text(Role::System, "be brief"), text(Role::User, "hi")]
    );

    // num_predict over the server's cap, or -1 (no limit), gets the cap.
    for n in [5000, -1] {
        post(
            addr,
            "/api/generate",
            &json!({"model": "tiny", "stream": false, "prompt": "hi", "options": {"num_predict": n}}),
        );
        assert_eq!(
            server.requests().pop().unwrap().sampling.max_tokens,
            Some(100),
            "{n}"
        );
    }
    // Control: no options, the pack's defaults (none set) and the cap; not what was asked above.
    post(
        addr,
        "/api/generate",
        &json!({"model": "tiny", "stream": false, "prompt": "hi"}),
    );
    let plain = server.requests().pop().unwrap().sampling;
    assert_eq!(
        plain,
        Sampling {
            max_tokens: Some(100),
            ..Sampling::default()
        }
    );
    assert_ne!(plain, expected);
    server.stop().unwrap();
}

#[test]
fn refusals_name_their_field_in_ollamas_shape() {
    let server = start(ServeOptions::default());
    let addr = server.addr;
    let chat = |extra: Value| {
        let mut body = json!({"model": "tiny", "stream": false,
                              "messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let generate = |extra: Value| {
        let mut body = json!({"model": "tiny", "stream": false, "prompt": "x"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases = [
        (
            "/api/chat",
            chat(json!({"model": "llama3.2"})),
            404,
            "model 'llama3.2' not found",
        ),
        (
            "/api/chat",
            chat(json!({"model": null})),
            400,
            "model is required",
        ),
        ("/api/chat", chat(json!({"format": "yaml"})), 400, "format"),
        (
            "/api/chat",
            chat(json!({"tools": [{"type": "function"}]})),
            400,
            "tools",
        ),
        ("/api/chat", chat(json!({"think": "high"})), 400, "think"),
        (
            "/api/chat",
            chat(json!({"keep_alive": 0})),
            400,
            "keep_alive",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"mirostat": 2}})),
            400,
            "options.mirostat",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"num_gpu": 1}})),
            400,
            "options.num_gpu",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"num_ctx": 8192}})),
            400,
            "options.num_ctx",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"temperature": 9}})),
            400,
            "options.temperature",
        ),
        (
            "/api/chat",
            chat(json!({"unheard_of": 1})),
            400,
            "unheard_of",
        ),
        (
            "/api/generate",
            generate(json!({"system": 5})),
            400,
            "system",
        ),
        (
            "/api/generate",
            generate(json!({"template": "{{ .Prompt }}"})),
            400,
            "template",
        ),
        ("/api/generate", generate(json!({"raw": true})), 400, "raw"),
        (
            "/api/generate",
            generate(json!({"context": [1, 2, 3]})),
            400,
            "context",
        ),
        (
            "/api/generate",
            generate(json!({"suffix": "}"})),
            400,
            "suffix",
        ),
        (
            "/api/generate",
            generate(json!({"format": ["json"]})),
            400,
            "format",
        ),
        (
            "/api/show",
            json!({"model": "llava"}),
            404,
            "model 'llava' not found",
        ),
        ("/api/chat", json!([1]), 400, "a JSON object"),
    ];
    for (path, body, status, needle) in &cases {
        let r = post(addr, path, body);
        assert_eq!(r.status, *status, "{path} {body}");
        let e = r.json();
        assert_eq!(e.as_object().unwrap().len(), 1, "{e}");
        assert!(
            e["error"].as_str().unwrap().contains(needle),
            "{path} {body}: {e}"
        );
    }
    assert!(
        server.requests().is_empty(),
        "a refused request never reaches the engine"
    );
    // A route Ollama has and this server does not: 404 in Ollama's shape, naming the routes.
    let r = post(addr, "/api/pull", &json!({"model": "llama3.2"}));
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].as_str().unwrap().contains("/api/chat"));

    // Control: each field at a value that asks for nothing is taken, as Ollama's Python client
    // sends some of them ("tools": []), and the OpenAI route keeps its own error shape.
    let taken = [
        (
            "/api/chat",
            chat(json!({"tools": [], "format": "", "keep_alive": "5m",
            "options": {"num_ctx": 400, "mirostat": 0, "repeat_last_n": -1}})),
        ),
        (
            "/api/generate",
            generate(json!({"raw": false, "context": [], "keep_alive": -1})),
        ),
    ];
    for (path, body) in &taken {
        let r = post(addr, path, body);
        assert_eq!(
            r.status,
            200,
            "{path} {body}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let openai = post(addr, "/v1/chat/completions", &json!({"messages": []}));
    assert!(openai.json()["error"]["message"].is_string());
    server.stop().unwrap();
}

#[test]
fn the_key_the_limit_and_the_queue_apply() {
    let server = start(ServeOptions {
        api_key: Some("sesame".into()),
        body_limit: 4096,
        ..ServeOptions::default()
    });
    let addr = server.addr;
    let body = json!({"model": "tiny", "prompt": "hi", "stream": false}).to_string();
    for (method, path, body) in [
        ("GET", "/api/tags", ""),
        ("GET", "/api/version", ""),
        ("POST", "/api/show", r#"{"model":"tiny"}"#),
        ("POST", "/api/generate", body.as_str()),
    ] {
        let no_key = request(addr, method, path, None, body.as_bytes());
        assert_eq!(no_key.status, 401, "{path}");
        assert!(
            no_key.json()["error"].as_str().unwrap().contains("Bearer"),
            "{path}"
        );
        let wrong = request(addr, method, path, Some("open"), body.as_bytes());
        assert_eq!(wrong.status, 401, "{path}");
        // Control: the key opens it.
        let ok = request(addr, method, path, Some("sesame"), body.as_bytes());
        assert_eq!(
            ok.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&ok.body)
        );
    }
    let big = json!({"model": "tiny", "prompt": "y".repeat(5000)}).to_string();
    let r = request(
        addr,
        "POST",
        "/api/generate",
        Some("sesame"),
        big.as_bytes(),
    );
    assert_eq!(r.status, 413);
    assert!(r.json()["error"].as_str().unwrap().contains("4096"));
    server.stop().unwrap();

    let busy = common::overflow_the_queue(|addr| {
        let body = json!({"model": "tiny", "stream": false,
                          "messages": [{"role": "user", "content": "w".repeat(100)}]});
        post(addr, "/api/chat", &body)
    });
    let e = busy[0].json();
    assert_eq!(e.as_object().unwrap().len(), 1, "Ollama's shape: {e}");
    assert!(
        e["error"].as_str().unwrap().contains("queue is full"),
        "{e}"
    );
}

#[test]
fn a_client_that_leaves_cancels_its_answer() {
    let server = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeOptions::default()
        },
        Duration::from_millis(2),
    );
    let addr = server.addr;
    // 300 characters: a 300-token answer at 2 ms a token would hold the engine 0.6 s.
    let long = "z".repeat(300);
    let cases = [
        (
            "/api/chat",
            json!({"model": "tiny", "messages": [{"role": "user", "content": long}]}),
            true,
        ),
        (
            "/api/generate",
            json!({"model": "tiny", "prompt": long}),
            true,
        ),
        (
            "/api/generate",
            json!({"model": "tiny", "prompt": long, "stream": false}),
            false,
        ),
    ];
    for (n, (path, body, streamed)) in cases.iter().enumerate() {
        common::leave_early(addr, path, body, *streamed);
        let started = Instant::now();
        let next = post(
            addr,
            "/api/generate",
            &json!({"model": "tiny", "prompt": "after", "stream": false}),
        );
        assert_eq!(next.json()["response"], "echo(0): after", "{path}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{path} {:?}",
            started.elapsed()
        );
        assert_eq!(server.cancels.load(Ordering::SeqCst), n + 1, "{path}");
    }
    // Control: a client that stays gets the whole answer, and nothing is cancelled.
    let r = post(
        addr,
        "/api/generate",
        &json!({"model": "tiny", "prompt": "z".repeat(50), "stream": false}),
    );
    assert_eq!(r.json()["response"].as_str().unwrap().len(), 59);
    assert_eq!(server.cancels.load(Ordering::SeqCst), cases.len());
    server.stop().unwrap();
}

/// Each streamed line's thinking and text (chat: the message's; generate: beside the response).
fn thoughts(lines: &[Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|l| {
            let at = l.get("message").unwrap_or(l);
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&at["thinking"]),
                s(at.get("content").unwrap_or(&l["response"])),
            )
        })
        .collect()
}

#[test]
fn think_separates_the_thinking_whole_and_streamed() {
    let types = PythonTypes::load();
    let server = Running::start_thinking(ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..ServeOptions::default()
    });
    let addr = server.addr;
    // The thinking, `</think>` cut across eight tokens, and the answer.
    let thought = "plan it\n</think>\n\nHi there";
    let chat = |think: Value, stream: bool| {
        let mut body = json!({"model": "tiny", "stream": stream,
            "messages": [{"role": "user", "content": thought}]});
        if !think.is_null() {
            body["think"] = think;
        }
        body
    };
    // think true, and no think (Ollama's default for a model that thinks): separated.
    for think in [json!(true), Value::Null] {
        let whole = post(addr, "/api/chat", &chat(think.clone(), false)).json();
        assert_eq!(
            types.mismatches("ChatResponse", &whole),
            Vec::<String>::new()
        );
        assert_eq!(
            whole["message"],
            json!({"role": "assistant", "content": "Hi there", "thinking": "plan it"}),
            "{think}"
        );
        let (text, lines) = streamed(
            &types,
            "ChatResponse",
            &post(addr, "/api/chat", &chat(think, true)),
        );
        assert_eq!(text, "Hi there");
        let t = thoughts(&lines);
        let thinking: String = t.iter().map(|(th, _)| th.as_str()).collect();
        assert_eq!(thinking, "plan it");
        // Thinking first, then the answer; no line carries a piece of the tag.
        let first = t.iter().position(|(_, c)| !c.is_empty()).unwrap();
        assert!(t[first..].iter().all(|(th, _)| th.is_empty()), "{t:?}");
        assert!(
            t.iter()
                .all(|(th, c)| !th.contains(['<', '>']) && !c.contains(['<', '>'])),
            "{t:?}"
        );
        // The last line has neither.
        assert_eq!(
            lines.last().unwrap()["message"],
            json!({"role": "assistant", "content": ""})
        );
    }
    let requests = server.requests();
    assert_eq!(
        requests[0].template_kwargs.get("enable_thinking"),
        Some(&json!(true))
    );
    assert_eq!(requests[2].template_kwargs.get("enable_thinking"), None);
    // Generate: the thinking beside the response.
    let generate = json!({"model": "tiny", "prompt": thought, "think": true, "stream": false});
    let whole = post(addr, "/api/generate", &generate).json();
    assert_eq!(
        types.mismatches("GenerateResponse", &whole),
        Vec::<String>::new()
    );
    assert_eq!(
        (&whole["response"], &whole["thinking"]),
        (&json!("Hi there"), &json!("plan it"))
    );
    // Control: think false turns the template's thinking off (the scripted model then answers
    // as a model without thinking does) and keeps any tag inline, as before.
    let whole = post(addr, "/api/chat", &chat(json!(false), false)).json();
    assert_eq!(
        whole["message"],
        json!({"role": "assistant", "content": format!("echo(0): {thought}")})
    );
    let (text, lines) = streamed(
        &types,
        "ChatResponse",
        &post(addr, "/api/chat", &chat(json!(false), true)),
    );
    assert_eq!(text, format!("echo(0): {thought}"));
    assert!(thoughts(&lines).iter().all(|(th, _)| th.is_empty()));
    // A level is refused by name.
    let refused = post(addr, "/api/chat", &chat(json!("medium"), false));
    assert_eq!(refused.status, 400);
    assert!(refused.json()["error"].as_str().unwrap().contains("think"));
    server.stop().unwrap();
}

#[test]
fn an_assistant_messages_thinking_reaches_the_engine() {
    let server = start(ServeOptions::default());
    let body = json!({"model": "tiny", "stream": false, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "thinking": "greet back"},
        {"role": "user", "content": "again"}]});
    let r = post(server.addr, "/api/chat", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let requests = server.requests();
    assert_eq!(
        requests[0].messages[1].reasoning.as_deref(),
        Some("greet back")
    );
    // Control: the user's message has none.
    assert_eq!(requests[0].messages[0].reasoning, None);
    server.stop().unwrap();
}
