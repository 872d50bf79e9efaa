//! Several conversations answered at once on one model: continuous batching.
//!
//! A [`Scheduler`] thread owns the decoder and a pool of KV caches, one per parallel sequence,
//! allocated when it starts: the memory budget is fixed then, never grown, and a running
//! sequence is never evicted. Each step is one forward over every running sequence: one decode
//! row for each that is answering, and the next slice of each prompt still being prefilled (at
//! most `prefill_chunk` rows a slice), so a long prompt joins the running answers without
//! freezing their streams. A finished, failed or cancelled sequence returns its cache at once.
//!
//! A new prompt starts from the longest prefix of it some cache holds (its token ids, and its
//! pictures' rows by the picture's hash): a free cache's (a finished conversation's rows stay
//! there) is taken as it is; a running sequence's is copied into the free cache the new
//! sequence takes (K/V rows; for Qwen3.5 only up to a prompt state the running one kept), so a
//! shared system prompt or the same picture asked by another client is prefilled once. The copy
//! fills the new sequence's own slots: shared rows count against the pool as often as they are
//! held, and a running sequence never waits for, or gives up, anything.
//!
//! Callers hold a [`SchedulerHandle`] (one per server worker, so a request waits for a cache in
//! the server's bounded queue): it renders the prompt and runs the vision tower on the caller's
//! thread (the tower's GEMMs interleave with the decoder's on the shared runtime), then blocks on
//! the sequence's events, as [`crate::Session::generate`] does. A sequence's answer is the one it
//! gets alone: the decoder's rows do not depend on their neighbours (tests/tests/sequences.rs),
//! and each sequence samples with its own sampler.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use decoder::{Decoder, HybridInputs, KvCache, Logits, SequenceStep, StepInput};
use vision::tower::VisionOutput;

use crate::decoding::{Decoding, Next};
use crate::error::{EngineError, Result};
use crate::format::ChatFormat;
use crate::image_rows::ImageRowsCache;
use crate::images::ImageEncoder;
use crate::message::Message;
use crate::mtp_drafts::{propose_drafts, DraftAsk, MtpDrafter};
use crate::prompt::{Prompt, PromptAblation, PromptBuilder};
use crate::sampling::SamplingParams;
use crate::session::{
    answer_params, prompt_fits, prompt_input, refuse_images, reuse_prefix, row_keys, Event,
    FinishReason, Generation, RowKey, Session, Timings,
};
use crate::template::TemplateInputs;

/// How many sequences and how large a prefill slice.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerOptions {
    /// Sequences answered at once (each holds a cache of the context's slots).
    pub parallel: usize,
    /// Most rows of one prompt prefilled in one step.
    pub prefill_chunk: usize,
    /// Draft tokens (prompt lookup) a decoding sequence's row may carry (0 = off, at most
    /// [`crate::MAX_DRAFTS`]): its window's rows go into the same forward as the others' rows
    /// and are kept while the sampler confirms them, as in `Session`.
    pub drafts: usize,
}

/// What a sequence tells its caller.
enum SeqEvent {
    /// A cache was free: the prompt goes in.
    Admitted,
    Started {
        prompt_tokens: usize,
        image_tokens: usize,
    },
    Text(String),
    Done(Result<Generation>),
}

/// A prompt from a caller, with its pictures' rows.
struct Submission {
    prompt: Prompt,
    vision: Option<VisionOutput>,
    /// Made on the caller's thread: a grammar is compiled (or refused) there, not in the step loop.
    decoding: Decoding,
    timings: Timings,
    start: Instant,
    events: Sender<SeqEvent>,
}

/// A cache in the pool with the rows it holds: a finished conversation's prompt and answer stay
/// there, so a later prompt that starts the same way (a shared system prompt, the same picture
/// asked again) reuses them instead of prefilling them again.
struct Pooled {
    cache: KvCache,
    keys: Vec<RowKey>,
    /// With MTP drafts: the head's drafter that read the cache's rows.
    mtp: Option<MtpDrafter>,
    /// When it was last given back (the least recently used empty one goes first).
    last_used: u64,
}

