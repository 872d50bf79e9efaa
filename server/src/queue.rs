//! Requests wait first come first served in a bounded queue; worker threads take them, one
//! request at a time each, and run them on their engine. One worker over a session is the
//! one-conversation server (its KV cache kept between requests for the prompt cache); several
//! workers over handles of one scheduler answer that many requests at once, batched into the same
//! forwards by the engine (`engine::Scheduler`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
    sender: SyncSender<Job>,
    /// Requests waiting or running.
    depth: Arc<AtomicUsize>,
    capacity: usize,
}

impl Queue {
    /// Starts one worker thread per engine; at most `capacity` requests wait beside the running
    /// ones. The workers end when every `Queue` clone is dropped.
    pub fn start(
        engines: Vec<Box<dyn ChatEngine>>,
        capacity: usize,
    ) -> (Queue, Vec<JoinHandle<()>>) {
        let (sender, receiver) = sync_channel::<Job>(capacity);
        let receiver = Arc::new(Mutex::new(receiver));
        let depth = Arc::new(AtomicUsize::new(0));
        let workers = engines
            .into_iter()
            .enumerate()
            .map(|(i, mut engine)| {
                let (receiver, depth) = (receiver.clone(), depth.clone());
                std::thread::Builder::new()
                    .name(format!("xdna-vl-engine-{i}"))
                    .spawn(move || loop {
                        // One idle worker waits on the channel at a time; the lock is released
                        // before the job runs.
                        let job = receiver.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok(job) = job else { return };
                        // A client that left while waiting costs nothing.
                        if !job.events.is_closed() {
                            run(engine.as_mut(), job);
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
        match self.sender.try_send(job) {
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

fn run(engine: &mut dyn ChatEngine, job: Job) {
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
    let _ = events.send(JobEvent::Done(result));
}
