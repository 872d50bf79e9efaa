//! A `Session`: the decoder with its KV cache, the next cache slot and the next rotary position,
//! the conversation so far, and the one generate loop every front end calls. A new prompt reuses
//! the cached rows it shares with the previous one (same ids and, on image rows, the same picture)
//! and prefills only the rest.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use compute::{Runtime, RuntimeOptions};
use decoder::{decode_step, Decoder, DecoderOptions, HybridInputs, KvDtype, Logits};
use packs::Pack;
use vision::preprocess::PreprocessOptions;

use crate::assets::ChatAssets;
use crate::decoding::{Decoding, Next};
use crate::drafts::{DraftAblation, DraftSource, Drafter, PromptLookup, MAX_DRAFTS, MTP_VOCAB};
use crate::error::{EngineError, Result};
use crate::format::ChatFormat;
use crate::images::{ImageEncoder, ImageSettings, TowerEncoder};
use crate::message::{Image, Message};
use crate::mtp_drafts::MtpDrafter;
use crate::prompt::{Prompt, PromptAblation, PromptBuilder};
use crate::sampling::SamplingParams;
use crate::template::TemplateInputs;
use vision::tower::VisionOutput;

#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// KV cache slots: the longest prompt + answer.
    pub context: usize,
    /// Threads and where the matrix products run (the device ticket's holder named there).
    pub runtime: RuntimeOptions,
    pub kv_dtype: KvDtype,
    /// Deliberate mistakes, for controls.
    pub ablation: PromptAblation,
    /// Draft tokens a decode step may carry (0 = off, at most [`MAX_DRAFTS`]): the sampled
    /// token and up to this many guesses go through one forward and the rows whose guesses the
    /// sampler confirms are kept (greedy: the argmax equals the guess; sampling: the speculative
    /// acceptance rule). The answer is the same as without drafts (greedy: the ids; sampling:
    /// the distribution).
    pub drafts: usize,
    /// Where the drafts come from: prompt lookup, or the pack's MTP head (Qwen3.5).
    pub draft_source: DraftSource,
    /// MTP drafts propose only among the first this many token ids (`None`: all of them;
    /// [`Decoder::set_mtp_vocab`]). Answers are the same either way; only how often a draft is
    /// right and what a draft costs change.
    pub mtp_vocab: Option<usize>,
    /// Deliberate mistakes in the draft windows' rollback, for controls.
    pub draft_ablation: DraftAblation,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            context: 4096,
            runtime: RuntimeOptions::default(),
            kv_dtype: KvDtype::F32,
            ablation: PromptAblation::default(),
            drafts: 0,
            draft_source: DraftSource::PromptLookup,
            mtp_vocab: Some(MTP_VOCAB),
            draft_ablation: DraftAblation::default(),
        }
    }
}

/// Why an answer ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id was sampled (not shown).
    Eos(u32),
    /// A stop string was met (not shown).
    Stop(String),
    /// `max_tokens` were produced.
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
    /// The caller's event callback returned false (a client went away).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Eos(_) => "eos",
            FinishReason::Stop(_) => "stop",
            FinishReason::MaxTokens => "max_tokens",
            FinishReason::ContextFull => "context_full",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// The vision tower over the prompt's new images.
    pub tower: Duration,
    /// The prefill of the rows not reused from the cache.
    pub prefill: Duration,
    pub prefilled_tokens: usize,
    /// Of the prompt rows not prefilled, those copied from a running sequence's cache (`serve
    /// --parallel`: a prompt that starts as a running one does).
    pub copied_tokens: usize,
    /// Decode steps (each feeds one sampled token).
    pub decode: Duration,
    pub decode_steps: usize,
    /// Forwards of the decode steps: as many as the steps without drafts, fewer when drafts were
    /// accepted (a forward then fed the sampled token and its drafts).
    pub decode_forwards: usize,
    /// Draft tokens fed, and those the sampler confirmed.
    pub drafts_proposed: usize,
    pub drafts_accepted: usize,
    /// From the call to the first sampled token (rendering, tower and prefill included).
    pub time_to_first_token: Duration,
}