/// A sequence being answered.
struct Running {
    cache: KvCache,
    /// The rows the cache holds (the prompt's, then the fed answer ids).
    keys: Vec<RowKey>,
    /// Prompt rows the cache already held.
    reused: usize,
    prompt_tokens: usize,
    image_tokens: usize,
    /// The prompt's input rows, in slices; `fed` of them are in the cache.
    slices: Vec<(Vec<f32>, HybridInputs)>,
    fed: usize,
    decoding: Decoding,
    /// What the next decode step feeds: the sampled token, then its drafts.
    window: Vec<u32>,
    /// With MTP drafts: the head's drafter of this sequence (its own head cache).
    mtp: Option<MtpDrafter>,
    /// MTP drafts to ask the head for after this step's sampling (all sequences' at once).
    mtp_ask: usize,
    /// With `SchedulerAblation::record_drafts`: every draft the head proposed, in order.
    proposed: Vec<u32>,
    /// The prompt's ids (prompt lookup reads them with the answer's).
    prompt_ids: Vec<u32>,
    /// The rotary position of the sampled token the next step feeds (`window[0]`).
    next_rotary_pos: i64,
    timings: Timings,
    start: Instant,
    prefill_start: Instant,
    decode_start: Option<Instant>,
    events: Sender<SeqEvent>,
}

/// With `SchedulerAblation::record_drafts`: each finished sequence's prompt ids and the MTP drafts
/// it proposed.
type RecordedDrafts = Arc<Mutex<Vec<(Vec<u32>, Vec<u32>)>>>;

/// What the handles share.
struct Shared {
    inbox: Mutex<Sender<Submission>>,
    format: Arc<ChatFormat>,
    /// The tower (one encode at a time), and the rows of recent pictures (locked after it).
    encoder: Option<Mutex<Box<dyn ImageEncoder>>>,
    image_rows: Mutex<ImageRowsCache>,
    merge: usize,
    /// The decoder's hidden size (the tower's rows are checked against it).
    hidden: usize,
    no_encoder: String,
    ablation: PromptAblation,
    context: usize,
    free_count: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
    parallel: usize,
    drafted: RecordedDrafts,
}

/// A caller's way to the scheduler; clone one per worker.
#[derive(Clone)]
pub struct SchedulerHandle {
    shared: Arc<Shared>,
}

/// The thread that owns the decoder and steps the running sequences.
pub struct Scheduler {
    decoder: Decoder,
    format: Arc<ChatFormat>,
    /// Caches not held by a sequence, with the rows they hold.
    free: Vec<Pooled>,
    /// Counts give-backs, for least-recently-used choice.
    tick: u64,
    running: Vec<Running>,
    /// Submissions waiting for a free cache, first come first served.
    waiting: VecDeque<Submission>,
    inbox: Receiver<Submission>,
    prefill_chunk: usize,
    drafts: usize,
    /// Drafts come from the MTP head (each sequence its drafter, which travels with its cache in
    /// the pool) instead of prompt lookup. A prompt reuses pooled or running rows only where the
    /// head resumes as if it read them itself (`MtpDrafter::resumes_at`), so a conversation's
    /// drafts, and a sampled answer's draws, are those it has alone, whatever the pool held.
    mtp_drafts: bool,
    context: usize,
    /// Free caches, as the handles see it.
    free_count: Arc<AtomicUsize>,
    /// The most sequences one step has run.
    most_at_once: Arc<AtomicUsize>,
    drafted: RecordedDrafts,
    ablation: SchedulerAblation,
}

/// Deliberate mistakes for the tests' controls ([`Scheduler::start_ablated`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedulerAblation {
    /// A prefix copied from a running sequence misses its last row's K/V (the slot keeps what
    /// the cache held) while the sequence goes on as if it had it.
    pub copy_one_row_short: bool,
    /// Prompts arriving together are admitted at once, each prefilling their shared prefix
    /// beside the others, instead of waiting for the first to hold it.
    pub no_prefix_wait: bool,
    /// Every sequence's MTP drafter reads the forward's first rows (the first sequence's) as its
    /// hidden states, instead of its own.
    pub mtp_reads_the_first_rows: bool,
    /// Keep each finished sequence's MTP drafts for [`SchedulerHandle::recorded_drafts`] (not a
    /// mistake: what the tests compare).
    pub record_drafts: bool,
}

/// Fewest shared prompt rows a waiting prompt waits for a running sequence to prefill, to copy
/// them instead of prefilling them beside it: two prefills of the same rows in one forward cost
/// twice the GEMM rows, while the wait costs the waiting prompt little more than its own prefill
/// of those rows would. A few shared template rows are not worth the wait.
const PREFIX_WAIT_MIN_ROWS: usize = 16;

impl Scheduler {
    /// Takes `session`'s model (decoder, tower, chat format), allocates `options.parallel` caches
    /// of the session's context and starts the scheduler thread. The thread ends when every
    /// handle is dropped.
    pub fn start(
        session: Session,
        options: SchedulerOptions,
    ) -> Result<(SchedulerHandle, JoinHandle<()>)> {
        Scheduler::start_ablated(session, options, SchedulerAblation::default())
    }

