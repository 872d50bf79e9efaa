//! The server over real HTTP on loopback, with a scripted engine standing in for the model (the
//! product's own engine is tested through `xdna-vl serve` in xdna-vl/tests): the OpenAI shapes,
//! streaming, images, the key, the limits, the queue, cancellation and shutdown.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{request, Running, PNG};
use serde_json::{json, Value};
use server::client::Reply;
use server::{MediaPolicy, ServeOptions};

fn chat(addr: SocketAddr, body: Value) -> Reply {
    request(
        addr,
        "POST",
        "/v1/chat/completions",
        None,
        body.to_string().as_bytes(),
    )
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

fn streamed_text(reply: &Reply) -> (String, Vec<Value>) {
    let events = reply.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| {
            c["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    (text, chunks)
}

#[test]
fn answers_whole_and_streamed_alike_with_usage() {
    let server = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeOptions::default()
        },
        Duration::ZERO,
    );
    let whole = chat(server.addr, user("hello"));
    assert_eq!(whole.status, 200);
    let j = whole.json();
    assert_eq!(j["object"], "chat.completion");
    assert_eq!(j["model"], "tiny");
    assert_eq!(j["choices"][0]["message"]["content"], "echo(0): hello");
    assert_eq!(j["choices"][0]["finish_reason"], "stop");
    assert_eq!(j["usage"]["prompt_tokens"], 5);
    assert_eq!(j["usage"]["completion_tokens"], 14);
    assert_eq!(j["usage"]["total_tokens"], 19);

    let mut body = user("hello");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let streamed = chat(server.addr, body);
    assert_eq!(streamed.status, 200);
    assert!(streamed
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let (text, chunks) = streamed_text(&streamed);
    assert_eq!(text, "echo(0): hello");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).map(|ch| &ch["finish_reason"]))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&json!("stop")]);
    assert_eq!(chunks.last().unwrap()["usage"], j["usage"]);

    // max_tokens: finish_reason length.
    let mut body = user("hello");
    body["max_tokens"] = json!(3);
    let short = chat(server.addr, body).json();
    assert_eq!(short["choices"][0]["message"]["content"], "ech");
    assert_eq!(short["choices"][0]["finish_reason"], "length");

    // /v1/models and /health.
    let models = request(server.addr, "GET", "/v1/models", None, b"").json();
    assert_eq!(models["data"][0]["id"], "tiny");
    let health = request(server.addr, "GET", "/health", None, b"").json();
    assert_eq!(
        (health["ready"].clone(), health["backend"].clone()),
        (json!(true), json!("host"))
    );
    assert_eq!(health["queue_depth"], 0);
    server.stop().unwrap();
}

/// `return_token_ids` (vLLM's field): the answer's ids in `choices[0].token_ids`, whole and in
/// the streamed chunk with the finish reason (the scripted engine's ids are its characters' code
/// points). Controls: without the flag no `token_ids`; a non-boolean is refused by name.
#[test]
fn return_token_ids_gives_the_answers_ids_whole_and_streamed() {
    let server = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeOptions::default()
        },
        Duration::ZERO,
    );
    let want: Vec<u32> = "echo(0): hello".chars().map(u32::from).collect();
    let mut body = user("hello");
    body["return_token_ids"] = json!(true);
    let whole = chat(server.addr, body.clone()).json();
    assert_eq!(whole["choices"][0]["token_ids"], json!(want));
    body["stream"] = json!(true);
    let (_, chunks) = streamed_text(&chat(server.addr, body));
    let with_ids: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["token_ids"].is_null())
        .collect();
    assert_eq!(with_ids.len(), 1);
    assert_eq!(with_ids[0]["choices"][0]["finish_reason"], "stop");
    assert_eq!(with_ids[0]["choices"][0]["token_ids"], json!(want));
    // Controls.
    let plain = chat(server.addr, user("hello")).json();
    assert!(plain["choices"][0].get("token_ids").is_none());
    let mut bad = user("hello");
    bad["return_token_ids"] = json!("yes");
    let refused = chat(server.addr, bad);
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["error"]["param"], "return_token_ids");
    server.stop().unwrap();
}