impl Timings {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        per_second(self.prefilled_tokens, self.prefill)
    }
    pub fn decode_tokens_per_s(&self) -> f64 {
        per_second(self.decode_steps, self.decode)
    }
}

fn per_second(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// What a generation reports while it works.
#[derive(Debug)]
pub enum Event<'a> {
    /// The prompt fits and its images were encoded; the prefill is done and sampling starts.
    Started {
        prompt_tokens: usize,
        image_tokens: usize,
        reused_tokens: usize,
        /// The prompt ends inside an open think block ([`Prompt::opens_think`]): the answer
        /// starts with a thinking model's reasoning.
        opens_think: bool,
    },
    /// More answer text (whole UTF-8 characters, never part of a stop string).
    Text(&'a str),
}

/// One answer.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The answer's text (special tokens skipped, stopped before a stop string).
    pub text: String,
    /// Every sampled id, the end-of-sequence id included.
    pub ids: Vec<u32>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub image_tokens: usize,
    /// Prompt rows taken from the cache instead of prefilled.
    pub reused_tokens: usize,
    pub timings: Timings,
}

/// What a cache row holds: its id and, for an image row, which picture and which of its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowKey {
    pub id: u32,
    pub image: Option<(u64, usize)>,
}

/// A session's model: decoder, chat format, tower, context.
pub(crate) struct SessionParts {
    pub decoder: Decoder,
    pub format: ChatFormat,
    pub encoder: Option<Box<dyn ImageEncoder>>,
    pub no_encoder: String,
    pub context: usize,
    pub ablation: PromptAblation,
    /// Drafts may come from the MTP head (`--drafts mtp`): the decoder keeps every row's hidden
    /// state and its head's logits cover the chosen ids.
    pub mtp: bool,
}

pub struct Session {
    forward: Decoder,
    format: ChatFormat,
    encoder: Option<Box<dyn ImageEncoder>>,
    /// Why there is no encoder (shown when a prompt has an image).
    no_encoder: String,
    context: usize,
    ablation: PromptAblation,
    /// Draft tokens per decode step (0 = off) and where they come from.
    drafts: usize,
    drafter: Box<dyn Drafter>,
    /// With `--drafts mtp`: the MTP head's drafter (it replaces `drafter`).
    mtp: Option<MtpDrafter>,
    draft_ablation: DraftAblation,
    /// The rows the KV cache holds, in slot order (always `forward.next_slot()` long).
    cached: Vec<RowKey>,
    /// The rotary position of the next token fed (all three planes).
    next_rotary_pos: i64,
    history: Vec<Message>,
    /// Last-row logits, reused step to step.
    logits: Vec<f32>,
}

impl Session {
    /// A session over `pack` with the chat files `assets`; the pack's vision tower encodes images.
    pub fn new(pack: &Arc<Pack>, assets: &ChatAssets, options: &SessionOptions) -> Result<Session> {
        let format = ChatFormat::new(assets)?;
        let vocab = pack.semantics().vocab_size;
        for (name, id) in [
            ("<|im_end|>", format.tokenizer.special.im_end),
            ("<|image_pad|>", format.tokenizer.special.image_pad),
        ] {
            if id as usize >= vocab {
                return Err(EngineError::Tokenizer(format!(
                    "{}: {name} is id {id}, outside the pack's vocabulary (0..{vocab}): a tokenizer for another model",
                    assets.source_name
                )));
            }
        }
        if let Some(image_id) = pack.semantics().image_token_id {
            if image_id != format.tokenizer.special.image_pad {
                return Err(EngineError::Tokenizer(format!(
                    "{}: <|image_pad|> is id {}, the pack's image_token_id is {image_id}",
                    assets.source_name, format.tokenizer.special.image_pad
                )));
            }
        }
        if options.drafts > MAX_DRAFTS {
            return Err(EngineError::Sampling(format!(
                "drafts {} must be in 0..={MAX_DRAFTS}",
                options.drafts
            )));
        }
        let runtime = Runtime::new(&options.runtime)?;
        let mut forward = Decoder::new(
            pack,
            &runtime,
            DecoderOptions {
                capacity: options.context,
                kv_dtype: options.kv_dtype,
                ..DecoderOptions::default()
            },
        )?;
        let mtp = match options.draft_source {
            DraftSource::PromptLookup => None,
            DraftSource::Mtp if forward.has_mtp() => {
                // The head reads every row's final hidden state.
                forward.keep_last_hidden(true);
                if let Some(ids) = options.mtp_vocab {
                    forward.set_mtp_vocab(ids)?;
                }
                Some(MtpDrafter::new(&forward, options.context, options.kv_dtype))
            }
            DraftSource::Mtp => {
                return Err(EngineError::Sampling(format!(
                    "--drafts mtp: {} has no MTP head (mtp.*: Qwen3.5 and Qwen3.5-MoE \
                     checkpoints carry one, packs build keeps it); use --drafts N (prompt lookup)",
                    pack.path().display()
                )))
            }
        };
        let mut session = Session {
            forward,
            format,
            encoder: None,
            no_encoder: String::new(),
            context: options.context,
            ablation: options.ablation,
            drafts: options.drafts,
            drafter: Box::new(PromptLookup::default()),
            mtp,
            draft_ablation: options.draft_ablation,
            cached: Vec::new(),
            next_rotary_pos: 0,
            history: Vec::new(),
            logits: Vec::new(),
        };
        match TowerEncoder::new(pack, &runtime) {
            Ok(tower) => session.set_image_encoder(Box::new(tower)),
            Err(e) => session.no_encoder = e.to_string(),
        }
        Ok(session)
    }

