//! `xdna-vl serve`: the engine's session behind the server (OpenAI's API and Ollama's). The
//! server owns the HTTP side and the queue; this file only maps its requests onto
//! `Session::generate` (the one generate loop) and the session's answers back.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use engine::tool_calls::{calls_grammar, CallForm, CallSplitter, FunctionTool};
use engine::{
    Content, EngineError, FinishReason, Generation, Grammar, Message, Role, SamplingParams,
    Scheduler, SchedulerHandle, SchedulerOptions, Session, TemplateInputs, ToolCall,
};
use server::chat::{
    self as api, ChatEngine, ChatRequest, Completion, Finish, ResponseFormat, ToolChoice,
};
use server::{MediaPolicy, ModelInfo, ServeOptions};

use crate::cli::ServeArgs;

/// What answers a request: a session (one at a time, with its prompt cache) or a handle of the
/// scheduler (beside the others).
trait Answerer: Send + 'static {
    fn image(&self, name: &str, bytes: &[u8]) -> engine::Result<engine::Image>;
    fn default_sampling(&self) -> SamplingParams;
    /// The form the checkpoint's template has calls written in (what the calls grammar makes).
    fn call_form(&self) -> CallForm;
    /// Answers `messages` with `inputs` (the tools shown, extra variables) given to the template.
    fn generate(
        &mut self,
        messages: &[Message],
        inputs: &TemplateInputs,
        params: &SamplingParams,
        on_event: &mut dyn FnMut(engine::Event<'_>) -> bool,
    ) -> engine::Result<Generation>;
}

