//! bench: host decoder speed against the memory-bandwidth roofline, on a random-weight pack of a named
//! shape (made once and cached), with a streaming-read bandwidth probe in the same run.
//!
//! `bench --shape qwen3-vl-2b --threads 2 --json` prints one object: `read_gb_s`, and per kind under
//! `kinds.<kind>`: `decode_tok_s`, `decode_tok_s_ctx512`, `prefill_tok_s` (keyed by rows),
//! `roofline_pct`, `peak_rss_mb`, and the figures behind them. `bench gemm` times each GEMM of the
//! shape alone (GEMV and 128-row GEMM) on every instruction set the CPU runs. `bench decode --ctx
//! 0,2048,4096 --kv bf16,f32` times decode steps with the cache filled to each context, against ctx 0
//! and against what the bytes a step reads predict.
//!
//! One module per benchmark (`decoder` and its mixture-of-experts variant `moe`, `decode`, `gemm`,
//! `attention`, `kv_accuracy`, `vision`); `forward` runs the decoder for them (prompts, timed
//! prefills and decode steps), `measure` probes the host (read bandwidth, multiply-add peaks, load,
//! memory), `random_pack` makes and caches the packs, `report` rounds and prints.

mod attention;
mod decode;
mod drafts;
mod gemm;
mod join;
mod kv_accuracy;
mod measure;
mod moe;
mod random_pack;
mod report;
mod roofline;
mod steps;
mod streams;
mod tower;

use clap::{Parser, Subcommand};
use packs::random::RandomShape;
use packs::QuantKind;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    version,
    about = "Host decoder and GEMM speed against the bandwidth roofline",
    after_help = "The decoder runs on the fastest host kernels that pass their self-check; \
                  XDNA_VL_KERNELS=avx512vnni|avx2|scalar picks one (same results, to compare speed). \
                  `bench gemm --isa` times each instruction set's GEMMs alone."
)]
struct Args {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    common: Common,
    /// Prefill row counts of the decoder benchmark (no subcommand), comma separated [default:
    /// 16,128,512,2048]; 512 is always run (the ctx-512 decode continues from it).
    #[arg(long, value_delimiter = ',')]
    prefill_rows: Option<Vec<usize>>,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// A named random shape (tiny, tiny-vl, qwen3-vl-2b, qwen3-vl-30b-a3b-reduced, qwen3.5-2b,
    /// qwen3.5-0.8b).
    #[arg(long, default_value = "qwen3-vl-2b", global = true)]
    shape: String,
    /// Threads of the forward's pool (and of the bandwidth probe).
    #[arg(long, default_value_t = 2, global = true)]
    threads: usize,
    /// Quant kinds to measure, comma separated (f32, bf16, i8, q4) [default: q4,i8; for vision
    /// f32,bf16,i8,q4].
    #[arg(long, value_delimiter = ',', global = true)]
    kinds: Option<Vec<String>>,
    /// Where the random packs are made once and kept.
    #[arg(long, default_value = "target/bench", global = true)]
    pack_dir: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1, global = true)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Clone)]
