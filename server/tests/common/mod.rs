//! What the server's tests share: a scripted engine standing in for the model, and the server
//! running in-process on a free loopback port.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use server::chat::{ChatEngine, ChatRequest, Completion, EngineError, Event, Finish, Part};
use server::{ModelInfo, ServeOptions};

/// Answers "echo(N): <the last text>", N the pictures in the whole conversation, one character
/// per token, `delay` per token. A prompt (text characters, 10 per picture) of more than 400 is
/// "over the context"; a picture must start with the PNG magic.
struct ScriptedEngine {
    delay: Duration,
    cancels: Arc<AtomicUsize>,
}

impl ChatEngine for ScriptedEngine {
    fn complete(
        &mut self,
        request: &ChatRequest,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Completion, EngineError> {
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
        if !on_event(Event::Started {
            prompt_tokens: prompt,
        }) {
            return Err(EngineError::Cancelled);
        }
        let answer = format!("echo({images}): {last_text}");
        let max = request.sampling.max_tokens.unwrap_or(usize::MAX);
        let mut text = String::new();
        for (n, c) in answer.chars().enumerate() {
            if n == max {
                return Ok(Completion {
                    text,
                    prompt_tokens: prompt,
                    completion_tokens: n,
                    finish: Finish::Length,
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
            text,
            prompt_tokens: prompt,
            finish: Finish::Stop,
        })
    }
}

pub struct Running {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<Result<(), server::ServeError>>>,
    /// Answers the engine stopped because the client went away.
    pub cancels: Arc<AtomicUsize>,
}

impl Running {
    pub fn start(options: ServeOptions, delay: Duration) -> Running {
        let cancels = Arc::new(AtomicUsize::new(0));
        let engine = ScriptedEngine {
            delay,
            cancels: cancels.clone(),
        };
        let (addr_tx, addr_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let info = ModelInfo {
            id: "tiny".into(),
            backend: "host".into(),
            context: 400,
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
        }
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