    /// [`Scheduler::start`] with a deliberate mistake (the tests' controls).
    #[doc(hidden)]
    pub fn start_ablated(
        session: Session,
        options: SchedulerOptions,
        ablation: SchedulerAblation,
    ) -> Result<(SchedulerHandle, JoinHandle<()>)> {
        if options.drafts > crate::MAX_DRAFTS {
            return Err(EngineError::Sampling(format!(
                "drafts {} must be in 0..={}",
                options.drafts,
                crate::MAX_DRAFTS
            )));
        }
        if options.parallel == 0 || options.prefill_chunk == 0 {
            return Err(EngineError::Prompt(format!(
                "parallel {} and prefill chunk {}: both must be at least 1",
                options.parallel, options.prefill_chunk
            )));
        }
        let mut parts = session.into_parts();
        let dtype = parts.decoder.kv().dtype();
        // The decoder's own cache is not used here: its memory goes back.
        parts.decoder.release_cache();
        let mtp_drafts = parts.mtp && options.drafts > 0;
        let free = (0..options.parallel)
            .map(|_| Pooled {
                cache: parts.decoder.new_cache(parts.context, dtype),
                keys: Vec::new(),
                mtp: mtp_drafts.then(|| MtpDrafter::new(&parts.decoder, parts.context, dtype)),
                last_used: 0,
            })
            .collect();
        let (sender, inbox) = channel();
        let format = Arc::new(parts.format);
        let free_count = Arc::new(AtomicUsize::new(options.parallel));
        let most_at_once = Arc::new(AtomicUsize::new(0));
        let drafted = Arc::new(Mutex::new(Vec::new()));
        let merge = parts.encoder.as_ref().map_or(2, |e| e.merge_size());
        let shared = Arc::new(Shared {
            inbox: Mutex::new(sender),
            format: format.clone(),
            encoder: parts.encoder.map(Mutex::new),
            image_rows: Mutex::new(ImageRowsCache::default()),
            merge,
            hidden: parts.decoder.semantics().hidden_size,
            no_encoder: parts.no_encoder,
            ablation: parts.ablation,
            context: parts.context,
            free_count: free_count.clone(),
            most_at_once: most_at_once.clone(),
            parallel: options.parallel,
            drafted: drafted.clone(),
        });
        let scheduler = Scheduler {
            decoder: parts.decoder,
            format,
            free,
            tick: 0,
            running: Vec::new(),
            waiting: VecDeque::new(),
            inbox,
            free_count,
            most_at_once,
            drafted,
            prefill_chunk: options.prefill_chunk,
            drafts: options.drafts,
            mtp_drafts,
            context: parts.context,
            ablation,
        };
        let thread = std::thread::Builder::new()
            .name("xdna-vl-scheduler".into())
            .spawn(move || scheduler.run())
            .map_err(|e| EngineError::Prompt(format!("cannot start the scheduler: {e}")))?;
        Ok((SchedulerHandle { shared }, thread))
    }

    fn run(mut self) {
        loop {
            // Idle: wait for work; busy: take what arrived and step.
            if self.running.is_empty() && self.waiting.is_empty() {
                match self.inbox.recv() {
                    Ok(s) => self.waiting.push_back(s),
                    Err(_) => return,
                }
            }
            while let Ok(s) = self.inbox.try_recv() {
                self.waiting.push_back(s);
            }
            // What fits starts; the rest waits for a cache (never one taken from a runner). A
            // prompt whose prefix a running sequence is still prefilling waits for it, keeping its
            // place: later prompts start only on caches beyond those the waiting ones will need.
            let mut held_back = 0;
            let mut i = 0;
            while i < self.waiting.len() && self.free.len() > held_back {
                if self.waits_for_a_prefix(&self.waiting[i]) {
                    held_back += 1;
                    i += 1;
                } else {
                    let s = self.waiting.remove(i).expect("an index below the length");
                    self.admit(s);
                }
            }
            self.free_count.store(self.free.len(), Ordering::SeqCst);
            if !self.running.is_empty() {
                self.step();
            }
            self.free_count.store(self.free.len(), Ordering::SeqCst);
        }
    }

