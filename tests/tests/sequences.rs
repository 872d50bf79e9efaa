//! Several sequences in one forward (`Decoder::step_sequences`): each sequence's logits beside
//! others, started at different moments, with its prompt prefilled in chunks between the others'
//! decode rows, are bit for bit its logits alone — on every committed case (pictures included)
//! and every quant kind. Controls: a sequence attending another's slots is caught; a refusal names
//! the sequence and leaves every cache where it was.

use decoder::{kv::KvCache, Logits};
use decoder::{
    Ablation, Decoder, DecoderError, DecoderOptions, HybridInputs, KvDtype, SequenceStep, StepInput,
};
use packs::QuantKind;
use xdna_vl_tests::{cases, forward, options, Case};

const STEPS: usize = 5;

/// What a sequence feeds: a text prompt (fed `chunk` rows per step) or an image prompt in slices.
enum Prompt {
    Text {
        ids: Vec<u32>,
        chunk: usize,
    },
    /// Slices of the prompt: their embeddings and `HybridInputs::slice_rows`.
    Image {
        slices: Vec<(Vec<f32>, HybridInputs)>,
        next_pos: i64,
    },
}

/// One conversation: its cache, its prompt, then greedy decode steps; every logits row it
/// sampled from is kept.
struct Seq {
    cache: KvCache,
    prompt: Prompt,
    /// Prompt rows fed so far.
    fed: usize,
    next_pos: i64,
    next_token: u32,
    steps_left: usize,
    logits: Vec<Vec<f32>>,
    ids: Vec<u32>,
    /// The step (tick) it starts at.
    start: usize,
}

impl Seq {
    fn new(f: &Decoder, prompt: Prompt, start: usize, kv: KvDtype) -> Seq {
        Seq {
            cache: f.new_cache(256, kv),
            prompt,
            fed: 0,
            next_pos: 0,
            next_token: 0,
            steps_left: STEPS,
            logits: Vec::new(),
            ids: Vec::new(),
            start,
        }
    }

    fn active(&self, tick: usize) -> bool {
        tick >= self.start && self.steps_left > 0
    }

    /// This tick's input.
    fn input(&self) -> StepInput<'_> {
        input_of(&self.prompt, self.fed, &self.next_token, self.next_pos)
    }

    /// Takes this tick's last-row logits.
    fn took(&mut self, rows: usize, logits: &[f32]) {
        let prompt_done_now = match &self.prompt {
            Prompt::Text { ids, .. } if self.fed < ids.len() => {
                self.fed += rows;
                if self.fed < ids.len() {
                    return; // a chunk before the prompt's last: its logits are not sampled
                }
                self.next_pos = ids.len() as i64;
                true
            }
            Prompt::Image { slices, next_pos } if self.fed < slices.len() => {
                // `fed` counts slices for an image prompt.
                let _ = rows;
                self.fed += 1;
                if self.fed < slices.len() {
                    return;
                }
                self.next_pos = *next_pos;
                true
            }
            _ => false,
        };
        if !prompt_done_now {
            self.next_pos += 1;
        }
        let id = compute::ops::sampling::argmax(logits);
        self.logits.push(logits.to_vec());
        self.ids.push(id);
        self.next_token = id;
        self.steps_left -= 1;
    }
}

/// A sequence's input from its parts (so its cache can be lent at the same time).
fn input_of<'a>(
    prompt: &'a Prompt,
    fed: usize,
    next_token: &'a u32,
    next_pos: i64,
) -> StepInput<'a> {
    match prompt {
        Prompt::Text { ids, chunk } if fed < ids.len() => {
            let end = (fed + chunk).min(ids.len());
            StepInput::Tokens {
                tokens: &ids[fed..end],
                start_pos: fed as i64,
            }
        }
        Prompt::Image { slices, .. } if fed < slices.len() => StepInput::Embeds {
            embeds: &slices[fed].0,
            hybrid: &slices[fed].1,
        },
        _ => StepInput::Tokens {
            tokens: std::slice::from_ref(next_token),
            start_pos: next_pos,
        },
    }
}

