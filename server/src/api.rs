//! The body of `POST /v1/chat/completions`, read field by field so that every refusal names the
//! field at fault (`messages[2].content[1].type`), and the response shapes (OpenAI's).

use serde_json::{json, Map, Value};

use crate::chat::{Completion, ResponseFormat, Role, Sampling, ToolCall, ToolChoice, Tools};
use crate::error::ApiError;
use crate::think::Reasoning;

/// A message as the client sent it; image URLs are fetched later (`media`).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestMessage {
    pub role: Role,
    pub parts: Vec<RequestPart>,
    /// An assistant message's calls.
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning (`reasoning_content`; Ollama's `thinking`).
    pub reasoning: Option<String>,
}

impl RequestMessage {
    pub fn new(role: Role, parts: Vec<RequestPart>) -> RequestMessage {
        RequestMessage {
            role,
            parts,
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum RequestPart {
    Text(String),
    /// `url` as given; `param` names it in errors.
    ImageUrl {
        url: String,
        param: String,
    },
    /// An image as base64 (Ollama's `images`).
    ImageBase64 {
        data: String,
        param: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChatBody {
    pub model: Option<String>,
    pub messages: Vec<RequestMessage>,
    pub sampling: Sampling,
    pub stream: bool,
    pub include_usage: bool,
    pub tools: Tools,
    pub format: ResponseFormat,
    pub template_kwargs: Map<String, Value>,
    /// `reasoning_format`: a thinking model's reasoning in `reasoning_content` or inline.
    pub reasoning: Reasoning,
    /// `return_token_ids` (vLLM's field): the answer's token ids in the choice's `token_ids`
    /// (streamed: all of them in the chunk with the finish reason).
    pub return_token_ids: bool,
}

pub(crate) fn bad(message: String, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param.to_string()))
}

/// Parses and checks a request body. `max_tokens_cap` is the server's `--max-tokens`: a request
/// asking for more gets the cap, none asking gets the cap too.
/// The body fields of `/v1/chat/completions` this server takes (the [`NOT_IMPLEMENTED`] ones are
/// taken only when they ask for nothing; `user`, `metadata`, `store` and `service_tier` do not
/// change the answer and are ignored). Any other field is refused by name: llama-server's
/// `grammar` would otherwise be silently dropped.
const CHAT_FIELDS: [&str; 28] = [
    "model",
    "messages",
    "n",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "chat_template_kwargs",
    "reasoning_format",
    "return_token_ids",
    "modalities",
    "user",
    "metadata",
    "store",
    "service_tier",
];

/// A chat message's fields (`name` is taken: Qwen's templates do not render it).
const MESSAGE_FIELDS: [&str; 6] = [
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
];

pub fn parse_chat_body(body: &[u8], max_tokens_cap: usize) -> Result<ChatBody, ApiError> {
    let obj = parse_object(body)?;
    let known: Vec<&str> = CHAT_FIELDS
        .iter()
        .copied()
        .chain(NOT_IMPLEMENTED.iter().map(|(k, _)| *k))
        .collect();
    only_fields(&obj, "", &known)?;
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(bad(format!("model must be a string, got {v}"), "model")),
    };
    let messages = match obj.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => list
            .iter()
            .enumerate()
            .map(|(i, m)| parse_message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => return Err(bad("messages must not be empty".into(), "messages")),
        Some(v) => {
            return Err(bad(
                format!("messages must be an array, got {}", kind_of(v)),
                "messages",
            ))
        }
        None => return Err(bad("messages is required".into(), "messages")),
    };
    if let Some(n) = obj.get("n").filter(|v| !v.is_null()) {
        if n.as_u64() != Some(1) {
            return Err(bad(
                format!("n must be 1 (one answer per request), got {n}"),
                "n",
            ));
        }
    }
    refuse_not_implemented(&obj)?;
    let sampling = parse_sampling(&obj, max_tokens_cap)?;
    let tools = parse_tools(&obj)?;
    let format = parse_response_format(obj.get("response_format"))?;
    let template_kwargs = parse_template_kwargs(obj.get("chat_template_kwargs"))?;
    let reasoning = parse_reasoning_format(obj.get("reasoning_format"))?;
    if format != ResponseFormat::Text
        && matches!(tools.choice, ToolChoice::Required | ToolChoice::Function(_))
        && !tools.list.is_empty()
    {
        return Err(bad(
            "response_format json_object or json_schema cannot be combined with tool_choice \
             \"required\" or a named function: the answer would have to be both JSON and calls"
                .into(),
            "response_format",
        ));
    }
    let stream = flag(&obj, "stream")?;
    let return_token_ids = flag(&obj, "return_token_ids")?;
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            flag(o, "include_usage").map_err(|e| bad(e.message, "stream_options.include_usage"))?
        }
        Some(v) => {
            return Err(bad(
                format!("stream_options must be an object, got {}", kind_of(v)),
                "stream_options",
            ))
        }
    };
    Ok(ChatBody {
        model,
        messages,
        sampling,
        stream,
        include_usage,
        tools,
        format,
        template_kwargs,
        reasoning,
        return_token_ids,
    })
}

