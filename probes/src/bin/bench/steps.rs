//! The decoder as the benchmarks run it: a forward on the host, the prompts it prefills (text, or
//! one picture's image rows among text), timed prefills, and timed decode steps.

use crate::measure::{median, secs, ReadProbe};
use crate::refuse;
use compute::Runtime;
use decoder::{
    Decoder, DecoderOptions, HybridInputs, KvCache, KvDtype, Logits, SequenceStep, StepInput,
};
use engine::rope_index::{position_planes, ImageSpan, RopeAblation};
use packs::Pack;
use std::sync::Arc;
use std::time::Instant;

/// Prefills of at least this many rows are fed as an image prompt (what a picture's prompt is).
pub const IMAGE_PROMPT_MIN_ROWS: usize = 512;

/// The token the first of a run of decode steps feeds.
const FIRST_TOKEN: u32 = 11;

/// Prompt tokens: spread over the vocabulary, reproducible.
pub fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// A forward on the host whose cache holds `rows` prompt rows and `steps` decode steps after them.
pub fn forward_with_room(
    pack: &Arc<Pack>,
    threads: usize,
    kv: KvDtype,
    rows: usize,
    steps: usize,
) -> Decoder {
    let options = DecoderOptions {
        capacity: rows + steps + 8,
        kv_dtype: kv,
        ..DecoderOptions::default()
    };
    let runtime = Runtime::host(threads).unwrap_or_else(|e| refuse(e));
    Decoder::new(pack, &runtime, options).unwrap_or_else(|e| refuse(e))
}

/// A prefill prompt: row embeddings and what `step_batch_embeds` needs beside them.
pub struct Prompt {
    pub embeds: Vec<f32>,
    pub hybrid: HybridInputs,
    /// The merged image grid (rows x columns) of an image prompt.
    pub image: Option<(usize, usize)>,
}

/// One picture in a prompt.
pub struct PromptImage<'a> {
    /// The first of its rows (vision start is the row before).
    pub first_row: usize,
    /// Its patch grid (t, h, w) before merging, and the merge (2: 2x2 patches a row).
    pub grid: [usize; 3],
    pub merge: usize,
    /// Its rows' embeddings, one a merged token; `None`: the text tokens' own (their cost is the
    /// same).
    pub embeds: Option<&'a [f32]>,
    /// DeepStack sets, `sets x rows x hidden`.
    pub deepstack: Vec<f32>,
    pub sets: usize,
}

/// `rows` rows: plain text below [`IMAGE_PROMPT_MIN_ROWS`], else one square picture's image rows
/// (merged grid side = the largest that leaves 8 text rows) with text around them and DeepStack
/// sets of the pack's count (zeros: their adds cost the same).
pub fn prompt_for(f: &Decoder, rows: usize) -> Prompt {
    let sem = f.semantics();
    let hidden = sem.hidden_size;
    if rows < IMAGE_PROMPT_MIN_ROWS {
        let mut embeds = vec![0f32; rows * hidden];
        for (row, token) in embeds
            .chunks_exact_mut(hidden)
            .zip(tokens(rows, sem.vocab_size))
        {
            f.embed_row(token, row);
        }
        return Prompt {
            embeds,
            hybrid: HybridInputs::text(0),
            image: None,
        };
    }
    let side = (rows - 8).isqrt();
    let n_img = side * side;
    let merge = sem.vision.as_ref().map_or(2, |v| v.spatial_merge_size);
    let sets = sem.deepstack_sets;
    let image = PromptImage {
        first_row: (rows - n_img) / 2,
        grid: [1, side * merge, side * merge],
        merge,
        embeds: None,
        deepstack: vec![0f32; sets * n_img * hidden],
        sets,
    };
    image_prompt(f, rows, image)
}

