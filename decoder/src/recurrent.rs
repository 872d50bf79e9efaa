//! A sequence's recurrent state (Qwen3.5's Gated DeltaNet layers): per linear layer, the conv's
//! last `kernel - 1` inputs and the delta rule's key x value matrix per value head.
//!
//! Unlike KV rows, this state cannot be cut back to an earlier slot: it is one state after the
//! last row. So a step writes the new state beside the old one (`next`, made current only when
//! the whole step succeeds), and a step of at most [`MAX_ROLLBACK_ROWS`] rows keeps the state
//! after each of its rows: a verified draft window can then keep any prefix of its rows. Any
//! other cut forgets the state (the caller prefills again from slot 0).

use packs::semantics::DeltaNetSemantics;

/// The most rows of one step whose per-row states are kept for a rollback: a draft window of 16
/// drafts and the sampled row (`--drafts` allows at most 16). For Qwen3.5-2B one row's state is
/// 18 layers x 1.1 MB; a 5-row window keeps about 80 MB beside the sequence.
pub const MAX_ROLLBACK_ROWS: usize = 17;

/// Where the values of one linear layer's state sit in a state vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateLayout {
    /// Linear layers.
    pub layers: usize,
    /// `(kernel - 1) x conv_dim` values, oldest input first.
    pub conv_values: usize,
    /// `value_heads x key_head_dim x value_head_dim` values.
    pub delta_values: usize,
}

