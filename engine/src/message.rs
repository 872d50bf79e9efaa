//! A conversation: system, user, assistant and tool turns; a user turn holds text and images in
//! order; an assistant turn may carry the tool calls it made, a tool turn answers one of them.

use std::sync::Arc;

use vision::preprocess::PixelPatches;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result (OpenAI's `tool` role), rendered as the template renders it (Qwen's: a
    /// `<tool_response>` in a user turn).
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A function call an assistant turn made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The caller's id for it (OpenAI's `call_...`), which a tool turn's `tool_call_id` names.
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

/// A preprocessed picture and what identifies it: two images are the same image when their pixel
/// rows are (the cached prefix of a chat is reused only up to the first different image).
#[derive(Clone, Debug)]
pub struct Image {
    /// The file (or caller's name) it came from, for messages.
    pub name: String,
    pub patches: Arc<PixelPatches>,
    /// A hash of the grid and every pixel value.
    pub identity: u64,
}

impl Image {
    pub fn new(name: impl Into<String>, patches: PixelPatches) -> Image {
        let identity = pixel_identity(&patches);
        Image {
            name: name.into(),
            patches: Arc::new(patches),
            identity,
        }
    }

    pub fn grid(&self) -> [usize; 3] {
        self.patches.grid
    }
}

/// FNV-1a over the grid and the values' bits: equal rows give equal identities; any changed value
/// changes it (a collision would need two pictures equal in 64 bits of hash).
fn pixel_identity(p: &PixelPatches) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        h ^= x;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    for g in p.grid {
        eat(g as u64);
    }
    for v in &p.values {
        eat(u64::from(v.to_bits()));
    }
    h
}

#[derive(Clone, Debug)]
pub enum Content {
    Text(String),
    Image(Image),
}

#[derive(Clone, Debug)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Content>,
    /// The calls an assistant turn made (empty otherwise).
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool turn answers.
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, given to the template as `reasoning_content` (Qwen3.5's
    /// renders it in a think block after the last user turn, as transformers' callers pass it).
    pub reasoning_content: Option<String>,
}

impl Message {
    /// A turn of `role` with `content` and no tool calls.
    pub fn new(role: Role, content: Vec<Content>) -> Message {
        Message {
            role,
            content,
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning_content: None,
        }
    }
    pub fn system(text: impl Into<String>) -> Message {
        Message::new(Role::System, vec![Content::Text(text.into())])
    }
    pub fn assistant(text: impl Into<String>) -> Message {
        Message::new(Role::Assistant, vec![Content::Text(text.into())])
    }
    /// A tool's result for the call `id`.
    pub fn tool(id: impl Into<String>, text: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(id.into()),
            ..Message::new(Role::Tool, vec![Content::Text(text.into())])
        }
    }
    /// A user turn: the images first, then the text (the order transformers' examples use).
    pub fn user(images: Vec<Image>, text: impl Into<String>) -> Message {
        let mut content: Vec<Content> = images.into_iter().map(Content::Image).collect();
        let text = text.into();
        if !text.is_empty() {
            content.push(Content::Text(text));
        }
        Message::new(Role::User, content)
    }

    pub fn images(&self) -> impl Iterator<Item = &Image> {
        self.content.iter().filter_map(|c| match c {
            Content::Image(i) => Some(i),
            Content::Text(_) => None,
        })
    }

    /// The text parts joined.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|c| match c {
                Content::Text(t) => Some(t.as_str()),
                Content::Image(_) => None,
            })
            .collect()
    }

    /// As transformers' messages: a user turn as a list of items, other turns as a string; an
    /// assistant turn's calls as `tool_calls` (OpenAI's shape, the arguments as an object when
    /// they parse, as templates expect: Qwen's writes them with `tojson`), a tool turn's
    /// `tool_call_id`.
    pub fn to_template_json(&self) -> serde_json::Value {
        let content = match self.role {
            Role::User => serde_json::Value::Array(
                self.content
                    .iter()
                    .map(|c| match c {
                        Content::Text(t) => serde_json::json!({"type": "text", "text": t}),
                        Content::Image(i) => serde_json::json!({"type": "image", "image": i.name}),
                    })
                    .collect(),
            ),
            _ => serde_json::Value::String(self.text()),
        };
        let mut m = serde_json::json!({"role": self.role.as_str(), "content": content});
        if !self.tool_calls.is_empty() {
            let calls: Vec<serde_json::Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments)
                        .unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone()));
                    serde_json::json!({
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments},
                    })
                })
                .collect();
            m["tool_calls"] = serde_json::Value::Array(calls);
        }
        if let Some(id) = &self.tool_call_id {
            m["tool_call_id"] = serde_json::Value::String(id.clone());
        }
        if let Some(r) = &self.reasoning_content {
            m["reasoning_content"] = serde_json::Value::String(r.clone());
        }
        m
    }
}
