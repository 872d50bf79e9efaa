//! The HTTP routes: `POST /v1/chat/completions` (whole or streamed as server-sent events),
//! `GET /v1/models`, `GET /health`, the web chat at `GET /` (`web`); a bearer key on all but
//! `/health` and the web chat's page and assets; OpenAI-shaped errors.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::api::{self, ChatBody, RequestPart};
use crate::chat::{ChatRequest, Completion, EngineError, Message, ModelInfo, Part};
use crate::error::ApiError;
use crate::media::{self, MediaPolicy};
use crate::queue::{Job, JobEvent, Queue};
use crate::web;

pub struct AppState {
    pub queue: Queue,
    pub info: ModelInfo,
    pub api_key: Option<String>,
    pub media: MediaPolicy,
    pub body_limit: usize,
    pub max_tokens_cap: usize,
    pub next_id: AtomicU64,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .merge(web::routes())
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let path = request.uri().path();
        if path != "/health" && !web::is_public(request.method(), path) {
            let given = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if given != Some(key.as_str()) {
                return ApiError::unauthorized().into_response();
            }
        }
    }
    next.run(request).await
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(method.as_str(), uri.path())
}

async fn health(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "status": "ok",
        "ready": true,
        "model": state.info.id,
        "backend": state.info.backend,
        "context": state.info.context,
        "queue_depth": state.queue.depth(),
    }))
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{ "id": state.info.id, "object": "model", "created": 0, "owned_by": "xdna-vl" }],
    }))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let limit = state.body_limit;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        if format!("{e:?}").contains("LengthLimit") {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request(format!("the body could not be read: {e}"), None)
        }
    })?;
    let body = api::parse_chat_body(&bytes, state.max_tokens_cap)?;
    let ChatBody {
        messages,
        sampling,
        stream,
        include_usage,
        ..
    } = body;
    // Images are read off the async threads: a file or a remote fetch blocks.
    let policy = state.media.clone();
    let messages = tokio::task::spawn_blocking(move || resolve_images(messages, &policy))
        .await
        .map_err(|e| ApiError::internal(format!("reading the images failed: {e}")))??;

    let (events, mut receiver) = mpsc::unbounded_channel();
    state.queue.submit(Job {
        request: ChatRequest { messages, sampling },
        events,
    })?;
    // Wait until the engine accepts the prompt, so a prompt over the context or an image that
    // does not decode is a 400 even for a streamed request.
    let prompt_tokens = match receiver.recv().await {
        Some(JobEvent::Started { prompt_tokens }) => prompt_tokens,
        Some(JobEvent::Done(Err(e))) => return Err(engine_error(e)),
        Some(JobEvent::Done(Ok(_))) | Some(JobEvent::Text(_)) | None => {
            return Err(ApiError::internal("the engine ended without starting"))
        }
    };
    let id = format!("chatcmpl-{}", state.next_id.fetch_add(1, Ordering::Relaxed));
    let created = now();
    let model = state.info.id.clone();
    if !stream {
        let mut text = String::new();
        loop {
            match receiver.recv().await {
                Some(JobEvent::Text(t)) => text.push_str(&t),
                Some(JobEvent::Done(Ok(c))) => {
                    let c = Completion { text, ..c };
                    debug_assert!(c.prompt_tokens == prompt_tokens);
                    return Ok(Json(api::completion_body(&id, created, &model, &c)).into_response());
                }
                Some(JobEvent::Done(Err(e))) => return Err(engine_error(e)),
                Some(JobEvent::Started { .. }) | None => {
                    return Err(ApiError::internal("the engine stopped mid-answer"))
                }
            }
        }
    }
    // Streamed: the forwarder turns engine events into SSE chunks; when the client disconnects,
    // the SSE body is dropped, the forwarder's send fails, it drops `receiver`, and the engine
    // stops at its next token.
    let (sse_tx, sse_rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        let role = api::chunk_body(
            &id,
            created,
            &model,
            json!({"role": "assistant", "content": ""}),
            None,
        );
        if sse_tx.send(data(role)).await.is_err() {
            return;
        }
        loop {
            let chunk = match receiver.recv().await {
                Some(JobEvent::Text(t)) => {
                    api::chunk_body(&id, created, &model, json!({ "content": t }), None)
                }
                Some(JobEvent::Done(Ok(c))) => {
                    let last =
                        api::chunk_body(&id, created, &model, json!({}), Some(c.finish.as_str()));
                    if sse_tx.send(data(last)).await.is_err() {
                        return;
                    }
                    if include_usage {
                        let usage = api::usage_chunk_body(&id, created, &model, &c);
                        if sse_tx.send(data(usage)).await.is_err() {
                            return;
                        }
                    }
                    break;
                }
                Some(JobEvent::Done(Err(e))) => engine_error(e).body(),
                Some(JobEvent::Started { .. }) | None => {
                    ApiError::internal("the engine stopped mid-answer").body()
                }
            };
            let is_error = chunk.get("error").is_some();
            if sse_tx.send(data(chunk)).await.is_err() {
                return;
            }
            if is_error {
                break;
            }
        }
        let _ = sse_tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Ok(Sse::new(ReceiverStream::new(sse_rx)).into_response())
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Invalid(m) => ApiError::bad_request(m, Some("messages".into())),
        EngineError::Cancelled => ApiError::internal("the request was cancelled"),
        EngineError::Failed(m) => ApiError::internal(m),
    }
}

fn resolve_images(
    messages: Vec<api::RequestMessage>,
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
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            Ok(Message {
                role: m.role,
                parts,
            })
        })
        .collect()
}