#[test]
fn images_by_data_url_and_media_dir_and_their_refusals() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.png"), PNG).unwrap();
    std::fs::write(dir.path().join("bad.png"), b"not a png").unwrap();
    let options = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        media: MediaPolicy {
            media_dir: Some(dir.path().to_path_buf()),
            ..MediaPolicy::default()
        },
        ..ServeOptions::default()
    };
    let server = Running::start(options, Duration::ZERO);
    use base64::Engine as _;
    let data = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(PNG)
    );
    let with_images = |urls: &[&str]| {
        let mut content: Vec<Value> = urls
            .iter()
            .map(|u| json!({"type": "image_url", "image_url": {"url": u}}))
            .collect();
        content.push(json!({"type": "text", "text": "what?"}));
        json!({"messages": [{"role": "user", "content": content}]})
    };
    let r = chat(server.addr, with_images(&[&data, "p.png"]));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "echo(2): what?"
    );
    for (url, status, needle) in [
        ("bad.png", 400, "not an image"),
        ("../etc/passwd", 400, "media directory"),
        ("data:image/png;base64,@@", 400, "does not decode"),
        ("https://127.0.0.1:9/x.png", 400, "--allow-remote-media"),
    ] {
        let r = chat(server.addr, with_images(&[url]));
        assert_eq!(r.status, status, "{url}");
        let e = r.json();
        assert!(
            e["error"]["message"].as_str().unwrap().contains(needle),
            "{url}: {e}"
        );
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }
    // Over the context: a 400 with both numbers, streamed or not.
    let mut long = user(&"x".repeat(500));
    let e = chat(server.addr, long.clone());
    assert_eq!(e.status, 400);
    assert!(e.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("500 tokens, over the context of 400"));
    long["stream"] = json!(true);
    assert_eq!(chat(server.addr, long).status, 400);
    server.stop().unwrap();
}

#[test]
fn key_limits_routes_and_malformed_bodies() {
    let options = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        api_key: Some("sesame".into()),
        body_limit: 4096,
        ..ServeOptions::default()
    };
    let server = Running::start(options, Duration::ZERO);
    let body = user("hi").to_string();
    let no_key = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        None,
        body.as_bytes(),
    );
    assert_eq!(no_key.status, 401);
    assert_eq!(no_key.json()["error"]["type"], "authentication_error");
    let wrong = request(server.addr, "GET", "/v1/models", Some("open"), b"");
    assert_eq!(wrong.status, 401);
    // /health needs no key.
    assert_eq!(
        request(server.addr, "GET", "/health", None, b"").status,
        200
    );
    let ok = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        Some("sesame"),
        body.as_bytes(),
    );
    assert_eq!(ok.status, 200);

    let missing = request(server.addr, "GET", "/v2/nothing", Some("sesame"), b"");
    assert_eq!(missing.status, 404);
    assert!(missing.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v2/nothing"));

    let big = user(&"y".repeat(5000)).to_string();
    let r = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        Some("sesame"),
        big.as_bytes(),
    );
    assert_eq!(r.status, 413);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("4096"));

    // Malformed bodies: each a 400 in OpenAI's shape, and the server answers after them.
    let deep = "[".repeat(3000);
    let huge = r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1e400}"#;
    let malformed: Vec<String> = vec![
        String::new(),
        "{".into(),
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}".into(),
        deep,
        huge.into(),
        r#"{"messages":[{"role":"user","content":{"a":1}}]}"#.into(),
        r#"{"messages":[{"role":"user","content":"x"}],"temperature":[1]}"#.into(),
        r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":18446744073709551616}"#.into(),
        "\u{0}\u{1}\u{2}".into(),
        r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#.into(),
    ];
    for b in &malformed {
        let r = request(
            server.addr,
            "POST",
            "/v1/chat/completions",
            Some("sesame"),
            b.as_bytes(),
        );
        assert_eq!(
            r.status,
            400,
            "{b:.60}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(r.json()["error"]["message"].is_string());
    }
    let after = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        Some("sesame"),
        body.as_bytes(),
    );
    assert_eq!(after.status, 200);
    server.stop().unwrap();
}

#[test]
fn concurrent_clients_queue_overflow_and_a_client_that_leaves() {
    let options = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        queue_capacity: 4,
        ..ServeOptions::default()
    };
    let server = Running::start(options, Duration::from_millis(2));
    let addr = server.addr;
    // Four clients at once: each answer equals its solo answer.
    let solo: Vec<String> = (0..4)
        .map(|i| {
            chat(addr, user(&format!("client {i}"))).json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let handles: Vec<_> = (0..4)
        .map(|i| std::thread::spawn(move || chat(addr, user(&format!("client {i}")))))
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["choices"][0]["message"]["content"], solo[i]);
    }

    // A client that leaves mid-stream: the engine stops at its next token and the next request
    // is answered.
    let mut long = user(&"z".repeat(300));
    long["stream"] = json!(true);
    common::leave_early(addr, "/v1/chat/completions", &long, true);
    let started = Instant::now();
    let next = chat(addr, user("after"));
    assert_eq!(next.status, 200);
    assert_eq!(
        next.json()["choices"][0]["message"]["content"],
        "echo(0): after"
    );
    // The 300-token answer at 2 ms a token would hold the engine 0.6 s; leaving freed it.
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.cancels.load(Ordering::SeqCst), 1);
    server.stop().unwrap();
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let busy = common::overflow_the_queue(|addr| chat(addr, user(&"w".repeat(100))));
    assert_eq!(busy[0].json()["error"]["type"], "server_error");
}

