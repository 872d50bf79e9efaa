//! A sequence's recurrent state (Qwen3.5's Gated DeltaNet layers): per linear layer, the conv's
//! last `kernel - 1` inputs and the delta rule's key x value matrix per value head.
//!
//! Unlike KV rows, this state cannot be cut back to an earlier slot: it is one state after the
//! last row. A step of one row (decode without drafts) or of more than [`MAX_ROLLBACK_ROWS`] rows
//! (a prompt) updates it in place: nothing is copied. A step of 2..=[`MAX_ROLLBACK_ROWS`] rows (a
//! verified draft window) writes its state into the second buffer, each value head copying its
//! matrix there just before updating it (while it is in cache), and keeps the rows' delta-rule
//! inputs (about 50 KB per row and layer at Qwen3.5-2B's width, against 1.1 MB per row and
//! layer for a state): a rollback to any prefix of the window replays that prefix from the state
//! before it, bit for bit what the step computed. Any other cut goes back to a prompt state
//! (`checkpoint`) or forgets the state (the caller prefills again from slot 0).
//!
//! A step that fails after it began may have updated the state in place: the state is then lost
//! until a cut (`restore`) or `reset`, and a step on it is refused.

use packs::semantics::DeltaNetSemantics;
use rayon::prelude::*;

use crate::qwen3_5::delta_rule::{recurrent_rows, DeltaIsa, HeadRows};
use crate::DecoderError;

/// The most rows of one step that can be rolled back to any of their prefixes: a draft window of
/// 16 drafts and the sampled row (`--drafts` allows at most 16).
pub const MAX_ROLLBACK_ROWS: usize = 17;

/// Where the values of one linear layer's state sit in a state vector, and the geometry a replay
/// of the delta rule needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateLayout {
    /// Linear layers.
    pub layers: usize,
    /// `(kernel - 1) x conv_dim` values, oldest input first.
    pub conv_values: usize,
    /// `value_heads x key_head_dim x value_head_dim` values.
    pub delta_values: usize,
    /// Channels of the conv: `2 x key_dim + value_dim` (q, k, v).
    pub conv_dim: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
}

impl StateLayout {
    pub fn of(d: &DeltaNetSemantics) -> StateLayout {
        StateLayout {
            layers: d.linear_layers.len(),
            conv_values: (d.conv_kernel - 1) * d.conv_dim(),
            delta_values: d.num_value_heads * d.key_head_dim * d.value_head_dim,
            conv_dim: d.conv_dim(),
            key_heads: d.num_key_heads,
            value_heads: d.num_value_heads,
            key_head_dim: d.key_head_dim,
            value_head_dim: d.value_head_dim,
        }
    }

    /// Values of one layer's state.
    pub fn per_layer(&self) -> usize {
        self.conv_values + self.delta_values
    }

    /// Values of a whole state (every linear layer).
    pub fn values(&self) -> usize {
        self.layers * self.per_layer()
    }

    /// Values of one value head's matrix.
    pub fn head_values(&self) -> usize {
        self.key_head_dim * self.value_head_dim
    }

    /// Value head `head`'s inputs over `rows` rows of conv outputs `mixed` (`rows x conv_dim`:
    /// q, k, v; value heads share key heads in groups) and β, g (`rows x value_heads`).
    pub(crate) fn head_rows<'a>(
        &self,
        head: usize,
        rows: usize,
        mixed: &'a [f32],
        beta: &'a [f32],
        log_decay: &'a [f32],
    ) -> HeadRows<'a> {
        let (dk, dv) = (self.key_head_dim, self.value_head_dim);
        let key_dim = self.key_heads * dk;
        let group = self.value_heads / self.key_heads;
        HeadRows {
            rows,
            mixed,
            row_len: self.conv_dim,
            q_at: (head / group) * dk,
            k_at: key_dim + (head / group) * dk,
            v_at: 2 * key_dim + head * dv,
            key_dim: dk,
            value_dim: dv,
            beta,
            log_decay,
            gate_len: self.value_heads,
            head,
        }
    }
}

