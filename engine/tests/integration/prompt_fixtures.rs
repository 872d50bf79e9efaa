//! Messages -> rendered text, ids, planes and rope delta equal transformers' Qwen3VLProcessor and
//! get_rope_index on every fixture case; the Qwen3-VL Instruct template renders byte for byte as
//! transformers renders it. Controls: no generation prompt, pads counted from the patch grid,
//! planes continuing from the image's token count — each shown to differ.

use crate::common;

use common::*;
use engine::prompt::PromptAblation;
use engine::rope_index::RopeAblation;
use engine::{ChatFormat, ChatTemplate, PromptBuilder};

fn format() -> ChatFormat {
    ChatFormat::new(&assets()).unwrap()
}

fn builder(f: &ChatFormat, ablation: PromptAblation) -> PromptBuilder<'_> {
    PromptBuilder {
        tokenizer: &f.tokenizer,
        template: &f.template,
        merge: 2,
        ablation,
    }
}

fn planes(case: &serde_json::Value) -> Vec<i64> {
    case["planes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()))
        .collect()
}

#[test]
fn every_case_renders_tokenizes_and_places_as_transformers() {
    let f = format();
    let b = builder(&f, PromptAblation::default());
    let cases = cases()["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 5);
    for (name, case) in cases {
        let p = b.build(&messages(case)).unwrap();
        assert_eq!(p.text, case["text"].as_str().unwrap(), "{name}: text");
        assert_eq!(p.ids, ids(&case["ids"]), "{name}: ids");
        assert_eq!(p.planes, planes(case), "{name}: planes");
        assert_eq!(
            p.rope_delta,
            case["rope_delta"].as_i64().unwrap(),
            "{name}: rope delta"
        );
        let grids: Vec<[usize; 3]> = p.images.iter().map(|i| i.span.grid).collect();
        let want: Vec<[usize; 3]> = case["grids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let g = ids(g);
                [g[0] as usize, g[1] as usize, g[2] as usize]
            })
            .collect();
        assert_eq!(grids, want, "{name}: grids");
    }
}

#[test]
fn the_qwen3_vl_instruct_template_renders_byte_for_byte_as_transformers() {
    let src =
        std::fs::read_to_string(fixtures().join("engine/qwen3-vl-instruct.chat_template.jinja"))
            .unwrap();
    let real = ChatTemplate::new(&src, None).unwrap();
    let f = format();
    for (name, case) in cases()["cases"].as_object().unwrap() {
        let b = PromptBuilder {
            tokenizer: &f.tokenizer,
            template: &real,
            merge: 2,
            ablation: PromptAblation::default(),
        };
        let text = b.render(&messages(case)).unwrap();
        assert_eq!(text, case["real_template_text"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn control_a_template_without_the_generation_prompt_differs() {
    let f = format();
    let b = builder(
        &f,
        PromptAblation {
            no_generation_prompt: true,
            ..PromptAblation::default()
        },
    );
    for (name, case) in cases()["cases"].as_object().unwrap() {
        let text = b.render(&messages(case)).unwrap();
        assert_ne!(text, case["text"].as_str().unwrap(), "{name}");
        assert_eq!(
            text,
            case["text_no_generation_prompt"].as_str().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn control_pads_counted_from_the_patch_grid_differ() {
    let f = format();
    let b = builder(
        &f,
        PromptAblation {
            pads_from_patch_grid: true,
            ..PromptAblation::default()
        },
    );
    let mut caught = 0;
    for (name, case) in cases()["cases"].as_object().unwrap() {
        let p = b.build(&messages(case)).unwrap();
        if case["grids"].as_array().unwrap().is_empty() {
            assert_eq!(
                p.ids,
                ids(&case["ids"]),
                "{name}: no image, nothing to count"
            );
        } else {
            assert_ne!(p.ids, ids(&case["ids"]), "{name}");
            caught += 1;
        }
    }
    assert_eq!(caught, 3);
}

#[test]
fn control_planes_continuing_from_the_token_count_differ() {
    let f = format();
    let b = builder(
        &f,
        PromptAblation {
            rope: RopeAblation {
                advance_by_token_count: true,
            },
            ..PromptAblation::default()
        },
    );
    let mut caught = 0;
    for (name, case) in cases()["cases"].as_object().unwrap() {
        let p = b.build(&messages(case)).unwrap();
        assert_eq!(p.ids, ids(&case["ids"]), "{name}");
        if case["grids"].as_array().unwrap().is_empty() {
            assert_eq!(p.planes, planes(case), "{name}");
        } else {
            assert_ne!(p.planes, planes(case), "{name}");
            assert_ne!(p.rope_delta, case["rope_delta"].as_i64().unwrap(), "{name}");
            caught += 1;
        }
    }
    assert_eq!(caught, 3);
}
