//! Errors with their HTTP status, in OpenAI's JSON shape (`{"error": {"message", "type", "param",
//! "code"}}`) or, on Ollama's `/api/*` routes, in Ollama's (`{"error": "message"}`): every refusal
//! reaches the client as one of these, never a dropped connection.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: invalid_request_error, authentication_error, server_error, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one (`messages[1].content[0].image_url`).
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            retry_after: None,
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key given to --api-key".into(),
            kind: "authentication_error",
            param: None,
            retry_after: None,
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!(
                "the request body is larger than {limit} bytes (the server's --body-limit)"
            ),
            kind: "invalid_request_error",
            param: None,
            retry_after: None,
        }
    }

    pub fn not_found(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "no route {method} {path}: this server has POST /v1/chat/completions, GET /v1/models, \
                 GET /health, Ollama's GET /api/tags, GET /api/version, POST /api/show, \
                 POST /api/chat and POST /api/generate, and the web chat at GET /"
            ),
            kind: "invalid_request_error",
            param: None,
            retry_after: None,
        }
    }

    pub fn busy(queued: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "the queue is full ({queued} requests waiting for the one model); retry later"
            ),
            kind: "server_error",
            param: None,
            retry_after: Some(1),
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            retry_after: None,
        }
    }

    /// The JSON body in OpenAI's shape.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16().to_string(),
        }})
    }

    /// The JSON body in Ollama's shape.
    pub fn ollama_body(&self) -> serde_json::Value {
        json!({ "error": self.message })
    }

    fn respond(&self, body: serde_json::Value) -> Response {
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond(self.body())
    }
}

/// An [`ApiError`] answered in Ollama's shape, with the same status and `Retry-After`.
#[derive(Clone, Debug, PartialEq)]
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> OllamaError {
        OllamaError(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        self.0.respond(self.0.ollama_body())
    }
}