    /// Opens the pack at `path` (its chat files from `assets`, or from the pack).
    pub fn open(
        path: &Path,
        assets: Option<&ChatAssets>,
        options: &SessionOptions,
    ) -> Result<Session> {
        let pack = Arc::new(Pack::open(path)?);
        let assets = match assets {
            Some(a) => a.clone(),
            None => crate::assets::from_pack(&pack)?,
        };
        Session::new(&pack, &assets, options)
    }

    /// Replaces the image encoder (a tower registers its weights on the session's runtime:
    /// [`Session::runtime`]).
    pub fn set_image_encoder(&mut self, encoder: Box<dyn ImageEncoder>) {
        self.encoder = Some(encoder);
    }

    /// Replaces where draft tokens come from (prompt lookup by default); they are used when
    /// [`SessionOptions::drafts`] (or [`Session::set_drafts`]) is above 0.
    pub fn set_drafter(&mut self, drafter: Box<dyn Drafter>) {
        self.drafter = drafter;
    }

    /// Draft tokens per greedy decode step from now on (0 = off, at most [`MAX_DRAFTS`]).
    pub fn set_drafts(&mut self, drafts: usize) {
        self.drafts = drafts.min(MAX_DRAFTS);
    }

    /// The model without the conversation: what a scheduler of several sequences takes over.
    pub(crate) fn into_parts(self) -> SessionParts {
        SessionParts {
            decoder: self.forward,
            format: self.format,
            encoder: self.encoder,
            no_encoder: self.no_encoder,
            context: self.context,
            ablation: self.ablation,
            mtp: self.mtp.is_some(),
        }
    }

    /// Whether prompts may hold images: the pack has a vision tower and its preprocessing
    /// settings.
    pub fn takes_images(&self) -> bool {
        self.encoder.is_some() && self.forward.semantics().preprocess.is_some()
    }

    /// The runtime the decoder and the tower run on.
    pub fn runtime(&self) -> &Runtime {
        self.forward.runtime()
    }

    pub fn format(&self) -> &ChatFormat {
        &self.format
    }
    pub fn forward(&self) -> &Decoder {
        &self.forward
    }
    pub fn history(&self) -> &[Message] {
        &self.history
    }
    /// Bytes one conversation's KV cache of the context's slots takes, with its MTP head's
    /// (one more attention layer) when the head drafts.
    pub fn kv_bytes_per_sequence(&self) -> usize {
        let head = self.mtp.as_ref().map_or(0, MtpDrafter::bytes_per_token);
        (self.forward.kv().bytes_per_token() + head) * self.context
    }
    pub fn context(&self) -> usize {
        self.context
    }
    /// The cache slot the next row goes to.
    pub fn next_slot(&self) -> usize {
        self.forward.next_slot()
    }
    /// The rotary position the next row fed rotates by.
    pub fn next_rotary_pos(&self) -> i64 {
        self.next_rotary_pos
    }
    /// The checkpoint's recommended sampling (generation config) with its eos ids.
    pub fn default_sampling(&self) -> SamplingParams {
        self.format.default_sampling()
    }

