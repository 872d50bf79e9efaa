//! `packs`: build a pack from a Hugging Face checkpoint, inspect one, or write a random one.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use packs::random::{self, RandomShape};
use packs::{BuildOptions, Pack, QuantKind, TensorKind};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "packs",
    version,
    about = "Turn Hugging Face Qwen3-VL checkpoints into memory-mapped packs, and look inside them",
    long_about = "A pack is one file holding the text decoder of a Qwen3-VL (or text-only Qwen3) model: \
the embedding, every layer, the final norm and the head, in f32, bf16, or int8/int4 with scales, \
plus the flattened semantics the forward needs (sizes, eps, rope theta, MRoPE section, DeepStack \
set count, special token ids). It is a safetensors-compatible container; see packs/FORMAT.md."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a pack from a hub checkpoint directory (config.json + model.safetensors or shards).
    Build {
        /// Checkpoint directory: config.json and model.safetensors, or shards with
        /// model.safetensors.index.json. Weights may be bf16, f16 or f32.
        hf_dir: PathBuf,
        /// Output pack file (written atomically: a failed build leaves nothing).
        #[arg(short, long)]
        out: PathBuf,
        /// f32 / bf16: every weight in that type (norms stay f32). i8: per-row int8 linears;
        /// q4: int4 in groups of 32 along K with bf16 scales (embedding bf16, norms f32).
        #[arg(long, value_parser = parse_quant)]
        quant: QuantKind,
        /// MRoPE section t,h,w, for configs that omit it (Qwen3-VL ships 24,20,20). Refused if
        /// it contradicts the config.
        #[arg(long, value_name = "T,H,W", value_parser = parse_section)]
        mrope_section: Option<[usize; 3]>,
        /// How the vision tower's linears are stored (default: bf16 beside an i8 or q4 decoder, where
        /// an i8 tower's image rows are ~2e-2 and a q4 one's ~0.17 from transformers' and a bf16
        /// one's ~3e-3; else as --quant). Its norms, biases and position table stay f32. Example:
        /// --quant q4 --vision-quant i8.
        #[arg(long, value_name = "KIND", value_parser = parse_quant, conflicts_with = "no_vision")]
        vision_quant: Option<QuantKind>,
        /// How a bf16 tower multiplies: `f32` widens its weights to f32, as transformers runs a bf16
        /// checkpoint in f32; `bf16` rounds the activations to bf16 and sums bf16 products in f32
        /// (AVX-512 BF16's `vdpbf16ps`: several times faster, ~3e-3 from f32; on a CPU without it
        /// the tower takes f32 products and says so). Default: bf16 beside an i8 or q4 decoder,
        /// else f32. Needs a bf16 tower.
        #[arg(
            long,
            value_name = "ARITHMETIC",
            value_parser = parse_products,
            conflicts_with = "no_vision"
        )]
        vision_products: Option<bool>,
        /// Leave the vision tower out: a text-only pack (image prompts will be refused).
        #[arg(long)]
        no_vision: bool,
        /// No progress bar.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Print a pack's semantics, every tensor (name, kind, dtype, shape, bytes) and the totals.
    Inspect {
        pack: PathBuf,
        /// Machine-readable JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a random-weight pack with a named model shape (for benchmarks and tests).
    Random {
        /// Model shape: "tiny", "tiny-vl" (tiny with a tiny tower), "qwen3-vl-2b"
        /// (Qwen3-VL-2B-Instruct: decoder, vision tower and preprocessing) or
        /// "qwen3-vl-30b-a3b-reduced" (Qwen3-VL-30B-A3B's decoder, 4 of its 48 layers).
        #[arg(long)]
        shape: String,
        #[arg(long, value_parser = parse_quant)]
        quant: QuantKind,
        #[arg(short, long)]
        out: PathBuf,
        /// Seed of the weight values.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// No progress bar.
        #[arg(short, long)]
        quiet: bool,
    },
}

/// `--vision-products`: `bf16` (true) or `f32`.
fn parse_products(s: &str) -> Result<bool, String> {
    match s {
        "bf16" => Ok(true),
        "f32" => Ok(false),
        _ => Err(format!("{s:?}: expected bf16 or f32")),
    }
}

fn parse_quant(s: &str) -> Result<QuantKind, String> {
    s.parse::<QuantKind>().map_err(|e| e.to_string())
}

fn parse_section(s: &str) -> Result<[usize; 3], String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let bad = || format!("{s:?} is not three non-negative integers like 24,20,20");
    if parts.len() != 3 {
        return Err(bad());
    }
    let mut out = [0usize; 3];
    for (o, p) in out.iter_mut().zip(parts) {
        *o = p.parse().map_err(|_| bad())?;
    }
    Ok(out)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