/// `reasoning_format` (llama-server's field): "auto" (the default) or "deepseek" put a thinking
/// model's reasoning in `message.reasoning_content` (`delta.reasoning_content` streamed), "none"
/// leaves it inline in the content, `<think>` block and all, as the model wrote it.
fn parse_reasoning_format(v: Option<&Value>) -> Result<Reasoning, ApiError> {
    let param = "reasoning_format";
    let allowed = Reasoning::FORMATS.map(|f| format!("{f:?}")).join(", ");
    match v {
        None | Some(Value::Null) => Ok(Reasoning::default()),
        Some(Value::String(s)) => Reasoning::of_format(s).ok_or_else(|| {
            bad(
                format!("{param} {s:?} is not supported (one of {allowed})"),
                param,
            )
        }),
        Some(v) => Err(bad(
            format!(
                "{param} must be a string (one of {allowed}), got {}",
                kind_of(v)
            ),
            param,
        )),
    }
}

/// `chat_template_kwargs` (vLLM's and llama-server's field): extra variables for the checkpoint's
/// chat template, as transformers' `apply_chat_template(**kwargs)` passes them; Qwen3.5's template
/// reads `enable_thinking` (false: the answer opens with an empty think block). The engine refuses
/// the variables the template is given already (`messages`, `tools`, ...) by name.
fn parse_template_kwargs(v: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(o)) => Ok(o.clone()),
        Some(v) => Err(bad(
            format!(
                "chat_template_kwargs must be an object of template variables (like \
                 {{\"enable_thinking\": false}}), got {}",
                kind_of(v)
            ),
            "chat_template_kwargs",
        )),
    }
}

/// OpenAI's fields this server does not implement, each with why: one that asks for something
/// (`"logprobs": true`, a non-empty `logit_bias`) is refused by name, never ignored. Fields that
/// do not change the answer (`user`, `metadata`, `store`, `service_tier`) are taken and ignored.
const NOT_IMPLEMENTED: &[(&str, &str)] = &[
    (
        "functions",
        "the legacy functions API is not implemented; send tools",
    ),
    (
        "function_call",
        "the legacy functions API is not implemented; send tool_choice",
    ),
    ("logprobs", "log probabilities are not returned"),
    ("top_logprobs", "log probabilities are not returned"),
    ("logit_bias", "logit biases are not implemented"),
    ("audio", "audio output is not implemented"),
    ("prediction", "predicted outputs are not implemented"),
    ("web_search_options", "web search is not implemented"),
];