    /// Adds a turn to the conversation without answering it (a system message, or a restored
    /// conversation); the next `chat` renders it with the rest.
    pub fn push_history(&mut self, message: Message) {
        self.history.push(message);
    }

    /// Image tokens `image` takes in a prompt (t*h*w / merge^2).
    pub fn image_tokens(&self, image: &Image) -> usize {
        image.patches.tokens(self.builder().merge)
    }

    /// Forgets the conversation and the cache.
    pub fn reset(&mut self) {
        self.history.clear();
        self.forward.reset();
        if let Some(m) = self.mtp.as_mut() {
            m.truncate(0);
        }
        self.cached.clear();
        self.next_rotary_pos = 0;
    }

    /// Decodes and preprocesses an encoded picture (PNG, JPEG, WebP, GIF) given as bytes; `name`
    /// names it in messages.
    pub fn image_from_bytes(&self, name: &str, bytes: &[u8]) -> Result<Image> {
        self.images().from_bytes(name, bytes)
    }

    /// The pack's picture settings (the scheduler's handles decode with them too).
    pub fn images(&self) -> ImageSettings {
        ImageSettings::of(self.forward.pack())
    }

    /// Decodes and preprocesses a picture with the pack's settings.
    pub fn load_image(&self, path: &Path) -> Result<Image> {
        if !path.is_file() {
            return Err(EngineError::Image {
                name: path.display().to_string(),
                what: "no such file".into(),
            });
        }
        let images = self.images();
        let pre = images.settings(&path.display().to_string())?;
        crate::images::load_image(path, pre, &PreprocessOptions::default())
    }

