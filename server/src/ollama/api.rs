//! Ollama's request bodies, read field by field so that every refusal names the field at fault
//! (`options.mirostat`, `messages[1].images[0]`), and its response shapes, as Ollama v0.32.15's
//! `docs/api.md` and `api/types.go` define them and its Python client (`ollama/_types.py`) reads
//! them. Sampling values get the checks the OpenAI route gives them (`crate::api`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use serde_json::{json, Map, Value};

use crate::api::{self, bad, kind_of, only_fields, RequestMessage, RequestPart};
use crate::chat::{Completion, ModelInfo, ResponseFormat, Role, Sampling};
use crate::error::ApiError;
use crate::think::Reasoning;

/// What `GET /api/version` answers: the Ollama release whose API these routes follow.
pub const OLLAMA_VERSION: &str = "0.32.15";

/// Which of the two answering routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Generate,
}

/// A checked `/api/chat` or `/api/generate` body.
#[derive(Clone, Debug, PartialEq)]
pub struct OllamaBody {
    /// The model as the request named it (answers repeat it, as Ollama's do).
    pub model: String,
    /// None: the client only asks that the model be loaded (it always is).
    pub messages: Vec<RequestMessage>,
    pub sampling: Sampling,
    pub stream: bool,
    /// `format`: `"json"` or a JSON schema, by the same constrained decoding as OpenAI's
    /// `response_format`.
    pub format: ResponseFormat,
    /// `think`: `enable_thinking` for the chat template (Qwen3.5's reads it), when given.
    pub template_kwargs: Map<String, Value>,
    /// `think` true or absent: a thinking model's thinking in `message.thinking` (Ollama's
    /// default for a model that thinks); false: inline, as the model writes it (with
    /// `enable_thinking` false Qwen3.5 writes none).
    pub reasoning: Reasoning,
}

/// The name `/api/tags` lists for the model `id`: with Ollama's default tag `latest` unless the id
/// has a tag of its own.
pub fn model_name(id: &str) -> String {
    if id.contains(':') {
        id.to_string()
    } else {
        format!("{id}:latest")
    }
}

/// The request's `key` must name the served model, with or without the `latest` tag (Ollama's
/// rule for a name without a tag); any other is refused by name with Ollama's 404.
fn check_model(obj: &Map<String, Value>, key: &str, info: &ModelInfo) -> Result<String, ApiError> {
    let served = model_name(&info.id);
    match obj.get(key) {
        Some(Value::String(m)) if *m == served || *m == info.id => Ok(m.clone()),
        Some(Value::String(m)) if !m.is_empty() => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("model '{m}' not found: this server serves '{served}'"),
            kind: "invalid_request_error",
            param: Some(key.into()),
            retry_after: None,
        }),
        None | Some(Value::Null) | Some(Value::String(_)) => Err(bad(
            format!("{key} is required: this server serves '{served}'"),
            key,
        )),
        Some(v) => Err(bad(
            format!("{key} must be a string, got {}", kind_of(v)),
            key,
        )),
    }
}

/// A value that asks for nothing: absent, null, false, 0, "" or [].
fn asks_nothing(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::Object(_)) | Some(Value::Bool(true)) => false,
    }
}

/// Ollama's fields this server does not implement, each with why. One left at a value that asks
/// for nothing (`"tools": []`, which Ollama's Python client always sends, `"raw": false`) is
/// taken as absent; any other value is refused by name, never ignored. `think` is taken as true or
/// false (the template's `enable_thinking`); a level ("low", "medium", "high", for models whose
/// thinking has levels) is refused.
const NOT_IMPLEMENTED: &[(&str, &str)] = &[
    ("template", "the prompt is always built with the model's own chat template"),
    ("raw", "the prompt always goes through the model's chat template"),
    ("suffix", "fill-in-the-middle is not implemented"),
    ("context", "token contexts are not returned or taken; send the conversation to /api/chat"),
    ("tools", "tool calling is not implemented"),
    ("think", "thinking levels are not implemented (Qwen's thinking is on or off); send true or false"),
    ("truncate", "a prompt over the context is refused, not truncated (\"truncate\": false)"),
    ("shift", "the answer stops when the context is full (done_reason \"length\"), it is not shifted (\"shift\": false)"),
    ("logprobs", "log probabilities are not returned"),
    ("top_logprobs", "log probabilities are not returned"),
    ("_debug_render_only", "rendering the prompt alone is not implemented"),
];

