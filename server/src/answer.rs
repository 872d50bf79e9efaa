//! The one path from a request to the engine and back, for the OpenAI and the Ollama routes
//! alike: the body read within its limit, the images fetched, the job queued (503 when the queue
//! is full), then the answer whole or as it comes. A client that goes away drops the stream, and
//! with it the job's receiver: the engine stops at its next token.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use serde_json::{Map, Value};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio_stream::wrappers::ReceiverStream;

use crate::api::{RequestMessage, RequestPart};
use crate::chat::{
    ChatRequest, Completion, EngineError, Message, Part, ResponseFormat, Sampling, Tools,
};
use crate::error::ApiError;
use crate::media::{self, MediaPolicy};
use crate::queue::{Job, JobEvent, Queue};
use crate::think::{append, Piece, Reasoning, ThinkSplitter};

/// The request body, refused with 413 past `limit` bytes (by its Content-Length before reading).
pub async fn read_body(limit: usize, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if format!("{e:?}").contains("LengthLimit") {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request(format!("the body could not be read: {e}"), None)
        }
    })
}

/// An answer under way: the engine has accepted its prompt.
pub struct Answer {
    pub prompt_tokens: usize,
    receiver: UnboundedReceiver<JobEvent>,
    /// The answer's reasoning split from its content, whole or streamed alike.
    splitter: ThinkSplitter,
}

/// A checked request, its images not yet fetched.
pub struct Request {
    pub messages: Vec<RequestMessage>,
    pub sampling: Sampling,
    pub tools: Tools,
    pub format: ResponseFormat,
    pub template_kwargs: Map<String, Value>,
    /// Whether a thinking model's reasoning is separated from the content.
    pub reasoning: Reasoning,
}

/// Fetches the messages' images, queues the request and waits until the engine accepts its
/// prompt, so that a prompt over the context, an image that does not decode or a schema the
/// constraint refuses is a 400 even for a streamed answer.
pub async fn start(
    queue: &Queue,
    policy: &MediaPolicy,
    request: Request,
) -> Result<Answer, ApiError> {
    let Request {
        messages,
        sampling,
        tools,
        format,
        template_kwargs,
        reasoning,
    } = request;
    // Off the async threads: a file or a remote fetch blocks.
    let policy = policy.clone();
    let messages = tokio::task::spawn_blocking(move || resolve_images(messages, &policy))
        .await
        .map_err(|e| ApiError::internal(format!("reading the images failed: {e}")))??;
    let (events, mut receiver) = mpsc::unbounded_channel();
    queue.submit(Job {
        request: ChatRequest {
            messages,
            sampling,
            tools,
            format,
            template_kwargs,
        },
        events,
    })?;
    match receiver.recv().await {
        Some(JobEvent::Started {
            prompt_tokens,
            opens_think,
        }) => Ok(Answer {
            prompt_tokens,
            receiver,
            splitter: ThinkSplitter::new(reasoning, opens_think),
        }),
        Some(JobEvent::Done(Err(e))) => Err(engine_error(e)),
        Some(JobEvent::Done(Ok(_))) | Some(JobEvent::Text(_)) | None => {
            Err(ApiError::internal("the engine ended without starting"))
        }
    }
}

/// How a route words a streamed answer: a chunk per piece of text or of reasoning, the last
/// chunks, an error.
pub trait Chunks: Send + 'static {
    fn text(&self, text: &str) -> Value;
    fn reasoning(&self, text: &str) -> Value;
    fn done(&self, completion: &Completion) -> Vec<Value>;
    fn error(&self, error: &ApiError) -> Value;
}

impl Answer {
    /// Waits for the whole answer.
    pub async fn whole(mut self) -> Result<Completion, ApiError> {
        let (mut text, mut reasoning) = (String::new(), String::new());
        loop {
            match self.receiver.recv().await {
                Some(JobEvent::Text(t)) => {
                    append(self.splitter.push(&t), &mut reasoning, &mut text)
                }
                Some(JobEvent::Done(Ok(c))) => {
                    debug_assert!(c.prompt_tokens == self.prompt_tokens);
                    append(self.splitter.finish(), &mut reasoning, &mut text);
                    return Ok(Completion {
                        text,
                        reasoning,
                        ..c
                    });
                }
                Some(JobEvent::Done(Err(e))) => return Err(engine_error(e)),
                Some(JobEvent::Started { .. }) | None => {
                    return Err(ApiError::internal("the engine stopped mid-answer"))
                }
            }
        }
    }

    /// The answer as it comes, in `chunks`' words, ending after the last chunks or an error.
    /// When the client disconnects, the response body and this stream are dropped, the
    /// forwarder's send fails, it drops the job's receiver, and the engine stops at its next
    /// token.
    pub fn stream(self, chunks: impl Chunks) -> ReceiverStream<Value> {
        let (sender, stream) = mpsc::channel::<Value>(64);
        let (mut receiver, mut splitter) = (self.receiver, self.splitter);
        tokio::spawn(async move {
            loop {
                let (out, last) = match receiver.recv().await {
                    Some(JobEvent::Text(t)) => (said(&chunks, splitter.push(&t)), false),
                    Some(JobEvent::Done(Ok(c))) => {
                        let mut out = said(&chunks, splitter.finish());
                        out.extend(chunks.done(&c));
                        (out, true)
                    }
                    Some(JobEvent::Done(Err(e))) => (vec![chunks.error(&engine_error(e))], true),
                    Some(JobEvent::Started { .. }) | None => {
                        let e = ApiError::internal("the engine stopped mid-answer");
                        (vec![chunks.error(&e)], true)
                    }
                };
                for chunk in out {
                    if sender.send(chunk).await.is_err() {
                        return;
                    }
                }
                if last {
                    return;
                }
            }
        });
        ReceiverStream::new(stream)
    }
}

/// The chunks that say `pieces`.
fn said(chunks: &impl Chunks, pieces: Vec<Piece>) -> Vec<Value> {
    pieces
        .into_iter()
        .map(|p| match p {
            Piece::Reasoning(r) => chunks.reasoning(&r),
            Piece::Content(t) => chunks.text(&t),
        })
        .collect()
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Invalid(m) => ApiError::bad_request(m, Some("messages".into())),
        EngineError::Cancelled => ApiError::internal("the request was cancelled"),
        EngineError::Failed(m) => ApiError::internal(m),
    }
}

fn resolve_images(
    messages: Vec<RequestMessage>,
    policy: &MediaPolicy,
) -> Result<Vec<Message>, ApiError> {
    messages
        .into_iter()
        .map(|m| {
            let parts = m
                .parts
                .into_iter()
                .map(|p| match p {
                    RequestPart::Text(t) => Ok(Part::Text(t)),
                    RequestPart::ImageUrl { url, param } => {
                        let (name, bytes) = media::fetch(&url, &param, policy)?;
                        Ok(Part::Image { name, bytes })
                    }
                    RequestPart::ImageBase64 { data, param } => {
                        let bytes = media::decode_base64(&data, &param, policy)?;
                        Ok(Part::Image { name: param, bytes })
                    }
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            Ok(Message {
                role: m.role,
                parts,
                tool_calls: m.tool_calls,
                tool_call_id: m.tool_call_id,
                reasoning: m.reasoning,
            })
        })
        .collect()
}