/// One linear layer's inputs over the rows of the last window step, what a replay reads.
#[derive(Debug, Default)]
pub(crate) struct WindowLayer {
    /// The conv's inputs (`rows x conv_dim`, before the conv).
    pub raw: Vec<f32>,
    /// The delta rule's q, k, v (`rows x conv_dim`, after the conv and the norms).
    pub mixed: Vec<f32>,
    /// β and g (`rows x value_heads` each).
    pub beta: Vec<f32>,
    pub log_decay: Vec<f32>,
    /// The kernels that ran (a replay runs the same ones: bit for bit).
    pub isa: Option<DeltaIsa>,
}

/// Linear layer `i`'s part of a running step: the state it updates, and for a window step the
/// state before the step (which the updated one starts as: the caller copies it per head, hot
/// in cache) and where the window's inputs go.
pub(crate) struct LayerViews<'a> {
    pub state: &'a mut [f32],
    pub window: Option<(&'a [f32], &'a mut WindowLayer)>,
}

/// One sequence's recurrent state; see the module comment.
#[derive(Debug)]
pub struct RecurrentState {
    layout: StateLayout,
    /// Two state buffers: `states[now]` is the state after the committed rows; after a window
    /// step, the other one is the state before it.
    states: [Vec<f32>; 2],
    now: usize,
    /// The running step's first slot and rows; whether it writes beside the current state.
    pending: (usize, usize),
    pending_beside: bool,
    /// The last step was a window step whose rows and inputs are kept: its first slot and rows.
    window: Option<(usize, usize)>,
    window_layers: Vec<WindowLayer>,
    /// A step began in place and did not commit: the current state is not the committed rows'.
    lost: bool,
    /// Saved states (prompt states): `(rows, state)`, the last [`MAX_CHECKPOINTS`] saved.
    checkpoints: Vec<(usize, Vec<f32>)>,
    /// A replay's discarded outputs (one head's rows).
    replay_out: Vec<f32>,
}

/// Prompt states a sequence keeps (the end of each of its last two prompts: a chat's next turn
/// re-renders the previous answer, so its rows part from the cache after the previous prompt).
pub const MAX_CHECKPOINTS: usize = 2;

impl RecurrentState {
    /// The zero state (before any row).
    pub fn new(layout: StateLayout) -> RecurrentState {
        RecurrentState {
            layout,
            states: [vec![0.0; layout.values()], Vec::new()],
            now: 0,
            pending: (0, 0),
            pending_beside: false,
            window: None,
            window_layers: (0..layout.layers).map(|_| WindowLayer::default()).collect(),
            lost: false,
            checkpoints: Vec::new(),
            replay_out: Vec::new(),
        }
    }

    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// Bytes held: the states, the window's inputs and the prompt states.
    pub fn bytes_allocated(&self) -> usize {
        let states: usize = self.states.iter().map(Vec::len).sum::<usize>()
            + self.checkpoints.len() * self.layout.values();
        let window: usize = self
            .window_layers
            .iter()
            .map(|w| w.raw.len() + w.mixed.len() + w.beta.len() + w.log_decay.len())
            .sum();
        (states + window) * 4
    }

    /// Forget everything: the zero state.
    pub fn reset(&mut self) {
        self.states[self.now].fill(0.0);
        self.window = None;
        self.lost = false;
        self.checkpoints.clear();
    }

    /// Saves the current state as the state after `rows` rows (a prompt state): a later cut
    /// back to at least `rows` rows resumes from it.
    pub(crate) fn checkpoint(&mut self, rows: usize) {
        if self.lost {
            return;
        }
        self.checkpoints.retain(|(r, _)| *r != rows);
        let now = &self.states[self.now];
        let buf = if self.checkpoints.len() >= MAX_CHECKPOINTS {
            let (_, mut b) = self.checkpoints.remove(0);
            b.copy_from_slice(now);
            b
        } else {
            now.clone()
        };
        self.checkpoints.push((rows, buf));
    }

    /// Whether a step may begin: refused on a lost state (module docs).
    pub(crate) fn check_usable(&self, start: usize) -> Result<(), DecoderError> {
        if self.lost {
            return Err(DecoderError::Options(format!(
                "a step at slot {start}: this sequence's recurrent state was lost by a step that \
                 failed after it began; cut the cache (truncate: back to a prompt state or slot 0) \
                 or reset it"
            )));
        }
        Ok(())
    }

