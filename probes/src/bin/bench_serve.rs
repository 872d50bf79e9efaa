//! `bench_serve`: load on `xdna-vl serve` over loopback. Starts the server (the `xdna-vl` binary
//! beside this one unless `--server` says otherwise) on a free port, drives N concurrent streaming
//! clients for a bounded time, and prints requests/s, time to first token p50/p95, decode tok/s
//! per stream, errors (must be 0) and the server's peak RSS; then stops the server with SIGTERM.
//!
//! Every request goes to 127.0.0.1 only, is bounded in count (`--requests`) and time
//! (`--seconds`), and the run stops by itself.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use probes::cli::refuse;
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "bench_serve",
    about = "Concurrent streaming clients against `xdna-vl serve` on loopback: requests/s, TTFT p50/p95, decode tok/s per stream, errors, server peak RSS",
    long_about = "Example:\n  cargo build --release -p xdna-vl -p probes\n  target/release/bench_serve --clients 4 --seconds 20 --json\n\n\
With no --pack the server loads its bundled tiny model. --image sends a picture (as a data URL) with every request."
)]
struct Args {
    /// The xdna-vl binary (default: the one beside this program).
    #[arg(long, value_name = "FILE")]
    server: Option<PathBuf>,
    /// The pack the server loads (default: its bundled tiny model).
    #[arg(long, value_name = "FILE")]
    pack: Option<PathBuf>,
    /// Concurrent clients, each sending one streaming request after another.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// How long the clients keep sending (no new request starts after this).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// The most requests in all.
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    /// Tokens per answer.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// A picture sent with every request.
    #[arg(long, value_name = "FILE")]
    image: Option<PathBuf>,
    /// Extra arguments for `xdna-vl serve` (e.g. "--threads 2").
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    serve_args: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// One finished request.
struct Sample {
    ok: bool,
    ttft: Duration,
    decode_tokens: usize,
    decode_time: Duration,
}

struct ServerProcess {
    child: Child,
    addr: SocketAddr,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(args: &Args) -> ServerProcess {
    let exe = args.server.clone().unwrap_or_else(|| {
        let me = std::env::current_exe().unwrap_or_default();
        me.with_file_name("xdna-vl")
    });
    if !exe.is_file() {
        refuse(format!(
            "{}: no xdna-vl binary (build it with `cargo build --release -p xdna-vl`, or give --server)",
            exe.display()
        ));
    }
    let mut cmd = Command::new(&exe);
    cmd.arg("serve");
    if let Some(p) = &args.pack {
        cmd.arg(p);
    }
    cmd.args(["--host", "127.0.0.1", "--port", "0"]);
    cmd.args(["--queue", &(args.clients * 2).to_string()]);
    if let Some(extra) = &args.serve_args {
        cmd.args(extra.split_whitespace());
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| refuse(format!("{}: {e}", exe.display())));
    // The server says where it listens on stderr: "... listening on http://ADDR".
    let stderr = child.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            refuse("the server exited before it listened");
        };
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest
                .trim()
                .parse::<SocketAddr>()
                .unwrap_or_else(|e| refuse(format!("server said {line:?}: {e}")));
        }
        if Instant::now() > deadline {
            refuse("the server did not listen within 120 s");
        }
    };
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    ServerProcess { child, addr }
}

fn request_body(args: &Args, image: &Option<String>, i: usize) -> String {
    let mut content = Vec::new();
    if let Some(url) = image {
        content.push(json!({"type": "image_url", "image_url": {"url": url}}));
    }
    content.push(json!({"type": "text", "text": format!("Describe picture number {i}.")}));
    json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": args.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0,
    })
    .to_string()
}

