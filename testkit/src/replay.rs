//! Replaying a reference prompt through the forward: prefill every row, then teacher-forced greedy
//! steps (`decoder::decode_step`: the next free cache slot, rotary positions from `max(position) + 1`
//! on), and the text-only control — the one procedure the probe, the tests and the C ABI test share.

use crate::compare::{cosine, RowsCompared};
use crate::inputs::PromptInputs;
use crate::reference::Reference;
use compute::ops::sampling::argmax;
use decoder::{Decoder, Logits};

#[derive(Clone, Debug, serde::Serialize)]
pub struct Replay {
    /// Every prompt row against `prefill_logits`.
    pub prompt: RowsCompared,
    /// Each decode step against `decode_logits`.
    pub decode: RowsCompared,
    /// Our own argmax after the prompt and after each step.
    pub greedy_ids: Vec<u32>,
    /// The text-only control against `text_logits`.
    pub text: RowsCompared,
    /// Cosine of all our logits (prompt + steps) with the reference's.
    pub cosine: f64,
    pub text_cosine: f64,
}

impl Replay {
    pub fn max_abs_logit_diff(&self) -> f32 {
        self.prompt.max_abs_diff().max(self.decode.max_abs_diff())
    }

    /// Fraction of prompt rows and steps whose argmax equals the reference's.
    pub fn top1_agreement(&self) -> f64 {
        let n = self.prompt.rows + self.decode.rows;
        (self.prompt.agreeing() + self.decode.agreeing()) as f64 / n.max(1) as f64
    }

    /// First greedy step (0 = after the prompt) whose argmax differs from the reference's greedy id.
    pub fn first_divergence(&self, reference: &Reference) -> Option<usize> {
        self.greedy_ids
            .iter()
            .zip(&reference.greedy_ids)
            .position(|(&a, &b)| i64::from(a) != b)
    }
}

/// Refuses a reference made for another model or prompt, naming what differs.
pub fn check_reference(
    forward: &Decoder,
    inputs: &PromptInputs,
    reference: &Reference,
) -> Result<(), String> {
    let vocab = forward.semantics().vocab_size;
    let p = reference.path.display();
    if reference.vocab != vocab {
        return Err(format!(
            "{p}: logits are {} wide but the pack's vocabulary is {vocab}: a reference from another model",
            reference.vocab
        ));
    }
    if reference.prompt_rows() != inputs.rows() {
        return Err(format!(
            "{p}: {} prompt rows of logits, the inputs hold {} rows: a reference for another prompt",
            reference.prompt_rows(),
            inputs.rows()
        ));
    }
    for (i, &t) in reference
        .greedy_ids
        .iter()
        .chain(&reference.text_ids)
        .enumerate()
    {
        if t < 0 || t as usize >= vocab {
            return Err(format!(
                "{p}: token id {t} (entry {i}) is outside the vocabulary (0..{vocab})"
            ));
        }
    }
    Ok(())
}

/// Runs the prompt, `reference.greedy_ids.len() - 1` teacher-forced steps, and the text control.
/// `on_step(step, own_argmax, logits, forward)` sees every greedy step as it is produced (step 0 is
/// the prompt).
pub fn replay(
    forward: &mut Decoder,
    inputs: &PromptInputs,
    reference: &Reference,
    mut on_step: impl FnMut(usize, u32, &[f32], &mut Decoder),
) -> Result<Replay, String> {
    check_reference(forward, inputs, reference)?;
    let vocab = reference.vocab;
    let rows = inputs.rows();
    forward.reset();
    let embeds = inputs.embeds(forward);
    let hybrid = inputs.hybrid();
    let logits = forward
        .step_batch_embeds(&embeds, &hybrid, 0, Logits::AllRows)
        .map_err(|e| e.to_string())?;
    let prompt = RowsCompared::new(logits, &reference.prefill_logits, vocab);
    let mut all_ours = logits.to_vec();
    let mut all_ref = reference.prefill_logits.clone();
    let mut greedy_ids = vec![argmax(&all_ours[(rows - 1) * vocab..])];
    on_step(0, greedy_ids[0], &all_ours[(rows - 1) * vocab..], forward);
    let mut decode = RowsCompared::default();
    // The slot is the forward's next free one, the rotary position the engine's decode rule's.
    let mut rotary_pos = inputs.next_rotary_pos();
    for (i, &fed) in reference.greedy_ids[..reference.greedy_ids.len() - 1]
        .iter()
        .enumerate()
    {
        let logits = decoder::decode_step(forward, fed as u32, &mut rotary_pos)
            .map_err(|e| e.to_string())?;
        let expected = &reference.decode_logits[i * vocab..(i + 1) * vocab];
        decode.push_rows(logits, expected, vocab);
        all_ours.extend_from_slice(logits);
        all_ref.extend_from_slice(expected);
        let id = argmax(logits);
        greedy_ids.push(id);
        on_step(i + 1, id, &all_ours[all_ours.len() - vocab..], forward);
    }
    let cosine_all = cosine(&all_ours, &all_ref);

    forward.reset();
    let text_ids: Vec<u32> = reference.text_ids.iter().map(|&t| t as u32).collect();
    let text_logits = forward
        .step_batch(&text_ids, 0, 0, Logits::AllRows)
        .map_err(|e| e.to_string())?;
    let text = RowsCompared::new(text_logits, &reference.text_logits, vocab);
    let text_cosine = cosine(text_logits, &reference.text_logits);
    Ok(Replay {
        prompt,
        decode,
        greedy_ids,
        text,
        cosine: cosine_all,
        text_cosine,
    })
}
