//! The tower's rows of recent pictures, by the picture's identity (a hash of its pixel rows): a
//! picture another client sent a moment ago is not encoded again (`serve --parallel`). The
//! tower is deterministic, so the rows are the ones it would give; least recently used go first
//! when the budget is full.

use vision::tower::VisionOutput;

use crate::error::Result;
use crate::images::ImageEncoder;
use crate::prompt::Prompt;
use crate::session::encode_these;

/// Bytes of tower rows kept: about 8 pictures of 1080p for a 2B model (8,160 patches merged
/// 4:1 into 2,040 rows x 2,048 x 4 bytes = 16.7 MB each, DeepStack sets aside).
pub const IMAGE_ROWS_BUDGET: usize = 128 << 20;

/// One picture's rows.
#[derive(Clone)]
struct Rows {
    identity: u64,
    tokens: usize,
    grid: [usize; 3],
    embeds: Vec<f32>,
    /// Per DeepStack set, this picture's rows.
    deepstack: Vec<Vec<f32>>,
    last_used: u64,
}

impl Rows {
    fn bytes(&self) -> usize {
        4 * (self.embeds.len() + self.deepstack.iter().map(Vec::len).sum::<usize>())
    }
}

#[derive(Default)]
pub struct ImageRowsCache {
    entries: Vec<Rows>,
    tick: u64,
}

impl ImageRowsCache {
    /// The tower's rows for every picture of `prompt` (None when it has none): kept rows where
    /// the picture was seen, one tower run for the rest (its time into `tower`).
    pub fn encode(
        &mut self,
        encoder: &mut dyn ImageEncoder,
        prompt: &Prompt,
        hidden: usize,
        tower: &mut std::time::Duration,
    ) -> Result<Option<VisionOutput>> {
        if prompt.images.is_empty() {
            return Ok(None);
        }
        self.tick += 1;
        let missing: Vec<_> = prompt
            .images
            .iter()
            .filter(|i| !self.entries.iter().any(|e| e.identity == i.image.identity))
            .collect();
        let mut sets = self.entries.first().map_or(0, |e| e.deepstack.len());
        if !missing.is_empty() {
            let out = encode_these(encoder, &missing, hidden, tower)?;
            let all: usize = out.tokens_per_image.iter().sum();
            sets = out.sets;
            let mut first = 0;
            for (img, (&tokens, &grid)) in missing
                .iter()
                .zip(out.tokens_per_image.iter().zip(&out.grids))
            {
                let span = first * hidden..(first + tokens) * hidden;
                let deepstack = (0..out.sets)
                    .map(|s| {
                        let base = s * all * hidden;
                        out.deepstack[base + span.start..base + span.end].to_vec()
                    })
                    .collect();
                self.entries.retain(|e| e.identity != img.image.identity);
                self.entries.push(Rows {
                    identity: img.image.identity,
                    tokens,
                    grid,
                    embeds: out.image_embeds[span].to_vec(),
                    deepstack,
                    last_used: self.tick,
                });
                first += tokens;
            }
        }
        let mut out = VisionOutput {
            image_embeds: Vec::new(),
            deepstack: Vec::new(),
            sets,
            tokens_per_image: Vec::new(),
            grids: Vec::new(),
        };
        let mut per_set: Vec<Vec<f32>> = vec![Vec::new(); sets];
        for img in &prompt.images {
            let Some(e) = self
                .entries
                .iter_mut()
                .find(|e| e.identity == img.image.identity)
            else {
                unreachable!("every picture was found or encoded above")
            };
            e.last_used = self.tick;
            out.image_embeds.extend_from_slice(&e.embeds);
            for (s, rows) in per_set.iter_mut().zip(&e.deepstack) {
                s.extend_from_slice(rows);
            }
            out.tokens_per_image.push(e.tokens);
            out.grids.push(e.grid);
        }
        out.deepstack = per_set.concat();
        self.evict(IMAGE_ROWS_BUDGET);
        Ok(Some(out))
    }

    /// Drops the least recently used pictures until the rows fit `budget` bytes (the pictures
    /// of the current prompt, used last, go last).
    fn evict(&mut self, budget: usize) {
        let mut total: usize = self.entries.iter().map(Rows::bytes).sum();
        while total > budget && self.entries.len() > 1 {
            let Some((i, _)) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
            else {
                return;
            };
            total -= self.entries.swap_remove(i).bytes();
        }
    }

    /// Pictures kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
