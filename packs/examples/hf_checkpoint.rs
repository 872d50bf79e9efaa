//! Writes a random-weight hub checkpoint (bf16, two shards + index, transformers 4.57 config
//! spelling) with a named shape, streamed tensor by tensor, for measuring `packs build`:
//!
//! ```text
//! cargo run --release -p packs --example hf_checkpoint -- qwen3-vl-2b /tmp/qwen3-vl-2b-random
//! ```

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use half::bf16;
use packs::layout::{self, WeightRole};
use packs::random::{fill_random, RandomShape};
use packs::QuantKind;
use serde_json::{json, Value};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: hf_checkpoint <tiny|qwen3-vl-2b> <out-dir>");
        std::process::exit(2);
    }
    let Some(shape) = RandomShape::named(&args[1]) else {
        eprintln!("error: unknown shape {:?}", args[1]);
        std::process::exit(2);
    };
    if let Err(e) = write(&shape, Path::new(&args[2])) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn write(shape: &RandomShape, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let sem = shape.semantics_for(QuantKind::Bf16, 0);
    let [t, h, w] = sem.mrope_section.expect("qwen3_vl shapes declare MRoPE");
    let config = json!({
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": sem.image_token_id, "video_token_id": sem.video_token_id,
        "vision_start_token_id": sem.vision_start_token_id, "vision_end_token_id": sem.vision_end_token_id,
        "tie_word_embeddings": sem.tie_word_embeddings,
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": sem.vocab_size, "hidden_size": sem.hidden_size,
            "num_hidden_layers": sem.num_layers, "num_attention_heads": sem.num_heads,
            "num_key_value_heads": sem.num_kv_heads, "head_dim": sem.head_dim,
            "intermediate_size": sem.intermediate_size, "rms_norm_eps": sem.rms_norm_eps,
            "rope_theta": sem.rope_theta, "torch_dtype": "bfloat16",
            "rope_scaling": { "rope_type": "default", "mrope_section": [t, h, w], "mrope_interleaved": true },
        },
        "vision_config": { "deepstack_visual_indexes": (0..sem.deepstack_sets).map(|i| 5 + 6 * i).collect::<Vec<_>>() },
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;

    // Every weight the checkpoint holds (a tied head is not stored), split over two shards.
    let plan_sem = packs::Semantics {
        quant: QuantKind::F32,
        ..sem.clone()
    };
    let mut weights: Vec<_> = layout::weights(&plan_sem)
        .into_iter()
        .filter(|w| w.source == w.name)
        .collect();
    if shape.name == "qwen3-vl-2b" {
        // The vision tower's blocks (24 x hidden 1024, MLP 4096), which a build must skip: they
        // bring the checkpoint to the hub's ~4 GB.
        for block in 0..24 {
            for (suffix, rows, cols) in [
                ("attn.qkv", 3072, 1024),
                ("attn.proj", 1024, 1024),
                ("mlp.linear_fc1", 4096, 1024),
                ("mlp.linear_fc2", 1024, 4096),
            ] {
                let name = format!("model.visual.blocks.{block}.{suffix}.weight");
                weights.push(layout::WeightPlan {
                    source: name.clone(),
                    name,
                    role: WeightRole::Linear,
                    rows,
                    cols,
                    quant: QuantKind::F32,
                    source_shape: None,
                    slice: None,
                    stored_plus_one: false,
                });
            }
        }
    }
    let total: usize = weights.iter().map(|w| w.rows * w.cols).sum();
    let mut shards: [Vec<&layout::WeightPlan>; 2] = [Vec::new(), Vec::new()];
    let mut running = 0;
    for w in &weights {
        shards[usize::from(running >= total / 2)].push(w);
        running += w.rows * w.cols;
    }
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), json!({ "format": "pt" }));
        let mut offset = 0usize;
        for w in shard {
            let shape = w.checkpoint_shape();
            let bytes = w.rows * w.cols * 2;
            header.insert(w.name.clone(), json!({ "dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes] }));
            offset += bytes;
            weight_map.insert(w.name.clone(), file.clone());
        }
        let mut header_bytes = serde_json::to_vec(&Value::Object(header))?;
        header_bytes.resize(header_bytes.len().next_multiple_of(8), b' ');
        let mut out = BufWriter::with_capacity(8 << 20, File::create(dir.join(&file))?);
        out.write_all(&(header_bytes.len() as u64).to_le_bytes())?;
        out.write_all(&header_bytes)?;
        for w in shard {
            let rows_per_block = ((4 << 20) / w.cols).clamp(1, w.rows);
            let mut values = vec![0f32; rows_per_block * w.cols];
            let mut first = 0;
            while first < w.rows {
                let n = rows_per_block.min(w.rows - first);
                let block = &mut values[..n * w.cols];
                fill_random(0, w, first, block);
                let encoded: Vec<u8> = block
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect();
                out.write_all(&encoded)?;
                first += n;
            }
        }
        out.flush()?;
    }
    let index = json!({ "metadata": { "total_size": total * 2 }, "weight_map": weight_map });
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index)?,
    )?;
    eprintln!(
        "wrote {} ({} weights, {} bytes of bf16)",
        dir.display(),
        weights.len(),
        total * 2
    );
    Ok(())
}