    /// A submission becomes a running sequence with a free cache (the caller checks one is).
    fn admit(&mut self, s: Submission) {
        if s.events.send(SeqEvent::Admitted).is_err() {
            return; // the caller left while it waited
        }
        let keys = row_keys(&s.prompt);
        // The free cache sharing the longest prefix with the prompt; with none, the least
        // recently used (its rows are the oldest to lose).
        let shared = |p: &Pooled| p.keys.iter().zip(&keys).take_while(|(a, b)| a == b).count();
        let Some(best) = (0..self.free.len())
            .max_by_key(|&i| (shared(&self.free[i]), u64::MAX - self.free[i].last_used))
        else {
            unreachable!("admit is called with a free cache")
        };
        let Pooled {
            mut cache,
            keys: mut cached,
            mut mtp,
            ..
        } = self.free.swap_remove(best);
        // A running sequence holding more of the prompt lends its rows: they are copied in.
        let held = reuse_prefix(&cached, &keys, &s.prompt, |r| r);
        let mut copied = 0;
        let lent = self.longest_running_prefix(&keys, &s.prompt);
        if let Some((from, rows)) = lent {
            let src = &self.running[from];
            // With MTP drafts the head's rows come along, where they resume exactly.
            let head_resumes = |rows| src.mtp.as_ref().is_none_or(|m| m.resumes_at(rows));
            if rows > held && head_resumes(rows) {
                copied = if self.ablation.copy_one_row_short {
                    cache.copy_prefix_but_last_row(&src.cache, rows)
                } else {
                    cache.copy_prefix(&src.cache, rows)
                };
                cached = keys[..copied].to_vec();
                if let (Some(m), Some(from)) = (mtp.as_mut(), src.mtp.as_ref()) {
                    if !m.copy_prefix(from, copied) {
                        cached.clear();
                    }
                }
            }
        }
        let mut reused = reuse_prefix(&cached, &keys, &s.prompt, |r| cache.truncate(r));
        if let Some(m) = mtp.as_mut() {
            // The head drafts from the kept rows only where it resumes as if it read the prompt
            // whole (at a prompt state it kept); elsewhere the prompt is prefilled whole.
            if !m.resumes_at(reused) {
                reused = cache.truncate(0);
            }
            m.truncate(reused);
        }
        let copied = copied.min(reused);
        let decoding = s.decoding;
        let rows = s.prompt.rows();
        let vision = s
            .vision
            .as_ref()
            .and_then(|v| images_from(v, &s.prompt, reused));
        let (embeds, hybrid) = prompt_input(&self.decoder, &s.prompt, reused, vision.as_ref());
        let hidden = self.decoder.semantics().hidden_size;
        let new_rows = rows - reused;
        // A recurrent (Qwen3.5) cache keeps its state before the prompt's last row (the prompt
        // state an equal or longer prompt resumes from: the last row is always prefilled), so
        // that row is a slice of its own.
        let recurrent = cache.recurrent.is_some();
        let mut bounds: Vec<(usize, usize)> = (0..new_rows)
            .step_by(self.prefill_chunk)
            .map(|first| (first, self.prefill_chunk.min(new_rows - first)))
            .collect();
        if let Some(last) = bounds.pop() {
            if recurrent && last.1 > 1 {
                bounds.push((last.0, last.1 - 1));
                bounds.push((last.0 + last.1 - 1, 1));
            } else {
                bounds.push(last);
            }
        }
        let slices = bounds
            .into_iter()
            .map(|(first, n)| {
                (
                    embeds[first * hidden..(first + n) * hidden].to_vec(),
                    hybrid.slice_rows(first, n, new_rows, hidden),
                )
            })
            .collect();
        let mut timings = s.timings;
        timings.prefilled_tokens = new_rows;
        timings.copied_tokens = copied;
        self.running.push(Running {
            cache,
            keys,
            reused,
            prompt_tokens: rows,
            image_tokens: s.prompt.image_tokens(),
            slices,
            fed: 0,
            decoding,
            window: Vec::new(),
            mtp,
            mtp_ask: 0,
            proposed: Vec::new(),
            prompt_ids: s.prompt.ids.clone(),
            next_rotary_pos: s.prompt.next_rotary_pos(),
            timings,
            start: s.start,
            prefill_start: Instant::now(),
            decode_start: None,
            events: s.events,
        });
    }