fn refuse_not_implemented(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for (key, why) in NOT_IMPLEMENTED {
        let asks = match obj.get(*key) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Number(n)) => *key != "top_logprobs" || n.as_f64() != Some(0.0),
            Some(_) => true,
        };
        if asks {
            return Err(bad(format!("{key} is not supported: {why}"), key));
        }
    }
    match obj.get("modalities") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(m)) if m.iter().all(|x| x.as_str() == Some("text")) => Ok(()),
        Some(v) => Err(bad(
            format!("modalities {v} is not supported: the answer is text ([\"text\"])"),
            "modalities",
        )),
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
fn parse_tools(obj: &Map<String, Value>) -> Result<Tools, ApiError> {
    let list = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, t)| check_tool(&format!("tools[{i}]"), t).map(|()| t.clone()))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => {
            return Err(bad(
                format!("tools must be an array, got {}", kind_of(v)),
                "tools",
            ))
        }
    };
    let names: Vec<&str> = list
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(bad(
                format!("tools[{i}].function.name {n:?} is given twice"),
                &format!("tools[{i}].function.name"),
            ));
        }
    }
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(n) => ToolChoice::Function(n.to_string()),
                None => {
                    return Err(bad(
                        "tool_choice.function.name is required (a string)".into(),
                        "tool_choice.function.name",
                    ))
                }
            }
        }
        Some(v) => {
            return Err(bad(
                format!(
                    "tool_choice must be \"none\", \"auto\", \"required\" or \
                     {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"
                ),
                "tool_choice",
            ))
        }
    };
    match &choice {
        ToolChoice::Required if list.is_empty() => {
            return Err(bad(
                "tool_choice \"required\" needs tools".into(),
                "tool_choice",
            ))
        }
        ToolChoice::Function(n) if !names.contains(&n.as_str()) => {
            return Err(bad(
                format!("tool_choice names {n:?}, which is not among the tools ({names:?})"),
                "tool_choice.function.name",
            ))
        }
        _ => {}
    }
    let parallel = match obj.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(bad(
                format!("parallel_tool_calls must be a boolean, got {v}"),
                "parallel_tool_calls",
            ))
        }
    };
    Ok(Tools {
        list,
        choice,
        parallel,
    })
}

/// One function tool: `{"type": "function", "function": {"name", "description"?, "parameters"?,
/// "strict"?}}`.
fn check_tool(at: &str, t: &Value) -> Result<(), ApiError> {
    let Value::Object(t) = t else {
        return Err(bad(format!("{at} must be an object"), at));
    };
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad(
            format!(
                "{at}.type must be \"function\" (the only kind of tool), got {}",
                t.get("type").unwrap_or(&Value::Null)
            ),
            &format!("{at}.type"),
        ));
    }
    let param = format!("{at}.function");
    let Some(Value::Object(f)) = t.get("function") else {
        return Err(bad(format!("{param} is required (an object)"), &param));
    };
    let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
    let good_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !good_name {
        return Err(bad(
            format!(
                "{param}.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got {}",
                f.get("name").unwrap_or(&Value::Null)
            ),
            &format!("{param}.name"),
        ));
    }
    match f.get("parameters") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(v) => {
            return Err(bad(
                format!(
                    "{param}.parameters must be a JSON schema object, got {}",
                    kind_of(v)
                ),
                &format!("{param}.parameters"),
            ))
        }
    }
    if let Some(v) = f
        .get("description")
        .filter(|v| !v.is_null() && !v.is_string())
    {
        return Err(bad(
            format!("{param}.description must be a string, got {}", kind_of(v)),
            &format!("{param}.description"),
        ));
    }
    Ok(())
}

/// `response_format`: text, json_object, or json_schema with its schema.
fn parse_response_format(v: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    let o = match v {
        None | Some(Value::Null) => return Ok(ResponseFormat::Text),
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(bad(
                format!("response_format must be an object, got {}", kind_of(v)),
                "response_format",
            ))
        }
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let param = "response_format.json_schema";
            let Some(Value::Object(js)) = o.get("json_schema") else {
                return Err(bad(
                    format!("{param} is required: {{\"name\": ..., \"schema\": {{...}}}}"),
                    param,
                ));
            };
            if !matches!(js.get("name"), Some(Value::String(n)) if !n.is_empty()) {
                return Err(bad(
                    format!("{param}.name is required (a string)"),
                    &format!("{param}.name"),
                ));
            }
            if let Some(v) = js.get("strict").filter(|v| !v.is_null() && !v.is_boolean()) {
                return Err(bad(
                    format!("{param}.strict must be a boolean, got {v}"),
                    &format!("{param}.strict"),
                ));
            }
            // Strict or not, the answer fits the schema: constrained decoding is always strict.
            match js.get("schema") {
                None | Some(Value::Null) => Ok(ResponseFormat::JsonObject),
                Some(s @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema(s.clone())),
                Some(v) => Err(bad(
                    format!(
                        "{param}.schema must be a JSON schema object, got {}",
                        kind_of(v)
                    ),
                    &format!("{param}.schema"),
                )),
            }
        }
        Some(other) => Err(bad(
            format!(
                "response_format.type {other:?} is not supported (text, json_object, json_schema)"
            ),
            "response_format.type",
        )),
        None => Err(bad(
            "response_format.type is required (text, json_object or json_schema)".into(),
            "response_format.type",
        )),
    }
}