fn refuse_not_implemented(obj: &Map<String, Value>, at: &str) -> Result<(), ApiError> {
    for (key, why) in NOT_IMPLEMENTED {
        let v = obj.get(*key);
        let refused = if *key == "think" {
            !matches!(v, None | Some(Value::Null) | Some(Value::Bool(_)))
        } else {
            !asks_nothing(v)
        };
        if refused {
            let param = if at.is_empty() {
                key.to_string()
            } else {
                format!("{at}.{key}")
            };
            return Err(bad(format!("{param} is not supported: {why}"), &param));
        }
    }
    Ok(())
}

/// `keep_alive` (a number of seconds or a duration like "5m"; negative: forever) is accepted
/// because this server keeps its one model loaded for as long as it runs, which any keep-alive
/// Ollama takes asks for at least; only 0 (unload right after this request) asks for what it
/// does not do and is refused.
fn check_keep_alive(v: Option<&Value>) -> Result<(), ApiError> {
    let zero = match v {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => go_duration_is_zero(s).ok_or_else(|| {
            bad(
                format!("keep_alive {s:?} is not a duration (\"5m\", \"1h30m\", \"-1s\" or seconds as a number)"),
                "keep_alive",
            )
        })?,
        Some(v) => {
            return Err(bad(
                format!("keep_alive must be a duration or a number, got {}", kind_of(v)),
                "keep_alive",
            ))
        }
    };
    if zero {
        return Err(bad(
            "keep_alive 0 asks to unload the model: this server keeps its one model loaded while it runs".into(),
            "keep_alive",
        ));
    }
    Ok(())
}

/// Whether a Go duration ("300ms", "-1.5h", "2h45m", "0") is zero; None when it is not one.
fn go_duration_is_zero(s: &str) -> Option<bool> {
    let rest = s.strip_prefix(['-', '+']).unwrap_or(s);
    if rest == "0" {
        return Some(true);
    }
    let mut rest = rest;
    let mut zero = true;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .into_iter()
            .find(|u| rest.starts_with(u))?;
        rest = &rest[unit.len()..];
        zero &= number == 0.0;
    }
    Some(zero)
}

/// Ollama options this server has no setting for, taken only at the value that is what it does
/// anyway.
fn what_it_does(key: &str) -> Option<Value> {
    match key {
        // Mirostat, typical and tail-free sampling: off.
        "mirostat" => Some(json!(0)),
        "typical_p" | "tfs_z" => Some(json!(1.0)),
        // The repetition penalty looks at the whole context, newlines included.
        "repeat_last_n" => Some(json!(-1)),
        "penalize_newline" => Some(json!(true)),
        _ => None,
    }
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// `options` onto our sampling: temperature, top_k, top_p, min_p, repeat_penalty (transformers'
/// repetition penalty), presence_penalty, frequency_penalty, seed, num_predict (the answer's
/// length: -1 and -2 mean as long as the server allows), stop. `num_ctx` up to the server's
/// context is accepted (see below); any other option is refused by name.
fn parse_options(
    v: Option<&Value>,
    max_tokens_cap: usize,
    context: usize,
) -> Result<Sampling, ApiError> {
    let empty = Map::new();
    let obj = match v {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(bad(
                format!("options must be an object, got {}", kind_of(v)),
                "options",
            ))
        }
    };
    for (key, v) in obj {
        let param = format!("options.{key}");
        match key.as_str() {
            "temperature" | "top_k" | "top_p" | "min_p" | "repeat_penalty" | "presence_penalty"
            | "frequency_penalty" | "seed" | "num_predict" | "stop" => {}
            // The context window Ollama would load the model with. This server's is fixed at
            // start (--ctx); a window no larger holds every prompt the asked one would, so
            // asking for it is asking for what the server does. A larger one is refused.
            "num_ctx" => match api::count(Some(v), &param)? {
                Some(n) if n as usize > context => {
                    return Err(bad(
                        format!("{param} {n} is more than this server's context of {context} tokens (xdna-vl serve --ctx)"),
                        &param,
                    ))
                }
                _ => {}
            },
            _ => {
                let only = match what_it_does(key) {
                    Some(w) if same_value(v, &w) => continue,
                    Some(w) => format!(" (only {w}, what it does anyway)"),
                    None => String::new(),
                };
                return Err(bad(
                    format!("{param} is not supported by this server{only}"),
                    &param,
                ));
            }
        }
    }
    let sampling = api::shared_sampling(|name| {
        let key = match name {
            "repetition_penalty" => "repeat_penalty",
            other => other,
        };
        (obj.get(key), format!("options.{key}"))
    })?;
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            bad(
                format!("options.seed must be an integer >= 0, got {v} (a seed < 0 asks Ollama for a random one; this server's answers are always seeded, 0 when none is given)"),
                "options.seed",
            )
        })?),
    };
    let max_tokens = match obj.get("num_predict") {
        None | Some(Value::Null) => max_tokens_cap,
        Some(v) => match v.as_i64() {
            Some(n) if n > 0 => (n as u64).min(max_tokens_cap as u64) as usize,
            Some(-1) | Some(-2) => max_tokens_cap,
            _ => {
                return Err(bad(
                    format!("options.num_predict must be at least 1, or -1 or -2 (as long as the server allows), got {v}"),
                    "options.num_predict",
                ))
            }
        },
    };
    Ok(Sampling {
        max_tokens: Some(max_tokens),
        seed,
        stop: api::stop_strings(obj.get("stop"), "options.stop", None)?,
        ..sampling
    })
}

