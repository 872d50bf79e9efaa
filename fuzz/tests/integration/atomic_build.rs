//! Packs are written atomically: a `packs build` (the same `build_from_hf`, run by `fuzz
//! build-pack` as a child process) killed with SIGKILL in the middle of writing leaves the old
//! pack at the output path byte for byte, and nothing that could be taken for a pack: the only
//! leftover is the hidden `.<name>.<random>.tmp` the writer was filling, which Pack::open refuses.
//! Control: the child is seen writing and dies by the signal (it did not finish first), and a
//! build left to finish replaces the pack.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use half::bf16;
use packs::layout;
use packs::{Pack, QuantKind};
use serde_json::json;

/// A bf16 hub checkpoint of ~40 MB (vocab 65536 x hidden 256, 4 layers): a q4 build of it takes
/// long enough to be killed mid-way.
fn big_checkpoint(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut sem = packs::RandomShape::tiny().semantics_for(QuantKind::F32, 0);
    (sem.vocab_size, sem.hidden_size, sem.num_layers) = (65536, 256, 4);
    (sem.head_dim, sem.intermediate_size) = (64, 1024);
    let [t, h, w] = sem.mrope_section.unwrap();
    let config = json!({
        "model_type": "qwen3_vl",
        "image_token_id": sem.image_token_id, "video_token_id": sem.video_token_id,
        "vision_start_token_id": sem.vision_start_token_id, "vision_end_token_id": sem.vision_end_token_id,
        "tie_word_embeddings": true,
        "text_config": {
            "vocab_size": sem.vocab_size, "hidden_size": sem.hidden_size,
            "num_hidden_layers": sem.num_layers, "num_attention_heads": sem.num_heads,
            "num_key_value_heads": sem.num_kv_heads, "head_dim": sem.head_dim,
            "intermediate_size": sem.intermediate_size, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "rope_scaling": { "rope_type": "default", "mrope_section": [t, h, w], "mrope_interleaved": true },
        },
        "vision_config": { "deepstack_visual_indexes": [0, 1] },
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let weights: Vec<_> = layout::weights(&sem)
        .into_iter()
        .filter(|w| w.source == w.name)
        .collect();
    let data: Vec<Vec<u8>> = weights
        .iter()
        .map(|w| {
            (0..w.rows * w.cols)
                .flat_map(|i| bf16::from_f32(((i % 251) as f32 - 125.0) * 1e-3).to_le_bytes())
                .collect()
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = weights
        .iter()
        .zip(&data)
        .map(|(w, d)| {
            let v = safetensors::tensor::TensorView::new(
                safetensors::Dtype::BF16,
                w.checkpoint_shape(),
                d,
            );
            (w.name.clone(), v.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn others(dir: &Path, pack: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != pack)
        .collect()
}

#[test]
fn a_build_killed_mid_way_leaves_the_old_pack_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("big");
    big_checkpoint(&ck);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let pack = out_dir.join("model.pack");
    let small = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/odd/checkpoint");
    packs::build_from_hf(&small, &pack, &packs::BuildOptions::new(QuantKind::F32)).unwrap();
    let old = std::fs::read(&pack).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_fuzz"))
        .args([
            "build-pack",
            ck.to_str().unwrap(),
            pack.to_str().unwrap(),
            "q4",
        ])
        .spawn()
        .unwrap();
    // Wait until the writer's temp file holds more than its header, then kill.
    let t0 = Instant::now();
    let seen = loop {
        if let Some(tmpfile) = others(&out_dir, &pack).into_iter().next() {
            if std::fs::metadata(&tmpfile).map(|m| m.len()).unwrap_or(0) > 1 << 20 {
                break Some(tmpfile);
            }
        }
        if child.try_wait().unwrap().is_some() || t0.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    child.kill().unwrap();
    let status = child.wait().unwrap();
    let seen = seen.expect("control: the build was seen writing its temp file before it ended");
    assert_eq!(
        status.signal(),
        Some(9),
        "control: the build died by SIGKILL, mid-way ({status})"
    );

    // The old pack, byte for byte, and it opens.
    assert!(
        std::fs::read(&pack).unwrap() == old,
        "the old pack is intact"
    );
    let opened = Pack::open(&pack).unwrap();
    assert_eq!(opened.semantics().vocab_size, 512, "the odd fixture's pack");
    // The only leftover is the hidden temp file, named so as not to pass for a pack, and refused
    // if opened anyway.
    let left = others(&out_dir, &pack);
    assert_eq!(
        left,
        vec![seen.clone()],
        "one leftover: the temp file being written"
    );
    let name = seen.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(".model.pack.") && name.ends_with(".tmp"),
        "{name}"
    );
    let err = Pack::open(&seen)
        .expect_err("a half-written pack is refused")
        .to_string();
    assert!(
        err.contains("not a pack") || err.contains("outside"),
        "{err}"
    );

    // A build left to finish replaces the pack (the stale temp file is in nobody's way).
    let status = Command::new(env!("CARGO_BIN_EXE_fuzz"))
        .args([
            "build-pack",
            ck.to_str().unwrap(),
            pack.to_str().unwrap(),
            "q4",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(Pack::open(&pack).unwrap().semantics().vocab_size, 65536);
    assert_eq!(
        others(&out_dir, &pack),
        vec![seen],
        "a finished build leaves no temp file"
    );
}
