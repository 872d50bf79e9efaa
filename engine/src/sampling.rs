//! Choosing the next token from a row of logits, in transformers' order: repetition penalty, then
//! temperature, top-k, top-p, min-p, then a draw from the softmax with a seeded generator (the same
//! seed gives the same tokens). Temperature 0 is greedy (the first of equal maxima, as
//! `torch.argmax`).

use crate::constraint::{Constraint, Grammar};
use crate::error::{EngineError, Result};
use crate::generation_config::GenerationConfig;
use compute::ops::sampling::argmax;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off; > 1 makes tokens already in the prompt or answer less likely.
    pub repetition_penalty: f32,
    /// OpenAI's: subtracted from a token's logit once per time it is in the answer (0 = off).
    pub frequency_penalty: f32,
    /// OpenAI's: subtracted from a token's logit if it is in the answer at all (0 = off).
    pub presence_penalty: f32,
    pub seed: u64,
    pub max_tokens: usize,
    /// The answer ends before the first of these strings (not shown).
    pub stop: Vec<String>,
    /// The answer ends at these ids (not shown); empty = the generation config's and `<|im_end|>`.
    pub eos_ids: Vec<u32>,
    /// What the answer must be (JSON, a schema, a grammar); none = free text.
    pub grammar: Option<Grammar>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            max_tokens: 256,
            stop: Vec::new(),
            eos_ids: Vec::new(),
            grammar: None,
        }
    }
}

impl SamplingParams {
    /// The checkpoint's recommendation: its sampling when `do_sample` is on, greedy otherwise.
    pub fn from_generation_config(gc: &GenerationConfig) -> SamplingParams {
        let mut p = SamplingParams::default();
        if gc.do_sample.unwrap_or(false) {
            p.temperature = gc.temperature.unwrap_or(1.0);
            p.top_k = gc.top_k.unwrap_or(0);
            p.top_p = gc.top_p.unwrap_or(1.0);
            p.min_p = gc.min_p.unwrap_or(0.0);
        }
        p.repetition_penalty = gc.repetition_penalty.unwrap_or(1.0);
        p
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Refuses values no sampler can use, naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Sampling(m));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!(
                "temperature {} must be >= 0 (0 = greedy)",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top-p {} must be in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min-p {} must be in [0, 1]", self.min_p));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad(format!(
                "repetition penalty {} must be > 0 (1 = off)",
                self.repetition_penalty
            ));
        }
        for (name, v) in [
            ("frequency penalty", self.frequency_penalty),
            ("presence penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} {v} must be in [-2, 2]"));
            }
        }
        if self.max_tokens == 0 {
            return bad("max tokens must be at least 1".into());
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return bad("a stop string is empty".into());
        }
        Ok(())
    }
}

