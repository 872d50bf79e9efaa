//! What the server asks of the engine: one chat completion at a time, events streamed out. The
//! server owns no generate loop; `xdna-vl serve` plugs the engine's session in behind this trait.

use std::time::{Duration, SystemTime};

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One piece of a message's content, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Text(String),
    /// An encoded image (PNG, JPEG, WebP, GIF) and where it came from, for messages.
    Image {
        name: String,
        bytes: Vec<u8>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// The request's sampling; `None` takes the pack's generation defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub sampling: Sampling,
}

/// Why generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-turn id or a stop string.
    Stop,
    /// max_tokens (or the context) ran out.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub finish: Finish,
    /// The time the engine spent on the prompt (its images and prefill) and on the answer (its
    /// decode steps), as it measured them (Ollama's `prompt_eval_duration` and `eval_duration`).
    pub prompt_time: Duration,
    pub answer_time: Duration,
}

/// What the engine reports while it works.
#[derive(Debug)]
pub enum Event<'a> {
    /// The prompt was accepted (it fits, its images decode) and generation starts.
    Started { prompt_tokens: usize },
    /// More answer text (whole UTF-8 characters).
    Text(&'a str),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngineError {
    /// The request itself is wrong (an undecodable image, a prompt over the context): HTTP 400.
    #[error("{0}")]
    Invalid(String),
    /// The caller stopped listening (the client went away).
    #[error("cancelled")]
    Cancelled,
    /// Anything else: HTTP 500.
    #[error("{0}")]
    Failed(String),
}

/// One model behind the server. `on_event` returning false means stop now (the client is gone):
/// the engine returns `Err(Cancelled)` at its next token.
pub trait ChatEngine: Send + 'static {
    fn complete(
        &mut self,
        request: &ChatRequest,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Completion, EngineError>;
}

/// What `/v1/models`, `/health` and Ollama's `/api/tags` and `/api/show` say about the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub id: String,
    /// The GEMM backend ("host", "device", "ab").
    pub backend: String,
    /// KV cache slots.
    pub context: usize,
    /// The architecture, as the checkpoint's `model_type` names it ("qwen3_vl").
    pub family: String,
    /// The model takes images (its pack has the vision tower).
    pub vision: bool,
    /// The model file's size in bytes and when it last changed, when known.
    pub size: Option<u64>,
    pub modified: Option<SystemTime>,
}
