//! What the HTTP tests share: a scripted engine standing in for the model, and a server over it
//! on a loopback port.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use server::chat::{
    new_call_id, ChatEngine, ChatRequest, Completion, EngineError, Event, Finish, Part, ToolCall,
};
use server::client::{self, Reply};
use server::{ModelInfo, ServeOptions};

/// The times the scripted engine says it spent on every prompt and answer.
pub const PROMPT_TIME: Duration = Duration::from_millis(3);
pub const ANSWER_TIME: Duration = Duration::from_millis(7);

/// A PNG's magic and a little more: what the scripted engine takes as an image.
pub const PNG: &[u8] = b"\x89PNG\r\n\x1a\nrest";

/// Answers "echo(<images>): <last user text>" one character per token, `delay` per token. A
/// prompt of more than 400 characters is "over the context"; an image must start with the PNG
/// magic. With tools in use and a last text "call", it calls each tool with `{"n": 1}` after the
/// text "ok". It keeps every request it is given and counts the ones cancelled mid-answer.
/// A thinking one (`thinks`) stands in for Qwen3.5: unless the request's template variables set
/// `enable_thinking` false, its prompt opens a think block and it answers the last user text as
/// it is, one character per token (the test writes the reasoning, `</think>` and the answer).
struct ScriptedEngine {
    delay: Duration,
    thinks: bool,
    cancels: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<ChatRequest>>>,
}

impl ChatEngine for ScriptedEngine {
    fn complete(
        &mut self,
        request: &ChatRequest,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Completion, EngineError> {
        self.requests.lock().unwrap().push(request.clone());
        let mut prompt = 0;
        let mut last_text = String::new();
        let mut images = 0;
        for m in &request.messages {
            for p in &m.parts {
                match p {
                    Part::Text(t) => {
                        prompt += t.chars().count();
                        last_text = t.clone();
                    }
                    Part::Image { name, bytes } => {
                        if !bytes.starts_with(b"\x89PNG") {
                            return Err(EngineError::Invalid(format!("{name}: not an image")));
                        }
                        images += 1;
                        prompt += 10;
                    }
                }
            }
        }
        if prompt > 400 {
            return Err(EngineError::Invalid(format!(
                "the prompt has {prompt} tokens, over the context of 400"
            )));
        }
        let opens_think = self.thinks
            && request.template_kwargs.get("enable_thinking") != Some(&Value::Bool(false));
        if !on_event(Event::Started {
            prompt_tokens: prompt,
            opens_think,
        }) {
            return Err(EngineError::Cancelled);
        }
        if request.tools.in_use() && last_text == "call" {
            if !on_event(Event::Text("ok")) {
                return Err(EngineError::Cancelled);
            }
            let tool_calls = request
                .tools
                .functions()
                .into_iter()
                .map(|(name, _)| ToolCall {
                    id: new_call_id(),
                    name,
                    arguments: r#"{"n":1}"#.into(),
                })
                .collect();
            return Ok(Completion {
                text: "ok".into(),
                reasoning: String::new(),
                tool_calls,
                prompt_tokens: prompt,
                completion_tokens: 9,
                ids: Vec::new(),
                finish: Finish::ToolCalls,
                prompt_time: PROMPT_TIME,
                answer_time: ANSWER_TIME,
            });
        }
        let answer = if opens_think {
            last_text
        } else {
            format!("echo({images}): {last_text}")
        };
        let max = request.sampling.max_tokens.unwrap_or(usize::MAX);
        let mut text = String::new();
        for (n, c) in answer.chars().enumerate() {
            if n == max {
                return Ok(Completion {
                    text,
                    reasoning: String::new(),
                    tool_calls: Vec::new(),
                    prompt_tokens: prompt,
                    completion_tokens: n,
                    ids: answer.chars().take(n).map(u32::from).collect(),
                    finish: Finish::Length,
                    prompt_time: PROMPT_TIME,
                    answer_time: ANSWER_TIME,
                });
            }
            std::thread::sleep(self.delay);
            let s = c.to_string();
            if !on_event(Event::Text(&s)) {
                self.cancels.fetch_add(1, Ordering::SeqCst);
                return Err(EngineError::Cancelled);
            }
            text.push(c);
        }
        Ok(Completion {
            completion_tokens: answer.chars().count(),
            // The scripted engine's "token ids": the characters' code points.
            ids: answer.chars().map(u32::from).collect(),
            text,
            reasoning: String::new(),
            tool_calls: Vec::new(),
            prompt_tokens: prompt,
            finish: Finish::Stop,
            prompt_time: PROMPT_TIME,
            answer_time: ANSWER_TIME,
        })
    }
}

/// A server on a loopback port over the scripted engine, serving the model "tiny".
pub struct Running {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<Result<(), server::ServeError>>>,
    /// Answers the engine stopped because the client went away.
    pub cancels: Arc<AtomicUsize>,
    /// Every request the engine was given, in order.
    pub requests: Arc<Mutex<Vec<ChatRequest>>>,
}

impl Running {
    pub fn start(options: ServeOptions, delay: Duration) -> Running {
        Running::launch(options, delay, false)
    }