/// splitmix64: a small generator with good statistics, fully determined by its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1) with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The sampler of one answer: parameters, generator and scratch.
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    /// (token, weight) candidates, reused across steps.
    scratch: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Sampler {
            params,
            rng,
            scratch: Vec::new(),
        })
    }

    /// The next token. `logits` is modified (penalties); `history` holds the ids the repetition
    /// penalty looks at (prompt and answer so far), `answer` the answer's ids (frequency and
    /// presence penalties); `step` names the step in errors.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        answer: &[u32],
        step: usize,
    ) -> Result<u32> {
        self.sample_constrained(logits, history, answer, step, None)
    }

    /// [`Sampler::sample`] with the tokens `constraint` does not allow at `-inf` after the
    /// penalties (the last logits processor, as llguidance's is in transformers), so greedy and
    /// sampled draws alike pick an allowed token.
    pub fn sample_constrained(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        answer: &[u32],
        step: usize,
        constraint: Option<&mut Constraint>,
    ) -> Result<u32> {
        self.apply_penalties(logits, history, answer, step)?;
        if let Some(c) = constraint {
            c.mask(logits)?;
            if logits.iter().all(|&l| l == f32::NEG_INFINITY) {
                return Err(EngineError::Grammar(format!(
                    "no token can continue the constrained answer at step {step}"
                )));
            }
        }
        if self.params.is_greedy() {
            return Ok(argmax(logits));
        }
        let candidates = filtered_distribution(logits, &self.params, &mut self.scratch);
        let u = self.rng.next_f64();
        Ok(draw(candidates, u))
    }

    /// Refuses non-finite or empty logits by name, then applies the repetition, frequency and
    /// presence penalties (every draw starts here).
    fn apply_penalties(
        &self,
        logits: &mut [f32],
        history: &[u32],
        answer: &[u32],
        step: usize,
    ) -> Result<()> {
        if let Some(i) = packs::first_non_finite(logits) {
            return Err(EngineError::NonFiniteLogits {
                value: logits[i],
                token: i,
                step,
            });
        }
        if logits.is_empty() {
            return Err(EngineError::Sampling("empty logits".into()));
        }
        apply_repetition_penalty(logits, history, self.params.repetition_penalty);
        apply_frequency_presence(
            logits,
            answer,
            self.params.frequency_penalty,
            self.params.presence_penalty,
        );
        Ok(())
    }

    /// The next token where `draft` was fed after this row (a verified window): greedy, the
    /// argmax (the window keeps the draft's row only if they agree); sampling, the speculative
    /// acceptance rule for a draft proposed with certainty (prompt lookup, the MTP head's argmax):
    /// the draft is taken with its probability p(draft), else a token is drawn from p without the
    /// draft, renormalized. Either way the token's distribution is p, as without drafts
    /// (Leviathan et al. 2023, with q a point mass).
    pub fn sample_after_draft(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        answer: &[u32],
        step: usize,
        draft: u32,
    ) -> Result<u32> {
        if self.params.is_greedy() {
            return self.sample(logits, history, answer, step);
        }
        self.apply_penalties(logits, history, answer, step)?;
        let candidates = filtered_distribution(logits, &self.params, &mut self.scratch);
        let p_draft = candidates
            .iter()
            .find(|c| c.0 == draft)
            .map_or(0.0, |c| f64::from(c.1));
        if self.rng.next_f64() < p_draft {
            return Ok(draft);
        }
        // Rejected: the residual max(0, p - q) is p without the draft.
        self.scratch.retain(|c| c.0 != draft);
        if self.scratch.is_empty() {
            return Ok(draft);
        }
        renormalize(&mut self.scratch);
        let u = self.rng.next_f64();
        Ok(draw(&self.scratch, u))
    }
}

/// transformers' `RepetitionPenaltyLogitsProcessor`: for every id seen, a positive logit is divided
/// by the penalty, a negative one multiplied.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = vec![false; logits.len()];
    for &t in history {
        let t = t as usize;
        if t < logits.len() && !seen[t] {
            seen[t] = true;
            let l = &mut logits[t];
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// OpenAI's penalties over the answer's ids: `logit -= count * frequency + (count > 0) * presence`.
pub fn apply_frequency_presence(logits: &mut [f32], answer: &[u32], frequency: f32, presence: f32) {
    if frequency == 0.0 && presence == 0.0 {
        return;
    }
    let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for &t in answer {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &n) in &counts {
        if let Some(l) = logits.get_mut(t as usize) {
            *l -= n as f32 * frequency + presence;
        }
    }
}

/// Temperature, top-k, top-p and min-p applied; the candidates left with their probabilities
/// (renormalized), most likely first.
pub fn filtered_distribution<'s>(
    logits: &[f32],
    p: &SamplingParams,
    scratch: &'s mut Vec<(u32, f32)>,
) -> &'s [(u32, f32)] {
    scratch.clear();
    let inv_t = 1.0 / p.temperature;
    scratch.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l * inv_t)),
    );
    // Most likely first; equal logits by lower id (a stable order makes draws reproducible).
    scratch.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if p.top_k > 0 && p.top_k < scratch.len() {
        // Ties with the k-th value stay, as transformers keeps every logit >= the k-th.
        let kth = scratch[p.top_k - 1].1;
        let keep = scratch.iter().take_while(|c| c.1 >= kth).count();
        scratch.truncate(keep);
    }
    // Tokens a constraint ruled out (-inf, last in the order) are no candidates: not even the
    // fallback of a draw that rounding carries past the total.
    let finite = scratch
        .iter()
        .take_while(|c| c.1 > f32::NEG_INFINITY)
        .count();
    scratch.truncate(finite.max(1));
    softmax_in_place(scratch);
    if p.top_p < 1.0 {
        // Keep a token while the mass of the tokens above it is below top-p (at least one).
        let mut above = 0.0f32;
        let mut keep = 0;
        for c in scratch.iter() {
            if keep > 0 && above >= p.top_p {
                break;
            }
            above += c.1;
            keep += 1;
        }
        scratch.truncate(keep);
        renormalize(scratch);
    }
    if p.min_p > 0.0 {
        let floor = p.min_p * scratch[0].1;
        let keep = scratch.iter().take_while(|c| c.1 >= floor).count().max(1);
        scratch.truncate(keep);
        renormalize(scratch);
    }
    scratch
}