/// A string field (`param` in errors); absent is empty.
fn string(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(bad(
            format!("{param} must be a string, got {}", kind_of(v)),
            param,
        )),
    }
}

/// Base64 images (`at` names the list), taken in user messages only.
fn images(v: Option<&Value>, at: &str, role: Role) -> Result<Vec<RequestPart>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(bad(
                format!(
                    "{at} must be an array of base64 strings, got {}",
                    kind_of(v)
                ),
                at,
            ))
        }
    };
    if !list.is_empty() && role != Role::User {
        return Err(bad(
            format!("{at}: images are taken in user messages only"),
            at,
        ));
    }
    list.iter()
        .enumerate()
        .map(|(j, image)| {
            let param = format!("{at}[{j}]");
            match image {
                Value::String(data) => Ok(RequestPart::ImageBase64 {
                    data: data.clone(),
                    param,
                }),
                v => Err(bad(
                    format!("{param} must be a base64 string, got {}", kind_of(v)),
                    &param,
                )),
            }
        })
        .collect()
}

/// Images first, then the text (none when it is empty and there are images).
fn message(role: Role, images: Vec<RequestPart>, text: String) -> RequestMessage {
    let mut parts = images;
    if !text.is_empty() || parts.is_empty() {
        parts.push(RequestPart::Text(text));
    }
    RequestMessage::new(role, parts)
}

fn parse_message(i: usize, m: &Value) -> Result<RequestMessage, ApiError> {
    let at = format!("messages[{i}]");
    let Value::Object(m) = m else {
        return Err(bad(format!("{at} must be an object"), &at));
    };
    only_fields(
        m,
        &at,
        &[
            "role",
            "content",
            "images",
            "thinking",
            "tool_calls",
            "tool_name",
            "tool_call_id",
        ],
    )?;
    let role = api::parse_role(m, &at)?;
    if role == Role::Tool {
        let param = format!("{at}.role");
        return Err(bad(
            format!("{param} \"tool\" is not supported: tool calling is not implemented on the Ollama routes (it is on /v1/chat/completions)"),
            &param,
        ));
    }
    for (key, why) in [
        ("tool_calls", "tool calling is not implemented"),
        ("tool_name", "tool calling is not implemented"),
        ("tool_call_id", "tool calling is not implemented"),
    ] {
        if !asks_nothing(m.get(key)) {
            let param = format!("{at}.{key}");
            return Err(bad(format!("{param} is not supported: {why}"), &param));
        }
    }
    let text = string(m.get("content"), &format!("{at}.content"))?;
    let images = images(m.get("images"), &format!("{at}.images"), role)?;
    // An assistant message's thinking goes back to the template as its reasoning_content.
    let param = format!("{at}.thinking");
    let thinking = string(m.get("thinking"), &param)?;
    if !thinking.is_empty() && role != Role::Assistant {
        return Err(bad(
            format!("{param}: only an assistant message carries thinking"),
            &param,
        ));
    }
    Ok(RequestMessage {
        reasoning: (!thinking.is_empty()).then_some(thinking),
        ..message(role, images, text)
    })
}

