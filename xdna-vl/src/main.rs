//! `xdna-vl`: the product binary. `run` answers one prompt, `chat` keeps a conversation, `serve`
//! answers HTTP clients; all on the engine's `Session` (the same generate loop as every other
//! front end).

mod bundled;
mod chat;
mod cli;
mod run;
mod serve;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use engine::{ChatAssets, Session, SessionOptions};

use cli::{Cli, Command, ModelArgs};

/// Bad input (a file, a flag, a prompt): nothing was answered.
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Chat(args) => chat::chat(&args),
        Command::Serve(args) => serve::serve(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

/// The session the arguments ask for: the pack (or the bundled one), its chat files (or
/// `--assets`), the backend, threads and context.
pub fn open_session(model: &ModelArgs) -> Result<Session, String> {
    let pack = match &model.pack {
        Some(p) => {
            if !p.is_file() {
                return Err(format!("{}: no such pack file", p.display()));
            }
            p.clone()
        }
        None => bundled::pack()?,
    };
    let assets = match &model.assets {
        Some(dir) if !dir.is_dir() => {
            return Err(format!("--assets {}: no such directory", dir.display()))
        }
        Some(dir) => Some(ChatAssets::from_dir(dir).map_err(|e| e.to_string())?),
        None => None,
    };
    if model.ctx == 0 {
        return Err("--ctx 0: the context must hold at least one token".into());
    }
    if model.draft_vocab.is_some() && model.drafts.source != engine::DraftSource::Mtp {
        return Err(
            "--draft-vocab: applies to the MTP head's drafts only; add --drafts mtp or drop it"
                .into(),
        );
    }
    if model.runtime.threads == 0 {
        return Err("--threads 0: at least one thread is needed".into());
    }
    let options = SessionOptions {
        context: model.ctx,
        runtime: model.runtime.options("xdna-vl"),
        kv_dtype: model.kv_dtype(),
        drafts: model.drafts.n,
        draft_source: model.drafts.source,
        mtp_vocab: model.draft_vocab.map_or(Some(engine::MTP_VOCAB), |v| v.0),
        ..SessionOptions::default()
    };
    Session::open(&pack, assets.as_ref(), &options).map_err(|e| e.to_string())
}

/// A text file's contents, refused by name when unreadable or not UTF-8.
pub fn read_utf8(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
