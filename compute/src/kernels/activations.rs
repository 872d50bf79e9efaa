//! Activation rows prepared for the integer kernels: quantized by `packs::quant`'s rule, laid out for
//! the weight kind, with the sums the SIMD paths subtract. Made once per GEMM input and reused while
//! the input bits are unchanged (q, k and v read the same normed rows; so do gate and up).

use super::Kernels;
use packs::quant::{Q4_CODE_OFFSET, Q4_GROUP};
use rayon::prelude::*;

/// How the codes of a prepared row are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationLayout {
    /// Element j at j (i8 weights).
    Natural,
    /// Groups of 32 taken in pairs (64 codes): the 16 even elements of the first group, the 16 even
    /// of the second, the 16 odd of the first, the 16 odd of the second — where the low and high
    /// nibbles of two groups' 32 weight bytes land once split. A last unpaired group: its 16 even
    /// elements, then its 16 odd. See [`q4_halves`]. (q4 weights; K must be a multiple of 32.)
    Q4Groups,
}

/// Prepared activation rows (see the module comment).
#[derive(Debug, Default)]
pub struct Activations {
    layout: Option<ActivationLayout>,
    rows: usize,
    k: usize,
    /// `rows x k` codes in `layout`.
    codes: Vec<i8>,
    /// One scale per row.
    scales: Vec<f32>,
    /// Natural: per row, the sum of the codes the 32-wide SIMD loop covers (`0 .. k - k % 32`).
    /// Q4Groups: per row and group, 8 x the group's code sum (`rows x k/32`): the kernels multiply
    /// the stored nibbles, `code + Q4_CODE_OFFSET`, and subtract this.
    sums: Vec<i32>,
    /// The bits of the f32 rows these were made from.
    source: Vec<u32>,
}

/// Where group g's 16 even and 16 odd elements start in a `Q4Groups` row of `groups` groups.
#[inline]
pub fn q4_halves(g: usize, groups: usize) -> (usize, usize) {
    let base = (g / 2) * 2 * Q4_GROUP;
    if g.is_multiple_of(2) && g + 1 == groups {
        (base, base + Q4_GROUP / 2)
    } else {
        let second = (g % 2) * Q4_GROUP / 2;
        (base + second, base + Q4_GROUP + second)
    }
}

/// Reorders one row of codes (natural order, K a multiple of 32) into the `Q4Groups` layout in place
/// and writes its group sums (8 x each group's code sum): the portable form of
/// [`Kernels::q4_groups_row`].
pub(crate) fn q4_groups_row_scalar(cr: &mut [i8], sums: &mut [i32]) {
    let groups = cr.len() / Q4_GROUP;
    for (g, sum) in sums.iter_mut().enumerate().take(groups) {
        let group = &cr[g * Q4_GROUP..(g + 1) * Q4_GROUP];
        *sum = Q4_CODE_OFFSET as i32 * group.iter().map(|&c| c as i32).sum::<i32>();
    }
    // A pair's codes stay inside the pair's 64 bytes: permute them through a copy.
    for g0 in (0..groups).step_by(2) {
        let n = (groups - g0).min(2);
        let mut natural = [0i8; 2 * Q4_GROUP];
        natural[..n * Q4_GROUP].copy_from_slice(&cr[g0 * Q4_GROUP..(g0 + n) * Q4_GROUP]);
        for (gi, src) in natural[..n * Q4_GROUP].chunks_exact(Q4_GROUP).enumerate() {
            let (even, odd) = q4_halves(g0 + gi, groups);
            for i in 0..Q4_GROUP / 2 {
                cr[even + i] = src[2 * i];
                cr[odd + i] = src[2 * i + 1];
            }
        }
    }
}

/// One row's input, codes, scale and sums.
type RowJob<'a> = ((&'a [f32], &'a mut [i8]), (&'a mut f32, &'a mut [i32]));

/// Elements per step of the 256-bit integer loops.
pub(crate) const SIMD_BYTES: usize = 32;