fn run(command: Command) -> CliResult {
    match command {
        Command::Build {
            hf_dir,
            out,
            quant,
            mrope_section,
            vision_quant,
            vision_products,
            no_vision,
            quiet,
        } => {
            let start = Instant::now();
            let (vision_quant, vision_bf16_products) =
                packs::build::tower_defaults(quant, vision_quant, vision_products);
            let opts = BuildOptions {
                mrope_section,
                progress: !quiet,
                vision: !no_vision,
                vision_quant: Some(vision_quant),
                vision_bf16_products,
                ..BuildOptions::new(quant)
            };
            let report = packs::build_from_hf(&hf_dir, &out, &opts)?;
            for warning in &report.warnings {
                eprintln!("warning: {warning}");
            }
            eprintln!(
                "wrote {} ({quant}, {} tensors, {}) in {:.1} s",
                report.out.display(),
                report.tensors,
                human_bytes(report.file_len),
                start.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Inspect { pack, json } => inspect(&pack, json),
        Command::Random {
            shape,
            quant,
            out,
            seed,
            quiet,
        } => {
            let start = Instant::now();
            let named = RandomShape::named(&shape).ok_or(packs::BuildError::UnknownShape(shape))?;
            let report = random::write_random_with_progress(&named, quant, seed, &out, !quiet)?;
            eprintln!(
                "wrote {} ({} {quant}, seed {seed}, {} tensors, {}) in {:.1} s",
                report.out.display(),
                named.name,
                report.tensors,
                human_bytes(report.file_len),
                start.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}

fn inspect(path: &Path, as_json: bool) -> CliResult {
    let pack = Pack::open(path)?;
    let sem = pack.semantics();
    let quant = sem.quant;
    let kind_label = |k: TensorKind, dtype: packs::Dtype| match (k, dtype) {
        (TensorKind::Linear, packs::Dtype::U8) => "linear q4 codes".to_string(),
        (TensorKind::Linear, packs::Dtype::I8) => "linear i8 codes".to_string(),
        (TensorKind::Scales, packs::Dtype::BF16) => "q4 scales".to_string(),
        (TensorKind::Scales, _) => "i8 scales".to_string(),
        (k, _) => k.as_str().to_string(),
    };
    let tensor_bytes: u64 = pack.tensors().iter().map(|t| t.len).sum();
    let mut by_kind: Vec<(&'static str, u64, usize)> = Vec::new();
    for t in pack.tensors() {
        let k = t.kind.as_str();
        match by_kind.iter_mut().find(|(name, _, _)| *name == k) {
            Some(entry) => {
                entry.1 += t.len;
                entry.2 += 1;
            }
            None => by_kind.push((k, t.len, 1)),
        }
    }
    if as_json {
        let tensors: Vec<_> = pack
            .tensors()
            .iter()
            .map(|t| {
                json!({
                    "name": t.name, "kind": t.kind.as_str(), "label": kind_label(t.kind, t.dtype),
                    "dtype": t.dtype.as_str(), "shape": t.shape, "offset": t.offset, "bytes": t.len,
                })
            })
            .collect();
        let kinds: serde_json::Map<String, serde_json::Value> = by_kind
            .iter()
            .map(|(k, bytes, count)| (k.to_string(), json!({ "tensors": count, "bytes": bytes })))
            .collect();
        let doc = json!({
            "path": pack.path().display().to_string(),
            "format": packs::FORMAT,
            "file_bytes": pack.file_len(),
            "semantics": sem,
            "tensors": tensors,
            "totals": { "tensors": pack.tensors().len(), "tensor_bytes": tensor_bytes, "by_kind": kinds },
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("pack        {} ({})", pack.path().display(), packs::FORMAT);
    println!("source      {}", sem.source);
    println!("quant       {quant}");
    println!("arch        {}", sem.architecture);
    println!(
        "sizes       vocab {}  hidden {}  layers {}  heads {}/{} (kv)  head_dim {}  intermediate {}",
        sem.vocab_size,
        sem.hidden_size,
        sem.num_layers,
        sem.num_heads,
        sem.num_kv_heads,
        sem.head_dim,
        sem.intermediate_size
    );
    println!("norm eps    {:e}", sem.rms_norm_eps);
    println!("rope theta  {}", sem.rope_theta);
    match sem.mrope_section {
        Some(s) if sem.mrope => println!(
            "mrope       section [{}, {}, {}]  {}",
            s[0],
            s[1],
            s[2],
            if sem.mrope_interleaved {
                "interleaved"
            } else {
                "contiguous"
            }
        ),
        _ => println!("mrope       none (plain RoPE)"),
    }
    println!("deepstack   {} sets", sem.deepstack_sets);
    if let Some(d) = &sem.delta_net {
        let kinds: String = (0..sem.num_layers)
            .map(|l| if d.is_linear(l) { 'L' } else { 'F' })
            .collect();
        println!(
            "layer kinds {kinds}  (L Gated DeltaNet x{}, F full attention x{})",
            d.linear_layers.len(),
            sem.num_layers - d.linear_layers.len()
        );
        println!(
            "deltanet    key heads {} x {}  value heads {} x {}  conv {}  rotary {} of {} dims",
            d.num_key_heads,
            d.key_head_dim,
            d.num_value_heads,
            d.value_head_dim,
            d.conv_kernel,
            d.rotary_dim,
            sem.head_dim
        );
    }
    if let Some(m) = &sem.moe {
        println!(
            "experts     {} per sparse layer, top-{} ({}), expert intermediate {}, router f32",
            m.num_experts,
            m.top_k,
            if m.norm_topk_prob {
                "weights renormalized"
            } else {
                "raw softmax weights"
            },
            m.moe_intermediate_size
        );
        if let Some(shared) = m.shared_expert_intermediate_size {
            println!(
                "shared      expert intermediate {shared} in every sparse layer, sigmoid gate f32"
            );
        }
        let dense: Vec<usize> = (0..sem.num_layers).filter(|l| !m.is_sparse(*l)).collect();
        println!(
            "            sparse layers {:?} (decoder_sparse_step {}, mlp_only_layers {:?}); dense layers {:?}",
            m.sparse_layers, m.decoder_sparse_step, m.mlp_only_layers, dense
        );
    }
    if sem.delta_net.as_ref().is_some_and(|d| d.mtp) {
        let mlp = match &sem.moe {
            Some(m) => format!(
                "routed MLP ({} experts, top-{}, shared expert)",
                m.num_experts, m.top_k
            ),
            None => format!("dense MLP (intermediate {})", sem.intermediate_size),
        };
        println!(
            "mtp         one full-attention layer, {mlp} (mtp.*): a draft source (--drafts mtp)"
        );
    }
    let id = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    println!(
        "token ids   image {}  video {}  vision start {}  vision end {}",
        id(sem.image_token_id),
        id(sem.video_token_id),
        id(sem.vision_start_token_id),
        id(sem.vision_end_token_id)
    );
    println!(
        "head        {}",
        match (
            sem.tie_word_embeddings,
            pack.tensor(packs::names::LM_HEAD).is_some()
        ) {
            (true, true) => "tied (stored once more as lm_head.weight)",
            (true, false) => "tied (the embedding)",
            (false, _) => "untied (lm_head.weight)",
        }
    );
    match (&sem.vision, &sem.preprocess) {
        (Some(v), Some(p)) => {
            println!(
                "vision      depth {}  hidden {}  heads {}  intermediate {}  out {}  patch {}  merge {}  temporal {}  positions {}  linears {}",
                v.depth,
                v.hidden_size,
                v.num_heads,
                v.intermediate_size,
                v.out_hidden_size,
                v.patch_size,
                v.spatial_merge_size,
                v.temporal_patch_size,
                v.num_position_embeddings,
                match (v.quant, v.bf16_products) {
                    (QuantKind::Bf16, true) => "bf16, bf16 products".to_string(),
                    (QuantKind::Bf16, false) => "bf16, f32 products".to_string(),
                    (kind, _) => kind.to_string(),
                }
            );
            println!(
                "            DeepStack taps after blocks {:?}; images resized to {}..={} pixels, mean {:?} std {:?}",
                v.deepstack_visual_indexes, p.min_pixels, p.max_pixels, p.image_mean, p.image_std
            );
        }
        _ => println!("vision      none (text-only pack: image prompts are refused)"),
    }
    let assets: Vec<&str> = packs::layout::ASSETS
        .iter()
        .copied()
        .filter(|a| pack.asset(a).is_some())
        .collect();
    println!(
        "assets      {}",
        if assets.is_empty() {
            "none".to_string()
        } else {
            assets.join(", ")
        }
    );
    println!();
    let name_width = pack
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4);
    println!(
        "{:<name_width$}  {:<16}  {:<5}  {:<14}  {:>12}",
        "name", "kind", "dtype", "shape", "bytes"
    );
    for t in pack.tensors() {
        println!(
            "{:<name_width$}  {:<16}  {:<5}  {:<14}  {:>12}",
            t.name,
            kind_label(t.kind, t.dtype),
            t.dtype.as_str(),
            format!("{:?}", t.shape),
            t.len
        );
    }
    println!();
    for (k, bytes, count) in &by_kind {
        println!(
            "{k:<10} {count:>5} tensors  {:>12} bytes  ({})",
            bytes,
            human_bytes(*bytes)
        );
    }
    println!(
        "total      {:>5} tensors  {:>12} bytes  ({}); file {} bytes",
        pack.tensors().len(),
        tensor_bytes,
        human_bytes(tensor_bytes),
        pack.file_len()
    );
    Ok(())
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}