/// Serves `body` to one HTTP request on a loopback port (a stand-in for a remote image host).
fn one_shot_host(body: Vec<u8>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&body);
        }
    });
    addr
}

#[test]
fn remote_images_only_when_allowed_and_within_the_size_limit() {
    let image_request = |url: String| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "what?"}]}]})
    };
    let options = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        media: MediaPolicy {
            allow_remote: true,
            max_bytes: 64,
            ..MediaPolicy::default()
        },
        ..ServeOptions::default()
    };
    let server = Running::start(options, Duration::ZERO);
    let host = one_shot_host(PNG.to_vec());
    let r = chat(server.addr, image_request(format!("http://{host}/p.png")));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "echo(1): what?"
    );
    // Control: an image over --max-image-mib is refused, naming the URL.
    let mut big = PNG.to_vec();
    big.resize(1000, 0);
    let host = one_shot_host(big);
    let url = format!("http://{host}/big.png");
    let r = chat(server.addr, image_request(url.clone()));
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&url));
    server.stop().unwrap();
}

#[test]
fn the_web_chat_is_served_without_the_key_and_the_api_still_needs_it() {
    let options = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        api_key: Some("sesame".into()),
        ..ServeOptions::default()
    };
    let server = Running::start(options, Duration::ZERO);
    for (path, content_type, body) in [
        ("/", "text/html; charset=utf-8", server::web::INDEX_HTML),
        (
            "/web/chat.js",
            "text/javascript; charset=utf-8",
            server::web::CHAT_JS,
        ),
        (
            "/web/chat.css",
            "text/css; charset=utf-8",
            server::web::CHAT_CSS,
        ),
    ] {
        let r = request(server.addr, "GET", path, None, b"");
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(content_type), "{path}");
        assert_eq!(r.body, body.as_bytes(), "{path}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert!(r
            .header("content-security-policy")
            .unwrap()
            .contains("default-src 'none'"));
        let head = request(server.addr, "HEAD", path, None, b"");
        assert_eq!((head.status, head.body.len()), (200, 0), "HEAD {path}");
    }
    let page = request(server.addr, "GET", "/", None, b"");
    let html = String::from_utf8(page.body).unwrap();
    assert!(html.contains(r#"<label for="prompt""#) && html.contains(r#"<textarea id="prompt""#));
    assert!(html.contains(r#"<script src="/web/chat.js""#));

    // Controls: everything else still needs the key — the API, other paths under /web/, and
    // other methods on the page's path.
    let chat_body = user("hi").to_string();
    for (method, path, body) in [
        ("GET", "/v1/models", &b""[..]),
        ("POST", "/v1/chat/completions", chat_body.as_bytes()),
        ("GET", "/web/other.js", b""),
        ("GET", "/web/chat.js/", b""),
        ("POST", "/", chat_body.as_bytes()),
    ] {
        let r = request(server.addr, method, path, None, body);
        assert_eq!(r.status, 401, "{method} {path}");
        assert_eq!(r.json()["error"]["type"], "authentication_error");
    }
    let with_key = |method, path, body| request(server.addr, method, path, Some("sesame"), body);
    assert_eq!(with_key("GET", "/v1/models", &b""[..]).status, 200);
    assert_eq!(
        with_key("POST", "/v1/chat/completions", chat_body.as_bytes()).status,
        200
    );
    assert_eq!(with_key("GET", "/web/other.js", b"").status, 404);
    server.stop().unwrap();

    // Without --api-key the page is there too.
    let open = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeOptions::default()
        },
        Duration::ZERO,
    );
    let r = request(open.addr, "GET", "/", None, b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, server::web::INDEX_HTML.as_bytes());
    open.stop().unwrap();
}

#[test]
fn tool_calls_whole_and_streamed_in_openais_shape() {
    let server = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeOptions::default()
        },
        Duration::ZERO,
    );
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "add"}}
    ]);
    let mut body = user("call");
    body["tools"] = tools.clone();
    let j = chat(server.addr, body.clone()).json();
    let choice = &j["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "ok");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    for (c, name) in calls.iter().zip(["get_weather", "add"]) {
        assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
        assert_eq!(c["type"], "function");
        assert_eq!(c["function"]["name"], name);
        // Arguments are a JSON object as a string, as OpenAI sends them.
        let args: Value =
            serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"n": 1}));
        assert!(c.get("index").is_none(), "{c}");
    }
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    let sent = server.requests().pop().unwrap();
    assert_eq!(sent.tools.list, tools.as_array().unwrap().clone());
    assert!(sent.tools.parallel);

    // Streamed: the text deltas, one chunk with every call whole (index, id, type, name,
    // arguments), then the finish chunk.
    body["stream"] = json!(true);
    let (text, chunks) = streamed_text(&chat(server.addr, body));
    assert_eq!(text, "ok");
    let call_chunks: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"].get("tool_calls").is_some())
        .collect();
    assert_eq!(call_chunks.len(), 1);
    let delta = &call_chunks[0]["choices"][0]["delta"]["tool_calls"];
    for (i, name) in ["get_weather", "add"].iter().enumerate() {
        assert_eq!(delta[i]["index"], i);
        assert!(delta[i]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(delta[i]["type"], "function");
        assert_eq!(delta[i]["function"]["name"], *name);
        assert_eq!(delta[i]["function"]["arguments"], r#"{"n":1}"#);
    }
    assert!(call_chunks[0]["choices"][0]["finish_reason"].is_null());
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "tool_calls");
    assert_eq!(last["delta"], json!({}));

    // Control: the same text without tools is an answer, no calls.
    let j = chat(server.addr, user("call")).json();
    assert_eq!(j["choices"][0]["finish_reason"], "stop");
    assert!(j["choices"][0]["message"].get("tool_calls").is_none());
    // tool_choice "none": the engine is told no tool may be used.
    let mut body = user("call");
    body["tools"] = tools;
    body["tool_choice"] = json!("none");
    let j = chat(server.addr, body).json();
    assert_eq!(j["choices"][0]["message"]["content"], "echo(0): call");
    assert!(!server.requests().pop().unwrap().tools.in_use());

    // Refusals are OpenAI-shaped 400s naming the field, and reach no engine.
    let before = server.requests().len();
    for (extra, param) in [
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"logprobs": true}), "logprobs"),
    ] {
        let mut body = user("x");
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = chat(server.addr, body);
        assert_eq!(r.status, 400);
        assert_eq!(r.json()["error"]["param"], param);
    }
    assert_eq!(server.requests().len(), before);
    server.stop().unwrap();
}

