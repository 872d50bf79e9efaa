//! DeepStack: the vision tower's intermediate features added to the image rows of the first
//! decoder layers (transformers' `_deepstack_process`).

use crate::hybrid::HybridInputs;

/// After layer l (l < sets), set l is added to the image rows, row i of the set to the i-th image
/// row in prompt order. `every_row` is a control: row r takes set row r % image_rows.
pub fn add_deepstack(
    x: &mut [f32],
    h: &HybridInputs,
    layer: usize,
    hidden: usize,
    every_row: bool,
) {
    let n_img = h.image_rows.len();
    if layer >= h.deepstack_sets || n_img == 0 {
        return;
    }
    let set = &h.deepstack[layer * n_img * hidden..(layer + 1) * n_img * hidden];
    if every_row {
        for (r, xr) in x.chunks_exact_mut(hidden).enumerate() {
            let i = r % n_img;
            for (a, b) in xr.iter_mut().zip(&set[i * hidden..(i + 1) * hidden]) {
                *a += b;
            }
        }
        return;
    }
    for (i, &r) in h.image_rows.iter().enumerate() {
        for (a, b) in x[r * hidden..(r + 1) * hidden]
            .iter_mut()
            .zip(&set[i * hidden..(i + 1) * hidden])
        {
            *a += b;
        }
    }
}

/// Checks the DeepStack sets' shape against the image rows, the pack's `sets` and `hidden`.
pub fn check(h: &HybridInputs, sets: usize, hidden: usize) -> Result<(), String> {
    let n_img = h.image_rows.len();
    if n_img > 0 && h.deepstack_sets != sets {
        return Err(format!(
            "{} DeepStack sets given, the pack declares {sets}",
            h.deepstack_sets
        ));
    }
    if n_img == 0 && !h.deepstack.is_empty() {
        return Err("DeepStack sets given but no image rows".into());
    }
    if h.deepstack.len() != h.deepstack_sets * n_img * hidden {
        let per_set = h.deepstack.len().checked_div(h.deepstack_sets).unwrap_or(0);
        return Err(format!(
            "DeepStack holds {} values: {} sets of {} rows x {hidden} expected (one row per image row); got {} values per set",
            h.deepstack.len(),
            h.deepstack_sets,
            n_img,
            per_set
        ));
    }
    Ok(())
}

/// Refuses a non-finite DeepStack value by its set, image row and column.
pub fn check_finite(h: &HybridInputs, hidden: usize) -> Result<(), String> {
    let n_img = h.image_rows.len();
    if let Some(i) = packs::first_non_finite(&h.deepstack) {
        let per_set = (n_img * hidden).max(1);
        return Err(format!(
            "DeepStack holds {} at set {}, image row {}, column {}: every set must be finite",
            h.deepstack[i],
            i / per_set,
            i % per_set / hidden,
            i % hidden
        ));
    }
    Ok(())
}