const COMMON_FIELDS: [&str; 11] = [
    "model",
    "stream",
    "options",
    "keep_alive",
    "format",
    "think",
    "truncate",
    "shift",
    "logprobs",
    "top_logprobs",
    "_debug_render_only",
];

/// Parses and checks a `/api/chat` or `/api/generate` body for the served model `info`;
/// `max_tokens_cap` is the server's `--max-tokens`.
pub fn parse_body(
    endpoint: Endpoint,
    body: &[u8],
    info: &ModelInfo,
    max_tokens_cap: usize,
) -> Result<OllamaBody, ApiError> {
    let obj = api::parse_object(body)?;
    let model = check_model(&obj, "model", info)?;
    let own: &[&str] = match endpoint {
        Endpoint::Chat => &["messages", "tools"],
        Endpoint::Generate => &[
            "prompt", "images", "system", "suffix", "template", "raw", "context",
        ],
    };
    let known: Vec<&str> = COMMON_FIELDS.iter().chain(own).copied().collect();
    only_fields(&obj, "", &known)?;
    refuse_not_implemented(&obj, "")?;
    check_keep_alive(obj.get("keep_alive"))?;
    let format = parse_format(obj.get("format"))?;
    let sampling = parse_options(obj.get("options"), max_tokens_cap, info.context)?;
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad(format!("stream must be a boolean, got {v}"), "stream")),
    };
    let messages = match endpoint {
        Endpoint::Chat => match obj.get("messages") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, m)| parse_message(i, m))
                .collect::<Result<Vec<_>, _>>()?,
            Some(v) => {
                return Err(bad(
                    format!("messages must be an array, got {}", kind_of(v)),
                    "messages",
                ))
            }
        },
        Endpoint::Generate => {
            let prompt = string(obj.get("prompt"), "prompt")?;
            let images = images(obj.get("images"), "images", Role::User)?;
            let system = string(obj.get("system"), "system")?;
            if prompt.is_empty() && images.is_empty() {
                Vec::new()
            } else if system.is_empty() {
                vec![message(Role::User, images, prompt)]
            } else {
                vec![
                    message(Role::System, Vec::new(), system),
                    message(Role::User, images, prompt),
                ]
            }
        }
    };
    let mut template_kwargs = Map::new();
    let mut reasoning = Reasoning::Separate;
    if let Some(Value::Bool(think)) = obj.get("think") {
        template_kwargs.insert("enable_thinking".into(), Value::Bool(*think));
        if !think {
            reasoning = Reasoning::Inline;
        }
    }
    Ok(OllamaBody {
        model,
        messages,
        sampling,
        stream,
        format,
        template_kwargs,
        reasoning,
    })
}

/// Ollama's `format`: none or `""` (text), `"json"` (any JSON object) or a JSON schema.
fn parse_format(v: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(ResponseFormat::Text),
        Some(Value::String(s)) if s.is_empty() => Ok(ResponseFormat::Text),
        Some(Value::String(s)) if s == "json" => Ok(ResponseFormat::JsonObject),
        Some(schema @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema(schema.clone())),
        Some(v) => Err(bad(
            format!("format must be \"json\" or a JSON schema object, got {v}"),
            "format",
        )),
    }
}

/// Checks a `/api/show` body (`model`, or `name` as older clients send it); returns the model as
/// named. `verbose` is accepted: this server has no longer answer to give.
pub fn parse_show(body: &[u8], info: &ModelInfo) -> Result<String, ApiError> {
    let obj = api::parse_object(body)?;
    only_fields(&obj, "", &["model", "name", "verbose"])?;
    api::flag(&obj, "verbose")?;
    let key = if obj.get("model").is_some_and(|v| !v.is_null()) || !obj.contains_key("name") {
        "model"
    } else {
        "name"
    };
    check_model(&obj, key, info)
}

/// An RFC 3339 UTC time with microseconds, as Ollama's `created_at` and `modified_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `details` of the model, in `/api/tags` and `/api/show`.
fn details(info: &ModelInfo) -> Value {
    json!({
        "parent_model": "",
        "format": "xdna-vl pack",
        "family": info.family,
        "families": [info.family],
        "parameter_size": "",
        "quantization_level": "",
    })
}

