//! Activation rows in blocks small enough to stay in a core's L2 while every weight panel of a
//! task runs over them. Without blocks a prefill's many rows are read again from L3 or memory for
//! each panel of a few weight rows (2048 rows of i8 codes at K = 2048 are 4 MB per pair of weight
//! rows), and the GEMM falls far below its compute rate. Each output is computed by the same
//! instructions whichever block its row falls in, so blocking changes no bit.

use std::ops::Range;

/// Activation bytes per block for the integer kernels (i8 and q4 codes): a quarter of a Zen 4
/// core's 1 MB L2, leaving room for the weight panel streaming past it.
pub(crate) const INT_BLOCK_BYTES: usize = 256 << 10;
/// The same for f32 rows (f32 and bf16 weights), whose rows are 4 bytes per element.
pub(crate) const F32_BLOCK_BYTES: usize = 512 << 10;
/// The same for bf16 rows (bf16 products): a quarter of L2, as the integer codes.
pub(crate) const BF16_BLOCK_BYTES: usize = 256 << 10;

/// The rows `0..rows` in consecutive blocks of at most `budget` bytes of `row_bytes`-byte rows, in
/// whole multiples of `multiple` rows (a tile's height; at least one multiple), ascending.
pub(crate) fn row_blocks(
    rows: usize,
    row_bytes: usize,
    budget: usize,
    multiple: usize,
) -> RowBlocks {
    let multiple = multiple.max(1);
    let fit = budget / row_bytes.max(1);
    #[cfg(test)]
    let fit = test_hooks::block_rows().unwrap_or(fit);
    let fit = fit / multiple * multiple;
    RowBlocks {
        next: 0,
        rows,
        size: fit.max(multiple),
    }
}

/// Iterator of [`row_blocks`].
pub(crate) struct RowBlocks {
    next: usize,
    rows: usize,
    size: usize,
}

impl Iterator for RowBlocks {
    type Item = Range<usize>;
    fn next(&mut self) -> Option<Range<usize>> {
        if self.next >= self.rows {
            return None;
        }
        let start = self.next;
        let end = (start + self.size).min(self.rows);
        self.next = end;
        #[cfg(test)]
        return test_hooks::fault(start..end, end == self.rows);
        #[cfg(not(test))]
        Some(start..end)
    }
}

/// Test-only settings of the calling thread: a block height small enough for small test shapes to
/// span many blocks, and planted mistakes (controls) that the oracle comparisons must catch.
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::cell::Cell;
    use std::ops::Range;

    /// A planted mistake in the blocking.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Fault {
        /// The last block is never computed.
        SkipLast,
        /// Every block of more than one row stops one row short (an off-by-one at each border).
        ShortByOne,
    }

    thread_local! {
        static BLOCK_ROWS: Cell<Option<usize>> = const { Cell::new(None) };
        static FAULT: Cell<Option<Fault>> = const { Cell::new(None) };
    }

    /// Blocks of `rows` rows (rounded as the kernels' tile heights need) on this thread until
    /// the guard drops, with an optional planted `fault`.
    pub(crate) fn set(rows: usize, fault: Option<Fault>) -> Guard {
        BLOCK_ROWS.with(|c| c.set(Some(rows)));
        FAULT.with(|c| c.set(fault));
        Guard
    }

    pub(crate) struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            BLOCK_ROWS.with(|c| c.set(None));
            FAULT.with(|c| c.set(None));
        }
    }

    pub(super) fn block_rows() -> Option<usize> {
        BLOCK_ROWS.with(|c| c.get())
    }

    pub(super) fn fault(block: Range<usize>, last: bool) -> Option<Range<usize>> {
        match FAULT.with(|c| c.get()) {
            Some(Fault::SkipLast) if last => None,
            Some(Fault::ShortByOne) if block.len() > 1 => Some(block.start..block.end - 1),
            _ => Some(block),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_every_row_once_in_order() {
        for (rows, row_bytes, budget, multiple, size) in [
            (2048, 2048, INT_BLOCK_BYTES, 4, 128),
            (2048, 6144 + 768, INT_BLOCK_BYTES, 4, 36),
            (5, 1 << 20, INT_BLOCK_BYTES, 4, 4),
            (1, 8, 64, 1, 8),
            (300, 4 * 8192, F32_BLOCK_BYTES, 1, 16),
        ] {
            let blocks: Vec<_> = row_blocks(rows, row_bytes, budget, multiple).collect();
            assert_eq!(blocks[0].len(), size.min(rows), "{rows} x {row_bytes}");
            let mut next = 0;
            for b in &blocks {
                assert_eq!(b.start, next);
                assert!(b.len() <= size && (b.end == rows || b.len() % multiple == 0));
                next = b.end;
            }
            assert_eq!(next, rows);
        }
        assert_eq!(row_blocks(0, 8, 64, 4).count(), 0);
    }
}
