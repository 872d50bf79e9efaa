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

    /// Rows `first..first + n` of a prompt of `rows` rows (rows of `hidden` values): their
    /// positions, their image rows (numbered within the slice) and those rows of every DeepStack
    /// set. A prompt prefilled slice by slice gives the rows it gives whole.
    pub fn slice_rows(&self, first: usize, n: usize, rows: usize, hidden: usize) -> HybridInputs {
        assert!(
            first + n <= rows,
            "slice_rows: rows {first}..{} of {rows}",
            first + n
        );
        let planes = self.planes.as_ref().map(|p| {
            (0..3)
                .flat_map(|plane| {
                    p[plane * rows + first..plane * rows + first + n]
                        .iter()
                        .copied()
                })
                .collect()
        });
        let n_img = self.image_rows.len();
        let inside: Vec<usize> = (0..n_img)
            .filter(|&i| (first..first + n).contains(&self.image_rows[i]))
            .collect();
        let sets = if inside.is_empty() {
            0
        } else {
            self.deepstack_sets
        };
        let mut deepstack = Vec::with_capacity(sets * inside.len() * hidden);
        for set in 0..sets {
            for &i in &inside {
                let at = (set * n_img + i) * hidden;
                deepstack.extend_from_slice(&self.deepstack[at..at + hidden]);
            }
        }
        HybridInputs {
            planes,
            start_pos: self.start_pos + first as i64,
            image_rows: inside.iter().map(|&i| self.image_rows[i] - first).collect(),
            deepstack,
            deepstack_sets: sets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HybridInputs;

    #[test]
    fn a_slice_keeps_its_rows_positions_and_deepstack() {
        // 5 rows, image rows 1 and 3, two sets of width 2.
        let h = HybridInputs {
            planes: Some(vec![0, 1, 1, 1, 4, 0, 1, 1, 2, 4, 0, 1, 2, 1, 4]),
            start_pos: 0,
            image_rows: vec![1, 3],
            deepstack: vec![10.0, 11.0, 30.0, 31.0, 110.0, 111.0, 130.0, 131.0],
            deepstack_sets: 2,
        };
        let s = h.slice_rows(2, 3, 5, 2);
        assert_eq!(s.planes, Some(vec![1, 1, 4, 1, 2, 4, 2, 1, 4]));
        assert_eq!(s.image_rows, vec![1]);
        assert_eq!(s.deepstack, vec![30.0, 31.0, 130.0, 131.0]);
        assert_eq!(s.deepstack_sets, 2);
        // A slice without image rows carries no DeepStack; text positions move on.
        let t = HybridInputs::text(7).slice_rows(2, 2, 4, 2);
        assert_eq!(
            (t.start_pos, t.deepstack_sets, t.deepstack.len()),
            (9, 0, 0)
        );
        // Control: the first rows hold the other image row.
        assert_eq!(
            h.slice_rows(0, 2, 5, 2).deepstack,
            vec![10.0, 11.0, 110.0, 111.0]
        );
    }
}
