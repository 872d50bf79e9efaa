//! The command line: subcommands, flags (each with an example in --help) and what they become.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use compute::cli::RuntimeArgs;
use engine::SamplingParams;

#[derive(Parser)]
#[command(
    name = "xdna-vl",
    version,
    about = "Ask a Qwen3-VL model about pictures, on the CPU or the AMD NPU",
    long_about = "Ask a Qwen3-VL model about pictures, on the CPU or the AMD NPU.\n\n\
Start with `xdna-vl run`: with no pack it builds the bundled tiny model (a random-weight \
Qwen3-VL, so its answers are gibberish) and asks it about two bundled pictures.\n\n\
Examples:\n  xdna-vl run\n  xdna-vl run qwen3-vl-2b-q4.pack --image cat.jpg --prompt \"What is in this picture?\"\n  \
xdna-vl run model.pack --prompt \"Hello\" --json\n  xdna-vl chat model.pack\n\n\
Make a pack from a Hugging Face checkpoint with `packs build CHECKPOINT -o model.pack --quant q4`.\n\
Bad input (a missing file, an unknown flag value, a prompt over the context) exits with status 2."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Answer one prompt (with pictures) and exit: the answer as it is produced on stdout, then a
    /// timing line on stderr.
    Run(RunArgs),
    /// Talk with the model: one message per line; /image FILE attaches a picture to the next
    /// message, /reset forgets the conversation, /exit (or end of input) leaves.
    Chat(ChatArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (POST /v1/chat/completions with images
    /// and streaming, GET /v1/models, GET /health), Ollama's beside it (POST /api/chat,
    /// /api/generate, /api/show, GET /api/tags, /api/version) and a web chat at / (open
    /// http://127.0.0.1:8080/ in a browser). One model, --parallel conversations answered at once,
    /// the rest waiting first come first served; Ctrl-C or SIGTERM lets the running requests
    /// finish, then exits.
    Serve(ServeArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The address to listen on; 0.0.0.0 opens it to the network. Example: --host 127.0.0.1
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port (0 picks a free one; the address is printed on stderr). Example: --port 8080
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health and the web chat's page
    /// (which asks for the key) (or set XDNA_VL_API_KEY, which keeps the key out of the process
    /// list). Example: --api-key s3cret
    #[arg(long, value_name = "KEY", env = "XDNA_VL_API_KEY")]
    pub api_key: Option<String>,
    /// Let requests name image files (a path or file://) under this directory; without it only
    /// data URLs are taken. Example: --media-dir ~/Pictures
    #[arg(long, value_name = "DIR")]
    pub media_dir: Option<std::path::PathBuf>,
    /// Fetch http(s) image URLs (off by default), within --max-image-mib and --remote-timeout.
    #[arg(long)]
    pub allow_remote_media: bool,
    /// The largest image a request may bring, in MiB. Example: --max-image-mib 16
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub max_image_mib: usize,
    /// Seconds a remote image fetch may take. Example: --remote-timeout 5
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub remote_timeout: u64,
    /// The largest request body, in MiB (larger: 413). Example: --body-limit-mib 64
    #[arg(long, value_name = "MIB", default_value_t = 48)]
    pub body_limit_mib: usize,
    /// The most tokens one answer may have (a request asking for more gets this many).
    /// Example: --max-tokens 1024
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub max_tokens: usize,
    /// Requests that may wait beside the running ones (more: 503 with Retry-After).
    /// Example: --queue 32
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub queue: usize,
    /// No line on stderr per request. Without it each request that ran prints one: how long it
    /// waited and ran, its prompt and answer tokens with their times and the answer's tok/s, and
    /// how it finished (or its error, or that the client left).
    #[arg(long)]
    pub quiet: bool,
    /// Conversations answered at once, batched into the same forwards (each holds a KV cache of
    /// --ctx tokens). 1 answers one request at a time and reuses the previous prompt's cached
    /// rows. Default: as many as --kv-budget-mib holds, at most 8. Example: --parallel 4
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// Memory for the KV caches of the parallel conversations, in MiB. Example: --kv-budget-mib 8192
    #[arg(long, value_name = "MIB", default_value_t = 4096)]
    pub kv_budget_mib: usize,
    /// Most prompt rows of one new conversation prefilled per step beside the running answers
    /// (smaller: the others' streams pause less; larger: the new prompt is in sooner).
    /// Example: --prefill-chunk 128
    #[arg(long, value_name = "ROWS", default_value_t = 64)]
    pub prefill_chunk: usize,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The question. Default (with no --prompt and no --image): "Describe these pictures." about
    /// the two bundled pictures. Example: --prompt "What colour is the car?"
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the question from a UTF-8 text file. Example: --prompt-file question.txt
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// A picture, before the question (repeat for several, in order; PNG, JPEG, WebP, GIF).
    /// Example: --image cat.jpg --image dog.png
    #[arg(long, value_name = "FILE")]
    pub image: Vec<PathBuf>,
    /// A system message before the question. Example: --system "Answer in one sentence."
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Print one JSON object (text, ids, finish reason, token counts, timings) instead of the
    /// streamed answer and the timing line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message for the whole conversation. Example: --system "You are terse."
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Print one JSON object per answer, a line each (text, ids, finish reason, token counts,
    /// timings: as `run --json`), instead of the streamed answer and the timing line; for scripts
    /// that pipe a conversation in. Example: printf 'Hi\nAnd then?\n' | xdna-vl chat --json
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Args)]
pub struct ModelArgs {
    /// The pack (`packs build CHECKPOINT -o model.pack --quant q4`). Default: the bundled tiny
    /// model, built into a pack under $XDG_CACHE_HOME/xdna-vl (or ~/.cache/xdna-vl) on first use.
    /// Example: xdna-vl run qwen3-vl-2b-q4.pack
    pub pack: Option<PathBuf>,
    /// Take the tokenizer, chat template and generation config from this checkpoint directory
    /// instead of the pack. Example: --assets ~/models/Qwen3-VL-2B-Instruct
    #[arg(long, value_name = "DIR")]
    pub assets: Option<PathBuf>,
    /// Where the matrix products run and on how many threads (--gemm, --runtime, --designs,
    /// --threads).
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Context length in tokens: prompt (image tokens included) + answer. A longer prompt is
    /// refused. The KV cache is allocated for all of it up front (Qwen3-VL-2B: 224 KiB per token
    /// in f32, half in bf16). Example: --ctx 8192
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// How the KV cache stores keys and values: f32 (exact) or bf16 (half the memory, rounded
    /// when written). Example: --kv bf16
    #[arg(long, value_enum, default_value = "f32")]
    pub kv: KvArg,
    /// Draft tokens per decode step: the sampled token and N guesses go through one forward
    /// and the guesses the model confirms are kept, so the answer is the same, in fewer forwards
    /// when the guesses are right. N (0..=16) guesses from prompt lookup (the tokens that
    /// followed the latest earlier occurrence of the answer's last 3, 2 or 1 tokens), or `mtp`
    /// / `mtp:N` from a Qwen3.5 pack's multi-token-prediction head (3 chained drafts, or N; a
    /// pack without the head is refused). Sampled answers take drafts by the speculative
    /// acceptance rule (the same distribution); `serve --parallel N` runs every conversation's
    /// windows in the shared forward (with mtp, each conversation's head drafts for it, all of
    /// them in one head step, and a shared prefix is reused only up to a prompt state, where the
    /// head resumes exactly). Default off.
    /// Examples: --drafts 4, --drafts mtp, --drafts mtp:2
    #[arg(long, value_name = "N|mtp[:N]|off", default_value = "off", value_parser = parse_drafts)]
    pub drafts: DraftsArg,
    /// With --drafts mtp: the head proposes only among the first N token ids (rounded up to 16),
    /// or `all`. The answer is the same either way (the model checks every draft); a smaller
    /// range makes each draft cheaper (the LM head is most of its cost) and misses the tokens
    /// past it. Default 65536 (byte-level BPE ids come in merge order, frequent pieces first);
    /// refused without --drafts mtp. Examples: --draft-vocab 32768, --draft-vocab all
    #[arg(long, value_name = "N|all", value_parser = parse_draft_vocab)]
    pub draft_vocab: Option<DraftVocab>,
    /// Extra variables for the checkpoint's chat template, a JSON object (as transformers'
    /// apply_chat_template(**kwargs) and llama-server's flag of the same name); `serve` gives
    /// them to every request, whose own `chat_template_kwargs` override them. Qwen3.5's
    /// template reads enable_thinking. Example: --chat-template-kwargs '{"enable_thinking": false}'
    #[arg(long, value_name = "JSON", value_parser = parse_template_kwargs)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ModelArgs {
    /// What the template is given besides the messages: `--chat-template-kwargs`, no tools.
    pub fn template_inputs(&self) -> engine::TemplateInputs {
        engine::TemplateInputs {
            kwargs: self.chat_template_kwargs.clone().unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// `--chat-template-kwargs`: a JSON object's variables.
fn parse_template_kwargs(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!(
            "--chat-template-kwargs {s}: must be a JSON object of template variables, like \
             '{{\"enable_thinking\": false}}', not {}",
            match other {
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::Bool(_) => "a boolean",
                _ => "null",
            }
        )),
        Err(e) => Err(format!(
            "--chat-template-kwargs {s}: not JSON ({e}); quote the object for the shell, like \
             '{{\"enable_thinking\": false}}'"
        )),
    }
}

/// `--drafts`: how many draft tokens per step, and from where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftsArg {
    pub n: usize,
    pub source: engine::DraftSource,
}

/// Chained MTP drafts when `--drafts mtp` names no count.
const MTP_DRAFTS: usize = 3;

/// `--drafts N|mtp[:N]|off`.
fn parse_drafts(s: &str) -> Result<DraftsArg, String> {
    let lookup = |n| DraftsArg {
        n,
        source: engine::DraftSource::PromptLookup,
    };
    let mtp = |n| DraftsArg {
        n,
        source: engine::DraftSource::Mtp,
    };
    let max = engine::MAX_DRAFTS;
    let bad = || {
        format!("--drafts {s}: must be a number of draft tokens in 0..={max}, mtp, mtp:N (1..={max}) or off")
    };
    match s {
        "off" => Ok(lookup(0)),
        "mtp" => Ok(mtp(MTP_DRAFTS)),
        _ => match s.strip_prefix("mtp:") {
            Some(n) => match n.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(mtp(n)),
                _ => Err(bad()),
            },
            None => match s.parse::<usize>() {
                Ok(n) if n <= max => Ok(lookup(n)),
                _ => Err(bad()),
            },
        },
    }
}

/// `--draft-vocab`: the token ids MTP drafts choose among (`None`: all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftVocab(pub Option<usize>);

/// `--draft-vocab N|all` ([`engine::parse_draft_vocab`]).
fn parse_draft_vocab(s: &str) -> Result<DraftVocab, String> {
    engine::parse_draft_vocab(s).map(DraftVocab)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvArg {
    F32,
    Bf16,
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy (always the most likely token). Default: the pack's
    /// generation config (greedy when it has none). Example: --temperature 0.7
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    /// Always take the most likely token (same as --temperature 0).
    #[arg(long, conflicts_with = "temperature")]
    pub greedy: bool,
    /// Sample only among the K most likely tokens (0 = all). Example: --top-k 20
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities sum to P. Example: --top-p 0.8
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one. Example: --min-p 0.05
    #[arg(long, value_name = "P")]
    pub min_p: Option<f32>,
    /// Make tokens already in the prompt or answer less likely (1 = off). Example: --repeat-penalty 1.1
    #[arg(long, value_name = "X")]
    pub repeat_penalty: Option<f32>,
    /// Lower a token's score by X for every time it is already in the answer (OpenAI's
    /// frequency_penalty, -2..2). Example: --frequency-penalty 0.5
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Lower a token's score by X once it is in the answer (OpenAI's presence_penalty, -2..2).
    /// Example: --presence-penalty 0.5
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Seed of the sampler: the same seed gives the same answer. Example: --seed 42
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most tokens in an answer. Example: --max-tokens 512
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// End the answer before this text (repeatable). Example: --stop "\n\n"
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
}

impl ModelArgs {
    pub fn kv_dtype(&self) -> decoder::KvDtype {
        match self.kv {
            KvArg::F32 => decoder::KvDtype::F32,
            KvArg::Bf16 => decoder::KvDtype::Bf16,
        }
    }
}

impl SamplingArgs {
    /// The pack's recommendation with the flags given on top.
    pub fn params(&self, defaults: SamplingParams) -> SamplingParams {
        let mut p = defaults;
        if let Some(t) = self.temperature {
            p.temperature = t;
        }
        if self.greedy {
            p.temperature = 0.0;
        }
        if let Some(k) = self.top_k {
            p.top_k = k;
        }
        if let Some(x) = self.top_p {
            p.top_p = x;
        }
        if let Some(x) = self.min_p {
            p.min_p = x;
        }
        if let Some(x) = self.repeat_penalty {
            p.repetition_penalty = x;
        }
        if let Some(x) = self.frequency_penalty {
            p.frequency_penalty = x;
        }
        if let Some(x) = self.presence_penalty {
            p.presence_penalty = x;
        }
        if let Some(n) = self.max_tokens {
            p.max_tokens = n;
        }
        p.seed = self.seed;
        p.stop.extend(self.stop.iter().map(|s| unescape(s)));
        p
    }
}

/// `\n` and `\t` typed in a flag mean the characters.
fn unescape(s: &str) -> String {
    s.replace("\\n", "\n").replace("\\t", "\t")
}