/// The body as a JSON object.
pub(crate) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::bad_request(
            "the body must be a JSON object",
            None,
        )),
    }
}

/// Refuses a field of `obj` (at `at`, "" for the body) that is not one of `known`: a field this
/// server does not know is refused by name, never ignored.
pub(crate) fn only_fields(
    obj: &Map<String, Value>,
    at: &str,
    known: &[&str],
) -> Result<(), ApiError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => {
            let param = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            Err(bad(
                format!(
                    "{param} is not a field this server knows (known: {})",
                    known.join(", ")
                ),
                &param,
            ))
        }
        None => Ok(()),
    }
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn flag(obj: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(format!("{key} must be a boolean, got {v}"), key)),
    }
}

fn parse_message(i: usize, m: &Value) -> Result<RequestMessage, ApiError> {
    let at = format!("messages[{i}]");
    let Value::Object(m) = m else {
        return Err(bad(format!("{at} must be an object"), &at));
    };
    only_fields(m, &at, &MESSAGE_FIELDS)?;
    let role = parse_role(m, &at)?;
    let tool_calls = match m.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) if role == Role::Assistant => list
            .iter()
            .enumerate()
            .map(|(j, c)| parse_tool_call(&format!("{at}.tool_calls[{j}]"), c))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => {
            return Err(bad(
                format!("{at}.tool_calls: only assistant messages carry tool calls"),
                &format!("{at}.tool_calls"),
            ))
        }
        Some(v) => {
            return Err(bad(
                format!("{at}.tool_calls must be an array, got {}", kind_of(v)),
                &format!("{at}.tool_calls"),
            ))
        }
    };
    let tool_call_id = match m.get("tool_call_id") {
        Some(Value::String(id)) if role == Role::Tool => Some(id.clone()),
        None | Some(Value::Null) if role != Role::Tool => None,
        _ => {
            let param = format!("{at}.tool_call_id");
            return Err(bad(
                format!("{param}: a tool message names the call it answers (a string), and only a tool message does"),
                &param,
            ));
        }
    };
    let parts = match m.get("content") {
        None | Some(Value::Null) if role == Role::Assistant => Vec::new(),
        Some(Value::String(s)) => vec![RequestPart::Text(s.clone())],
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(j, p)| parse_part(&format!("{at}.content[{j}]"), role, p))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => {
            return Err(bad(
                format!(
                    "{at}.content must be a string or an array of parts, got {}",
                    kind_of(v)
                ),
                &format!("{at}.content"),
            ))
        }
        None => {
            return Err(bad(
                format!("{at}.content is required"),
                &format!("{at}.content"),
            ))
        }
    };
    if role == Role::Tool && parts.iter().any(|p| !matches!(p, RequestPart::Text(_))) {
        return Err(bad(
            format!("{at}.content: a tool message holds text only"),
            &format!("{at}.content"),
        ));
    }
    let reasoning = match m.get("reasoning_content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if role == Role::Assistant => Some(s.clone()),
        Some(v) => {
            let param = format!("{at}.reasoning_content");
            let got = match v {
                Value::String(_) => format!("a {} message", m["role"]),
                v => kind_of(v).to_string(),
            };
            return Err(bad(
                format!("{param}: an assistant message's reasoning is a string, got {got}"),
                &param,
            ));
        }
    };
    Ok(RequestMessage {
        role,
        parts,
        tool_calls,
        tool_call_id,
        reasoning,
    })
}