    /// [`Running::start`] over a thinking model (see `ScriptedEngine`).
    pub fn start_thinking(options: ServeOptions) -> Running {
        Running::launch(options, Duration::ZERO, true)
    }

    fn launch(options: ServeOptions, delay: Duration, thinks: bool) -> Running {
        let cancels = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let engine = ScriptedEngine {
            delay,
            thinks,
            cancels: cancels.clone(),
            requests: requests.clone(),
        };
        let (addr_tx, addr_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let info = ModelInfo {
            id: "tiny".into(),
            backend: "host".into(),
            context: 400,
            family: "qwen3_vl".into(),
            vision: true,
            thinking: false,
            size: Some(1234),
            modified: Some(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        };
        let join = std::thread::spawn(move || {
            server::serve_until(
                options,
                info,
                Box::new(engine),
                move |a| addr_tx.send(a).unwrap(),
                async move {
                    let _ = stop_rx.await;
                },
            )
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Running {
            addr,
            stop: Some(stop_tx),
            join: Some(join),
            cancels,
            requests,
        }
    }

    /// The requests the engine has been given so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// Shuts down gracefully; the server returns Ok.
    pub fn stop(mut self) -> Result<(), server::ServeError> {
        let _ = self.stop.take().unwrap().send(());
        self.join.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &[u8],
) -> Reply {
    client::request(addr, method, path, key, body).unwrap()
}

/// Six clients at once on a server whose queue takes one, each sending with `send`: at least one
/// is answered and the rest are refused with 503 and `Retry-After: 1`; returns the refusals.
pub fn overflow_the_queue(send: fn(SocketAddr) -> Reply) -> Vec<Reply> {
    let options = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        queue_capacity: 1,
        ..ServeOptions::default()
    };
    let server = Running::start(options, Duration::from_millis(5));
    let addr = server.addr;
    let handles: Vec<_> = (0..6)
        .map(|_| std::thread::spawn(move || send(addr)))
        .collect();
    let replies: Vec<Reply> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let busy: Vec<Reply> = replies.into_iter().filter(|r| r.status == 503).collect();
    assert!(!busy.is_empty() && ok >= 1, "ok {ok}, busy {}", busy.len());
    assert_eq!(ok + busy.len(), 6);
    assert!(busy.iter().all(|r| r.header("retry-after") == Some("1")));
    server.stop().unwrap();
    busy
}

/// Sends `body` to `path` and goes away after the first bytes of the answer (or, when
/// `wait_for_bytes` is false, 50 ms after sending, without reading: a whole answer's client).
pub fn leave_early(addr: SocketAddr, path: &str, body: &Value, wait_for_bytes: bool) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    if wait_for_bytes {
        let mut first = [0u8; 256];
        let _ = s.read(&mut first).unwrap();
    } else {
        std::thread::sleep(Duration::from_millis(50));
    }
}
