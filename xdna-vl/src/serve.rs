//! `xdna-vl serve`: the engine's session behind the server (OpenAI's API and Ollama's). The
//! server owns the HTTP side and the queue; this file only maps its requests onto
//! `Session::generate` (the one generate loop) and the session's answers back.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use engine::{Content, EngineError, FinishReason, Message, Role, SamplingParams, Session};
use server::chat::{self as api, ChatEngine, ChatRequest, Completion, Finish};
use server::{MediaPolicy, ModelInfo, ServeOptions};

use crate::cli::ServeArgs;

/// A session answering the server's requests one at a time.
struct SessionEngine {
    session: Session,
}

impl ChatEngine for SessionEngine {
    fn complete(
        &mut self,
        request: &ChatRequest,
        on_event: &mut dyn FnMut(api::Event<'_>) -> bool,
    ) -> Result<Completion, api::EngineError> {
        let messages = self.messages(request).map_err(refusal)?;
        let params = sampling(self.session.default_sampling(), &request.sampling);
        let mut forward_event = |e: engine::Event<'_>| match e {
            engine::Event::Started { prompt_tokens, .. } => {
                on_event(api::Event::Started { prompt_tokens })
            }
            engine::Event::Text(t) => on_event(api::Event::Text(t)),
        };
        let g = self
            .session
            .generate(&messages, &params, &mut forward_event)
            .map_err(refusal)?;
        let finish = match g.finish {
            FinishReason::Eos(_) | FinishReason::Stop(_) => Finish::Stop,
            FinishReason::MaxTokens | FinishReason::ContextFull => Finish::Length,
            FinishReason::Cancelled => return Err(api::EngineError::Cancelled),
        };
        Ok(Completion {
            text: g.text,
            prompt_tokens: g.prompt_tokens,
            completion_tokens: g.ids.len(),
            finish,
            prompt_time: g.timings.tower + g.timings.prefill,
            answer_time: g.timings.decode,
        })
    }
}

impl SessionEngine {
    /// The request's messages with their pictures decoded and preprocessed.
    fn messages(&self, request: &ChatRequest) -> engine::Result<Vec<Message>> {
        request
            .messages
            .iter()
            .map(|m| {
                let content = m
                    .parts
                    .iter()
                    .map(|p| match p {
                        api::Part::Text(t) => Ok(Content::Text(t.clone())),
                        api::Part::Image { name, bytes } => {
                            Ok(Content::Image(self.session.image_from_bytes(name, bytes)?))
                        }
                    })
                    .collect::<engine::Result<Vec<_>>>()?;
                let role = match m.role {
                    api::Role::System => Role::System,
                    api::Role::User => Role::User,
                    api::Role::Assistant => Role::Assistant,
                };
                Ok(Message { role, content })
            })
            .collect()
    }
}

/// What the client got wrong is a 400; the rest is the server's fault.
fn refusal(e: EngineError) -> api::EngineError {
    match e {
        EngineError::OverContext { .. }
        | EngineError::Image { .. }
        | EngineError::Preprocess(_)
        | EngineError::Prompt(_)
        | EngineError::Template(_)
        | EngineError::Sampling(_) => api::EngineError::Invalid(e.to_string()),
        other => api::EngineError::Failed(other.to_string()),
    }
}

/// The pack's recommended sampling with the request's fields on top.
fn sampling(defaults: SamplingParams, s: &api::Sampling) -> SamplingParams {
    let mut p = defaults;
    if let Some(t) = s.temperature {
        p.temperature = t;
    }
    if let Some(k) = s.top_k {
        p.top_k = k;
    }
    if let Some(x) = s.top_p {
        p.top_p = x;
    }
    if let Some(x) = s.min_p {
        p.min_p = x;
    }
    if let Some(x) = s.repetition_penalty {
        p.repetition_penalty = x;
    }
    if let Some(x) = s.frequency_penalty {
        p.frequency_penalty = x;
    }
    if let Some(x) = s.presence_penalty {
        p.presence_penalty = x;
    }
    if let Some(x) = s.seed {
        p.seed = x;
    }
    if let Some(n) = s.max_tokens {
        p.max_tokens = n;
    }
    p.stop.extend(s.stop.iter().cloned());
    p
}

pub fn serve(args: &ServeArgs) -> Result<(), String> {
    let host: IpAddr = args
        .host
        .parse()
        .map_err(|_| format!("--host {:?}: not an IP address (e.g. 127.0.0.1)", args.host))?;
    if args.queue == 0 {
        return Err("--queue 0: at least one request must be able to wait".into());
    }
    if args.max_tokens == 0 {
        return Err("--max-tokens 0: an answer needs at least one token".into());
    }
    if let Some(dir) = &args.media_dir {
        if !dir.is_dir() {
            return Err(format!("--media-dir {}: no such directory", dir.display()));
        }
    }
    let session = crate::open_session(&args.model)?;
    let id = match &args.model.pack {
        Some(p) => p
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned()),
        None => "xdna-vl-bundled-tiny".into(),
    };
    let file = std::fs::metadata(session.forward().pack().path()).ok();
    let info = ModelInfo {
        id,
        backend: session.runtime().backend_name().to_string(),
        context: session.context(),
        family: session.forward().semantics().architecture.clone(),
        vision: session.takes_images(),
        size: file.as_ref().map(|m| m.len()),
        modified: file.and_then(|m| m.modified().ok()),
    };
    let options = ServeOptions {
        addr: SocketAddr::new(host, args.port),
        api_key: args.api_key.clone(),
        media: MediaPolicy {
            media_dir: args.media_dir.clone(),
            allow_remote: args.allow_remote_media,
            max_bytes: args.max_image_mib << 20,
            remote_timeout: Duration::from_secs(args.remote_timeout),
        },
        body_limit: args.body_limit_mib << 20,
        max_tokens_cap: args.max_tokens,
        queue_capacity: args.queue,
    };
    let model = format!(
        "{} ({} backend, context {})",
        info.id, info.backend, info.context
    );
    server::serve(options, info, Box::new(SessionEngine { session }), |addr| {
        // bench_serve and the tests read the address from this line.
        eprintln!("xdna-vl serve: {model}: listening on http://{addr}");
    })
    .map_err(|e| e.to_string())?;
    eprintln!("xdna-vl serve: stopped");
    Ok(())
}