/// One call of an assistant message: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`, the arguments a JSON object as text (or an object).
fn parse_tool_call(at: &str, c: &Value) -> Result<ToolCall, ApiError> {
    let Value::Object(c) = c else {
        return Err(bad(format!("{at} must be an object"), at));
    };
    let id = match c.get("id") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(bad(
                format!("{at}.id is required (a string)"),
                &format!("{at}.id"),
            ))
        }
    };
    if !matches!(
        c.get("type").and_then(Value::as_str),
        None | Some("function")
    ) {
        return Err(bad(
            format!("{at}.type must be \"function\""),
            &format!("{at}.type"),
        ));
    }
    let f = c.get("function").and_then(Value::as_object);
    let name = match f.and_then(|f| f.get("name")) {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            return Err(bad(
                format!("{at}.function.name is required (a string)"),
                &format!("{at}.function.name"),
            ))
        }
    };
    let param = format!("{at}.function.arguments");
    let arguments = match f.and_then(|f| f.get("arguments")) {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(_)) => s.clone(),
            _ => {
                return Err(bad(
                    format!("{param} must be a JSON object as a string, got {s:?}"),
                    &param,
                ))
            }
        },
        Some(v @ Value::Object(_)) => v.to_string(),
        _ => {
            return Err(bad(
                format!("{param} is required (a JSON object as a string)"),
                &param,
            ))
        }
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

/// A message's `role` (`at` names the message).
pub(crate) fn parse_role(m: &Map<String, Value>, at: &str) -> Result<Role, ApiError> {
    let param = format!("{at}.role");
    match m.get("role").and_then(Value::as_str) {
        Some("system") | Some("developer") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        Some("tool") => Ok(Role::Tool),
        Some(other) => Err(bad(
            format!(
                "{param} {other:?} is not supported (system, developer, user, assistant, tool)"
            ),
            &param,
        )),
        None => Err(bad(format!("{param} is required (a string)"), &param)),
    }
}

fn parse_part(at: &str, role: Role, p: &Value) -> Result<RequestPart, ApiError> {
    let Value::Object(p) = p else {
        return Err(bad(format!("{at} must be an object"), at));
    };
    match p.get("type").and_then(Value::as_str) {
        Some("text") => match p.get("text") {
            Some(Value::String(s)) => Ok(RequestPart::Text(s.clone())),
            _ => Err(bad(
                format!("{at}.text is required (a string)"),
                &format!("{at}.text"),
            )),
        },
        Some("image_url") if role == Role::User => {
            let param = format!("{at}.image_url");
            let url = match p.get("image_url") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(o)) => match o.get("url") {
                    Some(Value::String(s)) => s.clone(),
                    _ => {
                        return Err(bad(
                            format!("{param}.url is required (a string)"),
                            &format!("{param}.url"),
                        ))
                    }
                },
                _ => {
                    return Err(bad(
                        format!("{param} is required: {{\"url\": \"data:image/png;base64,...\"}}"),
                        &param,
                    ))
                }
            };
            Ok(RequestPart::ImageUrl { url, param })
        }
        Some("image_url") => Err(bad(
            format!("{at}: images are taken in user messages only"),
            &format!("{at}.type"),
        )),
        Some(other) => Err(bad(
            format!("{at}.type {other:?} is not supported (text, image_url)"),
            &format!("{at}.type"),
        )),
        None => Err(bad(
            format!("{at}.type is required (text or image_url)"),
            &format!("{at}.type"),
        )),
    }
}

fn parse_sampling(obj: &Map<String, Value>, max_tokens_cap: usize) -> Result<Sampling, ApiError> {
    let max_tokens = match (
        count(obj.get("max_completion_tokens"), "max_completion_tokens")?,
        count(obj.get("max_tokens"), "max_tokens")?,
    ) {
        (Some(0), _) | (None, Some(0)) => {
            return Err(bad("max_tokens must be at least 1".into(), "max_tokens"))
        }
        (Some(n), _) | (None, Some(n)) => n.min(max_tokens_cap as u64) as usize,
        (None, None) => max_tokens_cap,
    };
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        // OpenAI seeds are signed 64-bit: keep their bits.
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|s| s as u64))
                .ok_or_else(|| bad(format!("seed must be an integer, got {v}"), "seed"))?,
        ),
    };
    let stop = stop_strings(obj.get("stop"), "stop", Some(4))?;
    let sampling = shared_sampling(|name| (obj.get(name), name.to_string()))?;
    Ok(Sampling {
        max_tokens: Some(max_tokens),
        seed,
        stop,
        ..sampling
    })
}