enum Mode {
    /// Decode at chosen contexts: per kind and KV cache type, one prefill fills the cache to the
    /// largest context, then each context (largest first, the cache truncated to it) times
    /// `--steps` decode steps; ms/token, tok/s, and the ratio of each context's time per token to
    /// ctx 0's beside what the bytes a step reads predict.
    Decode {
        /// Filled cache slots to decode at, comma separated (ctx 0, the baseline, is always run).
        #[arg(long, default_value = "0,2048,4096", value_delimiter = ',')]
        ctx: Vec<String>,
        /// KV cache types, comma separated (f32, bf16).
        #[arg(long, default_value = "bf16,f32", value_delimiter = ',')]
        kv: Vec<String>,
        /// Timed decode steps per context (the median counts).
        #[arg(long, default_value_t = 16)]
        steps: usize,
    },
    /// Several conversations decoded in one forward: per stream count, ms per step, aggregate
    /// and per-stream tok/s, the share of the read roofline (the weights read once per step for
    /// all streams, plus their KV rows) and the aggregate against one stream's.
    Streams {
        /// Stream counts, comma separated.
        #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
        streams: Vec<String>,
        /// Timed decode steps per stream count (the median counts).
        #[arg(long, default_value_t = 12)]
        steps: usize,
    },
    /// Greedy decoding with verified draft windows (oracle drafts: the plain run's own
    /// continuation, k per forward) against plain decoding: tok/s of both, the ratio, and whether
    /// the ids are identical (they must be).
    Drafts {
        /// Draft tokens per forward (1..=16).
        #[arg(long, default_value_t = 4)]
        k: usize,
        /// Greedy tokens per run.
        #[arg(long, default_value_t = 41)]
        tokens: usize,
        /// What pays for the drafts: `oracle` (nothing: the window's cost alone) or `mtp` (a
        /// Qwen3.5 shape's multi-token-prediction head runs its k chained steps before each
        /// window, as `--drafts mtp` does, and its proposals are then replaced by the oracle's:
        /// the cost of MTP drafting at 100% acceptance). Example: --shape qwen3.5-2b --source mtp
        #[arg(long, default_value = "oracle")]
        source: drafts::Source,
        /// With --source mtp: the token ids the head's logits cover (`xdna-vl --draft-vocab`:
        /// the first N, or all; default 65536). Example: --draft-vocab all
        #[arg(long, value_name = "N|all")]
        draft_vocab: Option<String>,
        /// With --source mtp: also time the head's drafting for N conversations at once (one head
        /// step per draft over all of them, as `serve --parallel N --drafts mtp` runs it) against
        /// the same N one at a time. Example: --source mtp --streams 4
        #[arg(long, default_value_t = 1)]
        streams: usize,
    },
    /// A new conversation joining running decodes, as `serve --parallel` schedules it (each step
    /// one row per running conversation and the next slice of the new prompt): its time to the
    /// first token against the same slices alone (target <= x1.3 beside 3), and the others' step
    /// time while it joins. Example: bench join --kinds q4 --prompt-rows 512 --others 3
    Join {
        /// Rows of the joining prompt (an image prompt at 448x448 is about 220).
        #[arg(long, default_value_t = 512)]
        prompt_rows: usize,
        /// Most rows of the new prompt per step (`serve --prefill-chunk`'s default).
        #[arg(long, default_value_t = 64)]
        prefill_chunk: usize,
        /// Conversations decoding when it joins.
        #[arg(long, default_value_t = 3)]
        others: usize,
    },
    /// Each GEMM of the shape alone: GEMV (1 row) and GEMMs (`--rows`), GB/s and GMAC/s, per
    /// instruction set.
    Gemm {
        /// Rows of the batched cases, comma separated (the head, which a prefill runs for one
        /// row, is timed at 128 rows at most).
        #[arg(long, default_value = "128", value_delimiter = ',')]
        rows: Vec<usize>,
        /// Instruction sets to time, comma separated (default: every one this CPU runs).
        #[arg(long, value_delimiter = ',')]
        isa: Vec<String>,
    },
    /// The bf16 KV cache's accuracy cost: every transformers fixture replayed (prompt, teacher-forced
    /// steps, text control) with the f32 and the bf16 cache, each against the reference.
    KvAccuracy {
        /// The fixtures directory (cases with checkpoint/, inputs.safetensors, reference*.safetensors).
        #[arg(long, default_value = "tests/fixtures")]
        fixtures: PathBuf,
    },
    /// Attention alone over a filled cache, every layer, f32 and bf16 caches, as the decoder runs
    /// it: one decode row (the pool's threads over the KV heads), or with `--rows N` a prefill of N
    /// rows after the context (row i attends context + i + 1 slots), reported as GMAC/s
    /// = 2 · Σ_rows slots · query heads · head_dim · layers / time (q·k and p·v each count one
    /// multiply-add per element) and as % of the f32 FMA and mul+add peaks measured in the run.
    Attention {
        /// Filled cache slots the row attends to (a prefill's rows come after them).
        #[arg(long, default_value_t = 512)]
        context: usize,
        /// Query rows: 1 is a decode step; more is a prefill of that many rows.
        #[arg(long, default_value_t = 1)]
        rows: usize,
        /// Instead of the decoder's: the vision tower's attention alone over one image of this
        /// many patches (every block of the shape's tower), as GMAC/s and % of the in-run peak
        /// of the instruction its kernel uses.
        #[arg(long)]
        segment: Option<usize>,
    },
    /// The vision tower per image size and kind: preprocessing, tower, its GEMMs' GMAC/s against
    /// the host's peak (measured in the same run), attention, and the time to the first token
    /// (tower + decoder prefill of the image rows and a short prompt). A shape without a tower
    /// runs its tower variant (tiny -> tiny-vl).
    Vision {
        /// Image sizes, comma separated, each WIDTHxHEIGHT.
        #[arg(
            long,
            default_value = "448x448,1280x720,1920x1080",
            value_delimiter = ','
        )]
        images: Vec<String>,
        /// Text rows of the prompt around the image.
        #[arg(long, default_value_t = 16)]
        prompt: usize,
        /// Timed runs per image and kind (the fastest counts).
        #[arg(long, default_value_t = 1)]
        reps: usize,
    },
}