fn capabilities(info: &ModelInfo) -> Vec<&'static str> {
    let mut caps = vec!["completion"];
    // No "tools": these routes refuse `tools` (NOT_IMPLEMENTED).
    for (has, cap) in [(info.vision, "vision"), (info.thinking, "thinking")] {
        if has {
            caps.push(cap);
        }
    }
    caps
}

/// `GET /api/tags`: the one model.
pub fn tags_body(info: &ModelInfo) -> Value {
    let name = model_name(&info.id);
    json!({ "models": [{
        "name": name,
        "model": name,
        "modified_at": rfc3339(info.modified.unwrap_or(UNIX_EPOCH)),
        "size": info.size.unwrap_or(0),
        "digest": "",
        "details": details(info),
        "capabilities": capabilities(info),
    }]})
}

/// `POST /api/show`: what clients read of it (`model_info`'s `<family>.context_length` sizes
/// their prompts, `capabilities` tells them it takes images).
pub fn show_body(info: &ModelInfo) -> Value {
    let mut model_info = Map::new();
    model_info.insert("general.architecture".into(), json!(info.family));
    model_info.insert(
        format!("{}.context_length", info.family),
        json!(info.context),
    );
    json!({
        "details": details(info),
        "model_info": model_info,
        "capabilities": capabilities(info),
        "modified_at": rfc3339(info.modified.unwrap_or(UNIX_EPOCH)),
    })
}

/// The answer's text and thinking as each route words them: a chat message (`content`,
/// `thinking`) or a generate response (`response`, `thinking`); the thinking only when there is
/// some, as Ollama omits it.
fn reply(
    endpoint: Endpoint,
    model: &str,
    (text, thinking): (&str, &str),
    done: bool,
) -> Map<String, Value> {
    let mut obj = Map::new();
    obj.insert("model".into(), json!(model));
    obj.insert("created_at".into(), json!(rfc3339(SystemTime::now())));
    match endpoint {
        Endpoint::Chat => {
            let mut message = json!({ "role": "assistant", "content": text });
            if !thinking.is_empty() {
                message["thinking"] = json!(thinking);
            }
            obj.insert("message".into(), message);
        }
        Endpoint::Generate => {
            obj.insert("response".into(), json!(text));
            if !thinking.is_empty() {
                obj.insert("thinking".into(), json!(thinking));
            }
        }
    }
    obj.insert("done".into(), json!(done));
    obj
}

/// One streamed piece of the answer: its text and thinking (one of them empty).
pub fn chunk(endpoint: Endpoint, model: &str, text: (&str, &str)) -> Value {
    Value::Object(reply(endpoint, model, text, false))
}

/// The last object: the whole text and thinking (none when streamed), why it ended and the counts
/// and times (nanoseconds). `total` is the request's time in the server, queue included; the
/// model is loaded at start, so no request spends time loading it.
pub fn done(
    endpoint: Endpoint,
    model: &str,
    text: (&str, &str),
    c: &Completion,
    total: Duration,
) -> Value {
    let mut obj = reply(endpoint, model, text, true);
    obj.insert("done_reason".into(), json!(c.finish.as_str()));
    obj.insert("total_duration".into(), json!(nanos(total)));
    obj.insert("load_duration".into(), json!(0));
    obj.insert("prompt_eval_count".into(), json!(c.prompt_tokens));
    obj.insert("prompt_eval_duration".into(), json!(nanos(c.prompt_time)));
    obj.insert("eval_count".into(), json!(c.completion_tokens));
    obj.insert("eval_duration".into(), json!(nanos(c.answer_time)));
    Value::Object(obj)
}