/// The sampling fields both APIs take alike (all but the answer's length, the seed and the stop
/// strings), each with the same checks: `field(name)` is the request's value for our field
/// `name` and the name to give it in errors (the APIs name some differently).
pub(crate) fn shared_sampling<'a>(
    field: impl Fn(&'static str) -> (Option<&'a Value>, String),
) -> Result<Sampling, ApiError> {
    let number = |name: &'static str, lo: f64, hi: f64| {
        let (v, param) = field(name);
        number(v, &param, lo, hi)
    };
    let top_p = number("top_p", 0.0, 1.0)?;
    if top_p == Some(0.0) {
        return Err(bad(
            "top_p must be in (0, 1], got 0".into(),
            &field("top_p").1,
        ));
    }
    let repetition_penalty = number("repetition_penalty", 0.0, 100.0)?;
    if repetition_penalty == Some(0.0) {
        let param = field("repetition_penalty").1;
        return Err(bad(
            format!("{param} must be > 0 (1 is none), got 0"),
            &param,
        ));
    }
    let (top_k, param) = field("top_k");
    Ok(Sampling {
        max_tokens: None,
        temperature: number("temperature", 0.0, 2.0)?,
        top_p,
        top_k: count(top_k, &param)?.map(|k| k.min(u32::MAX as u64) as usize),
        min_p: number("min_p", 0.0, 1.0)?,
        repetition_penalty,
        frequency_penalty: number("frequency_penalty", -2.0, 2.0)?,
        presence_penalty: number("presence_penalty", -2.0, 2.0)?,
        seed: None,
        stop: Vec::new(),
    })
}

/// A number in `[lo, hi]`, or none.
fn number(v: Option<&Value>, param: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x >= lo && x <= hi => Ok(Some(x as f32)),
            _ => Err(bad(
                format!("{param} must be a number in [{lo}, {hi}], got {v}"),
                param,
            )),
        },
    }
}

/// A non-negative integer, or none.
pub(crate) fn count(v: Option<&Value>, param: &str) -> Result<Option<u64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            bad(
                format!("{param} must be a non-negative integer, got {v}"),
                param,
            )
        }),
    }
}

/// A non-empty stop string or an array of them (at most `most`), or none.
pub(crate) fn stop_strings(
    v: Option<&Value>,
    param: &str,
    most: Option<usize>,
) -> Result<Vec<String>, ApiError> {
    let stop = match v {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) if !matches!(most, Some(m) if list.len() > m) => list
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(format!("{param} must hold strings"), param))?,
        Some(v) => {
            let most = most.map_or(String::new(), |m| format!(" (at most {m})"));
            return Err(bad(
                format!("{param} must be a string or an array of strings{most}, got {v}"),
                param,
            ));
        }
    };
    if stop.iter().any(String::is_empty) {
        return Err(bad(format!("{param} strings must not be empty"), param));
    }
    Ok(stop)
}

/// `usage` of a completion.
pub fn usage(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    })
}

/// A whole (non-streamed) answer.
pub fn completion_body(id: &str, created: u64, model: &str, c: &Completion) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message_json(c),
            "finish_reason": c.finish.as_str(),
        }],
        "usage": usage(c),
    })
}

/// The answer's message: its text, its calls when it made some (the content then null when
/// there is no text, as OpenAI's), and a thinking model's reasoning when it has some
/// (`reasoning_content`, as llama-server's).
fn message_json(c: &Completion) -> Value {
    let mut m = if c.tool_calls.is_empty() {
        json!({ "role": "assistant", "content": c.text })
    } else {
        let content = if c.text.is_empty() {
            Value::Null
        } else {
            Value::String(c.text.clone())
        };
        json!({
            "role": "assistant",
            "content": content,
            "tool_calls": tool_calls_json(&c.tool_calls, false),
        })
    };
    if !c.reasoning.is_empty() {
        m["reasoning_content"] = json!(c.reasoning);
    }
    m
}

/// OpenAI's `tool_calls`: id, type and function (name, arguments as a JSON string); in a stream
/// delta each call also carries its `index`.
pub fn tool_calls_json(calls: &[ToolCall], indexed: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": c.id,
                "type": "function",
                "function": { "name": c.name, "arguments": c.arguments },
            });
            if indexed {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// One streamed chunk: `delta` and `finish_reason` of choice 0.
pub fn chunk_body(
    id: &str,
    created: u64,
    model: &str,
    delta: Value,
    finish: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    })
}