/// Runs the sequences tick by tick, all active ones in one `step_sequences` each tick.
fn run(f: &mut Decoder, seqs: &mut [Seq]) -> Result<(), DecoderError> {
    for tick in 0..64 {
        let active: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].active(tick)).collect();
        if active.is_empty() {
            if seqs.iter().all(|s| s.steps_left == 0) {
                return Ok(());
            }
            continue;
        }
        let rows: Vec<usize> = active
            .iter()
            .map(|&i| match seqs[i].input() {
                StepInput::Tokens { tokens, .. } => tokens.len(),
                StepInput::Embeds { embeds, .. } => embeds.len() / f.semantics().hidden_size,
            })
            .collect();
        let logits: Vec<Vec<f32>> = {
            let mut steps: Vec<SequenceStep<'_>> = Vec::new();
            for seq in seqs.iter_mut().filter(|s| s.active(tick)) {
                let Seq {
                    cache,
                    prompt,
                    fed,
                    next_token,
                    next_pos,
                    ..
                } = seq;
                steps.push(SequenceStep {
                    cache,
                    input: input_of(prompt, *fed, next_token, *next_pos),
                    logits: Logits::LastRow,
                });
            }
            let out = f.step_sequences(&mut steps)?;
            (0..active.len()).map(|j| out.of(j).to_vec()).collect()
        };
        for ((&i, l), n) in active.iter().zip(&logits).zip(rows) {
            seqs[i].took(n, l);
        }
    }
    panic!("sequences did not finish in 64 ticks");
}

fn text_prompt(f: &Decoder, seed: u32, len: usize, chunk: usize) -> Prompt {
    let vocab = f.semantics().vocab_size as u32;
    Prompt::Text {
        ids: (0..len as u32)
            .map(|i| (i * 37 + seed * 11 + 5) % vocab)
            .collect(),
        chunk,
    }
}

/// The case's prompt (its pictures' rows included), in slices of `chunk` rows.
fn image_prompt(case: &Case, f: &Decoder, chunk: usize) -> Prompt {
    let inputs = case.inputs();
    let (embeds, hybrid, rows) = (inputs.embeds(f), inputs.hybrid(), inputs.rows());
    let hidden = f.semantics().hidden_size;
    let slices = (0..rows)
        .step_by(chunk)
        .map(|first| {
            let n = chunk.min(rows - first);
            (
                embeds[first * hidden..(first + n) * hidden].to_vec(),
                hybrid.slice_rows(first, n, rows, hidden),
            )
        })
        .collect();
    Prompt::Image {
        slices,
        next_pos: inputs.next_rotary_pos(),
    }
}

/// Four conversations: the case's prompt (pictures included) whole from tick 0, a text prompt
/// from tick 0, a text prompt from tick 2 and the case's prompt again from tick 1, the last two
/// prefilled `chunk` rows per tick between the others' decode rows (`chunk` 0: whole).
fn four(case: &Case, f: &Decoder, kv: KvDtype, chunk: usize) -> Vec<Seq> {
    let whole = usize::MAX / 2;
    let chunk = if chunk == 0 { whole } else { chunk };
    vec![
        Seq::new(f, image_prompt(case, f, whole), 0, kv),
        Seq::new(f, text_prompt(f, 1, 9, 9), 0, kv),
        Seq::new(f, text_prompt(f, 2, 11, chunk), 2, kv),
        Seq::new(f, image_prompt(case, f, chunk), 1, kv),
    ]
}

fn alone(case: &Case, f: &mut Decoder, kv: KvDtype) -> Vec<Seq> {
    let mut out = Vec::new();
    for (i, mut s) in four(case, f, kv, 0).into_iter().enumerate() {
        s.start = 0;
        let mut one = [s];
        run(f, &mut one).unwrap_or_else(|e| panic!("{}: sequence {i} alone: {e}", case.name));
        let [s] = one;
        out.push(s);
    }
    out
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn each_sequence_beside_others_equals_itself_alone() {
    for name in cases() {
        let case = Case::new(&name);
        for kind in [QuantKind::F32, QuantKind::I8, QuantKind::Q4] {
            let (_dir, pack) = case.pack(kind);
            let mut f = forward(&pack, options());
            for kv in [KvDtype::F32, KvDtype::Bf16] {
                let alone = alone(&case, &mut f, kv);
                let mut together = four(&case, &f, kv, 3);
                run(&mut f, &mut together).unwrap();
                // The chunked image prompt (sequence 3) is the whole one (sequence 0) alone.
                assert_eq!(alone[3].ids, alone[0].ids, "{name} {kind}: chunked alone");
                for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
                    assert_eq!(
                        a.ids, t.ids,
                        "{name} {kind} {kv:?}: sequence {i}'s greedy ids"
                    );
                    assert!(
                        bits(&a.logits) == bits(&t.logits),
                        "{name} {kind} {kv:?}: sequence {i}'s logits differ beside the others"
                    );
                }
                println!(
                    "{name} {kind} {kv:?}: ids {:?}",
                    together.iter().map(|s| &s.ids).collect::<Vec<_>>()
                );
            }
        }
    }
}

