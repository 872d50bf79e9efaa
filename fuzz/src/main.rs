//! `fuzz`: runs N inputs per target with a time cap and prints inputs run, refusals by reason,
//! panics, hangs and peak RSS. Exits 1 when any input panicked or hung, 2 on a usage error.
//!
//! ```text
//! cargo run --release -p fuzz -- --target pack --inputs 1000000 --seconds 600
//! cargo run --release -p fuzz -- --target pack --seed 1 --replay 123456   # one input again
//! fuzz build-pack <checkpoint-dir> <out.pack> [quant]                   # packs build (kill test)
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use fuzz::runner::{self, RunConfig};
use fuzz::targets;

const USAGE: &str = "usage: fuzz --target <pack|checkpoint|inputs|chat-body|image|template|all> [--inputs N] \
[--seconds S] [--seed S] [--hang-seconds S] [--crash-dir DIR] [--scratch DIR] [--replay INDEX]\n       \
fuzz build-pack <checkpoint-dir> <out.pack> [f32|bf16|i8|q4]";

fn usage(msg: &str) -> ExitCode {
    eprintln!("error: {msg}\n{USAGE}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("build-pack") {
        return build_pack(&args[1..]);
    }
    let mut target = None;
    let mut replay = None;
    let scratch = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let mut cfg = RunConfig {
        inputs: 10_000,
        seconds: 60.0,
        seed: 1,
        hang_seconds: 10.0,
        crash_dir: PathBuf::from("fuzz-crashes"),
        scratch,
        progress_seconds: 30.0,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            return usage(&format!("{flag} needs a value"));
        };
        let num = |v: &str| {
            v.parse::<f64>()
                .map_err(|_| format!("{flag} {v:?} is not a number"))
        };
        let int = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v:?} is not a whole number"))
        };
        let r = match flag.as_str() {
            "--target" => {
                target = Some(value.clone());
                Ok(())
            }
            "--inputs" => int(value).map(|v| cfg.inputs = v),
            "--seconds" => num(value).map(|v| cfg.seconds = v),
            "--seed" => int(value).map(|v| cfg.seed = v),
            "--hang-seconds" => num(value).map(|v| cfg.hang_seconds = v),
            "--crash-dir" => {
                cfg.crash_dir = PathBuf::from(value);
                Ok(())
            }
            "--scratch" => {
                cfg.scratch = PathBuf::from(value);
                Ok(())
            }
            "--replay" => int(value).map(|v| replay = Some(v)),
            other => Err(format!("unknown flag {other}")),
        };
        if let Err(e) = r {
            return usage(&e);
        }
    }
    let Some(target) = target else {
        return usage("--target is required");
    };
    let names: Vec<&str> = if target == "all" {
        targets::NAMES.to_vec()
    } else {
        vec![target.as_str()]
    };
    let work = cfg
        .scratch
        .join(format!("fuzz-bases-{}", std::process::id()));
    let mut failed = false;
    for name in names {
        let t = match targets::by_name(name, &work) {
            Ok(t) => t,
            Err(e) => return usage(&e),
        };
        if let Some(index) = replay {
            let dir = cfg
                .crash_dir
                .join(format!("{name}-replay-seed{}-input{index}", cfg.seed));
            let _ = std::fs::remove_dir_all(&dir);
            let r = runner::run_one(t.as_ref(), cfg.seed, index, &dir);
            println!("{name} input {index} (written to {}): {r:?}", dir.display());
            continue;
        }
        println!(
            "fuzz --target {name} --inputs {} --seconds {} --seed {} --hang-seconds {}",
            cfg.inputs, cfg.seconds, cfg.seed, cfg.hang_seconds
        );
        let report = runner::run(t, &cfg);
        report.print();
        failed |= !report.panics.is_empty() || !report.hangs.is_empty();
    }
    let _ = std::fs::remove_dir_all(&work);
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `packs build` as a child process the atomic-write test can kill: the same `build_from_hf`.
fn build_pack(args: &[String]) -> ExitCode {
    let (Some(dir), Some(out)) = (args.first(), args.get(1)) else {
        return usage("build-pack needs <checkpoint-dir> <out.pack>");
    };
    let quant = match args.get(2).map(String::as_str) {
        None | Some("f32") => packs::QuantKind::F32,
        Some("bf16") => packs::QuantKind::Bf16,
        Some("i8") => packs::QuantKind::I8,
        Some("q4") => packs::QuantKind::Q4,
        Some(other) => return usage(&format!("unknown quant {other:?}")),
    };
    match packs::build_from_hf(dir.as_ref(), out.as_ref(), &packs::BuildOptions::new(quant)) {
        Ok(r) => {
            println!("wrote {} ({} bytes)", r.out.display(), r.file_len);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