impl StateLayout {
    pub fn of(d: &DeltaNetSemantics) -> StateLayout {
        StateLayout {
            layers: d.linear_layers.len(),
            conv_values: (d.conv_kernel - 1) * d.conv_dim(),
            delta_values: d.num_value_heads * d.key_head_dim * d.value_head_dim,
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
}

/// One sequence's recurrent state; see the module comment.
#[derive(Debug)]
pub struct RecurrentState {
    layout: StateLayout,
    /// The state after the sequence's committed rows.
    now: Vec<f32>,
    /// The state a running step writes; current after `commit`.
    next: Vec<f32>,
    /// After the last committed step: its first slot and the states after each of its rows but
    /// the last (`rows - 1` of them, or none when the step was longer than the bound).
    step_start: usize,
    row_states: Vec<Vec<f32>>,
    /// Row state buffers the running step writes (the first `next_keep_rows` of them).
    next_rows: Vec<Vec<f32>>,
    next_keep_rows: usize,
    /// The running step's first slot.
    pending_start: usize,
    /// Saved states (prompt states): `(rows, state)`, the last [`MAX_CHECKPOINTS`] saved.
    checkpoints: Vec<(usize, Vec<f32>)>,
}

/// Prompt states a sequence keeps (the end of each of its last two prompts: a chat's next turn
/// re-renders the previous answer, so its rows part from the cache after the previous prompt).
pub const MAX_CHECKPOINTS: usize = 2;

impl RecurrentState {
    /// The zero state (before any row).
    pub fn new(layout: StateLayout) -> RecurrentState {
        RecurrentState {
            layout,
            now: vec![0.0; layout.values()],
            next: vec![0.0; layout.values()],
            step_start: 0,
            row_states: Vec::new(),
            next_rows: Vec::new(),
            next_keep_rows: 0,
            pending_start: 0,
            checkpoints: Vec::new(),
        }
    }

    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// Bytes held: the state, its next copy, the kept row states and the prompt states.
    pub fn bytes_allocated(&self) -> usize {
        let states = 2 + self.row_states.len() + self.next_rows.len() + self.checkpoints.len();
        states * self.layout.values() * 4
    }

    /// Forget everything: the zero state.
    pub fn reset(&mut self) {
        self.now.fill(0.0);
        self.next_rows.append(&mut self.row_states);
        self.step_start = 0;
        self.checkpoints.clear();
    }

    /// Saves the current state as the state after `rows` rows (a prompt state): a later cut
    /// back to at least `rows` rows resumes from it.
    pub(crate) fn checkpoint(&mut self, rows: usize) {
        self.checkpoints.retain(|(r, _)| *r != rows);
        let buf = if self.checkpoints.len() >= MAX_CHECKPOINTS {
            let (_, mut b) = self.checkpoints.remove(0);
            b.copy_from_slice(&self.now);
            b
        } else {
            self.now.clone()
        };
        self.checkpoints.push((rows, buf));
    }

    /// A step of `rows` rows starting at slot `start` begins: `next` starts as the current state,
    /// and the row states are kept if the step is short enough.
    pub(crate) fn begin(&mut self, start: usize, rows: usize) {
        self.next.copy_from_slice(&self.now);
        self.next_keep_rows = if rows <= MAX_ROLLBACK_ROWS {
            rows - 1
        } else {
            0
        };
        let values = self.layout.values();
        while self.next_rows.len() < self.next_keep_rows {
            self.next_rows.push(vec![0.0; values]);
        }
        self.pending_start = start;
    }

    /// Linear layer `i`'s part of the state the step writes, and of each kept row state (the
    /// state after row r goes to the r-th; rows past the last kept one have none).
    pub(crate) fn layer_views(&mut self, i: usize) -> (&mut [f32], Vec<&mut [f32]>) {
        let n = self.layout.per_layer();
        let rows = self.next_rows[..self.next_keep_rows]
            .iter_mut()
            .map(|r| &mut r[i * n..(i + 1) * n])
            .collect();
        (&mut self.next[i * n..(i + 1) * n], rows)
    }

    /// The step succeeded: its state is current, and its row states are the ones kept.
    pub(crate) fn commit(&mut self) {
        std::mem::swap(&mut self.now, &mut self.next);
        self.step_start = self.pending_start;
        // Swap the kept rows in; the old ones become the next step's buffers.
        std::mem::swap(&mut self.row_states, &mut self.next_rows);
        self.next_rows
            .extend(self.row_states.drain(self.next_keep_rows..));
    }

    /// The state after at most `len` rows, from `committed` rows: the current one, a row state of
    /// the last step, or the latest prompt state at or before `len`. Returns the rows it is the
    /// state after, or `None` (nothing to go back to).
    pub(crate) fn restore(&mut self, len: usize, committed: usize) -> Option<usize> {
        if len == committed {
            return Some(len);
        }
        if len > self.step_start && len < committed {
            let r = len - self.step_start - 1;
            if r < self.row_states.len() {
                self.now.copy_from_slice(&self.row_states[r]);
                // Rows after it are gone; the states before it stay valid.
                let dropped: Vec<Vec<f32>> = self.row_states.drain(r..).collect();
                self.next_rows.extend(dropped);
                self.checkpoints.retain(|(rows, _)| *rows <= len);
                return Some(len);
            }
        }
        let (rows, state) = self
            .checkpoints
            .iter()
            .filter(|(rows, _)| *rows <= len && *rows > 0)
            .max_by_key(|(rows, _)| *rows)?;
        let rows = *rows;
        self.now.copy_from_slice(state);
        self.checkpoints.retain(|(r, _)| *r <= rows);
        // The row states belong to a step past the prompt state.
        self.next_rows.append(&mut self.row_states);
        self.step_start = rows;
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
        self.now.copy_from_slice(state);
        self.step_start = rows;
        self.checkpoints.push((rows, state.clone()));
        true
    }

    /// Linear layer `i`'s current state (tests and probes).
    pub fn layer(&self, i: usize) -> &[f32] {
        let n = self.layout.per_layer();
        &self.now[i * n..(i + 1) * n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> StateLayout {
        StateLayout {
            layers: 1,
            conv_values: 1,
            delta_values: 1,
        }
    }

    /// A step of `rows` rows from `start`, each row adding 1 to both values.
    fn step(s: &mut RecurrentState, start: usize, rows: usize) {
        s.begin(start, rows);
        for r in 0..rows {
            let (layer, mut kept) = s.layer_views(0);
            for v in layer.iter_mut() {
                *v += 1.0;
            }
            if let Some(k) = kept.get_mut(r) {
                k.copy_from_slice(layer);
            }
        }
        s.commit();
    }

    #[test]
    fn rows_of_the_last_step_and_prompt_states_restore_nothing_else() {
        let mut s = RecurrentState::new(layout());
        step(&mut s, 0, 10); // a prompt of 10 rows
        s.checkpoint(10);
        step(&mut s, 10, 5); // a window of 5
        assert_eq!(s.restore(13, 15), Some(13));
        assert_eq!(s.layer(0), &[13.0, 13.0]);
        // Before every kept state (inside the prompt): nothing to go back to.
        assert_eq!(s.restore(7, 13), None);
        assert_eq!(s.restore(12, 13), Some(12));
        assert_eq!(s.restore(11, 12), Some(11));
        assert_eq!(s.restore(10, 11), Some(10));
        assert_eq!(s.layer(0), &[10.0, 10.0]);
        // Control: a step longer than the bound keeps no row states.
        step(&mut s, 10, MAX_ROLLBACK_ROWS + 1);
        let end = 10 + MAX_ROLLBACK_ROWS + 1;
        assert_eq!(s.restore(end - 1, end), Some(10));
        assert_eq!(s.layer(0), &[10.0, 10.0]);
    }

    /// A copied prompt state continues as the source's own: the same values after the same next
    /// rows. Control: a row count the source kept no state after copies nothing.
    #[test]
    fn a_prompt_state_copied_to_another_sequence_continues_the_same() {
        let mut src = RecurrentState::new(layout());
        step(&mut src, 0, 9);
        src.checkpoint(9);
        step(&mut src, 9, 4);
        assert_eq!(src.prompt_state_within(12), Some(9));
        assert_eq!(src.prompt_state_within(8), None);
        let mut dst = RecurrentState::new(layout());
        step(&mut dst, 0, 3); // whatever it held before
        assert!(dst.start_from(&src, 9));
        assert_eq!(dst.layer(0), &[9.0, 9.0]);
        step(&mut dst, 9, 2);
        assert_eq!(dst.layer(0), &[11.0, 11.0]);
        // It keeps the copied prompt state: a cut back to it resumes there.
        assert_eq!(dst.restore(10, 11), Some(10));
        assert_eq!(dst.restore(9, 10), Some(9));
        assert_eq!(dst.layer(0), &[9.0, 9.0]);
        // Control: no state after 10 rows in `src`.
        assert!(!dst.start_from(&src, 10));
        assert_eq!(dst.layer(0), &[9.0, 9.0]);
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
        assert_eq!(s.layer(0), &[40.0, 40.0]);
    }
}
