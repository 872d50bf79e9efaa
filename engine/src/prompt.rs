//! Messages -> the prompt the decoder reads: the chat template's text, its ids with each image's
//! single `<|image_pad|>` expanded to the image's token count (as transformers' processor expands
//! it), where each image sits, and the three position planes.

use crate::error::{EngineError, Result};
use crate::message::{Image, Message, Role};
use crate::rope_index::{position_planes, ImageSpan, RopeAblation};
use crate::template::{ChatTemplate, TemplateInputs};
use crate::tokenizer::Tokenizer;

/// Deliberate mistakes, for controls.
#[derive(Clone, Copy, Debug, Default)]
pub struct PromptAblation {
    pub rope: RopeAblation,
    /// Count each image's pads (and rows in the planes) from its patch grid instead of the merged
    /// grid (t*h*w instead of t*h*w / merge^2).
    pub pads_from_patch_grid: bool,
    /// Render without the generation prompt.
    pub no_generation_prompt: bool,
}

/// One image of a prompt: where its rows are and which picture it is.
#[derive(Clone, Debug)]
pub struct PromptImage {
    pub span: ImageSpan,
    pub tokens: usize,
    pub image: Image,
}

#[derive(Clone, Debug)]
pub struct Prompt {
    pub text: String,
    pub ids: Vec<u32>,
    pub images: Vec<PromptImage>,
    /// Plane-major t, h, w for every row.
    pub planes: Vec<i64>,
    /// max position + 1 - rows: the token at cache slot s rotates by s + rope_delta.
    pub rope_delta: i64,
}

impl Prompt {
    pub fn rows(&self) -> usize {
        self.ids.len()
    }
    pub fn image_tokens(&self) -> usize {
        self.images.iter().map(|i| i.tokens).sum()
    }
    /// The rotary position of the first token after the prompt.
    pub fn next_rotary_pos(&self) -> i64 {
        self.rows() as i64 + self.rope_delta
    }

    /// Whether the prompt ends inside an open think block: its generation prompt ends with
    /// `<think>` and maybe a newline (Qwen3.5's, unless `enable_thinking` is false, when the
    /// block is closed in the prompt), so the answer starts with reasoning and `</think>`.
    pub fn opens_think(&self) -> bool {
        opens_think(&self.text)
    }
}

/// [`Prompt::opens_think`] of a prompt's text.
fn opens_think(text: &str) -> bool {
    text.strip_suffix('\n').unwrap_or(text).ends_with("<think>")
}

/// What turns messages into prompts: the tokenizer, the template, the merge size.
pub struct PromptBuilder<'a> {
    pub tokenizer: &'a Tokenizer,
    pub template: &'a ChatTemplate,
    /// Spatial merge of the vision tower (2 in Qwen3-VL).
    pub merge: usize,
    pub ablation: PromptAblation,
}

impl PromptBuilder<'_> {
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        self.render_with(messages, &TemplateInputs::default())
    }

    /// The prompt text with `inputs` (OpenAI's function tools, extra variables) given to the
    /// template.
    pub fn render_with(&self, messages: &[Message], inputs: &TemplateInputs) -> Result<String> {
        check_messages(messages)?;
        let json =
            serde_json::Value::Array(messages.iter().map(|m| m.to_template_json()).collect());
        self.template
            .render_with(&json, inputs, !self.ablation.no_generation_prompt)
    }

    pub fn build(&self, messages: &[Message]) -> Result<Prompt> {
        self.build_with(messages, &TemplateInputs::default())
    }

    /// [`PromptBuilder::build`] with `inputs` given to the template.
    pub fn build_with(&self, messages: &[Message], inputs: &TemplateInputs) -> Result<Prompt> {
        let text = self.render_with(messages, inputs)?;
        let images: Vec<&Image> = messages.iter().flat_map(|m| m.images()).collect();
        let raw = self.tokenizer.encode(&text)?;
        let pad = self.tokenizer.special.image_pad;
        let pads = raw.iter().filter(|&&t| t == pad).count();
        if pads != images.len() {
            return Err(EngineError::Prompt(format!(
                "the chat template wrote {pads} image placeholder(s) (<|image_pad|>) for {} image(s): \
                 text that contains <|image_pad|> itself, or a template that drops images",
                images.len()
            )));
        }
        let merge = if self.ablation.pads_from_patch_grid {
            1
        } else {
            self.merge
        };
        let mut ids = Vec::with_capacity(raw.len());
        let mut spans = Vec::with_capacity(images.len());
        let mut next = images.iter();
        for &t in &raw {
            if t != pad {
                ids.push(t);
                continue;
            }
            let image = (*next.next().expect("pads counted above")).clone();
            let grid = image.grid();
            if !grid[1].is_multiple_of(merge) || !grid[2].is_multiple_of(merge) || grid.contains(&0)
            {
                return Err(EngineError::Image {
                    name: image.name.clone(),
                    what: format!(
                        "patch grid {grid:?} is empty or not a multiple of the merge size {merge}"
                    ),
                });
            }
            let span = ImageSpan {
                first_row: ids.len(),
                grid,
            };
            let tokens = span.tokens(merge);
            ids.extend(std::iter::repeat_n(pad, tokens));
            spans.push(PromptImage {
                span,
                tokens,
                image,
            });
        }
        let rope_spans: Vec<ImageSpan> = spans.iter().map(|s| s.span).collect();
        let (planes, rope_delta) =
            position_planes(ids.len(), &rope_spans, merge, self.ablation.rope);
        Ok(Prompt {
            text,
            ids,
            images: spans,
            planes,
            rope_delta,
        })
    }
}

/// Refuses conversations the chat format cannot carry, naming the turn.
fn check_messages(messages: &[Message]) -> Result<()> {
    if messages.is_empty() {
        return Err(EngineError::Prompt(
            "no messages: the prompt is empty".into(),
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        if m.role != Role::User && m.images().next().is_some() {
            return Err(EngineError::Prompt(format!(
                "message {i} ({}) holds an image: only user turns carry images",
                m.role.as_str()
            )));
        }
        if m.role == Role::User && m.content.is_empty() {
            return Err(EngineError::Prompt(format!(
                "message {i} (user) is empty: give a prompt or an image"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::opens_think;

    #[test]
    fn a_prompt_opens_think_when_its_generation_prompt_ends_in_the_open_tag() {
        // Qwen3.5's thinking generation prompt, with and without the newline.
        assert!(opens_think("<|im_start|>assistant\n<think>\n"));
        assert!(opens_think("<|im_start|>assistant\n<think>"));
        // Control: enable_thinking false closes the block in the prompt; Qwen3-VL opens none.
        assert!(!opens_think(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!opens_think("<|im_start|>assistant\n"));
        assert!(!opens_think("<think>\n\n"));
    }
}