    /// A step of `rows` rows starting at slot `start` begins (module docs: in place, or beside
    /// the current state for a window); after [`RecurrentState::check_usable`].
    pub(crate) fn begin(&mut self, start: usize, rows: usize) {
        debug_assert!(!self.lost, "begin on a lost state");
        self.pending = (start, rows);
        self.pending_beside = (2..=MAX_ROLLBACK_ROWS).contains(&rows);
        // The other buffer is overwritten (a window step) or stale (an in-place one).
        self.window = None;
        if self.pending_beside {
            let values = self.layout.values();
            self.states[1 - self.now].resize(values, 0.0);
        } else {
            self.lost = true;
        }
    }

    /// Linear layer `i`'s views for the running step (see [`LayerViews`]).
    pub(crate) fn layer_views(&mut self, i: usize) -> LayerViews<'_> {
        let n = self.layout.per_layer();
        let at = i * n..(i + 1) * n;
        if !self.pending_beside {
            return LayerViews {
                state: &mut self.states[self.now][at],
                window: None,
            };
        }
        let [a, b] = &mut self.states;
        let (before, next) = if self.now == 0 { (a, b) } else { (b, a) };
        LayerViews {
            state: &mut next[at.clone()],
            window: Some((&before[at], &mut self.window_layers[i])),
        }
    }

    /// The step succeeded: its state is current, and a window step's inputs are kept.
    pub(crate) fn commit(&mut self) {
        if self.pending_beside {
            self.now = 1 - self.now;
            self.window = Some(self.pending);
        }
        self.lost = false;
    }

    /// The state after at most `len` rows, from `committed` rows: the current one, a prefix of
    /// the last window replayed, or the latest prompt state at or before `len`. Returns the rows
    /// it is the state after, or `None` (nothing to go back to).
    pub(crate) fn restore(&mut self, len: usize, committed: usize) -> Option<usize> {
        if !self.lost {
            if len == committed {
                return Some(len);
            }
            if let Some((start, _)) = self.window {
                if len > start && len < committed {
                    self.replay(len - start);
                    self.checkpoints.retain(|(rows, _)| *rows <= len);
                    return Some(len);
                }
            }
        }
        let (rows, state) = self
            .checkpoints
            .iter()
            .filter(|(rows, _)| *rows <= len && *rows > 0)
            .max_by_key(|(rows, _)| *rows)?;
        let rows = *rows;
        self.states[self.now].copy_from_slice(state);
        self.checkpoints.retain(|(r, _)| *r <= rows);
        self.window = None;
        self.lost = false;
        Some(rows)
    }

    /// The latest prompt state kept after at most `rows` rows (and after at least one), if any:
    /// the rows it is the state after.
    pub(crate) fn prompt_state_within(&self, rows: usize) -> Option<usize> {
        self.checkpoints
            .iter()
            .map(|(r, _)| *r)
            .filter(|&r| r <= rows && r > 0)
            .max()
    }

    /// Starts over from `src`'s prompt state after exactly `rows` rows (one
    /// [`RecurrentState::prompt_state_within`] named): it becomes this state's current state and
    /// its only prompt state, as if this sequence had prefilled those rows itself. False (and
    /// nothing changed) when `src` keeps no state there.
    pub(crate) fn start_from(&mut self, src: &RecurrentState, rows: usize) -> bool {
        assert_eq!(
            self.layout, src.layout,
            "a recurrent state copied between caches of different models"
        );
        let Some((_, state)) = src.checkpoints.iter().find(|(r, _)| *r == rows) else {
            return false;
        };
        self.reset();
        self.states[self.now].copy_from_slice(state);
        self.checkpoints.push((rows, state.clone()));
        true
    }

    /// The current state := the state before the last window step, then its first `rows` rows.
    fn replay(&mut self, rows: usize) {
        let l = self.layout;
        let (n, past, conv_dim, hs) = (
            l.per_layer(),
            l.conv_values / l.conv_dim.max(1),
            l.conv_dim,
            l.head_values(),
        );
        let [a, b] = &mut self.states;
        let (now, before) = if self.now == 0 { (a, b) } else { (b, a) };
        // One head's discarded outputs per value head: the heads run on the pool they are
        // called on (the decoder's, through `Decoder::truncate`).
        let per_head = rows * l.value_head_dim;
        let outs = &mut self.replay_out;
        outs.resize(l.value_heads * per_head, 0.0);
        for (i, w) in self.window_layers.iter().enumerate() {
            let (from, to) = (&before[i * n..(i + 1) * n], &mut now[i * n..(i + 1) * n]);
            let (conv, delta) = to.split_at_mut(l.conv_values);
            // The conv's history after `rows` rows: inputs rows..rows + past of [history | raw].
            for (j, dst) in conv.chunks_exact_mut(conv_dim).enumerate() {
                let c = rows + j;
                dst.copy_from_slice(if c < past {
                    &from[c * conv_dim..(c + 1) * conv_dim]
                } else {
                    &w.raw[(c - past) * conv_dim..(c - past + 1) * conv_dim]
                });
            }
            let isa = w.isa.expect("a window step recorded its kernels");
            delta
                .par_chunks_exact_mut(hs)
                .zip(outs.par_chunks_exact_mut(per_head))
                .enumerate()
                .for_each(|(h, (s, out))| {
                    s.copy_from_slice(&from[l.conv_values + h * hs..][..hs]);
                    let inp = l.head_rows(h, rows, &w.mixed, &w.beta, &w.log_decay);
                    recurrent_rows(isa, s, &inp, out);
                });
        }
    }

    /// Linear layer `i`'s current state (tests and probes).
    pub fn layer(&self, i: usize) -> &[f32] {
        let n = self.layout.per_layer();
        &self.states[self.now][i * n..(i + 1) * n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One linear layer, one key and one value head of 2, conv kernel 2: a conv row is
    /// [q q k k v v] and the history one input row.
    fn layout() -> StateLayout {
        StateLayout {
            layers: 1,
            conv_values: 6,
            delta_values: 4,
            conv_dim: 6,
            key_heads: 1,
            value_heads: 1,
            key_head_dim: 2,
            value_head_dim: 2,
        }
    }

    /// Input row `t` of the sequence (a function of the slot, so a replayed row is the same row).
    fn input(t: usize) -> [f32; 6] {
        let x = t as f32;
        [
            0.6,
            0.8,
            (x * 0.7).sin(),
            (x * 0.7).cos(),
            x * 0.1,
            1.0 - x * 0.05,
        ]
    }

    /// A step over slots `start..start + rows` as the DeltaNet layer runs it: the conv is the
    /// identity (its history is the last input), the delta rule the real kernel with β 0.5 and
    /// g -0.1.
    fn step(s: &mut RecurrentState, start: usize, rows: usize) {
        s.check_usable(start).unwrap();
        s.begin(start, rows);
        let l = s.layout();
        let raw: Vec<f32> = (start..start + rows).flat_map(input).collect();
        let (beta, decay) = (vec![0.5; rows], vec![-0.1; rows]);
        let isa = DeltaIsa::best();
        let LayerViews { state, window } = s.layer_views(0);
        let (conv, delta) = state.split_at_mut(l.conv_values);
        if let Some((before, w)) = window {
            delta.copy_from_slice(&before[l.conv_values..]);
            w.raw.clone_from(&raw);
            w.mixed.clone_from(&raw);
            w.beta.clone_from(&beta);
            w.log_decay.clone_from(&decay);
            w.isa = Some(isa);
        }
        conv.copy_from_slice(&raw[(rows - 1) * 6..]);
        let mut out = vec![0.0; rows * 2];
        let inp = l.head_rows(0, rows, &raw, &beta, &decay);
        recurrent_rows(isa, delta, &inp, &mut out);
        s.commit();
    }

    /// The state after slots `0..rows`, one row per step.
    fn row_by_row(rows: usize) -> Vec<f32> {
        let mut s = RecurrentState::new(layout());
        for t in 0..rows {
            step(&mut s, t, 1);
        }
        s.layer(0).to_vec()
    }

    #[test]
    fn a_window_goes_back_to_any_of_its_rows_bit_for_bit() {
        let mut s = RecurrentState::new(layout());
        step(&mut s, 0, 10); // a prompt of 10 rows (a window step by its length)
        s.checkpoint(10);
        step(&mut s, 10, 5); // a window of 5
        assert_eq!(s.layer(0), &row_by_row(15)[..]);
        for len in [13, 12, 11] {
            assert_eq!(s.restore(len, len + 1), Some(len));
            assert_eq!(s.layer(0), &row_by_row(len)[..], "back to {len} rows");
        }
        // Control: the state one row short differs.
        assert_ne!(row_by_row(11), row_by_row(10));
        // At the window's first slot: the prompt state; inside the prompt: nothing.
        assert_eq!(s.restore(10, 11), Some(10));
        assert_eq!(s.layer(0), &row_by_row(10)[..]);
        assert_eq!(s.restore(7, 10), None);
    }

    #[test]
    fn steps_outside_the_window_bound_keep_nothing_to_go_back_to() {
        let mut s = RecurrentState::new(layout());
        step(&mut s, 0, 4);
        s.checkpoint(4);
        // One-row steps and long steps update in place: only the prompt state is left.
        step(&mut s, 4, 1);
        step(&mut s, 5, 1);
        assert_eq!(s.layer(0), &row_by_row(6)[..]);
        assert_eq!(s.restore(5, 6), Some(4));
        let long = MAX_ROLLBACK_ROWS + 1;
        step(&mut s, 4, long);
        assert_eq!(s.restore(4 + long - 1, 4 + long), Some(4));
        assert_eq!(s.layer(0), &row_by_row(4)[..]);
        // Control: a window of MAX_ROLLBACK_ROWS rows goes back inside itself.
        step(&mut s, 4, MAX_ROLLBACK_ROWS);
        assert_eq!(s.restore(6, 4 + MAX_ROLLBACK_ROWS), Some(6));
        assert_eq!(s.layer(0), &row_by_row(6)[..]);
    }

    #[test]
    fn a_step_that_failed_in_place_loses_the_state_until_a_cut() {
        let mut s = RecurrentState::new(layout());
        step(&mut s, 0, 3);
        s.checkpoint(3);
        step(&mut s, 3, 1);
        // A one-row step begins and fails before its commit.
        s.begin(4, 1);
        assert!(
            s.check_usable(4).is_err(),
            "a step on a lost state was taken"
        );
        assert_eq!(s.restore(4, 4), Some(3), "the lost state was kept");
        assert_eq!(s.layer(0), &row_by_row(3)[..]);
        // Control: a window step that fails leaves the current state as it was.
        step(&mut s, 3, 1);
        s.begin(4, 3);
        assert_eq!(s.restore(4, 4), Some(4));
        assert_eq!(s.layer(0), &row_by_row(4)[..]);
    }

    /// A copied prompt state continues as the source's own: the same values after the same next
    /// rows. Control: a row count the source kept no state after copies nothing.
    #[test]
    fn a_prompt_state_copied_to_another_sequence_continues_the_same() {
        let mut src = RecurrentState::new(layout());
        step(&mut src, 0, 9);
        src.checkpoint(9);
        let after_9 = src.layer(0).to_vec();
        step(&mut src, 9, 4);
        let after_13 = src.layer(0).to_vec();
        assert_ne!(after_9, after_13);
        assert_eq!(src.prompt_state_within(12), Some(9));
        assert_eq!(src.prompt_state_within(8), None);
        let mut dst = RecurrentState::new(layout());
        step(&mut dst, 0, 3); // whatever it held before
        assert!(dst.start_from(&src, 9));
        assert_eq!(dst.layer(0), &after_9[..]);
        step(&mut dst, 9, 4);
        assert_eq!(dst.layer(0), &after_13[..]);
        // It keeps the copied prompt state: a cut back to it resumes there.
        assert_eq!(dst.restore(9, 13), Some(9));
        assert_eq!(dst.layer(0), &after_9[..]);
        // Control: no state after 10 rows in `src`.
        assert!(!dst.start_from(&src, 10));
        assert_eq!(dst.layer(0), &after_9[..]);
    }

    #[test]
    fn the_oldest_prompt_state_goes_first() {
        let mut s = RecurrentState::new(layout());
        for (start, rows) in [(0, 20), (20, 20), (40, 20)] {
            step(&mut s, start, rows);
            s.checkpoint(start + rows);
        }
        assert_eq!(
            s.restore(30, 60),
            None,
            "the state after 20 rows was evicted"
        );
        assert_eq!(s.restore(45, 60), Some(40));
        assert_eq!(s.layer(0), &row_by_row(40)[..]);
    }
}