fn softmax_in_place(c: &mut [(u32, f32)]) {
    let max = c[0].1;
    let mut sum = 0.0f64;
    for x in c.iter_mut() {
        x.1 = (x.1 - max).exp();
        sum += f64::from(x.1);
    }
    for x in c.iter_mut() {
        x.1 = (f64::from(x.1) / sum) as f32;
    }
}

fn renormalize(c: &mut [(u32, f32)]) {
    let sum: f64 = c.iter().map(|x| f64::from(x.1)).sum();
    for x in c.iter_mut() {
        x.1 = (f64::from(x.1) / sum) as f32;
    }
}

/// The candidate whose cumulative probability first exceeds `u` (the last one if rounding leaves
/// `u` above the total).
pub fn draw(candidates: &[(u32, f32)], u: f64) -> u32 {
    let mut acc = 0.0f64;
    for c in candidates {
        acc += f64::from(c.1);
        if u < acc {
            return c.0;
        }
    }
    candidates.last().map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        f(&mut p);
        p
    }

    fn dist(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f32)> {
        let mut s = Vec::new();
        filtered_distribution(logits, p, &mut s).to_vec()
    }

    fn close(got: &[(u32, f32)], want: &[(u32, f32)]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.0, w.0, "{got:?} vs {want:?}");
            assert!((g.1 - w.1).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    // ln of probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625: softmax gives them back exactly.
    fn halves() -> Vec<f32> {
        [0.0625f32, 0.5, 0.0625, 0.25, 0.125]
            .iter()
            .map(|p| p.ln())
            .collect()
    }

    #[test]
    fn the_full_distribution_is_the_softmax() {
        close(
            &dist(&halves(), &params(|_| {})),
            &[(1, 0.5), (3, 0.25), (4, 0.125), (0, 0.0625), (2, 0.0625)],
        );
    }

    #[test]
    fn top_k_keeps_the_k_largest_renormalized() {
        // By hand: 0.5 / 0.75, 0.25 / 0.75.
        close(
            &dist(&halves(), &params(|p| p.top_k = 2)),
            &[(1, 2.0 / 3.0), (3, 1.0 / 3.0)],
        );
        // Ties at the k-th value stay (transformers keeps logits >= the k-th).
        let d = dist(&halves(), &params(|p| p.top_k = 4));
        assert_eq!(d.len(), 5);
    }

    #[test]
    fn top_p_keeps_the_smallest_head_reaching_p() {
        // 0.5 + 0.25 = 0.75 >= 0.7: two tokens.
        close(
            &dist(&halves(), &params(|p| p.top_p = 0.7)),
            &[(1, 2.0 / 3.0), (3, 1.0 / 3.0)],
        );
        // 0.75 < 0.8: the third joins (0.5/0.875, 0.25/0.875, 0.125/0.875).
        close(
            &dist(&halves(), &params(|p| p.top_p = 0.8)),
            &[(1, 0.5 / 0.875), (3, 0.25 / 0.875), (4, 0.125 / 0.875)],
        );
        // At least one token however small p is.
        assert_eq!(dist(&halves(), &params(|p| p.top_p = 1e-6)).len(), 1);
    }

    #[test]
    fn min_p_drops_tokens_under_a_fraction_of_the_top() {
        // Floor 0.3 * 0.5 = 0.15: 0.5 and 0.25 stay.
        close(
            &dist(&halves(), &params(|p| p.min_p = 0.3)),
            &[(1, 2.0 / 3.0), (3, 1.0 / 3.0)],
        );
        // Floor 0.2 * 0.5 = 0.1: 0.125 stays too.
        assert_eq!(dist(&halves(), &params(|p| p.min_p = 0.2)).len(), 3);
    }

    #[test]
    fn temperature_sharpens_by_dividing_logits() {
        // T = 0.5 squares the probabilities: 0.25, 0.0625, ... / sum.
        let sq: Vec<f32> = [0.5f32, 0.25, 0.125, 0.0625, 0.0625]
            .iter()
            .map(|p| p * p)
            .collect();
        let sum: f32 = sq.iter().sum();
        let d = dist(&halves(), &params(|p| p.temperature = 0.5));
        close(
            &d,
            &[
                (1, sq[0] / sum),
                (3, sq[1] / sum),
                (4, sq[2] / sum),
                (0, sq[3] / sum),
                (2, sq[4] / sum),
            ],
        );
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let mut l = vec![2.0, -2.0, 1.0];
        apply_repetition_penalty(&mut l, &[0, 1, 1], 2.0);
        assert_eq!(l, vec![1.0, -4.0, 1.0]);
    }

    #[test]
    fn frequency_and_presence_penalties_count_the_answer() {
        let mut l = vec![1.0, 1.0, 1.0];
        // Token 0 twice, token 2 once: 1 - 2*0.5 - 0.25, 1, 1 - 0.5 - 0.25.
        apply_frequency_presence(&mut l, &[0, 2, 0], 0.5, 0.25);
        assert_eq!(l, vec![-0.25, 1.0, 0.25]);
    }

    fn run(params: SamplingParams, steps: usize) -> Vec<u32> {
        let mut s = Sampler::new(params).unwrap();
        let mut rng = Rng::new(99);
        (0..steps)
            .map(|i| {
                let mut l: Vec<f32> = (0..50).map(|_| rng.next_f64() as f32 * 4.0).collect();
                s.sample(&mut l, &[], &[], i).unwrap()
            })
            .collect()
    }

    /// The speculative rule keeps the distribution: over many seeds, each token's frequency after
    /// a draft is within 5 standard deviations of its probability; the draft is taken about as
    /// often as its probability says. Control: taking every draft is caught.
    #[test]
    fn a_draft_leaves_the_sampled_distribution_unchanged() {
        let logits = vec![2.0, 1.5, 1.0, 0.2, -0.5, 0.9];
        let p = params(|p| {
            p.temperature = 0.8;
            p.top_k = 5;
        });
        let want = dist(&logits, &p);
        let n = 20_000;
        for draft in [0u32, 2, 5] {
            let mut counts = [0usize; 6];
            for seed in 0..n {
                let mut s = Sampler::new(SamplingParams {
                    seed: seed as u64,
                    ..p.clone()
                })
                .unwrap();
                let mut l = logits.clone();
                counts[s.sample_after_draft(&mut l, &[], &[], 0, draft).unwrap() as usize] += 1;
            }
            for (t, &count) in counts.iter().enumerate() {
                let pt = want.iter().find(|c| c.0 == t as u32).map_or(0.0, |c| c.1) as f64;
                let sd = (pt * (1.0 - pt) / n as f64).sqrt().max(1e-9);
                let got = count as f64 / n as f64;
                assert!(
                    (got - pt).abs() <= 5.0 * sd + 1e-12,
                    "draft {draft}: token {t} drawn {got}, probability {pt}"
                );
            }
            // Control: a rule that takes every draft draws the draft every time.
            let p_draft = want.iter().find(|c| c.0 == draft).map_or(0.0, |c| c.1) as f64;
            let sd = (p_draft * (1.0 - p_draft) / n as f64).sqrt();
            assert!(
                (1.0 - p_draft) > 5.0 * sd,
                "draft {draft}: the control cannot fail"
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let p = params(|p| p.seed = 7);
        assert_eq!(run(p.clone(), 40), run(p.clone(), 40));
        // Control: another seed gives other tokens.
        assert_ne!(run(p, 40), run(params(|p| p.seed = 8), 40));
    }

    #[test]
    fn temperature_zero_and_top_k_one_are_greedy() {
        let greedy = run(params(|p| p.temperature = 0.0), 40);
        let mut rng = Rng::new(99);
        let argmaxes: Vec<u32> = (0..40)
            .map(|_| {
                let l: Vec<f32> = (0..50).map(|_| rng.next_f64() as f32 * 4.0).collect();
                argmax(&l)
            })
            .collect();
        assert_eq!(greedy, argmaxes);
        assert_eq!(run(params(|p| p.top_k = 1), 40), argmaxes);
        // Control: plain sampling at T = 1 leaves the argmax somewhere.
        assert_ne!(run(params(|_| {}), 40), argmaxes);
    }

    #[test]
    fn non_finite_logits_are_refused_by_name() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        let mut l = vec![0.0, f32::NAN, 1.0];
        let e = s.sample(&mut l, &[], &[], 3).unwrap_err().to_string();
        assert!(e.contains("NaN at token id 1 (decode step 3)"), "{e}");
        let mut l = vec![0.0, 1.0, f32::INFINITY];
        let e = s.sample(&mut l, &[], &[], 0).unwrap_err().to_string();
        assert!(e.contains("inf at token id 2"), "{e}");
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        for (p, what) in [
            (params(|p| p.temperature = -1.0), "temperature"),
            (params(|p| p.top_p = 0.0), "top-p"),
            (params(|p| p.min_p = 2.0), "min-p"),
            (params(|p| p.repetition_penalty = 0.0), "repetition penalty"),
            (params(|p| p.max_tokens = 0), "max tokens"),
        ] {
            let e = Sampler::new(p).err().unwrap().to_string();
            assert!(e.contains(what), "{e}");
        }
    }
}