    /// Whether a waiting prompt should wait for a running sequence still prefilling a prefix of
    /// it (at least [`PREFIX_WAIT_MIN_ROWS`] rows) longer than any cache holds now: once that
    /// sequence holds them, the prompt copies them (`admit`). For a recurrent (Qwen3.5) cache only the
    /// state before the running prompt's last row is kept, so only a prompt that starts with the
    /// whole running prompt waits. The wait ends when the runner's prompt is in or it leaves.
    fn waits_for_a_prefix(&self, s: &Submission) -> bool {
        if self.ablation.no_prefix_wait {
            return false;
        }
        let keys = row_keys(&s.prompt);
        let shared = |held: &[RowKey]| reuse_prefix(held, &keys, &s.prompt, |n| n);
        let now = self
            .free
            .iter()
            .map(|p| shared(&p.keys))
            .chain(
                self.longest_running_prefix(&keys, &s.prompt)
                    .map(|(_, n)| n),
            )
            .max()
            .unwrap_or(0);
        self.running.iter().any(|r| {
            let prefilling = r.fed < r.slices.len();
            let mut rows = shared(&r.keys[..r.prompt_tokens.min(r.keys.len())]);
            if r.cache.recurrent.is_some() && rows < r.prompt_tokens.saturating_sub(1) {
                rows = 0;
            }
            prefilling && rows >= PREFIX_WAIT_MIN_ROWS && rows > now
        })
    }

    /// The running sequence whose cache holds the longest prefix of a prompt's rows `keys`, and
    /// how many of them a copy would bring (at most all but the prompt's last row, never a cut
    /// inside a picture, for Qwen3.5 only up to a prompt state it kept), if any would.
    fn longest_running_prefix(&self, keys: &[RowKey], prompt: &Prompt) -> Option<(usize, usize)> {
        self.running
            .iter()
            .enumerate()
            .map(|(i, r)| {
                // Its cache holds its prompt's rows, then the fed answer ids (the last sampled
                // id is not fed yet: the cache's length cuts it off).
                let answer = r
                    .decoding
                    .ids()
                    .iter()
                    .map(|&id| RowKey { id, image: None });
                let held: Vec<RowKey> = r
                    .keys
                    .iter()
                    .copied()
                    .chain(answer)
                    .take(r.cache.len())
                    .collect();
                let rows = reuse_prefix(&held, keys, prompt, |n| r.cache.copyable_prefix(n));
                (i, rows)
            })
            .filter(|&(_, rows)| rows > 0)
            .max_by_key(|&(_, rows)| rows)
    }

    /// One forward over every running sequence, then each samples (if its prompt is in) and
    /// hears its events; finished sequences leave.
    fn step(&mut self) {
        let vocab = self.decoder.semantics().vocab_size;
        self.most_at_once
            .fetch_max(self.running.len(), Ordering::SeqCst);
        let result = {
            let mut steps: Vec<SequenceStep<'_>> = self
                .running
                .iter_mut()
                .map(|r| {
                    let Running {
                        cache,
                        slices,
                        fed,
                        window,
                        next_rotary_pos,
                        ..
                    } = r;
                    let (input, logits) = match slices.get(*fed) {
                        Some((embeds, hybrid)) => {
                            (StepInput::Embeds { embeds, hybrid }, Logits::LastRow)
                        }
                        // A draft window wants every row's logits.
                        None => (
                            StepInput::Tokens {
                                tokens: window,
                                start_pos: *next_rotary_pos,
                            },
                            if window.len() > 1 {
                                Logits::AllRows
                            } else {
                                Logits::LastRow
                            },
                        ),
                    };
                    SequenceStep {
                        cache,
                        input,
                        logits,
                    }
                })
                .collect();
            self.decoder.step_sequences(&mut steps).map(|out| {
                (0..out.len())
                    .map(|i| out.of(i).to_vec())
                    .collect::<Vec<_>>()
            })
        };
        let logits = match result {
            Ok(l) => l,
            Err(decoder::DecoderError::InSequence { index, source }) => {
                // One sequence's rows were refused: it fails, the others step again.
                let r = self.running.remove(index);
                self.finish(r, Err(EngineError::Decoder(*source)));
                return;
            }
            Err(e) => {
                let msg = e.to_string();
                for r in std::mem::take(&mut self.running) {
                    self.finish(r, Err(EngineError::Prompt(msg.clone())));
                }
                return;
            }
        };
        debug_assert!(logits.iter().all(|l| l.len() % vocab == 0));
        if self.mtp_drafts {
            self.hand_rows_to_drafters();
        }
        let mut done = Vec::new();
        for (i, (r, mut l)) in self.running.iter_mut().zip(logits).enumerate() {
            let outcome = advance(r, &mut l, &self.format, (self.context, vocab), self.drafts);
            if let Some(outcome) = outcome {
                done.push((i, outcome));
            }
        }
        if self.mtp_drafts {
            self.propose_mtp_drafts(&mut done);
        }
        for (i, outcome) in done.into_iter().rev() {
            let r = self.running.remove(i);
            self.finish(r, outcome);
        }
    }