/// The last streamed chunk with `stream_options.include_usage`: no choices, the usage.
pub fn usage_chunk_body(id: &str, created: u64, model: &str, c: &Completion) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(c),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<ChatBody, ApiError> {
        parse_chat_body(body.as_bytes(), 256)
    }

    #[test]
    fn strings_and_parts_both_read() {
        let b = parse(
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"what?"},
            {"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}]}],
            "max_tokens":9000,"temperature":0.5,"top_k":3,"seed":-1,"stop":["\n\n"],
            "stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(b.messages.len(), 2);
        assert_eq!(b.messages[0].role, Role::System);
        assert_eq!(
            b.messages[1].parts[1],
            RequestPart::ImageUrl {
                url: "data:image/png;base64,AA==".into(),
                param: "messages[1].content[1].image_url".into()
            }
        );
        // Over the cap, max_tokens takes the cap; a negative seed keeps its bits.
        assert_eq!(b.sampling.max_tokens, Some(256));
        assert_eq!(b.sampling.seed, Some(u64::MAX));
        assert_eq!(b.sampling.top_k, Some(3));
        assert!(b.stream && b.include_usage);
        // No max_tokens: the cap.
        let b = parse(r#"{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7}"#)
            .unwrap();
        assert_eq!(b.sampling.max_tokens, Some(7));
    }

    #[test]
    fn each_wrong_field_is_named() {
        for (body, param) in [
            (r#"{"messages":[]}"#, "messages"),
            (r#"{"messages":"hi"}"#, "messages"),
            (
                r#"{"messages":[{"role":"function","content":"x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"messages":[{"role":"tool","content":"x"}]}"#,
                "messages[0].tool_call_id",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x","tool_call_id":"c"}]}"#,
                "messages[0].tool_call_id",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x","tool_calls":[]}]}"#,
                "messages[0].tool_calls",
            ),
            (
                r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{oops"}}]}]}"#,
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                r#"{"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#,
                "messages[0].tool_calls[0].id",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":{}}"#,
                "tools",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]}"#,
                "tools[0].function.name",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]}"#,
                "tools[0].function.parameters",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}"#,
                "tools[1].function.name",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"required"}"#,
                "tool_choice",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}"#,
                "tool_choice",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}"#,
                "tool_choice.function.name",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":"no"}"#,
                "parallel_tool_calls",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}"#,
                "response_format.type",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":"json"}"#,
                "response_format",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}"#,
                "response_format.json_schema",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{}}}}"#,
                "response_format.json_schema.name",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":[]}}}"#,
                "response_format.json_schema.schema",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}"#,
                "response_format",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true}"#,
                "logprobs",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"42":5}}"#,
                "logit_bias",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]}"#,
                "functions",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"modalities":["text","audio"]}"#,
                "modalities",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":["enable_thinking"]}"#,
                "chat_template_kwargs",
            ),
            // Fields this server does not know, refused by name, not dropped.
            (
                r#"{"messages":[{"role":"user","content":"x"}],"grammar":"root ::= \"a\""}"#,
                "grammar",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"reasoning_format":"deepseek-legacy"}"#,
                "reasoning_format",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"reasoning_format":true}"#,
                "reasoning_format",
            ),
            (
                r#"{"messages":[{"role":"assistant","content":"x","reasoning_content":["y"]},{"role":"user","content":"x"}]}"#,
                "messages[0].reasoning_content",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x","reasoning_content":"y"}]}"#,
                "messages[0].reasoning_content",
            ),
            (
                r#"{"messages":[{"role":"user","content":5}]}"#,
                "messages[0].content",
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"audio"}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
                "messages[0].content[0].image_url.url",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-4}"#,
                "max_tokens",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#,
                "top_p",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                "stream",
            ),
            (r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#, "n"),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#,
                "stop",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"seed":1.5}"#,
                "seed",
            ),
        ] {
            let e = parse(body).expect_err(body);
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        // Control: a good body parses, and fields at values that ask for nothing are taken.
        parse(r#"{"messages":[{"role":"user","content":"x"}],"temperature":0}"#).unwrap();
        parse(
            r#"{"messages":[{"role":"user","content":"x","name":"ann"}],"logprobs":false,"logit_bias":{},
            "tools":[],"tool_choice":"auto","modalities":["text"],"response_format":{"type":"text"},
            "user":"u","store":false,"metadata":{"k":"v"},"service_tier":"auto"}"#,
        )
        .unwrap();
        // chat_template_kwargs: an object's variables are taken as they are; null is none.
        let b = parse(
            r#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false,"x":[1]}}"#,
        )
        .unwrap();
        assert_eq!(
            Value::Object(b.template_kwargs),
            json!({"enable_thinking": false, "x": [1]})
        );
        let b =
            parse(r#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":null}"#)
                .unwrap();
        assert!(b.template_kwargs.is_empty());
    }

    #[test]
    fn reasoning_format_and_history_reasoning_read() {
        let with = |format: &str| {
            parse(&format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],"reasoning_format":{format}}}"#
            ))
            .map(|b| b.reasoning)
        };
        assert_eq!(with("\"auto\"").unwrap(), Reasoning::Separate);
        assert_eq!(with("\"deepseek\"").unwrap(), Reasoning::Separate);
        assert_eq!(with("null").unwrap(), Reasoning::Separate);
        assert_eq!(with("\"none\"").unwrap(), Reasoning::Inline);
        // A value not taken is refused with the ones that are.
        let e = with("\"deepseek-legacy\"").unwrap_err();
        assert!(
            e.message.contains("\"auto\", \"deepseek\", \"none\""),
            "{}",
            e.message
        );
        // No field: separate.
        let b = parse(r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert_eq!(b.reasoning, Reasoning::Separate);
        // An assistant message's reasoning is kept; null is none.
        let b = parse(
            r#"{"messages":[{"role":"user","content":"x"},
            {"role":"assistant","content":"y","reasoning_content":"because"},
            {"role":"assistant","content":"z","reasoning_content":null},
            {"role":"user","content":"w"}]}"#,
        )
        .unwrap();
        assert_eq!(b.messages[1].reasoning.as_deref(), Some("because"));
        assert_eq!(b.messages[2].reasoning, None);
        assert_eq!(b.messages[0].reasoning, None);
    }

    #[test]
    fn tools_calls_and_formats_read() {
        let b = parse(
            r#"{"messages":[{"role":"user","content":"weather?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
             "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
            {"role":"tool","tool_call_id":"call_1","content":"sunny"}],
            "tools":[{"type":"function","function":{"name":"get_weather","description":"d",
             "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
            "tool_choice":{"type":"function","function":{"name":"get_weather"}},
            "parallel_tool_calls":false}"#,
        )
        .unwrap();
        assert_eq!(
            b.messages[1].tool_calls,
            vec![ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        assert!(b.messages[1].parts.is_empty());
        assert_eq!(b.messages[2].role, Role::Tool);
        assert_eq!(b.messages[2].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(b.tools.choice, ToolChoice::Function("get_weather".into()));
        assert!(!b.tools.parallel);
        assert_eq!(b.tools.functions()[0].0, "get_weather");
        assert_eq!(b.format, ResponseFormat::Text);
        // Defaults: auto, parallel; tool_choice none keeps the tools but uses none.
        let b = parse(
            r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
            "tools":[{"type":"function","function":{"name":"f"}}]}"#,
        )
        .unwrap();
        assert!(b.tools.parallel && !b.tools.in_use());
        assert_eq!(b.tools.functions()[0].1, json!({"type": "object"}));
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let b = parse(
            &json!({"messages": [{"role": "user", "content": "x"}], "response_format":
                {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": schema}}})
            .to_string(),
        )
        .unwrap();
        assert_eq!(b.format, ResponseFormat::JsonSchema(schema));
        let b = parse(r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}"#)
            .unwrap();
        assert_eq!(b.format, ResponseFormat::JsonObject);
    }

    #[test]
    fn malformed_json_is_a_400_not_a_panic() {
        let deep = "[".repeat(10_000);
        for body in [
            "",
            "{",
            "{\"messages\": [",
            "null",
            "1e999999",
            deep.as_str(),
        ] {
            let e = parse(body).expect_err(body);
            assert_eq!(e.status.as_u16(), 400);
        }
    }
}
