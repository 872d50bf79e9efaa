//! What the engine's tests share: the committed transformers fixtures (tests/fixtures/engine, made
//! by tools/engine_reference.py), the tiny chat checkpoint built into an f32 pack, and an image
//! encoder that gives transformers' rows for the two pictures.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use engine::{ChatAssets, Image, ImageEncoder, Message, Result};
use serde_json::Value;
use vision::preprocess::PixelPatches;
use vision::tower::VisionOutput;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

pub fn checkpoint() -> PathBuf {
    fixtures().join("chat/Qwen3-VL-tiny")
}

pub fn cases() -> &'static Value {
    static CASES: OnceLock<Value> = OnceLock::new();
    CASES.get_or_init(|| {
        let text = std::fs::read_to_string(fixtures().join("engine/cases.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

/// One picture as transformers saw it: pixel rows, grid, image rows, DeepStack sets.
pub struct Picture {
    pub name: String,
    pub patches: PixelPatches,
    pub image_embeds: Vec<f32>,
    /// [sets, tokens, hidden]
    pub deepstack: Vec<f32>,
    pub sets: usize,
    pub tokens: usize,
}

pub fn pictures() -> &'static [Picture] {
    static PICTURES: OnceLock<Vec<Picture>> = OnceLock::new();
    PICTURES.get_or_init(|| {
        let bytes = std::fs::read(fixtures().join("engine/images.safetensors")).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let meta = meta.metadata().clone().unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let f32s = |name: &str| -> (Vec<f32>, Vec<usize>) {
            let t = st.tensor(name).unwrap();
            let v = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (v, t.shape().to_vec())
        };
        (0..2)
            .map(|i| {
                let (values, pshape) = f32s(&format!("{i}.pixel_values"));
                let g = st.tensor(&format!("{i}.grid")).unwrap();
                let grid: Vec<usize> = g
                    .data()
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as usize)
                    .collect();
                let (image_embeds, eshape) = f32s(&format!("{i}.image_embeds"));
                let (deepstack, dshape) = f32s(&format!("{i}.deepstack"));
                let name = meta[&format!("{i}.name")].clone();
                Picture {
                    patches: PixelPatches {
                        values,
                        row_len: pshape[1],
                        grid: [grid[0], grid[1], grid[2]],
                        size_in: (0, 0),
                        size_resized: (0, 0),
                    },
                    name,
                    image_embeds,
                    deepstack,
                    sets: dshape[0],
                    tokens: eshape[0],
                }
            })
            .collect()
    })
}

pub fn picture(name: &str) -> &'static Picture {
    pictures().iter().find(|p| p.name == name).unwrap()
}

pub fn image(name: &str) -> Image {
    Image::new(name, picture(name).patches.clone())
}

/// transformers' tower rows for the two fixture pictures, found by their pixel rows (a picture
/// that is neither takes the rows of the one with its grid). Counts the images it encodes.
#[derive(Clone, Default)]
pub struct FixtureEncoder {
    pub encoded: Arc<std::sync::atomic::AtomicUsize>,
}

impl FixtureEncoder {
    pub fn encoded(&self) -> usize {
        self.encoded.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl ImageEncoder for FixtureEncoder {
    fn merge_size(&self) -> usize {
        2
    }
    fn encode(&mut self, images: &[&PixelPatches]) -> Result<VisionOutput> {
        let found: Vec<&Picture> = images
            .iter()
            .map(|p| {
                let all = pictures().iter();
                all.clone()
                    .find(|q| q.patches.values == p.values && q.patches.grid == p.grid)
                    .or_else(|| all.clone().find(|q| q.patches.grid == p.grid))
                    .expect("a fixture picture's grid")
            })
            .collect();
        self.encoded
            .fetch_add(found.len(), std::sync::atomic::Ordering::SeqCst);
        let sets = found[0].sets;
        let hidden = found[0].image_embeds.len() / found[0].tokens;
        let mut out = VisionOutput {
            sets,
            ..VisionOutput::default()
        };
        for p in &found {
            out.image_embeds.extend_from_slice(&p.image_embeds);
            out.tokens_per_image.push(p.tokens);
            out.grids.push(p.patches.grid);
        }
        for s in 0..sets {
            for p in &found {
                out.deepstack.extend_from_slice(
                    &p.deepstack[s * p.tokens * hidden..(s + 1) * p.tokens * hidden],
                );
            }
        }
        Ok(out)
    }
}

/// Messages of a fixture case (images found among the fixture pictures).
pub fn messages(case: &Value) -> Vec<Message> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap();
            match &m["content"] {
                Value::String(s) => match role {
                    "system" => Message::system(s.clone()),
                    "assistant" => Message::assistant(s.clone()),
                    _ => Message::user(vec![], s.clone()),
                },
                Value::Array(items) => {
                    let content = items
                        .iter()
                        .map(|it| match it["type"].as_str().unwrap() {
                            "image" => engine::Content::Image(image(it["image"].as_str().unwrap())),
                            _ => engine::Content::Text(it["text"].as_str().unwrap().to_string()),
                        })
                        .collect();
                    let role = match role {
                        "system" => engine::Role::System,
                        "assistant" => engine::Role::Assistant,
                        _ => engine::Role::User,
                    };
                    Message::new(role, content)
                }
                other => panic!("content {other}"),
            }
        })
        .collect()
}

pub fn assets() -> ChatAssets {
    ChatAssets::from_dir(&checkpoint()).unwrap()
}

/// The tiny chat checkpoint as an f32 pack, built once per test binary.
pub fn pack_path() -> &'static Path {
    static PACK: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, p) = PACK.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("chat-f32.pack");
        let opts = packs::build::BuildOptions::new(packs::QuantKind::F32);
        packs::build::build_from_hf(&checkpoint(), &out, &opts).unwrap();
        (dir, out)
    });
    p
}

pub fn pack() -> Arc<packs::Pack> {
    Arc::new(packs::Pack::open(pack_path()).unwrap())
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A session over the tiny chat pack with its own (Rust) vision tower: 256 slots, 2 threads.
pub fn tower_session() -> engine::Session {
    let options = engine::SessionOptions {
        context: 256,
        runtime: compute::RuntimeOptions::host(2),
        ..engine::SessionOptions::default()
    };
    // No encoder set: the session runs the pack's tower.
    engine::Session::new(&pack(), &assets(), &options).unwrap()
}

/// `ask` (messages, sampling) answered by `h` while `holder` is being answered beside it, which
/// leaves once the ask is answered: (the ask's generation, with its timings). The holder
/// answers until its context runs out unless cancelled, so it is still running when the ask is
/// admitted (within one step of its submission).
pub fn ask_beside(
    h: &engine::SchedulerHandle,
    holder: &[Message],
    (m, p): (&[Message], &engine::SamplingParams),
) -> engine::Generation {
    use engine::{Event, FinishReason, SamplingParams};
    let long = SamplingParams {
        max_tokens: 10_000,
        ..SamplingParams::default()
    };
    let mut got = None;
    let g = h
        .generate(holder, &long, &mut |e| {
            if let Event::Text(_) = e {
                got = Some(h.generate(m, p, &mut |_| true).unwrap());
                return false; // the ask is answered: the holder leaves
            }
            true
        })
        .unwrap();
    assert_eq!(
        g.finish,
        FinishReason::Cancelled,
        "the holder ran to its end"
    );
    got.expect("the holder said something")
}