impl Answerer for Session {
    fn image(&self, name: &str, bytes: &[u8]) -> engine::Result<engine::Image> {
        self.image_from_bytes(name, bytes)
    }
    fn default_sampling(&self) -> SamplingParams {
        Session::default_sampling(self)
    }
    fn call_form(&self) -> CallForm {
        self.format().template.call_form()
    }
    fn generate(
        &mut self,
        messages: &[Message],
        inputs: &TemplateInputs,
        params: &SamplingParams,
        on_event: &mut dyn FnMut(engine::Event<'_>) -> bool,
    ) -> engine::Result<Generation> {
        Session::generate_with(self, messages, inputs, params, on_event)
    }
}

/// A scheduler handle and the pack's picture settings (pictures decode on the worker's thread).
struct Parallel {
    handle: SchedulerHandle,
    images: engine::ImageSettings,
}

impl Answerer for Parallel {
    fn image(&self, name: &str, bytes: &[u8]) -> engine::Result<engine::Image> {
        self.images.from_bytes(name, bytes)
    }
    fn default_sampling(&self) -> SamplingParams {
        self.handle.default_sampling()
    }
    fn call_form(&self) -> CallForm {
        self.handle.format().template.call_form()
    }
    fn generate(
        &mut self,
        messages: &[Message],
        inputs: &TemplateInputs,
        params: &SamplingParams,
        on_event: &mut dyn FnMut(engine::Event<'_>) -> bool,
    ) -> engine::Result<Generation> {
        self.handle
            .generate_with(messages, inputs, params, on_event)
    }
}

/// An answerer behind the server's engine trait.
struct ServerEngine<A: Answerer> {
    answerer: A,
    /// `--chat-template-kwargs`: every request's template variables, under its own.
    template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl<A: Answerer> ChatEngine for ServerEngine<A> {
    fn complete(
        &mut self,
        request: &ChatRequest,
        on_event: &mut dyn FnMut(api::Event<'_>) -> bool,
    ) -> Result<Completion, api::EngineError> {
        let messages = self.messages(request).map_err(refusal)?;
        let mut params = sampling(self.answerer.default_sampling(), &request.sampling);
        params.grammar = grammar(request, self.answerer.call_form()).map_err(refusal)?;
        let tools = &request.tools;
        // tool_choice "none": the model is not told about the tools, so it calls none.
        let inputs = TemplateInputs {
            tools: if tools.choice == ToolChoice::None {
                Vec::new()
            } else {
                tools.list.clone()
            },
            kwargs: {
                let mut kwargs = self.template_kwargs.clone();
                kwargs.extend(request.template_kwargs.clone());
                kwargs
            },
        };
        // Calls are read out of free text and out of the calls grammar's answer alike; a JSON
        // answer (response_format) is only JSON.
        let reads_calls = tools.in_use() && request.format == ResponseFormat::Text;
        let functions = tools.functions();
        let names: Vec<&str> = functions.iter().map(|(n, _)| n.as_str()).collect();
        let mut splitter = CallSplitter::default();
        // After a prompt that opens a think block, the reasoning is shown as it is: a call is
        // read only after `</think>` (a `<tool_call>` the model muses about is not one).
        let mut reasoning: Option<String> = None;
        let mut shown = String::new();
        let mut show = |t: &str, on_event: &mut dyn FnMut(api::Event<'_>) -> bool| {
            shown.push_str(t);
            t.is_empty() || on_event(api::Event::Text(t))
        };
        // A constrained answer (a JSON format, forced calls) is what the grammar makes from its
        // first token: no reasoning, even after a prompt that opens a think block.
        let free = params.grammar.is_none();
        let mut forward_event = |e: engine::Event<'_>| match e {
            engine::Event::Started {
                prompt_tokens,
                opens_think,
                ..
            } => {
                if opens_think && free {
                    reasoning = Some(String::new());
                }
                on_event(api::Event::Started {
                    prompt_tokens,
                    opens_think: opens_think && free,
                })
            }
            engine::Event::Text(t) if reads_calls => match reasoning.as_mut() {
                Some(held) => {
                    let (now, after) = think_gate(held, t);
                    if after.is_some() {
                        reasoning = None;
                    }
                    show(&now, on_event)
                        && after.is_none_or(|rest| show(&splitter.push(&rest), on_event))
                }
                None => show(&splitter.push(t), on_event),
            },
            engine::Event::Text(t) => show(t, on_event),
        };
        let g = self
            .answerer
            .generate(&messages, &inputs, &params, &mut forward_event)
            .map_err(refusal)?;
        let mut finish = match g.finish {
            FinishReason::Eos(_) | FinishReason::Stop(_) => Finish::Stop,
            FinishReason::MaxTokens | FinishReason::ContextFull => Finish::Length,
            FinishReason::Cancelled => return Err(api::EngineError::Cancelled),
        };
        let mut tool_calls = Vec::new();
        if let Some(held) = reasoning.take() {
            // The answer ended inside its reasoning: what was held is reasoning too.
            show(&held, on_event);
        }
        if reads_calls {
            let parsed = splitter.finish(&names);
            show(&parsed.text, on_event);
            tool_calls = parsed
                .calls
                .into_iter()
                .map(|c| api::ToolCall {
                    id: api::new_call_id(),
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect();
            // parallel_tool_calls false: at most one call (the grammar makes one; free text may
            // hold more, of which the first is kept).
            if !tools.parallel {
                tool_calls.truncate(1);
            }
            if !tool_calls.is_empty() && finish == Finish::Stop {
                finish = Finish::ToolCalls;
            }
        }
        Ok(Completion {
            text: shown,
            reasoning: String::new(),
            tool_calls,
            prompt_tokens: g.prompt_tokens,
            completion_tokens: g.ids.len(),
            ids: g.ids,
            finish,
            prompt_time: g.timings.tower + g.timings.prefill,
            answer_time: g.timings.decode,
        })
    }
}

/// Reasoning text `piece` added to what `held` keeps back: (the text to show now, the text after
/// `</think>` once the tag has come). The tag itself is shown with the reasoning; an end of the
/// text that could begin it is held until the next piece.
fn think_gate(held: &mut String, piece: &str) -> (String, Option<String>) {
    use server::think::{tag_prefix_start, CLOSE};
    held.push_str(piece);
    if let Some(i) = held.find(CLOSE) {
        let rest = held.split_off(i + CLOSE.len());
        return (std::mem::take(held), Some(rest));
    }
    let rest = held.split_off(tag_prefix_start(held));
    (std::mem::replace(held, rest), None)
}

/// The constraint a request asks for: its response format's, or the calls grammar (in the
/// template's `form`) of tool_choice "required" (any of the tools) or a named function (that
/// one).
fn grammar(request: &ChatRequest, form: CallForm) -> engine::Result<Option<Grammar>> {
    match &request.format {
        ResponseFormat::JsonObject => return Ok(Some(Grammar::JsonObject)),
        ResponseFormat::JsonSchema(schema) => return Ok(Some(Grammar::JsonSchema(schema.clone()))),
        ResponseFormat::Text => {}
    }
    let tools = &request.tools;
    let functions: Vec<FunctionTool> = tools
        .functions()
        .into_iter()
        .filter(|(name, _)| match &tools.choice {
            ToolChoice::Required => true,
            ToolChoice::Function(n) => n == name,
            ToolChoice::None | ToolChoice::Auto => false,
        })
        .map(|(name, parameters)| FunctionTool { name, parameters })
        .collect();
    if functions.is_empty() {
        return Ok(None);
    }
    calls_grammar(&functions, tools.parallel, form)
        .map(Some)
        .map_err(EngineError::Grammar)
}

impl<A: Answerer> ServerEngine<A> {
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
                            Ok(Content::Image(self.answerer.image(name, bytes)?))
                        }
                    })
                    .collect::<engine::Result<Vec<_>>>()?;
                let role = match m.role {
                    api::Role::System => Role::System,
                    api::Role::User => Role::User,
                    api::Role::Assistant => Role::Assistant,
                    api::Role::Tool => Role::Tool,
                };
                Ok(Message {
                    tool_calls: m
                        .tool_calls
                        .iter()
                        .map(|c| ToolCall {
                            id: c.id.clone(),
                            name: c.name.clone(),
                            arguments: c.arguments.clone(),
                        })
                        .collect(),
                    tool_call_id: m.tool_call_id.clone(),
                    reasoning_content: m.reasoning.clone(),
                    ..Message::new(role, content)
                })
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
        // The request's schema or a tool's parameters schema, refused by the constraint parser.
        EngineError::Grammar(m) => api::EngineError::Invalid(format!(
            "response_format or tools: the schema is refused by the constraint: {m}"
        )),
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
    args.model
        .template_inputs()
        .check()
        .map_err(|e| format!("--chat-template-kwargs: {e}"))?;
    let session = crate::open_session(&args.model)?;
    let parallel = parallel(args, session.kv_bytes_per_sequence())?;
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
        thinking: session.format().template.thinks(),
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
        log_requests: !args.quiet,
    };
    let model = format!(
        "{} ({} backend, context {}",
        info.id, info.backend, info.context
    );
    let template_kwargs = args.model.template_inputs().kwargs;
    let engines: Vec<Box<dyn ChatEngine>> = if parallel == 1 {
        vec![Box::new(ServerEngine {
            answerer: session,
            template_kwargs: template_kwargs.clone(),
        })]
    } else {
        let images = session.images();
        let scheduler = SchedulerOptions {
            parallel,
            prefill_chunk: args.prefill_chunk,
            drafts: args.model.drafts.n,
        };
        let (handle, _thread) = Scheduler::start(session, scheduler).map_err(|e| e.to_string())?;
        (0..parallel)
            .map(|_| -> Box<dyn ChatEngine> {
                Box::new(ServerEngine {
                    answerer: Parallel {
                        handle: handle.clone(),
                        images: images.clone(),
                    },
                    template_kwargs: template_kwargs.clone(),
                })
            })
            .collect()
    };
    let model = format!("{model}, {parallel} at once)");
    server::serve(options, info, engines, |addr| {
        // bench_serve and the tests read the address from this line.
        eprintln!("xdna-vl serve: {model}: listening on http://{addr}");
    })
    .map_err(|e| e.to_string())?;
    eprintln!("xdna-vl serve: stopped");
    Ok(())
}

/// `--parallel`, or as many conversations as `--kv-budget-mib` holds (at most 8); refused by name
/// when the budget cannot hold them.
fn parallel(args: &ServeArgs, per_sequence: usize) -> Result<usize, String> {
    if args.prefill_chunk == 0 {
        return Err("--prefill-chunk 0: a step must prefill at least one row".into());
    }
    let mib = |b: usize| b.div_ceil(1 << 20);
    let budget = args.kv_budget_mib << 20;
    let fits = budget / per_sequence.max(1);
    if fits == 0 {
        return Err(format!(
            "--kv-budget-mib {}: one conversation's KV cache of --ctx {} tokens takes {} MiB; raise \
             --kv-budget-mib or lower --ctx",
            args.kv_budget_mib,
            args.model.ctx,
            mib(per_sequence)
        ));
    }
    match args.parallel {
        Some(0) => Err("--parallel 0: at least one conversation must run".into()),
        Some(n) if n > fits => Err(format!(
            "--parallel {n}: {n} KV caches of --ctx {} tokens take {} MiB, over --kv-budget-mib {} \
             (it holds {fits}); raise --kv-budget-mib, lower --ctx or --parallel",
            args.model.ctx,
            mib(n * per_sequence),
            args.kv_budget_mib
        )),
        Some(n) => Ok(n),
        None => Ok(fits.min(8)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use server::chat::{Part, Tools};

    /// Answers with `pieces` as its streamed text, whatever it is asked; keeps the tools and the
    /// grammar it was given.
    struct Scripted {
        pieces: Vec<String>,
        seen: Vec<(usize, Option<Grammar>)>,
        /// The template variables of each request.
        kwargs: Vec<serde_json::Value>,
        form: CallForm,
        /// Whether its prompt opens a think block (Qwen3.5's generation prompt).
        opens_think: bool,
    }

    impl Scripted {
        fn new(pieces: &[&str], form: CallForm, opens_think: bool) -> Scripted {
            Scripted {
                pieces: pieces.iter().map(|p| p.to_string()).collect(),
                seen: Vec::new(),
                kwargs: Vec::new(),
                form,
                opens_think,
            }
        }
    }

    impl Answerer for Scripted {
        fn image(&self, name: &str, _: &[u8]) -> engine::Result<engine::Image> {
            Err(EngineError::Prompt(format!("{name}: no images here")))
        }
        fn default_sampling(&self) -> SamplingParams {
            SamplingParams::default()
        }
        fn call_form(&self) -> CallForm {
            self.form
        }
        fn generate(
            &mut self,
            _: &[Message],
            inputs: &TemplateInputs,
            params: &SamplingParams,
            on_event: &mut dyn FnMut(engine::Event<'_>) -> bool,
        ) -> engine::Result<Generation> {
            self.seen.push((inputs.tools.len(), params.grammar.clone()));
            self.kwargs
                .push(serde_json::Value::Object(inputs.kwargs.clone()));
            on_event(engine::Event::Started {
                prompt_tokens: 1,
                image_tokens: 0,
                reused_tokens: 0,
                opens_think: self.opens_think,
            });
            for p in &self.pieces {
                on_event(engine::Event::Text(p));
            }
            Ok(Generation {
                text: self.pieces.concat(),
                ids: vec![0; self.pieces.len()],
                finish: FinishReason::Eos(0),
                prompt_tokens: 1,
                image_tokens: 0,
                reused_tokens: 0,
                timings: Default::default(),
            })
        }
    }

    /// (streamed text, completion) of `pieces` answered under `tools`.
    fn answer(pieces: &[&str], tools: Tools) -> (String, Completion, Scripted) {
        let (streamed, c, s) = answer_in(CallForm::Json, pieces, tools);
        (streamed, c.unwrap(), s)
    }

    /// `pieces` as the answer of a checkpoint whose template writes calls in `form`.
    fn answer_in(
        form: CallForm,
        pieces: &[&str],
        tools: Tools,
    ) -> (String, Result<Completion, api::EngineError>, Scripted) {
        answer_after(false, form, pieces, tools)
    }

    /// A server engine over a scripted answerer (no model), no template arguments.
    fn scripted(pieces: &[&str], form: CallForm, opens_think: bool) -> ServerEngine<Scripted> {
        ServerEngine {
            answerer: Scripted::new(pieces, form, opens_think),
            template_kwargs: Default::default(),
        }
    }

    /// A request of one user message, "hi".
    fn hi() -> ChatRequest {
        ChatRequest {
            messages: vec![api::Message::new(
                api::Role::User,
                vec![Part::Text("hi".into())],
            )],
            ..ChatRequest::default()
        }
    }

    /// `answer_in` after a prompt that opens a think block (`opens_think`) or not.
    fn answer_after(
        opens_think: bool,
        form: CallForm,
        pieces: &[&str],
        tools: Tools,
    ) -> (String, Result<Completion, api::EngineError>, Scripted) {
        let mut engine = scripted(pieces, form, opens_think);
        let request = ChatRequest { tools, ..hi() };
        let mut streamed = String::new();
        let c = engine.complete(&request, &mut |e| {
            if let api::Event::Text(t) = e {
                streamed.push_str(t);
            }
            true
        });
        (streamed, c, engine.answerer)
    }

    /// After a prompt that opens a think block, a call is read only after `</think>`: a
    /// `<tool_call>` in the reasoning is shown as text (the tag split across pieces), one after it
    /// is a call. Control: the same reasoning after a prompt that opens nothing is read as a call.
    #[test]
    fn calls_in_the_reasoning_are_not_calls() {
        let musing = ["I could ", CALL, " maybe.</th", "ink>\n\n", CALL];
        let (streamed, c, _) =
            answer_after(true, CallForm::Json, &musing, tools(ToolChoice::Auto, true));
        let c = c.unwrap();
        assert_eq!(streamed, format!("I could {CALL} maybe.</think>\n\n"));
        assert_eq!(c.tool_calls.len(), 1, "{:?}", c.tool_calls);
        assert_eq!(c.finish, Finish::ToolCalls);
        // No `</think>`: all reasoning, no call.
        let (streamed, c, _) = answer_after(
            true,
            CallForm::Json,
            &["I could ", CALL],
            tools(ToolChoice::Auto, true),
        );
        let c = c.unwrap();
        assert_eq!(streamed, format!("I could {CALL}"));
        assert!(c.tool_calls.is_empty());
        assert_eq!(c.finish, Finish::Stop);
        // Control: no open think block, the first call is read (and the second too).
        let (_, c, _) = answer_after(
            false,
            CallForm::Json,
            &musing,
            tools(ToolChoice::Auto, true),
        );
        assert_eq!(c.unwrap().tool_calls.len(), 2);
    }

    fn tools(choice: ToolChoice, parallel: bool) -> Tools {
        Tools {
            list: vec![serde_json::json!({"type": "function", "function": {"name": "add"}})],
            choice,
            parallel,
        }
    }

    const CALL: &str = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";

    #[test]
    fn auto_reads_calls_and_leaves_a_malformed_one_as_text() {
        let (streamed, c, seen) = answer(
            &["Sure.\n", "<tool_", &CALL[6..]],
            tools(ToolChoice::Auto, true),
        );
        assert_eq!(streamed, "Sure.\n");
        assert_eq!(c.text, "Sure.\n");
        assert_eq!(c.finish, Finish::ToolCalls);
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "add");
        assert_eq!(c.tool_calls[0].arguments, r#"{"a":1}"#);
        // auto: the tools go to the template, no grammar.
        assert_eq!(seen.seen, vec![(1, None)]);

        for bad in [
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1\n</tool_call>",
            "<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}",
        ] {
            let (streamed, c, _) = answer(&["x ", bad], tools(ToolChoice::Auto, true));
            assert_eq!(streamed, format!("x {bad}"), "shown whole, as text");
            assert_eq!(c.text, streamed);
            assert!(c.tool_calls.is_empty());
            assert_eq!(c.finish, Finish::Stop);
        }
    }

    #[test]
    fn choices_pick_the_grammar_and_the_tools_shown() {
        let two = format!("{CALL}\n{CALL}");
        // parallel false keeps one call.
        let (_, c, _) = answer(&[&two], tools(ToolChoice::Auto, false));
        assert_eq!(c.tool_calls.len(), 1);
        let (_, c, _) = answer(&[&two], tools(ToolChoice::Auto, true));
        assert_eq!(c.tool_calls.len(), 2);
        assert_ne!(c.tool_calls[0].id, c.tool_calls[1].id);
        // none: no tools shown, no calls read (the text stays text).
        let (streamed, c, seen) = answer(&[CALL], tools(ToolChoice::None, true));
        assert_eq!(streamed, CALL);
        assert!(c.tool_calls.is_empty());
        assert_eq!(seen.seen, vec![(0, None)]);
        // required and named: the calls grammar.
        for choice in [ToolChoice::Required, ToolChoice::Function("add".into())] {
            let (_, c, seen) = answer(&[CALL], tools(choice, false));
            assert_eq!(c.finish, Finish::ToolCalls);
            let Some(Grammar::Lark(g)) = &seen.seen[0].1 else {
                panic!("{:?}", seen.seen)
            };
            assert!(
                g.starts_with("start: call\n") && g.contains(r#"{"const":"add"}"#),
                "{g}"
            );
        }
    }

    /// The prompt's open think block reaches the server for a free answer only: a constrained one
    /// (a JSON format, forced calls) is the grammar's from its first token, with no reasoning.
    #[test]
    fn an_open_think_block_is_told_for_free_answers_only() {
        let opens = |format: ResponseFormat, tools: Tools| {
            let mut engine = scripted(&["{}"], CallForm::Json, true);
            let request = ChatRequest {
                format,
                tools,
                ..hi()
            };
            let mut told = None;
            engine
                .complete(&request, &mut |e| {
                    if let api::Event::Started { opens_think, .. } = e {
                        told = Some(opens_think);
                    }
                    true
                })
                .unwrap();
            told.unwrap()
        };
        assert!(opens(ResponseFormat::Text, Tools::default()));
        assert!(opens(ResponseFormat::Text, tools(ToolChoice::Auto, true)));
        assert!(!opens(ResponseFormat::JsonObject, Tools::default()));
        assert!(!opens(
            ResponseFormat::Text,
            tools(ToolChoice::Required, true)
        ));
    }

    /// An assistant message's reasoning goes to the template as its `reasoning_content`.
    #[test]
    fn history_reasoning_becomes_the_templates_reasoning_content() {
        let engine = scripted(&[], CallForm::Json, false);
        let request = ChatRequest {
            messages: vec![
                api::Message::new(api::Role::User, vec![Part::Text("hi".into())]),
                api::Message {
                    reasoning: Some("greet back".into()),
                    ..api::Message::new(api::Role::Assistant, vec![Part::Text("hello".into())])
                },
            ],
            ..ChatRequest::default()
        };
        let json: Vec<serde_json::Value> = engine
            .messages(&request)
            .unwrap()
            .iter()
            .map(Message::to_template_json)
            .collect();
        assert_eq!(
            json[1],
            serde_json::json!({"role": "assistant", "content": "hello",
                "reasoning_content": "greet back"})
        );
        // Control: a message without reasoning has no such field.
        assert!(json[0].get("reasoning_content").is_none());
    }

    /// `--chat-template-kwargs` reach every request's template, under the request's own.
    #[test]
    fn server_template_variables_sit_under_the_requests_own() {
        let mut engine = ServerEngine {
            answerer: Scripted::new(&["ok"], CallForm::Json, false),
            template_kwargs: serde_json::json!({"enable_thinking": false, "a": 1})
                .as_object()
                .unwrap()
                .clone(),
        };
        let mut request = ChatRequest {
            messages: vec![api::Message::new(
                api::Role::User,
                vec![Part::Text("hi".into())],
            )],
            ..ChatRequest::default()
        };
        engine.complete(&request, &mut |_| true).unwrap();
        request.template_kwargs = serde_json::json!({"enable_thinking": true})
            .as_object()
            .unwrap()
            .clone();
        engine.complete(&request, &mut |_| true).unwrap();
        assert_eq!(
            engine.answerer.kwargs,
            vec![
                serde_json::json!({"enable_thinking": false, "a": 1}),
                serde_json::json!({"enable_thinking": true, "a": 1}),
            ]
        );
    }

    #[test]
    fn forced_calls_take_the_form_of_the_checkpoints_template() {
        let xml = "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
        let add = |parameters: serde_json::Value| Tools {
            list: vec![serde_json::json!({"type": "function",
                "function": {"name": "add", "parameters": parameters}})],
            choice: ToolChoice::Required,
            parallel: false,
        };
        let number =
            serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let (_, c, seen) = answer_in(CallForm::Xml, &[xml], add(number.clone()));
        let c = c.unwrap();
        assert_eq!(c.finish, Finish::ToolCalls);
        assert_eq!(c.tool_calls[0].arguments, r#"{"a":1}"#);
        let Some(Grammar::Lark(g)) = &seen.seen[0].1 else {
            panic!("{:?}", seen.seen)
        };
        assert!(g.contains(r#""<tool_call>\n<function=" (f0)"#), "{g}");
        // Control: a Qwen3-VL template's checkpoint gets Hermes' JSON form.
        let (_, _, seen) = answer_in(CallForm::Json, &[CALL], add(number));
        let Some(Grammar::Lark(g)) = &seen.seen[0].1 else {
            panic!("{:?}", seen.seen)
        };
        assert!(
            g.contains(r#"{"const":"add"}"#) && !g.contains("<function="),
            "{g}"
        );
        // What the XML form cannot enforce is refused by name, before any generation.
        let pattern = serde_json::json!({"type": "object",
            "properties": {"a": {"type": "string", "pattern": "^[0-9]+$"}}});
        let (_, c, seen) = answer_in(CallForm::Xml, &[xml], add(pattern));
        match c {
            Err(api::EngineError::Invalid(m)) => {
                assert!(
                    m.contains("parameter \"a\"") && m.contains("\"pattern\""),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(seen.seen.is_empty());
    }
}
