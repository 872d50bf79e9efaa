//! What the server asks of the engine: one chat completion at a time, events streamed out. The
//! server owns no generate loop; `xdna-vl serve` plugs the engine's session in behind this trait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering an assistant's call (`tool_call_id`).
    Tool,
}

/// A function call: made by the model in an answer, or sent back in an assistant message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_...`, which the tool message with the result names.
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

/// A fresh call id: `call_` and 24 hex digits, from the clock and a process-wide counter (unique
/// within a server's life, which is all a client matches them within).
pub fn new_call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("call_{t:016x}{:08x}", n as u32)
}

/// Which calls the answer may or must make (OpenAI's `tool_choice`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the tools are not shown to the model, its answer is text.
    None,
    /// Text or calls, as the model chooses; its calls are read out of the answer.
    #[default]
    Auto,
    /// At least one call (constrained decoding).
    Required,
    /// A call of this function (constrained decoding).
    Function(String),
}

/// The tools a request offers and how they may be used.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// OpenAI function tools as sent (`{"type": "function", "function": {...}}`), given to the
    /// chat template as they are.
    pub list: Vec<Value>,
    pub choice: ToolChoice,
    /// More than one call in an answer (OpenAI's `parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl Default for Tools {
    fn default() -> Self {
        Tools {
            list: Vec::new(),
            choice: ToolChoice::Auto,
            parallel: true,
        }
    }
}

impl Tools {
    /// Each tool's name and parameters schema (none given: any object).
    pub fn functions(&self) -> Vec<(String, Value)> {
        self.list
            .iter()
            .map(|t| {
                let f = &t["function"];
                let parameters = match f.get("parameters") {
                    Some(p @ Value::Object(_)) => p.clone(),
                    _ => serde_json::json!({"type": "object"}),
                };
                (
                    f["name"].as_str().unwrap_or_default().to_string(),
                    parameters,
                )
            })
            .collect()
    }

    /// Whether the model's answer is read for calls.
    pub fn in_use(&self) -> bool {
        !self.list.is_empty() && self.choice != ToolChoice::None
    }
}

/// What the answer must look like (OpenAI's `response_format`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ResponseFormat {
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON fitting this schema.
    JsonSchema(Value),
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
    /// The calls an assistant message made.
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning (OpenAI's `reasoning_content`, Ollama's `thinking`),
    /// given to the chat template as the message's `reasoning_content` (Qwen3.5's renders it).
    pub reasoning: Option<String>,
}

impl Message {
    /// A message of `role` with `parts`, no calls.
    pub fn new(role: Role, parts: Vec<Part>) -> Message {
        Message {
            role,
            parts,
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
        }
    }
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

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub sampling: Sampling,
    pub tools: Tools,
    pub format: ResponseFormat,
    /// Extra chat-template variables (`chat_template_kwargs`, e.g. Qwen3.5's `enable_thinking`).
    pub template_kwargs: Map<String, Value>,
}

/// Why generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-turn id or a stop string.
    Stop,
    /// max_tokens (or the context) ran out.
    Length,
    /// The answer is tool calls.
    ToolCalls,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The answer's text (without its calls); its reasoning split off by the server.
    pub text: String,
    /// A thinking model's reasoning (what came before `</think>`), split off the text by the
    /// server (`crate::think`); engines leave it empty.
    pub reasoning: String,
    /// The calls the answer made (finish [`Finish::ToolCalls`]).
    pub tool_calls: Vec<ToolCall>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// The answer's token ids, when the engine has them (`return_token_ids`; empty otherwise).
    pub ids: Vec<u32>,
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
    /// `opens_think`: the prompt ends inside an open think block (Qwen3.5's generation prompt
    /// ends with `<think>\n`) and the answer is free text, so it starts with reasoning.
    Started {
        prompt_tokens: usize,
        opens_think: bool,
    },
    /// More answer text (whole UTF-8 characters).
    Text(&'a str),
}

#[derive(Clone, Debug, thiserror::Error, PartialEq)]
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
    /// Its chat template has it reason in `<think>` blocks (Ollama's "thinking" capability).
    pub thinking: bool,
    /// The model file's size in bytes and when it last changed, when known.
    pub size: Option<u64>,
    pub modified: Option<SystemTime>,
}