/// The answer to a request with nothing to answer, which Ollama takes as "load the model".
pub fn loaded(endpoint: Endpoint, model: &str) -> Value {
    let mut obj = reply(endpoint, model, ("", ""), true);
    obj.insert("done_reason".into(), json!("load"));
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ModelInfo {
        ModelInfo {
            id: "tiny".into(),
            backend: "host".into(),
            context: 400,
            family: "qwen3_vl".into(),
            vision: true,
            thinking: false,
            size: None,
            modified: None,
        }
    }

    fn parse(endpoint: Endpoint, body: &str) -> Result<OllamaBody, ApiError> {
        parse_body(endpoint, body.as_bytes(), &info(), 256)
    }

    /// `capabilities` lists "thinking" as the chat template has it (Qwen3.5's does), and never
    /// "tools" (these routes refuse them). Control: a template without thinking lists only what
    /// the pack has.
    #[test]
    fn capabilities_follow_the_template() {
        let thinking = ModelInfo {
            thinking: true,
            ..info()
        };
        assert_eq!(
            show_body(&thinking)["capabilities"],
            json!(["completion", "vision", "thinking"])
        );
        assert_eq!(
            tags_body(&info())["models"][0]["capabilities"],
            json!(["completion", "vision"])
        );
    }

    #[test]
    fn times_are_rfc3339_utc() {
        let at = |s: u64, micros: u64| {
            rfc3339(UNIX_EPOCH + Duration::from_secs(s) + Duration::from_micros(micros))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(1_700_000_000, 499_127), "2023-11-14T22:13:20.499127Z");
        assert_eq!(at(4_107_542_399, 0), "2100-02-28T23:59:59.000000Z");
    }

    #[test]
    fn go_durations() {
        for (s, zero) in [
            ("0", Some(true)),
            ("0s", Some(true)),
            ("-0m", Some(true)),
            ("0h0m", Some(true)),
            ("5m", Some(false)),
            ("1h30m", Some(false)),
            ("-1s", Some(false)),
            ("1.5h", Some(false)),
            ("300ms", Some(false)),
            // Not durations, as Go's time.ParseDuration says (a unit is needed but for "0").
            ("-1", None),
            ("", None),
            ("m", None),
            ("5x", None),
            ("1h-2m", None),
        ] {
            assert_eq!(go_duration_is_zero(s), zero, "{s:?}");
        }
    }

    #[test]
    fn options_map_onto_our_sampling() {
        let b = parse(
            Endpoint::Chat,
            r#"{"model":"tiny:latest","messages":[{"role":"user","content":"hi"}],
            "options":{"temperature":0.5,"top_k":7,"top_p":0.9,"min_p":0.1,"repeat_penalty":1.3,
            "presence_penalty":0.2,"frequency_penalty":-0.4,"seed":42,"num_predict":9000,
            "stop":["\n\n","END"],"num_ctx":400,"mirostat":0,"typical_p":1,"repeat_last_n":-1},
            "keep_alive":"5m","tools":[]}"#,
        )
        .unwrap();
        assert_eq!(
            b.sampling,
            Sampling {
                max_tokens: Some(256),
                temperature: Some(0.5),
                top_p: Some(0.9),
                top_k: Some(7),
                min_p: Some(0.1),
                repetition_penalty: Some(1.3),
                frequency_penalty: Some(-0.4),
                presence_penalty: Some(0.2),
                seed: Some(42),
                stop: vec!["\n\n".into(), "END".into()],
            }
        );
        assert!(b.stream, "stream defaults to true");
        assert_eq!(b.model, "tiny:latest");
        // No options: the pack's defaults and the server's cap; num_predict -1 is the cap too.
        let b = parse(
            Endpoint::Generate,
            r#"{"model":"tiny","prompt":"hi","stream":false}"#,
        )
        .unwrap();
        assert_eq!(
            b.sampling,
            Sampling {
                max_tokens: Some(256),
                ..Sampling::default()
            }
        );
        assert!(!b.stream);
        let b = parse(
            Endpoint::Generate,
            r#"{"model":"tiny","prompt":"hi","options":{"num_predict":-1}}"#,
        )
        .unwrap();
        assert_eq!(b.sampling.max_tokens, Some(256));
    }

    #[test]
    fn generate_is_a_user_message_with_its_system_and_images_first() {
        let b = parse(
            Endpoint::Generate,
            r#"{"model":"tiny","prompt":"what?","system":"be brief","images":["AAEC"]}"#,
        )
        .unwrap();
        assert_eq!(
            b.messages,
            vec![
                RequestMessage::new(Role::System, vec![RequestPart::Text("be brief".into())]),
                RequestMessage::new(
                    Role::User,
                    vec![
                        RequestPart::ImageBase64 {
                            data: "AAEC".into(),
                            param: "images[0]".into()
                        },
                        RequestPart::Text("what?".into())
                    ]
                )
            ]
        );
        // Nothing to answer: a load request.
        assert!(parse(Endpoint::Generate, r#"{"model":"tiny"}"#)
            .unwrap()
            .messages
            .is_empty());
        assert!(parse(Endpoint::Chat, r#"{"model":"tiny","messages":[]}"#)
            .unwrap()
            .messages
            .is_empty());
        // think false: the template's enable_thinking off; absent or null: nothing given.
        let off = parse(
            Endpoint::Generate,
            r#"{"model":"tiny","prompt":"x","think":false}"#,
        );
        assert_eq!(
            Value::Object(off.unwrap().template_kwargs),
            json!({"enable_thinking": false})
        );
        let none = parse(
            Endpoint::Chat,
            r#"{"model":"tiny","messages":[],"think":null}"#,
        );
        assert!(none.unwrap().template_kwargs.is_empty());
    }

    #[test]
    fn think_switches_the_template_and_the_split_and_thinking_goes_back() {
        let think = |v: &str| {
            let b = parse(
                Endpoint::Chat,
                &format!(r#"{{"model":"tiny","messages":[],"think":{v}}}"#),
            )
            .unwrap();
            (Value::Object(b.template_kwargs), b.reasoning)
        };
        assert_eq!(
            think("true"),
            (json!({"enable_thinking": true}), Reasoning::Separate)
        );
        assert_eq!(
            think("false"),
            (json!({"enable_thinking": false}), Reasoning::Inline)
        );
        // Absent: the template's default, thinking separated (Ollama's default for a thinking
        // model).
        assert_eq!(think("null"), (json!({}), Reasoning::Separate));
        // An assistant message's thinking is its reasoning; empty is none.
        let b = parse(
            Endpoint::Chat,
            r#"{"model":"tiny","messages":[{"role":"user","content":"hi"},
            {"role":"assistant","content":"hello","thinking":"greet back"},
            {"role":"assistant","content":"again","thinking":""},
            {"role":"user","content":"bye"}]}"#,
        )
        .unwrap();
        assert_eq!(b.messages[1].reasoning.as_deref(), Some("greet back"));
        assert_eq!(b.messages[2].reasoning, None);
        // The answer's thinking: in the message (chat) or beside the response (generate), and
        // only when there is some.
        let c = Completion {
            text: "hello".into(),
            reasoning: "greet back".into(),
            tool_calls: Vec::new(),
            prompt_tokens: 1,
            completion_tokens: 2,
            ids: Vec::new(),
            finish: crate::chat::Finish::Stop,
            prompt_time: Duration::ZERO,
            answer_time: Duration::ZERO,
        };
        let whole = done(
            Endpoint::Chat,
            "tiny",
            ("hello", "greet back"),
            &c,
            Duration::ZERO,
        );
        assert_eq!(
            whole["message"],
            json!({"role": "assistant", "content": "hello", "thinking": "greet back"})
        );
        let whole = done(
            Endpoint::Generate,
            "tiny",
            ("hello", "greet back"),
            &c,
            Duration::ZERO,
        );
        assert_eq!(
            (whole["response"].clone(), whole["thinking"].clone()),
            (json!("hello"), json!("greet back"))
        );
        let plain = chunk(Endpoint::Chat, "tiny", ("hello", ""));
        assert_eq!(
            plain["message"],
            json!({"role": "assistant", "content": "hello"})
        );
    }

    #[test]
    fn each_refusal_names_its_field() {
        let chat = |extra: &str| {
            format!(r#"{{"model":"tiny","messages":[{{"role":"user","content":"x"}}]{extra}}}"#)
        };
        for (body, param, status) in [
            (r#"{"messages":[]}"#.to_string(), "model", 400),
            (r#"{"model":"llama3.2","messages":[]}"#.into(), "model", 404),
            (r#"{"model":"tiny:7b","messages":[]}"#.into(), "model", 404),
            (chat(r#","format":"yaml""#), "format", 400),
            (chat(r#","format":["json"]"#), "format", 400),
            (chat(r#","tools":[{"type":"function"}]"#), "tools", 400),
            (chat(r#","think":"high""#), "think", 400),
            (chat(r#","think":"low""#), "think", 400),
            (chat(r#","think":1"#), "think", 400),
            (chat(r#","truncate":true"#), "truncate", 400),
            (chat(r#","shift":true"#), "shift", 400),
            (chat(r#","logprobs":true"#), "logprobs", 400),
            (chat(r#","top_logprobs":3"#), "top_logprobs", 400),
            (chat(r#","keep_alive":0"#), "keep_alive", 400),
            (chat(r#","keep_alive":"0s""#), "keep_alive", 400),
            (chat(r#","keep_alive":"soon""#), "keep_alive", 400),
            (chat(r#","stream":"yes""#), "stream", 400),
            (chat(r#","surprise":1"#), "surprise", 400),
            (chat(r#","options":{"mirostat":2}"#), "options.mirostat", 400),
            (chat(r#","options":{"num_gpu":1}"#), "options.num_gpu", 400),
            (chat(r#","options":{"num_ctx":401}"#), "options.num_ctx", 400),
            (chat(r#","options":{"seed":-1}"#), "options.seed", 400),
            (chat(r#","options":{"num_predict":0}"#), "options.num_predict", 400),
            (chat(r#","options":{"temperature":3}"#), "options.temperature", 400),
            (chat(r#","options":{"repeat_penalty":0}"#), "options.repeat_penalty", 400),
            (chat(r#","options":{"stop":[""]}"#), "options.stop", 400),
            (chat(r#","options":[1]"#), "options", 400),
            (
                r#"{"model":"tiny","messages":[{"role":"tool","content":"x"}]}"#.into(),
                "messages[0].role",
                400,
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"user","content":"x","images":[1]}]}"#.into(),
                "messages[0].images[0]",
                400,
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"assistant","content":"x","images":["AA=="]}]}"#.into(),
                "messages[0].images",
                400,
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"assistant","content":"x","tool_calls":[{}]}]}"#.into(),
                "messages[0].tool_calls",
                400,
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"assistant","content":"x","thinking":7}]}"#.into(),
                "messages[0].thinking",
                400,
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"user","content":"x","thinking":"y"}]}"#.into(),
                "messages[0].thinking",
                400,
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"user","content":5}]}"#.into(),
                "messages[0].content",
                400,
            ),
            (
                r#"{"model":"tiny","messages":[{"role":"user","content":"x","name":"bob"}]}"#.into(),
                "messages[0].name",
                400,
            ),
        ] {
            let e = parse(Endpoint::Chat, &body).expect_err(&body);
            assert_eq!(e.status.as_u16(), status, "{body}: {}", e.message);
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(param), "{body}: {}", e.message);
        }
        for (body, param) in [
            (r#"{"model":"tiny","prompt":"x","raw":true}"#, "raw"),
            (
                r#"{"model":"tiny","prompt":"x","template":"{{ .Prompt }}"}"#,
                "template",
            ),
            (
                r#"{"model":"tiny","prompt":"x","context":[1,2]}"#,
                "context",
            ),
            (r#"{"model":"tiny","prompt":"x","suffix":"end"}"#, "suffix"),
            (r#"{"model":"tiny","prompt":"x","images":"AAEC"}"#, "images"),
            (r#"{"model":"tiny","prompt":"x","messages":[]}"#, "messages"),
        ] {
            let e = parse(Endpoint::Generate, body).expect_err(body);
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        // Control: the same fields at values that ask for nothing, and a tagless name, pass.
        parse(
            Endpoint::Chat,
            &chat(r#","format":"","tools":[],"truncate":false,"shift":false,"logprobs":false,"top_logprobs":0,"keep_alive":-1"#),
        )
        .unwrap();
        parse(
            Endpoint::Generate,
            r#"{"model":"tiny","prompt":"x","raw":false,"context":[],"suffix":"","template":""}"#,
        )
        .unwrap();
    }

    #[test]
    fn show_takes_model_or_name() {
        assert_eq!(parse_show(br#"{"model":"tiny"}"#, &info()).unwrap(), "tiny");
        assert_eq!(
            parse_show(br#"{"name":"tiny:latest"}"#, &info()).unwrap(),
            "tiny:latest"
        );
        assert_eq!(
            parse_show(br#"{"name":"other"}"#, &info())
                .unwrap_err()
                .status
                .as_u16(),
            404
        );
        assert_eq!(
            parse_show(br#"{}"#, &info()).unwrap_err().param.as_deref(),
            Some("model")
        );
        assert_eq!(
            parse_show(br#"{"model":"tiny","verbose":"x"}"#, &info())
                .unwrap_err()
                .param
                .as_deref(),
            Some("verbose")
        );
    }
}