    /// The MTP drafts every sequence asked for in this step's sampling, in one head step per
    /// draft over all of them (each sequence's drafts as its own alone); they join its window. A
    /// failed head step fails the sequences that asked (into `done`, kept in index order).
    fn propose_mtp_drafts(&mut self, done: &mut Vec<(usize, Result<FinishReason>)>) {
        let mut asked = Vec::new();
        let mut asks: Vec<DraftAsk<'_>> = Vec::new();
        for (i, r) in self.running.iter_mut().enumerate() {
            let k = std::mem::take(&mut r.mtp_ask);
            if let Some(drafter) = r.mtp.as_mut().filter(|_| k > 0) {
                asked.push(i);
                asks.push(DraftAsk {
                    drafter,
                    token: r.window[0],
                    k,
                });
            }
        }
        if asks.is_empty() {
            return;
        }
        match propose_drafts(&mut self.decoder, &mut asks) {
            Ok(drafts) => {
                drop(asks);
                for (i, d) in asked.into_iter().zip(drafts) {
                    let r = &mut self.running[i];
                    if self.ablation.record_drafts {
                        r.proposed.extend_from_slice(&d);
                    }
                    r.window.extend(d);
                }
            }
            Err(e) => {
                drop(asks);
                let msg = e.to_string();
                done.extend(
                    asked
                        .into_iter()
                        .map(|i| (i, Err(EngineError::Prompt(msg.clone())))),
                );
                done.sort_by_key(|d| d.0);
            }
        }
    }

    /// After a forward: each sequence's MTP drafter gets its rows of it (their final hidden
    /// states, in the sequences' order, the embeddings fed and their positions), before any
    /// window is walked and rolled back.
    fn hand_rows_to_drafters(&mut self) {
        let h = self.decoder.semantics().hidden_size;
        let hidden = self.decoder.last_hidden();
        let mut row0 = 0;
        for r in self.running.iter_mut() {
            let slice = r.slices.get(r.fed);
            let rows = slice.map_or(r.window.len(), |(e, _)| e.len() / h);
            if let Some(m) = r.mtp.as_mut() {
                let first = r.cache.len() - rows;
                let from = if self.ablation.mtp_reads_the_first_rows {
                    0
                } else {
                    row0
                };
                let mine = &hidden[from * h..(from + rows) * h];
                match slice {
                    Some((embeds, hybrid)) => m.ran_rows(first, (&[], mine), embeds, hybrid),
                    None => {
                        let window = (&r.window[..], r.next_rotary_pos);
                        m.ran_tokens(first, mine, &self.decoder, window);
                    }
                }
            }
            row0 += rows;
        }
    }

    /// A cache goes back to the pool holding the rows `keys` names (cut to what it holds), with
    /// the head's drafter that read them.
    fn give_back(&mut self, cache: KvCache, mut keys: Vec<RowKey>, mtp: Option<MtpDrafter>) {
        keys.truncate(cache.len());
        self.tick += 1;
        self.free.push(Pooled {
            cache,
            keys,
            mtp,
            last_used: self.tick,
        });
    }

    /// The sequence leaves: its cache goes back to the pool, its caller hears the end.
    fn finish(&mut self, r: Running, outcome: Result<FinishReason>) {
        if self.ablation.record_drafts {
            let mut d = self.drafted.lock().unwrap_or_else(|p| p.into_inner());
            d.push((r.prompt_ids.clone(), r.proposed.clone()));
        }
        let Running {
            cache,
            mut keys,
            mtp,
            reused,
            decoding,
            events,
            mut timings,
            decode_start,
            prompt_tokens,
            image_tokens,
            ..
        } = r;
        // The fed answer ids follow the prompt's rows in the cache.
        keys.extend(decoding.ids().iter().map(|&id| RowKey { id, image: None }));
        self.give_back(cache, keys, mtp);
        let result = outcome.and_then(|finish| {
            if let Some(t) = decode_start {
                timings.decode = t.elapsed();
            }
            let mut on_text = |t: &str| events.send(SeqEvent::Text(t.to_string())).is_ok();
            let (text, ids) = decoding.finish(&finish, &self.format.tokenizer, &mut on_text)?;
            Ok(Generation {
                text,
                ids,
                finish,
                prompt_tokens,
                image_tokens,
                reused_tokens: reused,
                timings,
            })
        });
        let _ = events.send(SeqEvent::Done(result));
    }
}