fn refuse(msg: impl std::fmt::Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

fn main() {
    let args = Args::parse();
    let c = &args.common;
    if c.threads == 0 {
        refuse("--threads must be at least 1");
    }
    let Some(shape) = RandomShape::named(&c.shape) else {
        refuse(format!(
            "unknown shape {:?} (expected one of {})",
            c.shape,
            RandomShape::NAMES.join(", ")
        ))
    };
    let default_kinds = match args.mode {
        Some(Mode::Vision { .. }) => "f32,bf16,i8,q4",
        _ => "q4,i8",
    };
    let kinds: Vec<QuantKind> = c
        .kinds
        .clone()
        .unwrap_or_else(|| default_kinds.split(',').map(String::from).collect())
        .iter()
        .map(|k| {
            k.parse()
                .unwrap_or_else(|e| refuse(format!("--kinds: {e}")))
        })
        .collect();
    if kinds.is_empty() {
        refuse("--kinds names no kind");
    }
    if let Err(e) = std::fs::create_dir_all(&c.pack_dir) {
        refuse(format!("cannot create {}: {e}", c.pack_dir.display()));
    }
    let report = match &args.mode {
        None => roofline::run(c, &shape, &kinds, args.prefill_rows.as_deref()),
        Some(Mode::Attention {
            context,
            rows,
            segment: Some(n),
        }) => {
            let _ = (context, rows);
            attention::tower(c, &shape, *n)
        }
        Some(Mode::Attention {
            context,
            rows,
            segment: None,
        }) => attention::run(c, &shape, *context, *rows),
        Some(Mode::KvAccuracy { fixtures }) => kv_accuracy::run(c, fixtures),
        Some(Mode::Vision {
            images,
            prompt,
            reps,
        }) => tower::run(c, &shape, &kinds, images, *prompt, *reps),
        Some(Mode::Decode { ctx, kv, steps }) => decode::run(c, &shape, &kinds, ctx, kv, *steps),
        Some(Mode::Gemm { rows, isa }) => gemm::run(c, &shape, &kinds, rows, isa),
        Some(Mode::Streams { streams, steps }) => streams::run(c, &shape, &kinds, streams, *steps),
        Some(Mode::Join {
            prompt_rows,
            prefill_chunk,
            others,
        }) => join::run(c, &shape, &kinds, *prompt_rows, *prefill_chunk, *others),
        Some(Mode::Drafts {
            k,
            tokens,
            source,
            draft_vocab,
            streams,
        }) => {
            if draft_vocab.is_some() && *source != drafts::Source::Mtp {
                refuse("--draft-vocab: applies to --source mtp only; drop it or add --source mtp");
            }
            if *streams != 1 && *source != drafts::Source::Mtp {
                refuse("--streams: applies to --source mtp only; drop it or add --source mtp");
            }
            if !(1..=64).contains(streams) {
                refuse(format!(
                    "--streams {streams}: conversations must be in 1..=64"
                ));
            }
            let vocab = match draft_vocab {
                Some(v) => engine::parse_draft_vocab(v).unwrap_or_else(|e| refuse(e)),
                None => Some(engine::MTP_VOCAB),
            };
            drafts::run(c, &shape, &kinds, (*k, vocab), (*tokens, *streams), *source)
        }
    };
    if c.json {
        println!("{}", serde_json::to_string_pretty(&report).expect("json"));
    }
}
