//! The body of `POST /v1/chat/completions`, read field by field so that every refusal names the
//! field at fault (`messages[2].content[1].type`), and the response shapes (OpenAI's).

use serde_json::{json, Map, Value};

use crate::chat::{Completion, Role, Sampling};
use crate::error::ApiError;

/// A message as the client sent it; image URLs are fetched later (`media`).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestMessage {
    pub role: Role,
    pub parts: Vec<RequestPart>,
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
}

pub(crate) fn bad(message: String, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param.to_string()))
}

/// Parses and checks a request body. `max_tokens_cap` is the server's `--max-tokens`: a request
/// asking for more gets the cap, none asking gets the cap too.
pub fn parse_chat_body(body: &[u8], max_tokens_cap: usize) -> Result<ChatBody, ApiError> {
    let obj = parse_object(body)?;
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
    let sampling = parse_sampling(&obj, max_tokens_cap)?;
    let stream = flag(&obj, "stream")?;
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
    })
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
    let role = parse_role(m, &at)?;
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
    Ok(RequestMessage { role, parts })
}

/// A message's `role` (`at` names the message); tools are not implemented, so no `tool` role.
pub(crate) fn parse_role(m: &Map<String, Value>, at: &str) -> Result<Role, ApiError> {
    let param = format!("{at}.role");
    match m.get("role").and_then(Value::as_str) {
        Some("system") | Some("developer") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        Some(other) => Err(bad(
            format!("{param} {other:?} is not supported (system, developer, user, assistant)"),
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
            "message": { "role": "assistant", "content": c.text },
            "finish_reason": c.finish.as_str(),
        }],
        "usage": usage(c),
    })
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
                r#"{"messages":[{"role":"tool","content":"x"}]}"#,
                "messages[0].role",
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
        // Control: a good body parses.
        parse(r#"{"messages":[{"role":"user","content":"x"}],"temperature":0}"#).unwrap();
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