/// A sequence after a step: its prompt slice is in, or it samples its next token. Returns how it
/// ended, if it did.
fn advance(
    r: &mut Running,
    logits: &mut [f32],
    format: &ChatFormat,
    (context, vocab): (usize, usize),
    drafts: usize,
) -> Option<Result<FinishReason>> {
    // The rows of this step whose logits are here: 1, or a decode step's window.
    let mut rows = 1;
    let decode_step = r.fed >= r.slices.len();
    if !decode_step {
        r.fed += 1;
        if r.fed + 1 == r.slices.len() {
            // All but the prompt's last row: a Qwen3.5 cache keeps its state here (a prompt
            // state a later prompt starting the same way resumes from; K/V need none).
            r.cache.checkpoint();
            if let Some(m) = r.mtp.as_mut() {
                m.keep_row_before(r.cache.len());
            }
        }
        if r.fed < r.slices.len() {
            return None;
        }
        // The prompt is in: sampling starts.
        r.timings.prefill = r.prefill_start.elapsed();
        r.slices = Vec::new();
        let started = SeqEvent::Started {
            prompt_tokens: r.prompt_tokens,
            image_tokens: r.image_tokens,
        };
        if r.events.send(started).is_err() {
            return Some(Ok(FinishReason::Cancelled));
        }
        r.decode_start = Some(Instant::now());
    } else {
        rows = r.window.len();
        r.timings.decode_forwards += 1;
        r.timings.drafts_proposed += rows - 1;
    }
    let events = &r.events;
    let mut on_text = |t: &str| events.send(SeqEvent::Text(t.to_string())).is_ok();
    // Walk the window's rows: row i's logits choose the token after the row; the draft fed at
    // row i + 1 is kept while the sampler confirms it (greedy: the argmax; sampling: the
    // speculative acceptance rule), as the session's windows are.
    let mut row = 0;
    let walked = loop {
        let draft = r.window.get(row + 1).copied().filter(|_| decode_step);
        // Every sampled token but the first is fed by a decode step.
        r.timings.decode_steps += usize::from(!r.decoding.ids().is_empty());
        let kept = r.cache.len() - (rows - 1 - row);
        let next = r.decoding.next(
            &mut logits[row * vocab..(row + 1) * vocab],
            &format.tokenizer,
            kept >= context,
            draft,
            &mut on_text,
        );
        if r.decoding.ids().len() == 1 {
            r.timings.time_to_first_token = r.start.elapsed();
        }
        match next {
            Ok(Next::Feed(token)) if Some(token) == draft => {
                r.timings.drafts_accepted += 1;
                row += 1;
            }
            Ok(Next::Feed(token)) => break Ok(token),
            Ok(Next::Done(f)) => break Err(Ok(f)),
            Err(e) => break Err(Err(e)),
        }
    };
    // The rows after the last one whose logits were used held rejected drafts.
    let kept = r.cache.len() - (rows - 1 - row);
    if kept < r.cache.len() && r.cache.truncate(kept) != kept {
        return Some(Err(EngineError::Prompt(format!(
            "a draft window could not roll back to slot {kept}; serve without --drafts"
        ))));
    }
    if let Some(m) = r.mtp.as_mut() {
        m.truncate(kept);
    }
    if decode_step {
        // The kept rows' positions are used; the next token's follows them.
        r.next_rotary_pos += row as i64 + 1;
    }
    match walked {
        Ok(token) => {
            // The next step's window: the token, then prompt-lookup drafts that fit the cache.
            let room = context.saturating_sub(r.cache.len() + 1);
            let k = if r.decoding.is_constrained() {
                0
            } else {
                drafts.min(room)
            };
            r.window.clear();
            r.window.push(token);
            if r.mtp.is_some() {
                // The scheduler asks every sequence's head at once after the sampling.
                r.mtp_ask = k;
            } else if k > 0 {
                let mut seen = r.prompt_ids.clone();
                seen.extend_from_slice(r.decoding.ids());
                r.window.extend(
                    crate::drafts::prompt_lookup(&seen, 3, k)
                        .into_iter()
                        .take(k),
                );
            }
            None
        }
        Err(end) => Some(end),
    }
}

impl SchedulerHandle {
    /// The checkpoint's recommended sampling (generation config) with its eos ids.
    pub fn default_sampling(&self) -> SamplingParams {
        self.shared.format.default_sampling()
    }

    pub fn format(&self) -> &ChatFormat {
        &self.shared.format
    }

    pub fn context(&self) -> usize {
        self.shared.context
    }

    /// Conversations answered at once (caches in the pool).
    pub fn parallel(&self) -> usize {
        self.shared.parallel
    }

