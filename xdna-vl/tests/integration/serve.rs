//! `xdna-vl serve` as a process on an ephemeral loopback port, talked to over real HTTP: its
//! answers (text, pictures as data URLs and as files, streamed or not) equal `xdna-vl run` on the
//! same input byte for byte, `usage` equals the engine's counts, four concurrent clients each get
//! their solo answer, the client's mistakes are OpenAI-shaped 400s, Ollama's routes answer the same
//! with the engine's counts and times, and SIGTERM ends it with 0.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use serde_json::{json, Value};
use server::client::{self, Reply};

use crate::common::{chat_dir, pack};

pub(crate) struct Served {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// Its stderr after the listening line.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Served {
    pub(crate) fn start(extra: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_xdna-vl"))
            .arg("serve")
            .arg(pack())
            .args(["--port", "0", "--threads", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("the server exited").unwrap();
            if let Some(a) = line.split("listening on http://").nth(1) {
                break a.trim().parse().unwrap();
            }
        };
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Served { child, addr, log }
    }

    /// The stderr lines so far that start with `prefix`, after waiting up to a second for one.
    pub(crate) fn log_lines(&self, prefix: &str) -> Vec<String> {
        let matching = || -> Vec<String> {
            let log = self.log.lock().unwrap();
            log.iter()
                .filter(|l| l.starts_with(prefix))
                .cloned()
                .collect()
        };
        for _ in 0..100 {
            if !matching().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        matching()
    }

    pub(crate) fn post(&self, body: &Value) -> Reply {
        client::request(
            self.addr,
            "POST",
            "/v1/chat/completions",
            None,
            body.to_string().as_bytes(),
        )
        .unwrap()
    }

    /// SIGTERM: the server finishes and exits 0.
    pub(crate) fn terminate(mut self) -> i32 {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `xdna-vl run --json` on the same pack: (text, prompt tokens, ids).
fn run_json(args: &[&str]) -> (String, u64, usize) {
    let out = Command::new(env!("CARGO_BIN_EXE_xdna-vl"))
        .arg("run")
        .arg(pack())
        .args(["--json", "--threads", "1"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["text"].as_str().unwrap().to_string(),
        v["prompt_tokens"].as_u64().unwrap(),
        v["ids"].as_array().unwrap().len(),
    )
}

/// `xdna-vl run --json` on the bundled question: its two pictures, "Describe these pictures.".
fn run_bundled_question() -> (String, u64, usize) {
    run_json(&[
        "--image",
        chat_dir().join("picture-1.png").to_str().unwrap(),
        "--image",
        chat_dir().join("picture-2.png").to_str().unwrap(),
        "--prompt",
        "Describe these pictures.",
    ])
}

fn data_url(file: &str) -> String {
    let bytes = std::fs::read(chat_dir().join(file)).unwrap();
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn user(parts: Vec<Value>) -> Value {
    json!({"messages": [{"role": "user", "content": parts}], "temperature": 0})
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

fn image(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

fn answer(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn streamed(served: &Served, mut body: Value) -> (String, Value) {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = served.post(&body);
    assert_eq!(r.status, 200);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str())
        .collect();
    (text, chunks.last().unwrap()["usage"].clone())
}

#[test]
fn answers_equal_xdna_vl_run_and_usage_the_engines() {
    let served = Served::start(&["--media-dir", chat_dir().to_str().unwrap()]);
    // The bundled question: two pictures, one as a data URL and one as a file.
    let body = user(vec![
        image(&data_url("picture-1.png")),
        image("picture-2.png"),
        text("Describe these pictures."),
    ]);
    let r = served.post(&body);
    let (run_text, run_prompt, run_ids) = run_bundled_question();
    assert_eq!(answer(&r), run_text);
    // transformers' answer on this checkpoint (tests/fixtures/chat/answer.json).
    assert_eq!(run_text, "anksson\u{FFFD}ud");
    let usage = r.json()["usage"].clone();
    assert_eq!(usage["prompt_tokens"], run_prompt);
    assert_eq!(usage["completion_tokens"], run_ids as u64);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    // return_token_ids: the answer's ids, transformers' greedy ids (tests/fixtures/chat/answer.json).
    let mut with_ids = body.clone();
    with_ids["return_token_ids"] = json!(true);
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(chat_dir().join("answer.json")).unwrap())
            .unwrap();
    let ids = served.post(&with_ids).json()["choices"][0]["token_ids"].clone();
    assert_eq!(ids, fixture["answer"]["greedy_ids"]);
    assert!(
        r.json()["choices"][0].get("token_ids").is_none(),
        "control: not asked"
    );

    // Streamed: the chunks add up to the same text, and the usage chunk to the same counts.
    let (s, s_usage) = streamed(&served, body.clone());
    assert_eq!(s, run_text);
    assert_eq!(s_usage, usage);

    // Text only, cut by max_tokens: finish_reason length.
    let mut body = user(vec![text("Hello there.")]);
    body["max_tokens"] = json!(40);
    let r = served.post(&body);
    let (run_text, _, run_ids) = run_json(&["--prompt", "Hello there.", "--max-tokens", "40"]);
    assert_eq!(answer(&r), run_text);
    assert_eq!(run_ids, 40);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");

    // /health says what runs.
    let h = client::request(served.addr, "GET", "/health", None, b"")
        .unwrap()
        .json();
    assert_eq!(h["backend"], "host");
    assert_eq!(h["model"], "chat-f32");
    assert_eq!(served.terminate(), 0);
}

#[test]
fn four_concurrent_clients_each_get_their_solo_answer() {
    let served = Served::start(&[]);
    let questions: Vec<String> = (0..4).map(|i| format!("Question number {i}?")).collect();
    let solo: Vec<String> = questions
        .iter()
        .map(|q| answer(&served.post(&user(vec![text(q)]))))
        .collect();
    let addr = served.addr;
    let handles: Vec<_> = questions
        .iter()
        .map(|q| {
            let body = user(vec![image(&data_url("picture-1.png")), text(q)]);
            let plain = user(vec![text(q)]);
            std::thread::spawn(move || {
                // One request with a picture between, so the cache is really shared.
                let post = |b: &Value| {
                    client::request(
                        addr,
                        "POST",
                        "/v1/chat/completions",
                        None,
                        b.to_string().as_bytes(),
                    )
                    .unwrap()
                };
                let _ = post(&body);
                answer(&post(&plain))
            })
        })
        .collect();
    for (h, want) in handles.into_iter().zip(&solo) {
        assert_eq!(&h.join().unwrap(), want);
    }
    assert_eq!(served.terminate(), 0);
}

#[test]
fn the_clients_mistakes_are_400s_and_the_server_goes_on() {
    let served = Served::start(&["--ctx", "40"]);
    let bad_image = user(vec![
        image("data:image/png;base64,aGVsbG8="),
        text("What is this?"),
    ]);
    let r = served.post(&bad_image);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    // Over the context: both numbers.
    let long = user(vec![text(&"word ".repeat(80))]);
    let r = served.post(&long);
    assert_eq!(r.status, 400);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("over the context of 40"), "{msg}");
    // Files are refused without --media-dir.
    let r = served.post(&user(vec![image("picture-1.png"), text("x")]));
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--media-dir"));
    // Control: the server still answers.
    assert_eq!(served.post(&user(vec![text("Hi.")])).status, 200);
    assert_eq!(served.terminate(), 0);
}

/// `serve` with N conversations at once: the answers of six concurrent clients (pictures, a
/// system turn, sampled with a seed) equal the one-at-a-time server's; control: a different
/// seed changes the sampled answer.
#[test]
fn parallel_conversations_answer_as_one_at_a_time() {
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            let mut parts = vec![text(&format!("Question number {i}?"))];
            if i % 2 == 0 {
                parts.insert(0, image(&data_url("picture-1.png")));
            }
            let mut b = user(parts);
            b["max_tokens"] = json!(8);
            if i % 3 == 2 {
                b["temperature"] = json!(0.9);
                b["seed"] = json!(i);
            }
            b
        })
        .collect();
    let one = Served::start(&["--parallel", "1"]);
    let solo: Vec<String> = bodies.iter().map(|b| answer(&one.post(b))).collect();
    let mut reseeded = bodies[2].clone();
    reseeded["seed"] = json!(1234);
    assert_ne!(answer(&one.post(&reseeded)), solo[2], "the seed matters");
    assert_eq!(one.terminate(), 0);

    let many = Served::start(&["--parallel", "3", "--prefill-chunk", "4"]);
    let addr = many.addr;
    let handles: Vec<_> = bodies
        .iter()
        .cloned()
        .map(|b| {
            std::thread::spawn(move || {
                let reply = client::request(
                    addr,
                    "POST",
                    "/v1/chat/completions",
                    None,
                    b.to_string().as_bytes(),
                )
                .unwrap();
                answer(&reply)
            })
        })
        .collect();
    for (i, (h, want)) in handles.into_iter().zip(&solo).enumerate() {
        assert_eq!(&h.join().unwrap(), want, "client {i}");
    }
    assert_eq!(many.terminate(), 0);
}

#[test]
fn parallel_and_budget_refusals_name_the_flag() {
    let refused = |args: &[&str], needle: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_xdna-vl"))
            .arg("serve")
            .arg(pack())
            .args(["--port", "0"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    };
    refused(&["--parallel", "0"], "--parallel 0");
    refused(&["--prefill-chunk", "0"], "--prefill-chunk 0");
    refused(
        &["--kv-budget-mib", "0"],
        "raise --kv-budget-mib or lower --ctx",
    );
    refused(
        &["--parallel", "100", "--kv-budget-mib", "1", "--ctx", "512"],
        "over --kv-budget-mib 1",
    );
}

#[test]
fn ollama_routes_answer_as_xdna_vl_run_does() {
    let served = Served::start(&[]);
    let post = |path: &str, body: Value| {
        client::request(served.addr, "POST", path, None, body.to_string().as_bytes()).unwrap()
    };
    let pictures: Vec<String> = ["picture-1.png", "picture-2.png"]
        .iter()
        .map(|f| {
            let bytes = std::fs::read(chat_dir().join(f)).unwrap();
            base64::engine::general_purpose::STANDARD.encode(bytes)
        })
        .collect();
    let (run_text, run_prompt, run_ids) = run_bundled_question();
    let whole = post(
        "/api/chat",
        json!({"model": "chat-f32", "stream": false, "options": {"temperature": 0},
               "messages": [{"role": "user", "content": "Describe these pictures.",
                             "images": pictures}]}),
    );
    assert_eq!(
        whole.status,
        200,
        "{}",
        String::from_utf8_lossy(&whole.body)
    );
    let whole = whole.json();
    assert_eq!(whole["message"]["content"], run_text.as_str());
    assert_eq!(whole["done_reason"], "stop");
    assert_eq!(whole["prompt_eval_count"], run_prompt);
    assert_eq!(whole["eval_count"], run_ids as u64);
    // The engine's times, in nanoseconds, within the request's own.
    let ns = |k: &str| whole[k].as_u64().unwrap();
    assert!(
        ns("prompt_eval_duration") > 0 && ns("eval_duration") > 0,
        "{whole}"
    );
    assert!(
        ns("total_duration") >= ns("prompt_eval_duration") + ns("eval_duration"),
        "{whole}"
    );

    // /api/generate, streamed as Ollama streams by default: the same answer.
    let r = post(
        "/api/generate",
        json!({"model": "chat-f32:latest", "prompt": "Describe these pictures.",
               "images": pictures, "options": {"temperature": 0}}),
    );
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let lines = r.ndjson();
    let text: String = lines
        .iter()
        .map(|l| l["response"].as_str().unwrap())
        .collect();
    assert_eq!(text, run_text);
    let last = lines.last().unwrap();
    assert_eq!(
        (&last["done"], &last["eval_count"]),
        (&json!(true), &json!(run_ids))
    );

    // /api/tags lists the pack, which takes pictures.
    let tags = client::request(served.addr, "GET", "/api/tags", None, b"")
        .unwrap()
        .json();
    let listed = &tags["models"][0];
    assert_eq!(listed["name"], "chat-f32:latest");
    assert_eq!(listed["size"], std::fs::metadata(pack()).unwrap().len());
    assert_eq!(listed["capabilities"], json!(["completion", "vision"]));
    assert_eq!(served.terminate(), 0);
}

/// Each request that ran leaves one line on stderr with its counts and finish; a refused one its
/// error. Control: `--quiet` leaves none.
#[test]
fn each_request_leaves_a_log_line_unless_quiet() {
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let served = Served::start(&[]);
    let r = served.post(&body);
    assert_eq!(r.status, 200);
    let prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let lines = served.log_lines("request 1:");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(&format!("{prompt} prompt tokens"))
            && lines[0].contains("3 answer tokens")
            && lines[0].ends_with("finish length"),
        "{}",
        lines[0]
    );
    let bad = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
    assert_eq!(served.post(&bad).status, 400);
    let lines = served.log_lines("request 2:");
    assert!(lines[0].contains("refused (400): image"), "{lines:?}");
    let quiet = Served::start(&["--quiet"]);
    assert_eq!(quiet.post(&body).status, 200);
    assert!(quiet.log_lines("request").is_empty());
}