/// Control: a sequence that attends the previous sequence's slots is caught by the comparison.
#[test]
fn a_sequence_reading_anothers_slots_is_caught() {
    let case = Case::new("hd128");
    let (_dir, pack) = case.pack(QuantKind::F32);
    let mut f = forward(&pack, options());
    let alone = alone(&case, &mut f, KvDtype::F32);
    let mut planted = forward(
        &pack,
        DecoderOptions {
            ablation: Ablation {
                attend_other_sequence: true,
                ..Ablation::default()
            },
            ..options()
        },
    );
    let mut together = four(&case, &planted, KvDtype::F32, 3);
    run(&mut planted, &mut together).unwrap();
    let differing = alone
        .iter()
        .zip(&together)
        .filter(|(a, t)| bits(&a.logits) != bits(&t.logits))
        .count();
    assert!(
        differing >= 2,
        "only {differing} sequences differ with the planted reads"
    );
}

#[test]
fn a_refusal_names_the_sequence_and_advances_no_cache() {
    let case = Case::new("hd128");
    let (_dir, pack) = case.pack(QuantKind::F32);
    let mut f = forward(&pack, options());
    let mut a = f.new_cache(8, KvDtype::F32);
    let mut b = f.new_cache(4, KvDtype::F32);
    let (ta, tb) = ([1u32, 2, 3], [4u32, 5, 6, 7, 8]);
    let e = f
        .step_sequences(&mut [
            SequenceStep {
                cache: &mut a,
                input: StepInput::Tokens {
                    tokens: &ta,
                    start_pos: 0,
                },
                logits: Logits::LastRow,
            },
            SequenceStep {
                cache: &mut b,
                input: StepInput::Tokens {
                    tokens: &tb,
                    start_pos: 0,
                },
                logits: Logits::LastRow,
            },
        ])
        .err()
        .expect("5 rows into a 4-slot cache were accepted")
        .to_string();
    assert!(e.starts_with("sequence 1:") && e.contains("holds 4"), "{e}");
    assert_eq!((a.len(), b.len()), (0, 0), "no cache advanced");
    // Control: the same step with room runs and advances both.
    let mut b = f.new_cache(8, KvDtype::F32);
    f.step_sequences(&mut [
        SequenceStep {
            cache: &mut a,
            input: StepInput::Tokens {
                tokens: &ta,
                start_pos: 0,
            },
            logits: Logits::LastRow,
        },
        SequenceStep {
            cache: &mut b,
            input: StepInput::Tokens {
                tokens: &tb,
                start_pos: 0,
            },
            logits: Logits::AllRows,
        },
    ])
    .unwrap();
    assert_eq!((a.len(), b.len()), (3, 5));
    // A cache made for another geometry is refused by name.
    let other = Case::new("odd");
    let (_dir2, other_pack) = other.pack(QuantKind::F32);
    let g = forward(&other_pack, options());
    let mut foreign = g.new_cache(8, KvDtype::F32);
    let e = f
        .step_sequences(&mut [SequenceStep {
            cache: &mut foreign,
            input: StepInput::Tokens {
                tokens: &ta,
                start_pos: 0,
            },
            logits: Logits::LastRow,
        }])
        .err()
        .map(|e| e.to_string());
    let same_geometry = g.semantics().num_layers == f.semantics().num_layers
        && g.semantics().num_kv_heads * g.semantics().head_dim
            == f.semantics().num_kv_heads * f.semantics().head_dim
        && g.semantics().head_dim == f.semantics().head_dim;
    if !same_geometry {
        let e = e.expect("a cache of another geometry was accepted");
        assert!(e.contains("new_cache"), "{e}");
    }
}
