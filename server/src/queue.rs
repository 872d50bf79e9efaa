//! Requests wait first come first served in a bounded queue; worker threads take them, one
//! request at a time each, and run them on their engine. One worker over a session is the
//! one-conversation server (its KV cache kept between requests for the prompt cache); several
//! workers over handles of one scheduler answer that many requests at once, batched into the same
//! forwards by the engine (`engine::Scheduler`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::chat::{ChatEngine, ChatRequest, Completion, EngineError, Event};
use crate::error::ApiError;

/// What a request hears from the worker.
#[derive(Debug)]
pub enum JobEvent {
    Started {
        prompt_tokens: usize,
        opens_think: bool,
    },
    Text(String),
    Done(Result<Completion, EngineError>),
}

pub struct Job {
    pub request: ChatRequest,
    /// Dropping the receiver (the client went away) cancels the job at its next token.
    pub events: UnboundedSender<JobEvent>,
}

#[derive(Clone)]
pub struct Queue {
    /// Jobs with the moment they were queued.
    sender: SyncSender<(Job, Instant)>,
    /// Requests waiting or running.
    depth: Arc<AtomicUsize>,
    capacity: usize,
}

impl Queue {
    /// Starts one worker thread per engine; at most `capacity` requests wait beside the running
    /// ones. With `log`, each request that ran leaves one line on stderr ([`request_line`]). The
    /// workers end when every `Queue` clone is dropped.
    pub fn start(
        engines: Vec<Box<dyn ChatEngine>>,
        capacity: usize,
        log: bool,
    ) -> (Queue, Vec<JoinHandle<()>>) {
        let (sender, receiver) = sync_channel::<(Job, Instant)>(capacity);
        let receiver = Arc::new(Mutex::new(receiver));
        let depth = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicU64::new(0));
        let workers = engines
            .into_iter()
            .enumerate()
            .map(|(i, mut engine)| {
                let (receiver, depth, ran) = (receiver.clone(), depth.clone(), ran.clone());
                std::thread::Builder::new()
                    .name(format!("xdna-vl-engine-{i}"))
                    .spawn(move || loop {
                        // One idle worker waits on the channel at a time; the lock is released
                        // before the job runs.
                        let job = receiver.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok((job, queued)) = job else { return };
                        // A client that left while waiting costs nothing.
                        if !job.events.is_closed() {
                            let n = ran.fetch_add(1, Ordering::SeqCst) + 1;
                            let (waited, started) = (queued.elapsed(), Instant::now());
                            let result = run(engine.as_mut(), job);
                            if log {
                                eprintln!(
                                    "{}",
                                    request_line(n, waited, started.elapsed(), &result)
                                );
                            }
                        }
                        depth.fetch_sub(1, Ordering::SeqCst);
                    })
                    .expect("spawn an engine thread")
            })
            .collect();
        (
            Queue {
                sender,
                depth,
                capacity,
            },
            workers,
        )
    }

    /// Queues a job, or refuses it with 503 when `capacity` are already waiting.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.depth.fetch_add(1, Ordering::SeqCst);
        match self.sender.try_send((job, Instant::now())) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.depth.fetch_sub(1, Ordering::SeqCst);
                Err(ApiError::busy(self.capacity))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.depth.fetch_sub(1, Ordering::SeqCst);
                Err(ApiError::internal("the engine thread has stopped"))
            }
        }
    }

    /// Requests waiting or running.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::SeqCst)
    }
}

/// Runs the job; its outcome goes to the request and, for the log, back to the caller (the text
/// is already the request's: only the counts and the finish or the error are kept).
fn run(engine: &mut dyn ChatEngine, job: Job) -> Result<Completion, EngineError> {
    let events = job.events;
    let mut on_event = |event: Event<'_>| {
        let sent = match event {
            Event::Started {
                prompt_tokens,
                opens_think,
            } => events.send(JobEvent::Started {
                prompt_tokens,
                opens_think,
            }),
            Event::Text(text) => events.send(JobEvent::Text(text.to_string())),
        };
        sent.is_ok()
    };
    // A panic in the engine must not take the server down with it: the request gets a 500.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine.complete(&job.request, &mut on_event)
    }))
    .unwrap_or_else(|_| {
        Err(EngineError::Failed(
            "the engine panicked on this request".into(),
        ))
    });
    let outcome = match &result {
        Ok(c) => Ok(Completion {
            text: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            ids: Vec::new(),
            ..*c
        }),
        Err(e) => Err(e.clone()),
    };
    let _ = events.send(JobEvent::Done(result));
    outcome
}

/// The log line of request `n` (the n-th that ran): how long it waited in the queue and ran, and
/// what came of it — token counts, the engine's prompt and answer times and the answer's tok/s,
/// and how it finished; or that the client left, or the error (as its client was told).
pub fn request_line(
    n: u64,
    waited: Duration,
    ran: Duration,
    result: &Result<Completion, EngineError>,
) -> String {
    let head = format!("request {n}: waited {}, ran {}", time(waited), time(ran));
    match result {
        Ok(c) => {
            let answer = c.answer_time.as_secs_f64();
            let rate = if answer > 0.0 {
                format!(" ({:.1} tok/s)", c.completion_tokens as f64 / answer)
            } else {
                String::new()
            };
            format!(
                "{head}: {} prompt tokens in {}, {} answer tokens in {}{rate}, finish {}",
                c.prompt_tokens,
                time(c.prompt_time),
                c.completion_tokens,
                time(c.answer_time),
                c.finish.as_str()
            )
        }
        Err(EngineError::Cancelled) => format!("{head}: cancelled (the client left)"),
        Err(EngineError::Invalid(m)) => format!("{head}: refused (400): {m}"),
        Err(EngineError::Failed(m)) => format!("{head}: failed (500): {m}"),
    }
}

/// A time as a person reads it: milliseconds below a second, else seconds.
fn time(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::Finish;

    fn completion(completion_tokens: usize, answer_ms: u64) -> Completion {
        Completion {
            text: "hello".into(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            prompt_tokens: 17,
            completion_tokens,
            ids: Vec::new(),
            finish: Finish::Length,
            prompt_time: Duration::from_millis(50),
            answer_time: Duration::from_millis(answer_ms),
        }
    }

    /// A request's log line carries its counts, times, rate and finish, or its error by kind;
    /// an answer of no time gives no rate rather than inf. Control: another count is another line.
    #[test]
    fn a_request_line_says_what_came_of_it() {
        let (w, r) = (Duration::from_millis(1250), Duration::from_millis(260));
        let ok = request_line(3, w, r, &Ok(completion(8, 200)));
        assert_eq!(
            ok,
            "request 3: waited 1.25 s, ran 260.0 ms: 17 prompt tokens in 50.0 ms, 8 answer tokens \
             in 200.0 ms (40.0 tok/s), finish length"
        );
        assert_ne!(ok, request_line(3, w, r, &Ok(completion(9, 200))));
        assert!(!request_line(1, w, r, &Ok(completion(0, 0))).contains("tok/s"));
        let err = |e| request_line(4, w, r, &Err(e));
        assert!(err(EngineError::Cancelled).ends_with("cancelled (the client left)"));
        assert!(err(EngineError::Invalid("too long".into())).ends_with("refused (400): too long"));
        assert!(err(EngineError::Failed("boom".into())).ends_with("failed (500): boom"));
    }
}
