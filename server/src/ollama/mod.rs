//! Ollama's API beside OpenAI's, for the clients that speak only Ollama: `GET /api/tags`,
//! `GET /api/version`, `POST /api/show`, and `POST /api/chat` and `POST /api/generate`, whole or
//! streamed as newline-delimited JSON (Ollama streams unless `"stream": false`). They share the
//! OpenAI route's key, body limit, image checks, queue and cancellation (`crate::answer`); their
//! errors are Ollama's `{"error": "..."}`. Requests and answers: `api`.

pub mod api;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use crate::answer::{self, Chunks};
use crate::chat::{Completion, Tools};
use crate::error::{ApiError, OllamaError};
use crate::routes::AppState;
use api::Endpoint;

pub async fn tags(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(api::tags_body(&state.info))
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": api::OLLAMA_VERSION }))
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, OllamaError> {
    let bytes = answer::read_body(state.body_limit, &headers, body).await?;
    api::parse_show(&bytes, &state.info)?;
    Ok(Json(api::show_body(&state.info)))
}

pub async fn chat(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OllamaError> {
    respond(Endpoint::Chat, &state, &headers, body).await
}

pub async fn generate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OllamaError> {
    respond(Endpoint::Generate, &state, &headers, body).await
}

async fn respond(
    endpoint: Endpoint,
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, OllamaError> {
    let received = Instant::now();
    let bytes = answer::read_body(state.body_limit, headers, body).await?;
    let body = api::parse_body(endpoint, &bytes, &state.info, state.max_tokens_cap)?;
    let model = body.model;
    if body.messages.is_empty() {
        return Ok(Json(api::loaded(endpoint, &model)).into_response());
    }
    let request = answer::Request {
        messages: body.messages,
        sampling: body.sampling,
        tools: Tools::default(),
        format: body.format,
        template_kwargs: body.template_kwargs,
        reasoning: body.reasoning,
    };
    let answer = answer::start(&state.queue, &state.media, request).await?;
    if !body.stream {
        let c = answer.whole().await?;
        let whole = api::done(
            endpoint,
            &model,
            (&c.text, &c.reasoning),
            &c,
            received.elapsed(),
        );
        return Ok(Json(whole).into_response());
    }
    let lines = answer
        .stream(OllamaChunks {
            endpoint,
            model,
            received,
        })
        .map(|v| Ok::<_, Infallible>(Bytes::from(format!("{v}\n"))));
    let mut response = Body::from_stream(lines).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

/// Ollama's streamed objects: one per piece of thinking or text, then the last with the counts and
/// times; an error mid-answer is a last `{"error": "..."}` line (the status is sent already).
struct OllamaChunks {
    endpoint: Endpoint,
    model: String,
    received: Instant,
}

impl Chunks for OllamaChunks {
    fn text(&self, text: &str) -> Value {
        api::chunk(self.endpoint, &self.model, (text, ""))
    }

    fn reasoning(&self, text: &str) -> Value {
        api::chunk(self.endpoint, &self.model, ("", text))
    }

    fn done(&self, c: &Completion) -> Vec<Value> {
        let total = self.received.elapsed();
        vec![api::done(self.endpoint, &self.model, ("", ""), c, total)]
    }

    fn error(&self, error: &ApiError) -> Value {
        error.ollama_body()
    }
}
