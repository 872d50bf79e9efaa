//! npu-hold: the device-hold ticket from the shell. `npu-hold status` says who holds the NPU and
//! who waits; `npu-hold run -- CMD...` takes the lease (FIFO), runs CMD, and releases it.

use std::path::PathBuf;
use std::process::{Command as Process, ExitCode};
use std::time::Duration;

use clap::{Parser, Subcommand};
use npu_sys::hold::{self, Hold, HoldOptions, INHERITED_ENV};

#[derive(Parser)]
#[command(
    name = "npu-hold",
    about = "An exclusive, first-come-first-served lease on the NPU"
)]
struct Cli {
    /// The hold directory (else XDNA_VL_HOLD_DIR, else /run/lock/xdna-vl or a temporary one).
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Who holds the NPU, since when, and who is waiting.
    Status,
    /// Take the lease, run CMD while holding it, release it; exits with CMD's status.
    Run {
        /// Give up after this many seconds of waiting (an error naming the holder).
        #[arg(long)]
        timeout: Option<f64>,
        /// What the lease is for, shown to waiters.
        #[arg(long)]
        purpose: Option<String>,
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.command {
        Command::Status => {
            let status = hold::status(cli.dir.as_deref()).map_err(|e| e.to_string())?;
            println!("{status}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            timeout,
            purpose,
            command,
        } => {
            let timeout = match timeout {
                Some(seconds) if seconds.is_finite() && seconds >= 0.0 => {
                    Some(Duration::from_secs_f64(seconds))
                }
                Some(seconds) => return Err(format!("--timeout {seconds}: expected seconds >= 0")),
                None => None,
            };
            let command_line = command.join(" ");
            let options = HoldOptions {
                dir: cli.dir.clone(),
                program: format!("npu-hold run {}", command[0]),
                purpose: purpose.unwrap_or_else(|| command_line.clone()),
                timeout,
                quiet: false,
            };
            let hold = Hold::acquire(&options).map_err(|e| e.to_string())?;
            eprintln!("npu-hold: holding the NPU for: {command_line}");
            let mut child = Process::new(&command[0]);
            child
                .args(&command[1..])
                .env(INHERITED_ENV, std::process::id().to_string());
            if let Some(dir) = &cli.dir {
                // A program under us must find our lease where we took it.
                child.env(hold::HOLD_DIR_ENV, dir);
            } else {
                child.env(hold::HOLD_DIR_ENV, hold.dir());
            }
            let status = child
                .status()
                .map_err(|e| format!("cannot run {}: {e}", command[0]));
            drop(hold);
            let status = status?;
            Ok(exit_code_of(status))
        }
    }
}

fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return ExitCode::from(u8::try_from(128 + signal).unwrap_or(1));
        }
    }
    ExitCode::from(1)
}