/// Each streamed delta's reasoning and content, in order ("" for the role chunk's content).
fn deltas(reply: &Reply) -> Vec<(String, String)> {
    let (_, chunks) = streamed_text(reply);
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).map(|ch| ch["delta"].clone()))
        .filter(|d| d.get("reasoning_content").is_some() || d.get("content").is_some())
        .map(|d| {
            let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
            (s("reasoning_content"), s("content"))
        })
        .collect()
}

/// A streamed answer's reasoning and content, checked as a client reads them: every reasoning
/// delta before the first content one, and no delta carrying a piece of a tag.
fn read_deltas(reply: &Reply) -> Result<(String, String), String> {
    let d = deltas(reply);
    let first_content = d.iter().position(|(_, c)| !c.is_empty()).unwrap_or(d.len());
    let ordered = d[first_content..].iter().all(|(r, _)| r.is_empty());
    let tag_free = d
        .iter()
        .all(|(r, c)| !r.contains(['<', '>']) && !c.contains(['<', '>']));
    if !ordered || !tag_free {
        return Err(format!("{d:?}"));
    }
    let reasoning = d.iter().map(|(r, _)| r.as_str()).collect();
    let content = d.iter().map(|(_, c)| c.as_str()).collect();
    Ok((reasoning, content))
}

/// The thinking model's answer: the reasoning, `</think>` and the answer, one character per
/// token (so the tag is cut across eight chunks).
const THOUGHT: &str = "plan it\n</think>\n\nHi there";

fn thinking_server() -> Running {
    Running::start_thinking(ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..ServeOptions::default()
    })
}

