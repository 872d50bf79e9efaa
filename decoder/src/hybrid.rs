//! Prompt rows given as embeddings, with their position planes, image rows and DeepStack sets.

/// What `Forward::step_batch_embeds` needs beside the row embeddings.
#[derive(Clone, Debug, Default)]
pub struct HybridInputs {
    /// Position planes, plane-major: t for every row, then h, then w (`3 x rows`). `None` means plain
    /// positions `start_pos + i` on all planes.
    pub planes: Option<Vec<i64>>,
    /// Rotary position of the first row when `planes` is `None`.
    pub start_pos: i64,
    /// Which prompt rows are image rows, ascending (any number of images, in order).
    pub image_rows: Vec<usize>,
    /// DeepStack sets, `n_sets x image_rows x hidden`; set l is added to the image rows after
    /// decoder layer l.
    pub deepstack: Vec<f32>,
    pub deepstack_sets: usize,
}

impl HybridInputs {
    /// Plain text positions starting at `start_pos`, no image rows.
    pub fn text(start_pos: i64) -> HybridInputs {
        HybridInputs {
            start_pos,
            ..HybridInputs::default()
        }
    }

    /// Equal planes t = h = w = `start_pos + i` for `rows` rows.
    pub fn equal_planes(rows: usize, start_pos: i64) -> Vec<i64> {
        let one: Vec<i64> = (0..rows as i64).map(|i| start_pos + i).collect();
        [one.clone(), one.clone(), one].concat()
    }

    /// The (t, h, w) positions of row `r` of `rows`.
    pub fn position(&self, r: usize, rows: usize) -> [i64; 3] {
        match &self.planes {
            Some(p) => [p[r], p[rows + r], p[2 * rows + r]],
            None => {
                let p = self.start_pos + r as i64;
                [p, p, p]
            }
        }
    }

    /// The largest position on any plane (the next decoded token rotates by this + 1).
    pub fn max_position(&self, rows: usize) -> i64 {
        match &self.planes {
            Some(p) => p.iter().copied().max().unwrap_or(-1),
            None => self.start_pos + rows as i64 - 1,
        }
    }
}