/// `rows` rows around one picture: text tokens ([`tokens`]) with vision start on the row before
/// the image rows and vision end on the row after them, and, when the pack uses MRoPE, the planes
/// transformers' `get_rope_index` gives one image (`engine::rope_index`).
pub fn image_prompt(f: &Decoder, rows: usize, image: PromptImage<'_>) -> Prompt {
    let sem = f.semantics();
    let hidden = sem.hidden_size;
    let text = tokens(rows, sem.vocab_size);
    let (gh, gw) = (image.grid[1] / image.merge, image.grid[2] / image.merge);
    let n_img = image.grid[0] * gh * gw;
    let first = image.first_row;
    let mut embeds = vec![0f32; rows * hidden];
    for (r, row) in embeds.chunks_exact_mut(hidden).enumerate() {
        match image.embeds {
            Some(e) if (first..first + n_img).contains(&r) => {
                let i = r - first;
                row.copy_from_slice(&e[i * hidden..(i + 1) * hidden]);
            }
            _ => {
                let token = if r + 1 == first {
                    sem.vision_start_token_id.unwrap_or(text[r])
                } else if r == first + n_img {
                    sem.vision_end_token_id.unwrap_or(text[r])
                } else {
                    text[r]
                };
                f.embed_row(token, row);
            }
        }
    }
    let span = ImageSpan {
        first_row: first,
        grid: image.grid,
    };
    let planes = f
        .rotary()
        .layout
        .is_mrope()
        .then(|| position_planes(rows, &[span], image.merge, RopeAblation::default()).0);
    Prompt {
        embeds,
        hybrid: HybridInputs {
            planes,
            start_pos: 0,
            image_rows: (first..first + n_img).collect(),
            deepstack: image.deepstack,
            deepstack_sets: image.sets,
        },
        image: Some((gh, gw)),
    }
}

/// Decode steps from the current cache position, each after two bandwidth passes.
pub struct Decode {
    /// Seconds per step.
    pub times: Vec<f64>,
    /// Share of each step spent outside the GEMMs.
    pub non_gemm: Vec<f64>,
    /// Seconds of each step outside the GEMMs, and in attention (cache writes included).
    pub non_gemm_s: Vec<f64>,
    pub attention_s: Vec<f64>,
    /// Seconds of each step in Gated DeltaNet mixers outside their GEMMs (0 for other families).
    pub delta_net_s: Vec<f64>,
    /// The better of the two bandwidth passes just before each step (GB/s).
    pub read: Vec<f64>,
    pub logits: Vec<Vec<f32>>,
    /// The token each step fed, and the cache slot (= rotary position) of the first step.
    pub tokens: Vec<u32>,
    pub first_slot: usize,
}

impl Decode {
    pub fn tok_s(&self) -> f64 {
        1.0 / median(self.times.clone())
    }
    /// Median over steps of (bytes the step read / its time) / (the bandwidth just before it).
    pub fn roofline(&self, bytes: f64) -> f64 {
        median(
            self.times
                .iter()
                .zip(&self.read)
                .map(|(t, r)| bytes / t / 1e9 / r)
                .collect(),
        )
    }
    pub fn non_gemm(&self) -> f64 {
        median(self.non_gemm.clone())
    }
    /// Median ms per step: (outside the GEMMs, in attention).
    pub fn non_gemm_ms(&self) -> (f64, f64) {
        (
            1e3 * median(self.non_gemm_s.clone()),
            1e3 * median(self.attention_s.clone()),
        )
    }
    /// Median ms per step in the DeltaNet mixers outside their GEMMs.
    pub fn delta_net_ms(&self) -> f64 {
        1e3 * median(self.delta_net_s.clone())
    }
}

/// `steps` decode steps, each feeding the argmax of the one before (the first feeds a fixed
/// token).
pub fn decode_steps(f: &mut Decoder, steps: usize, probe: &ReadProbe) -> Decode {
    decode(f, steps, None, probe)
}

/// Decode steps feeding `tokens`, one a step, whatever the logits pick.
pub fn decode_tokens(f: &mut Decoder, tokens: &[u32], probe: &ReadProbe) -> Decode {
    decode(f, tokens.len(), Some(tokens), probe)
}

fn decode(f: &mut Decoder, steps: usize, feed: Option<&[u32]>, probe: &ReadProbe) -> Decode {
    let vocab = f.semantics().vocab_size;
    let mut d = Decode {
        times: Vec::new(),
        non_gemm: Vec::new(),
        non_gemm_s: Vec::new(),
        attention_s: Vec::new(),
        delta_net_s: Vec::new(),
        read: Vec::new(),
        logits: Vec::new(),
        tokens: Vec::new(),
        first_slot: f.next_slot(),
    };
    let mut token = FIRST_TOKEN;
    for step in 0..steps {
        if let Some(feed) = feed {
            token = feed[step];
        }
        d.tokens.push(token);
        d.read.push(probe.beside());
        f.runtime().take_stats();
        f.take_attention_time();
        f.take_delta_net_time();
        let slot = f.next_slot();
        let t = Instant::now();
        let out = f
            .step(token, slot as i64, slot)
            .unwrap_or_else(|e| refuse(e));
        let dt = secs(t.elapsed());
        token = compute::ops::sampling::argmax(out) % vocab as u32;
        d.logits.push(out.to_vec());
        let gemm = secs(f.runtime().take_stats().host);
        d.times.push(dt);
        d.non_gemm.push(((dt - gemm) / dt).max(0.0));
        d.non_gemm_s.push((dt - gemm).max(0.0));
        d.attention_s.push(secs(f.take_attention_time()));
        d.delta_net_s.push(secs(f.take_delta_net_time()));
    }
    d
}