impl Activations {
    /// Prepares `rows` rows of `x` (`rows x k`) for `layout`. Returns false when the previous
    /// preparation was for the same bits and layout and was reused.
    pub fn prepare(
        &mut self,
        kernels: Kernels,
        layout: ActivationLayout,
        x: &[f32],
        rows: usize,
        k: usize,
    ) -> bool {
        assert_eq!(x.len(), rows * k, "Activations::prepare: x is not rows x k");
        if layout == ActivationLayout::Q4Groups {
            assert_eq!(
                k % Q4_GROUP,
                0,
                "Activations::prepare: q4 layout needs K % 32 == 0, got {k}"
            );
        }
        let bits: &[u32] = bytemuck::cast_slice(x);
        let same_shape = self.layout == Some(layout) && self.rows == rows && self.k == k;
        if self.source.len() != bits.len() {
            self.source.clear();
            self.source.resize(bits.len(), 0);
        }
        // One pass compares the bits with the last input's and keeps them.
        let same_bits = kernels.copy_bits(&mut self.source, bits);
        if same_shape && same_bits {
            return false;
        }
        self.layout = Some(layout);
        self.rows = rows;
        self.k = k;
        self.codes.resize(rows * k, 0);
        self.scales.resize(rows, 0.0);
        let per_row = match layout {
            ActivationLayout::Natural => 1,
            ActivationLayout::Q4Groups => k / Q4_GROUP,
        };
        self.sums.resize(rows * per_row, 0);
        if k == 0 {
            self.scales.fill(0.0);
            self.sums.fill(0);
            return true;
        }
        let row_job = |((xr, cr), (s, sums)): RowJob<'_>| {
            *s = kernels.quantize_row(xr, cr);
            match layout {
                ActivationLayout::Natural => {
                    let covered = k - k % SIMD_BYTES;
                    sums[0] = cr[..covered].iter().map(|&c| c as i32).sum();
                }
                ActivationLayout::Q4Groups => kernels.q4_groups_row(cr, sums),
            }
        };
        if rows >= 4 {
            // Spread over whichever rayon pool runs us (the forward's persistent pool).
            x.par_chunks_exact(k)
                .zip(self.codes.par_chunks_exact_mut(k))
                .zip(
                    self.scales
                        .par_iter_mut()
                        .zip(self.sums.par_chunks_exact_mut(per_row)),
                )
                .for_each(row_job);
        } else {
            x.chunks_exact(k)
                .zip(self.codes.chunks_exact_mut(k))
                .zip(
                    self.scales
                        .iter_mut()
                        .zip(self.sums.chunks_exact_mut(per_row)),
                )
                .for_each(row_job);
        }
        true
    }

    /// Panics unless these were prepared for `layout`, `rows` and `k` (a caller bug).
    pub(crate) fn check(&self, layout: ActivationLayout, rows: usize, k: usize) {
        assert!(
            self.layout == Some(layout) && self.rows == rows && self.k == k,
            "activations prepared as {:?} {} x {}, the kernel needs {layout:?} {rows} x {k}",
            self.layout,
            self.rows,
            self.k
        );
    }

    pub fn layout(&self) -> Option<ActivationLayout> {
        self.layout
    }

    /// Row r's codes (in the prepared layout).
    pub fn codes(&self, r: usize) -> &[i8] {
        &self.codes[r * self.k..(r + 1) * self.k]
    }

    pub fn scale(&self, r: usize) -> f32 {
        self.scales[r]
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales[..self.rows]
    }

    /// Row r's sums (see the field comment).
    pub fn sums(&self, r: usize) -> &[i32] {
        let per_row = self.sums.len() / self.rows.max(1);
        &self.sums[r * per_row..(r + 1) * per_row]
    }

    /// Forget the cached input (the next `prepare` recomputes).
    pub fn invalidate(&mut self) {
        self.layout = None;
    }
}