/// One streaming request; reads the SSE chunks as they come.
fn one_request(addr: SocketAddr, body: &str) -> Sample {
    let failed = Sample {
        ok: false,
        ttft: Duration::ZERO,
        decode_tokens: 0,
        decode_time: Duration::ZERO,
    };
    let start = Instant::now();
    let Ok(s) = server::client::send(addr, "POST", "/v1/chat/completions", None, body.as_bytes())
    else {
        return failed;
    };
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    if reader.read_line(&mut status).is_err() || !status.contains(" 200 ") {
        return failed;
    }
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut completion_tokens = 0usize;
    let mut ok = false;
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if v.get("error").is_some() {
            ok = false;
            break;
        }
        if let Some(text) = v["choices"]
            .get(0)
            .and_then(|c| c["delta"]["content"].as_str())
        {
            if !text.is_empty() {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
            }
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            completion_tokens = n as usize;
            ok = true;
        }
    }
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest);
    let first = first.unwrap_or(last);
    Sample {
        ok,
        ttft: first - start,
        decode_tokens: completion_tokens.saturating_sub(1),
        decode_time: last - first,
    }
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() {
    let args = Args::parse();
    if args.clients == 0 || args.seconds == 0 || args.max_tokens == 0 {
        refuse("--clients, --seconds and --max-tokens must be at least 1");
    }
    let image = args.image.as_ref().map(|p| {
        let bytes = std::fs::read(p).unwrap_or_else(|e| refuse(format!("{}: {e}", p.display())));
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        format!("data:image/png;base64,{b64}")
    });
    let server = start_server(&args);
    let addr = server.addr;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let issued = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let clients: Vec<_> = (0..args.clients)
        .map(|_| {
            let samples = samples.clone();
            let issued = issued.clone();
            let bodies: Vec<String> = (0..4).map(|i| request_body(&args, &image, i)).collect();
            let limit = args.requests;
            std::thread::spawn(move || {
                while Instant::now() < deadline {
                    let n = issued.fetch_add(1, Ordering::SeqCst);
                    if n >= limit {
                        break;
                    }
                    let s = one_request(addr, &bodies[n % bodies.len()]);
                    samples.lock().unwrap().push(s);
                }
            })
        })
        .collect();
    for c in clients {
        let _ = c.join();
    }
    let wall = started.elapsed().as_secs_f64();
    let rss = peak_rss_kib(server.child.id());
    drop(server);
    let samples = samples.lock().unwrap();
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let errors = samples.len() - ok.len();
    let mut ttft: Vec<f64> = ok.iter().map(|s| s.ttft.as_secs_f64() * 1e3).collect();
    ttft.sort_by(f64::total_cmp);
    let mut decode: Vec<f64> = ok
        .iter()
        .filter(|s| s.decode_tokens > 0 && s.decode_time > Duration::ZERO)
        .map(|s| s.decode_tokens as f64 / s.decode_time.as_secs_f64())
        .collect();
    decode.sort_by(f64::total_cmp);
    let result = json!({
        "clients": args.clients,
        "seconds": wall,
        "requests": samples.len(),
        "errors": errors,
        "requests_per_s": ok.len() as f64 / wall,
        "ttft_ms_p50": percentile(&ttft, 0.5),
        "ttft_ms_p95": percentile(&ttft, 0.95),
        "decode_tok_s_per_stream_p50": percentile(&decode, 0.5),
        "server_peak_rss_mib": rss.map(|k| k as f64 / 1024.0),
        "max_tokens": args.max_tokens,
        "image": args.image.as_ref().map(|p| p.display().to_string()),
    });
    if args.json {
        println!("{result}");
    } else {
        println!(
            "bench_serve: {} clients, {:.1} s, {} requests, {} errors\n  requests/s {:.2}\n  TTFT p50 {:.1} ms  p95 {:.1} ms\n  decode per stream p50 {:.1} tok/s\n  server peak RSS {}",
            args.clients,
            wall,
            samples.len(),
            errors,
            ok.len() as f64 / wall,
            percentile(&ttft, 0.5),
            percentile(&ttft, 0.95),
            percentile(&decode, 0.5),
            rss.map_or("?".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0)),
        );
    }
    if errors > 0 {
        std::process::exit(1);
    }
}