    fn builder(&self) -> PromptBuilder<'_> {
        PromptBuilder {
            tokenizer: &self.format.tokenizer,
            template: &self.format.template,
            merge: self.encoder.as_ref().map_or(2, |e| e.merge_size()),
            ablation: self.ablation,
        }
    }

    /// The prompt `messages` make (text, ids, image places, planes).
    pub fn prompt(&self, messages: &[Message]) -> Result<Prompt> {
        self.builder().build(messages)
    }

    /// A chat turn: `user` joins the history, the answer is generated on the whole history (its
    /// cached prefix reused) and joins it too. On error the history is as before.
    pub fn chat(
        &mut self,
        user: Message,
        params: &SamplingParams,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Generation> {
        self.chat_with(user, &TemplateInputs::default(), params, on_event)
    }

    /// [`Session::chat`] with `inputs` given to the chat template.
    pub fn chat_with(
        &mut self,
        user: Message,
        inputs: &TemplateInputs,
        params: &SamplingParams,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Generation> {
        self.history.push(user);
        let messages = self.history.clone();
        match self.generate_with(&messages, inputs, params, on_event) {
            Ok(g) => {
                self.history.push(Message::assistant(g.text.clone()));
                Ok(g)
            }
            Err(e) => {
                self.history.pop();
                Err(e)
            }
        }
    }

    /// Answers `messages` (a whole conversation, ending with a user turn). `on_event` hears when
    /// sampling starts and receives the answer's text as it is produced, never half a character;
    /// returning false stops the answer there ([`FinishReason::Cancelled`]).
    pub fn generate(
        &mut self,
        messages: &[Message],
        params: &SamplingParams,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Generation> {
        self.generate_with(messages, &TemplateInputs::default(), params, on_event)
    }

    /// [`Session::generate`] with `inputs` given to the chat template: OpenAI's function tools
    /// (the template tells the model how to call them) and extra variables.
    pub fn generate_with(
        &mut self,
        messages: &[Message],
        inputs: &TemplateInputs,
        params: &SamplingParams,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Generation> {
        let start = Instant::now();
        let params = answer_params(params, &self.format)?;
        let prompt = self.builder().build_with(messages, inputs)?;
        let rows = prompt_fits(&prompt, self.context)?;
        let mut decoding = Decoding::new(params, &prompt.ids, &self.format.tokenizer)?;
        let mut timings = Timings::default();
        let reused = self.prefill(&prompt, &mut timings)?;
        let started = on_event(Event::Started {
            prompt_tokens: rows,
            image_tokens: prompt.image_tokens(),
            reused_tokens: reused,
            opens_think: prompt.opens_think(),
        });
        let tokenizer = &self.format.tokenizer;
        let mut on_text = |t: &str| on_event(Event::Text(t));
        let mut finish = FinishReason::Cancelled;
        let decode_start = Instant::now();
        // Greedy answers keep a draft's row when the argmax equals it; sampled ones by the
        // speculative acceptance rule (`Sampler::sample_after_draft`): same distribution.
        // Prompt lookup rarely guesses a constrained answer's next tokens: no drafts there.
        let k = if decoding.is_constrained() {
            0
        } else {
            self.drafts
        };
        let vocab = self.forward.semantics().vocab_size;
        // The last forward's rows: its first cache slot, the drafts fed after its first row, all
        // its rows' logits, and the row whose logits `self.logits` holds.
        let mut window = Window::default();
        // A cancel at the start (the caller stopped listening) decodes nothing.
        if started {
            loop {
                // The slots kept so far: the window's rows up to the current one.
                let kept = window.kept(self.forward.next_slot());
                let cache_full = kept >= self.context;
                let draft = window.drafts.get(window.row).copied();
                let next =
                    decoding.next(&mut self.logits, tokenizer, cache_full, draft, &mut on_text)?;
                if decoding.ids().len() == 1 {
                    timings.time_to_first_token = start.elapsed();
                }
                let token = match next {
                    Next::Feed(token) => token,
                    Next::Done(f) => {
                        finish = f;
                        break;
                    }
                };
                timings.decode_steps += 1;
                if window.row < window.drafts.len() && window.drafts[window.row] == token {
                    // The draft fed after this row is the sampled token: its row is in the
                    // cache and its logits choose the next token, no forward.
                    window.row += 1;
                    timings.drafts_accepted += 1;
                    self.logits.clear();
                    self.logits
                        .extend_from_slice(&window.logits[window.row * vocab..][..vocab]);
                    continue;
                }
                roll_back(
                    &mut self.forward,
                    &mut self.cached,
                    &mut self.next_rotary_pos,
                    self.mtp.as_mut(),
                    self.draft_ablation,
                    kept,
                )?;
                // The sampled token and its drafts (as many as the cache has slots for).
                let room = (self.context - self.forward.next_slot()).saturating_sub(1);
                let drafts = if k == 0 {
                    Vec::new()
                } else if let Some(m) = self.mtp.as_mut() {
                    let mut d = m.propose(&mut self.forward, token, k.min(room))?;
                    d.truncate(k.min(room));
                    d
                } else {
                    let mut seen = prompt.ids.clone();
                    seen.extend_from_slice(decoding.ids());
                    let mut d = self.drafter.propose(&seen, k.min(room));
                    d.truncate(k.min(room));
                    d
                };
                let slot = self.forward.next_slot();
                let first_pos = self.next_rotary_pos;
                if drafts.is_empty() {
                    // Feed through the decoder (not `self.feed`: the tokenizer is borrowed).
                    let logits = decode_step(&mut self.forward, token, &mut self.next_rotary_pos)?;
                    self.logits.clear();
                    self.logits.extend_from_slice(logits);
                    if let Some(m) = self.mtp.as_mut() {
                        let hidden = self.forward.last_hidden();
                        m.ran_tokens(slot, hidden, &self.forward, (&[token], first_pos));
                    }
                    self.cached.push(RowKey {
                        id: token,
                        image: None,
                    });
                    window = Window::default();
                } else {
                    let mut rows = Vec::with_capacity(drafts.len() + 1);
                    rows.push(token);
                    rows.extend_from_slice(&drafts);
                    let logits = self.forward.step_batch(
                        &rows,
                        self.next_rotary_pos,
                        slot,
                        Logits::AllRows,
                    )?;
                    window.logits.clear();
                    window.logits.extend_from_slice(logits);
                    self.logits.clear();
                    self.logits.extend_from_slice(&window.logits[..vocab]);
                    if let Some(m) = self.mtp.as_mut() {
                        let hidden = self.forward.last_hidden();
                        m.ran_tokens(slot, hidden, &self.forward, (&rows, first_pos));
                    }
                    self.next_rotary_pos += rows.len() as i64;
                    timings.drafts_proposed += drafts.len();
                    for &id in &rows {
                        self.cached.push(RowKey { id, image: None });
                    }
                    window.start = slot;
                    window.row = 0;
                    window.drafts = drafts;
                }
                timings.decode_forwards += 1;
            }
        }
        // The rows past the last one whose logits were used are a window's rejected drafts.
        let kept = window.kept(self.forward.next_slot());
        roll_back(
            &mut self.forward,
            &mut self.cached,
            &mut self.next_rotary_pos,
            self.mtp.as_mut(),
            self.draft_ablation,
            kept,
        )?;
        timings.decode = decode_start.elapsed();
        let (text, ids) = decoding.finish(&finish, tokenizer, &mut on_text)?;
        Ok(Generation {
            text,
            ids,
            finish,
            prompt_tokens: rows,
            image_tokens: prompt.image_tokens(),
            reused_tokens: reused,
            timings,
        })
    }

    /// Brings the cache to `prompt`: keeps the rows it shares with what is cached, prefills the
    /// rest (running the tower on the images among them). Returns the rows reused.
    fn prefill(&mut self, prompt: &Prompt, timings: &mut Timings) -> Result<usize> {
        let rows = prompt.rows();
        let keys = row_keys(prompt);
        // The cache may hold rows of a failed step only up to the forward's slot.
        self.cached.truncate(self.forward.next_slot());
        let reuse = reuse_prefix(&self.cached, &keys, prompt, |r| self.forward.truncate(r));
        self.cached.truncate(reuse);

        let vision = match self.encoder.as_mut() {
            Some(encoder) => {
                let hidden = self.forward.semantics().hidden_size;
                encode_images(encoder.as_mut(), prompt, reuse, hidden, &mut timings.tower)?
            }
            None => refuse_images(prompt, reuse, &self.no_encoder)?,
        };
        let prefill_start = Instant::now();
        let new_rows = rows - reuse;
        let (embeds, hybrid) = prompt_input(&self.forward, prompt, reuse, vision.as_ref());
        let hidden = self.forward.semantics().hidden_size;
        let mut first = 0;
        let mut mtp_hidden = Vec::new();
        if self.forward.kv().recurrent.is_some() && new_rows > 1 {
            // A Qwen3.5 cache keeps its recurrent state before the prompt's last row: the next
            // turn (or the same prompt again) resumes from it; the last row is always prefilled.
            first = new_rows - 1;
            let head = hybrid.slice_rows(0, first, new_rows, hidden);
            self.forward.step_batch_embeds(
                &embeds[..first * hidden],
                &head,
                reuse,
                Logits::LastRow,
            )?;
            self.forward.checkpoint();
            mtp_hidden.extend_from_slice(self.forward.last_hidden());
        }
        let tail = hybrid.slice_rows(first, new_rows - first, new_rows, hidden);
        let logits = self.forward.step_batch_embeds(
            &embeds[first * hidden..],
            &tail,
            reuse + first,
            Logits::LastRow,
        )?;
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        if let Some(m) = self.mtp.as_mut() {
            m.ran(reuse, &self.forward, &embeds, &hybrid, &mtp_hidden);
            if first > 0 {
                m.keep_row_before(reuse + first);
            }
        }
        self.cached.extend_from_slice(&keys[reuse..]);
        self.next_rotary_pos = prompt.next_rotary_pos();
        timings.prefill = prefill_start.elapsed();
        timings.prefilled_tokens = new_rows;
        Ok(reuse)
    }
}

/// How many of `prompt`'s rows (`keys`) a cache holding `cached` rows keeps: the shared prefix,
/// but never the last row (its logits choose the first token) and never part of an image (its
/// rows are encoded whole); `truncate` cuts the cache and says what it kept (a recurrent
/// Qwen3.5 cache keeps only to a kept state, maybe less). The cache is cut on return.
pub(crate) fn reuse_prefix(
    cached: &[RowKey],
    keys: &[RowKey],
    prompt: &Prompt,
    mut truncate: impl FnMut(usize) -> usize,
) -> usize {
    let mut reuse = cached
        .iter()
        .zip(keys)
        .take_while(|(a, b)| a == b)
        .count()
        .min(keys.len().saturating_sub(1));
    loop {
        for img in &prompt.images {
            let (first, end) = (img.span.first_row, img.span.first_row + img.tokens);
            if first < reuse && reuse < end {
                reuse = first;
            }
        }
        let kept = truncate(reuse);
        if kept == reuse {
            return reuse;
        }
        reuse = kept;
    }
}

/// The request's sampling with the checkpoint's eos ids when it names none; bad parameters are
/// refused before the prompt is looked at.
pub(crate) fn answer_params(
    params: &SamplingParams,
    format: &ChatFormat,
) -> Result<SamplingParams> {
    let mut params = params.clone();
    if params.eos_ids.is_empty() {
        params.eos_ids = format.eos_ids();
    }
    params.validate()?;
    Ok(params)
}

/// The prompt's rows, refused by name when empty or over the context.
pub(crate) fn prompt_fits(prompt: &Prompt, context: usize) -> Result<usize> {
    let rows = prompt.rows();
    if rows == 0 {
        return Err(EngineError::Prompt(
            "the chat template rendered an empty prompt".into(),
        ));
    }
    if rows > context {
        return Err(EngineError::OverContext {
            prompt: rows,
            context,
        });
    }
    Ok(rows)
}

/// Forgets the cache rows from slot `kept` on (a draft window's rows past the last accepted one),
/// with their keys (`cached`), rotary positions (text rows: one position each) and the MTP
/// head's rows.
fn roll_back(
    forward: &mut Decoder,
    cached: &mut Vec<RowKey>,
    next_rotary_pos: &mut i64,
    mtp: Option<&mut MtpDrafter>,
    ablation: DraftAblation,
    kept: usize,
) -> Result<()> {
    let slots = forward.next_slot();
    let mut keep = kept;
    if ablation.keep_one_row_too_many && kept < slots {
        keep += 1;
    }
    if keep < slots {
        // A window is one step of at most 17 rows: a recurrent cache keeps each row's state.
        let kept_slots = forward.truncate(keep);
        if kept_slots != keep {
            return Err(EngineError::Prompt(format!(
                "a draft window could not roll back to slot {keep} (the cache kept {kept_slots}); \
                 decode without drafts (--drafts off)"
            )));
        }
        cached.truncate(keep);
        *next_rotary_pos -= (slots - keep) as i64;
        if let Some(m) = mtp {
            m.truncate(keep);
        }
    }
    Ok(())
}

/// A draft window: the rows of the last forward that fed a sampled token and its drafts.
#[derive(Default)]
struct Window {
    /// The cache slot of its first row (the sampled token).
    start: usize,
    /// The drafts fed after the first row.
    drafts: Vec<u32>,
    /// All its rows' logits (`(1 + drafts) x vocab`).
    logits: Vec<f32>,
    /// The row whose logits choose the next token.
    row: usize,
}

impl Window {
    /// The cache slots kept when the current row's logits are the last used: the window's rows up
    /// to it (all `slots` when there is no window).
    fn kept(&self, slots: usize) -> usize {
        if self.drafts.is_empty() {
            slots
        } else {
            self.start + self.row + 1
        }
    }
}

/// The tower's rows for `prompt`'s images at or after row `from` (None when there are none),
/// checked against the image tokens the prompt gave them (rows of `hidden`); the tower's time
/// goes to `tower`.
pub(crate) fn encode_images(
    encoder: &mut dyn ImageEncoder,
    prompt: &Prompt,
    from: usize,
    hidden: usize,
    tower: &mut std::time::Duration,
) -> Result<Option<VisionOutput>> {
    let new_images: Vec<&crate::prompt::PromptImage> = prompt
        .images
        .iter()
        .filter(|i| i.span.first_row >= from)
        .collect();
    if new_images.is_empty() {
        return Ok(None);
    }
    encode_these(encoder, &new_images, hidden, tower).map(Some)
}

/// The tower's rows for `images` (one run), checked against the tokens the prompt gave them.
pub(crate) fn encode_these(
    encoder: &mut dyn ImageEncoder,
    images: &[&crate::prompt::PromptImage],
    hidden: usize,
    tower: &mut std::time::Duration,
) -> Result<VisionOutput> {
    let patches: Vec<&vision::preprocess::PixelPatches> =
        images.iter().map(|i| i.image.patches.as_ref()).collect();
    let tower_start = Instant::now();
    let out = encoder.encode(&patches)?;
    *tower = tower_start.elapsed();
    let want: Vec<usize> = images.iter().map(|i| i.tokens).collect();
    if out.tokens_per_image != want || out.image_embeds.len() != want.iter().sum::<usize>() * hidden
    {
        return Err(EngineError::Image {
            name: images[0].image.name.clone(),
            what: format!(
                "the image encoder gave {:?} rows ({} values) for images of {want:?} tokens x hidden {hidden}",
                out.tokens_per_image,
                out.image_embeds.len()
            ),
        });
    }
    Ok(out)
}

/// A pack without an encoder refuses a prompt with images (at or after `from`) by name.
pub(crate) fn refuse_images(
    prompt: &Prompt,
    from: usize,
    why: &str,
) -> Result<Option<VisionOutput>> {
    match prompt.images.iter().find(|i| i.span.first_row >= from) {
        Some(img) => Err(EngineError::Image {
            name: img.image.name.clone(),
            what: format!("cannot be read by this pack: {why}"),
        }),
        None => Ok(None),
    }
}

/// The decoder's input for `prompt`'s rows `from..`: text rows embedded, image rows from the
/// tower's output `vision` (the images at or after `from`, in order), with the rows' position
/// planes, image rows and DeepStack sets.
pub(crate) fn prompt_input(
    decoder: &Decoder,
    prompt: &Prompt,
    from: usize,
    vision: Option<&VisionOutput>,
) -> (Vec<f32>, HybridInputs) {
    let rows = prompt.rows();
    let hidden = decoder.semantics().hidden_size;
    let keys = row_keys(prompt);
    let mut embeds = vec![0.0f32; (rows - from) * hidden];
    let mut image_rows = Vec::new();
    let mut next_image_row = 0;
    for (r, (row, &id)) in embeds
        .chunks_exact_mut(hidden)
        .zip(&prompt.ids[from..])
        .enumerate()
    {
        if keys[from + r].image.is_some() {
            let v = vision.expect("image rows come with the tower's output");
            row.copy_from_slice(&v.image_embeds[next_image_row * hidden..][..hidden]);
            next_image_row += 1;
            image_rows.push(r);
        } else {
            decoder.embed_row(id, row);
        }
    }
    let hybrid = if decoder.rotary().layout.is_mrope() {
        let plane = |p: usize| &prompt.planes[p * rows + from..(p + 1) * rows];
        HybridInputs {
            planes: Some([plane(0), plane(1), plane(2)].concat()),
            start_pos: 0,
            image_rows,
            deepstack: vision.map(|v| v.deepstack.clone()).unwrap_or_default(),
            deepstack_sets: vision.map_or(0, |v| v.sets),
        }
    } else {
        // A text-only decoder without MRoPE: plain positions (images were refused above).
        HybridInputs::text(from as i64)
    };
    (embeds, hybrid)
}

/// Each prompt row's key: image rows carry their picture's identity and their index in it.
pub(crate) fn row_keys(prompt: &Prompt) -> Vec<RowKey> {
    let mut keys: Vec<RowKey> = prompt
        .ids
        .iter()
        .map(|&id| RowKey { id, image: None })
        .collect();
    for img in &prompt.images {
        for i in 0..img.tokens {
            keys[img.span.first_row + i].image = Some((img.image.identity, i));
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    /// The server runs a session on its own worker thread.
    #[test]
    fn a_session_can_move_to_another_thread() {
        fn send<T: Send + 'static>() {}
        send::<super::Session>();
    }
}
