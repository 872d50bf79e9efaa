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
}

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
        }
    }

    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// Bytes held: the state, its next copy, and the kept row states.
    pub fn bytes_allocated(&self) -> usize {
        let states = 2 + self.row_states.len() + self.next_rows.len();
        states * self.layout.values() * 4
    }

    /// Forget everything: the zero state.
    pub fn reset(&mut self) {
        self.now.fill(0.0);
        self.next_rows.append(&mut self.row_states);
        self.step_start = 0;
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
        self.next_rows.extend(self.row_states.drain(self.next_keep_rows..));
    }

    /// The state after `len` rows, if it can be had from `committed` rows: the current one, or a
    /// row state of the last step. Returns whether it was restored.
    pub(crate) fn restore(&mut self, len: usize, committed: usize) -> bool {
        if len == committed {
            return true;
        }
        if len > self.step_start && len < committed {
            let r = len - self.step_start - 1;
            if r < self.row_states.len() {
                self.now.copy_from_slice(&self.row_states[r]);
                // Rows after it are gone; the states before it stay valid.
                let kept = r;
                let dropped: Vec<Vec<f32>> = self.row_states.drain(kept..).collect();
                self.next_rows.extend(dropped);
                return true;
            }
        }
        false
    }

    /// Linear layer `i`'s current state (tests and probes).
    pub fn layer(&self, i: usize) -> &[f32] {
        let n = self.layout.per_layer();
        &self.now[i * n..(i + 1) * n]
    }
}
