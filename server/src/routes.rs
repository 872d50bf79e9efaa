//! The HTTP routes: `POST /v1/chat/completions` (whole or streamed as server-sent events),
//! `GET /v1/models`, `GET /health`, Ollama's under `/api/` (`ollama`) and the web chat at `GET /`
//! (`web`); a bearer key on all but `/health` and the web chat's page and assets; errors in
//! OpenAI's shape, or in Ollama's under `/api/`.

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
use tokio_stream::{self as stream, StreamExt};

use crate::answer;
use crate::api::{self, ChatBody};
use crate::chat::{Completion, ModelInfo};
use crate::error::{ApiError, OllamaError};
use crate::media::MediaPolicy;
use crate::ollama;
use crate::queue::Queue;
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
        .route("/api/tags", get(ollama::tags))
        .route("/api/version", get(ollama::version))
        .route("/api/show", post(ollama::show))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
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
                return in_shape(request.uri(), ApiError::unauthorized());
            }
        }
    }
    next.run(request).await
}

/// An error in the shape of the API the path belongs to: Ollama's under `/api/`, else OpenAI's.
fn in_shape(uri: &Uri, e: ApiError) -> Response {
    if uri.path().starts_with("/api/") {
        OllamaError(e).into_response()
    } else {
        e.into_response()
    }
}

async fn not_found(method: Method, uri: Uri) -> Response {
    in_shape(&uri, ApiError::not_found(method.as_str(), uri.path()))
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
    let bytes = answer::read_body(state.body_limit, &headers, body).await?;
    let ChatBody {
        messages,
        sampling,
        stream,
        include_usage,
        tools,
        format,
        template_kwargs,
        reasoning,
        return_token_ids,
        ..
    } = api::parse_chat_body(&bytes, state.max_tokens_cap)?;
    let request = answer::Request {
        messages,
        sampling,
        tools,
        format,
        template_kwargs,
        reasoning,
    };
    let answer = answer::start(&state.queue, &state.media, request).await?;
    let id = format!("chatcmpl-{}", state.next_id.fetch_add(1, Ordering::Relaxed));
    let created = now();
    let model = state.info.id.clone();
    if !stream {
        let c = answer.whole().await?;
        let mut body = api::completion_body(&id, created, &model, &c);
        if return_token_ids {
            body["choices"][0]["token_ids"] = json!(c.ids);
        }
        return Ok(Json(body).into_response());
    }
    let role = api::chunk_body(
        &id,
        created,
        &model,
        json!({"role": "assistant", "content": ""}),
        None,
    );
    let chunks = answer.stream(OpenAiChunks {
        id,
        created,
        model,
        include_usage,
        return_token_ids,
    });
    let events = stream::once(role)
        .chain(chunks)
        .map(|v| Ok::<_, Infallible>(SseEvent::default().data(v.to_string())))
        .chain(stream::once(Ok(SseEvent::default().data("[DONE]"))));
    Ok(Sse::new(events).into_response())
}

/// OpenAI's streamed chunks: the reasoning and the text as deltas (`reasoning_content`, as
/// llama-server streams it, and `content`), then the finish reason and, when asked, the usage.
struct OpenAiChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    return_token_ids: bool,
}

impl answer::Chunks for OpenAiChunks {
    fn text(&self, text: &str) -> Value {
        let delta = json!({ "content": text });
        api::chunk_body(&self.id, self.created, &self.model, delta, None)
    }

    fn reasoning(&self, text: &str) -> Value {
        let delta = json!({ "reasoning_content": text });
        api::chunk_body(&self.id, self.created, &self.model, delta, None)
    }

    fn done(&self, c: &Completion) -> Vec<Value> {
        let (id, created, model) = (&self.id, self.created, &self.model);
        let mut last = Vec::new();
        if !c.tool_calls.is_empty() {
            // Each call whole in one chunk (id, type, name and all its arguments), as the
            // `openai` client accepts beside OpenAI's own name-then-argument-pieces chunks.
            let delta = json!({ "tool_calls": api::tool_calls_json(&c.tool_calls, true) });
            last.push(api::chunk_body(id, created, model, delta, None));
        }
        let mut finish = api::chunk_body(id, created, model, json!({}), Some(c.finish.as_str()));
        if self.return_token_ids {
            finish["choices"][0]["token_ids"] = json!(c.ids);
        }
        last.push(finish);
        if self.include_usage {
            last.push(api::usage_chunk_body(id, created, model, c));
        }
        last
    }

    fn error(&self, error: &ApiError) -> Value {
        error.body()
    }
}