#[test]
fn a_thinking_answer_is_split_whole_and_streamed() {
    let server = thinking_server();
    let whole = chat(server.addr, user(THOUGHT)).json();
    assert_eq!(
        whole["choices"][0]["message"],
        json!({"role": "assistant", "content": "Hi there", "reasoning_content": "plan it"})
    );
    let mut body = user(THOUGHT);
    body["stream"] = json!(true);
    let streamed = chat(server.addr, body.clone());
    assert_eq!(
        read_deltas(&streamed).unwrap(),
        ("plan it".to_string(), "Hi there".to_string())
    );
    // The tag was cut: its characters came one per token.
    assert!(deltas(&streamed).len() > 3);
    // Control: reasoning_format "none" keeps today's inline answer, tag and all, which the
    // streamed check refuses.
    body["reasoning_format"] = json!("none");
    let inline = chat(server.addr, body.clone());
    let (text, _) = streamed_text(&inline);
    assert_eq!(text, THOUGHT);
    assert!(read_deltas(&inline).is_err());
    body["stream"] = json!(false);
    let whole = chat(server.addr, body).json();
    assert_eq!(
        whole["choices"][0]["message"],
        json!({"role": "assistant", "content": THOUGHT})
    );
    // "deepseek" is "auto"'s split.
    let mut body = user(THOUGHT);
    body["reasoning_format"] = json!("deepseek");
    assert_eq!(
        chat(server.addr, body).json()["choices"][0]["message"]["reasoning_content"],
        "plan it"
    );
    // Any other format is refused by name.
    let mut body = user(THOUGHT);
    body["reasoning_format"] = json!("hidden");
    let refused = chat(server.addr, body);
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["error"]["param"], "reasoning_format");
    server.stop().unwrap();
}

#[test]
fn an_answer_stopped_before_the_tag_is_all_reasoning() {
    let server = thinking_server();
    let mut body = user(THOUGHT);
    body["max_tokens"] = json!(11);
    let whole = chat(server.addr, body.clone()).json();
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(
        whole["choices"][0]["message"],
        json!({"role": "assistant", "content": "", "reasoning_content": "plan it\n</t"})
    );
    body["stream"] = json!(true);
    let d = deltas(&chat(server.addr, body));
    let reasoning: String = d.iter().map(|(r, _)| r.as_str()).collect();
    let content: String = d.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!((reasoning.as_str(), content.as_str()), ("plan it\n</t", ""));
    // Control: a longer answer reaches the tag and has content.
    let mut body = user(THOUGHT);
    body["max_tokens"] = json!(19);
    let whole = chat(server.addr, body).json();
    assert_eq!(whole["choices"][0]["message"]["content"], "H");
    server.stop().unwrap();
}

#[test]
fn an_answer_without_thinking_is_as_before() {
    // A model whose prompt opens no think block (Qwen3-VL): the tag is text like any other.
    let plain = Running::start(
        ServeOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeOptions::default()
        },
        Duration::ZERO,
    );
    let whole = chat(plain.addr, user(THOUGHT)).json();
    let echoed = format!("echo(0): {THOUGHT}");
    assert_eq!(
        whole["choices"][0]["message"],
        json!({"role": "assistant", "content": echoed})
    );
    let mut body = user(THOUGHT);
    body["stream"] = json!(true);
    let (text, chunks) = streamed_text(&chat(plain.addr, body));
    assert_eq!(text, echoed);
    assert!(chunks
        .iter()
        .all(|c| !c.to_string().contains("reasoning_content")));
    plain.stop().unwrap();
    // The thinking model with enable_thinking false: the block is closed in the prompt.
    let server = thinking_server();
    let mut body = user(THOUGHT);
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let whole = chat(server.addr, body).json();
    assert_eq!(
        whole["choices"][0]["message"],
        json!({"role": "assistant", "content": echoed})
    );
    server.stop().unwrap();
}

#[test]
fn history_reasoning_reaches_the_engine() {
    let server = thinking_server();
    let body = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "ok</think>done"},
    ]});
    let whole = chat(server.addr, body).json();
    assert_eq!(whole["choices"][0]["message"]["content"], "done");
    let requests = server.requests();
    let history = &requests[0].messages;
    assert_eq!(history[1].reasoning.as_deref(), Some("greet back"));
    assert_eq!(history[0].reasoning, None);
    // Not a string: refused by name.
    let body = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": {"text": "x"}},
        {"role": "user", "content": "again"},
    ]});
    let refused = chat(server.addr, body);
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.json()["error"]["param"],
        "messages[1].reasoning_content"
    );
    server.stop().unwrap();
}