/// One prefill from an empty cache, split: seconds in all, in the GEMMs, in attention.
#[derive(Clone, Copy)]
pub struct PrefillRun {
    pub secs: f64,
    pub gemm: f64,
    pub attention: f64,
    /// Seconds in Gated DeltaNet mixers outside their GEMMs.
    pub delta_net: f64,
}

impl PrefillRun {
    pub fn non_gemm(&self) -> f64 {
        ((self.secs - self.gemm) / self.secs).max(0.0)
    }
}

/// One prefill of `rows` rows ([`prompt_for`]) from an empty cache.
pub fn prefill(f: &mut Decoder, rows: usize) -> PrefillRun {
    let prompt = prompt_for(f, rows);
    prefill_prompt(f, &prompt)
}

/// One prefill of `prompt` from an empty cache.
pub fn prefill_prompt(f: &mut Decoder, prompt: &Prompt) -> PrefillRun {
    f.reset();
    f.runtime().take_stats();
    f.take_attention_time();
    f.take_delta_net_time();
    let t = Instant::now();
    f.step_batch_embeds(&prompt.embeds, &prompt.hybrid, 0, Logits::LastRow)
        .unwrap_or_else(|e| refuse(e));
    let secs_all = secs(t.elapsed());
    PrefillRun {
        secs: secs_all,
        gemm: secs(f.runtime().take_stats().host),
        attention: secs(f.take_attention_time()),
        delta_net: secs(f.take_delta_net_time()),
    }
}

/// Several conversations' prompts in one forward: conversation i's `rows` prompt tokens are
/// [`tokens`] rotated by i (each its own), into `caches[i]` (reset first). Their next tokens.
pub fn prefill_sequences(f: &mut Decoder, caches: &mut [KvCache], rows: usize) -> Vec<u32> {
    let vocab = f.semantics().vocab_size;
    let prompts: Vec<Vec<u32>> = (0..caches.len())
        .map(|i| {
            let mut t = tokens(rows, vocab);
            t.rotate_left(i % rows.max(1));
            t
        })
        .collect();
    for cache in caches.iter_mut() {
        cache.reset();
    }
    let mut batch: Vec<SequenceStep<'_>> = caches
        .iter_mut()
        .zip(&prompts)
        .map(|(cache, p)| SequenceStep {
            cache,
            input: StepInput::Tokens {
                tokens: p,
                start_pos: 0,
            },
            logits: Logits::LastRow,
        })
        .collect();
    let out = f.step_sequences(&mut batch).unwrap_or_else(|e| refuse(e));
    (0..prompts.len())
        .map(|i| compute::ops::sampling::argmax(out.of(i)))
        .collect()
}

/// One decode step of several conversations in one forward (conversation i feeds `next[i]` at
/// rotary position `pos` into `caches[i]`), and `extra` (another sequence's rows) beside them if
/// any: seconds, their next tokens, and `extra`'s last row's next token.
pub fn decode_sequences(
    f: &mut Decoder,
    caches: &mut [KvCache],
    next: &[u32],
    pos: i64,
    extra: Option<SequenceStep<'_>>,
) -> (f64, Vec<u32>, Option<u32>) {
    let mut batch: Vec<SequenceStep<'_>> = caches
        .iter_mut()
        .zip(next)
        .map(|(cache, t)| SequenceStep {
            cache,
            input: StepInput::Tokens {
                tokens: std::slice::from_ref(t),
                start_pos: pos,
            },
            logits: Logits::LastRow,
        })
        .collect();
    let has_extra = extra.is_some();
    batch.extend(extra);
    let n = next.len();
    let t = Instant::now();
    let out = f.step_sequences(&mut batch).unwrap_or_else(|e| refuse(e));
    let s = secs(t.elapsed());
    let argmax = |i: usize| compute::ops::sampling::argmax(out.of(i));
    (
        s,
        (0..n).map(argmax).collect(),
        has_extra.then(|| argmax(n)),
    )
}