    /// With `SchedulerAblation::record_drafts`: each finished conversation's prompt ids and the
    /// MTP drafts it proposed, in the order they finished.
    #[doc(hidden)]
    pub fn recorded_drafts(&self) -> Vec<(Vec<u32>, Vec<u32>)> {
        self.shared
            .drafted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The most conversations one forward has run so far.
    pub fn most_at_once(&self) -> usize {
        self.shared.most_at_once.load(Ordering::SeqCst)
    }

    /// Caches not held by a running conversation (as of the scheduler's last step).
    pub fn free_caches(&self) -> usize {
        self.shared.free_count.load(Ordering::SeqCst)
    }

    /// Answers `messages` as [`Session::generate`] does (without reusing an earlier prompt's
    /// rows), beside whatever else the scheduler is answering.
    pub fn generate(
        &self,
        messages: &[Message],
        params: &SamplingParams,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Generation> {
        self.generate_with(messages, &TemplateInputs::default(), params, on_event)
    }

    /// [`SchedulerHandle::generate`] with `inputs` (tools, extra variables) given to the chat
    /// template.
    pub fn generate_with(
        &self,
        messages: &[Message],
        inputs: &TemplateInputs,
        params: &SamplingParams,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<Generation> {
        let start = Instant::now();
        let sh = &self.shared;
        let params = answer_params(params, &sh.format)?;
        let prompt = PromptBuilder {
            tokenizer: &sh.format.tokenizer,
            template: &sh.format.template,
            merge: sh.merge,
            ablation: sh.ablation,
        }
        .build_with(messages, inputs)?;
        let rows = prompt_fits(&prompt, sh.context)?;
        let opens_think = prompt.opens_think();
        let decoding = Decoding::new(params, &prompt.ids, &sh.format.tokenizer)?;
        let mut timings = Timings::default();
        let vision = match &sh.encoder {
            Some(encoder) => {
                let mut encoder = encoder.lock().unwrap_or_else(|p| p.into_inner());
                let mut rows = sh.image_rows.lock().unwrap_or_else(|p| p.into_inner());
                rows.encode(encoder.as_mut(), &prompt, sh.hidden, &mut timings.tower)?
            }
            None => refuse_images(&prompt, 0, &sh.no_encoder)?,
        };
        let (events, receiver) = channel();
        let submission = Submission {
            prompt,
            vision,
            decoding,
            timings,
            start,
            events,
        };
        sh.inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(submission)
            .map_err(|_| EngineError::Prompt("the scheduler has stopped".into()))?;
        // Dropping `receiver` (on a cancel) tells the scheduler the caller went away.
        for event in receiver {
            match event {
                SeqEvent::Admitted => {}
                SeqEvent::Started {
                    prompt_tokens,
                    image_tokens,
                } => {
                    let go_on = on_event(Event::Started {
                        prompt_tokens,
                        image_tokens,
                        reused_tokens: 0,
                        opens_think,
                    });
                    if !go_on {
                        return Ok(cancelled(prompt_tokens, image_tokens));
                    }
                }
                SeqEvent::Text(t) => {
                    if !on_event(Event::Text(&t)) {
                        return Ok(cancelled(rows, 0));
                    }
                }
                SeqEvent::Done(result) => return result,
            }
        }
        Err(EngineError::Prompt(
            "the scheduler stopped before the answer ended".into(),
        ))
    }
}

/// The tower's rows of the images at or after row `from` (a prefix reused from a cache holds the
/// others; a cut never falls inside an image), or None when there are none.
fn images_from(v: &VisionOutput, prompt: &Prompt, from: usize) -> Option<VisionOutput> {
    let skip = prompt
        .images
        .iter()
        .take_while(|i| i.span.first_row < from)
        .count();
    if skip == prompt.images.len() {
        return None;
    }
    let tokens: usize = v.tokens_per_image[..skip].iter().sum();
    let all: usize = v.tokens_per_image.iter().sum();
    let width = v.image_embeds.len() / all.max(1);
    let deepstack = (0..v.sets)
        .flat_map(|set| {
            let base = set * all * width;
            v.deepstack[base + tokens * width..base + all * width]
                .iter()
                .copied()
        })
        .collect();
    Some(VisionOutput {
        image_embeds: v.image_embeds[tokens * width..].to_vec(),
        deepstack,
        sets: v.sets,
        tokens_per_image: v.tokens_per_image[skip..].to_vec(),
        grids: v.grids[skip..].to_vec(),
    })
}

/// The answer of a caller that stopped listening.
fn cancelled(prompt_tokens: usize, image_tokens: usize) -> Generation {
    Generation {
        text: String::new(),
        ids: Vec::new(),
        finish: FinishReason::Cancelled,
        prompt_tokens,
        image_tokens,
        reused_tokens: 0,
        timings: Timings::default(),
    }
}
