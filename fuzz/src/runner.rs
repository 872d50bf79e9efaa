//! Runs a target's inputs: each under catch_unwind (a panic is a finding, its input saved), each
//! watched by a watchdog (an input running longer than the hang limit is a finding, saved, and its
//! worker abandoned), refusals counted by category, peak RSS read from /proc/self/status.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use crate::input::{self, Base, Input};
use crate::rng::Rng;

/// A parser under fuzz.
pub trait Target: Send + Sync {
    fn name(&self) -> &'static str;
    /// The valid files mutations start from.
    fn bases(&self) -> &[Base];
    /// Input `rng` draws (the same rng state gives the same input).
    fn generate(&self, rng: &mut Rng) -> Input;
    /// Runs the parser on the base copy in `dir` (patches applied); `out` is an empty directory
    /// for anything the parser writes. `Err` is a refusal, by category.
    fn run(&self, dir: &Path, out: &Path, input: &Input) -> Result<(), String>;
    /// The parser reads the input's bytes from memory (a request body, an encoded image, a
    /// template): the runner skips writing them to the scratch directory.
    fn in_memory(&self) -> bool {
        false
    }
}

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub inputs: u64,
    pub seconds: f64,
    pub seed: u64,
    /// An input taking longer than this is a hang.
    pub hang_seconds: f64,
    /// Where panicking and hanging inputs are written.
    pub crash_dir: PathBuf,
    /// Where workers keep their copies of the bases (tmpfs is fastest).
    pub scratch: PathBuf,
    /// Print progress every this many seconds (0: never).
    pub progress_seconds: f64,
}

/// One panicking or hanging input.
#[derive(Clone, Debug)]
pub struct Finding {
    pub index: u64,
    pub message: String,
    pub saved: Option<PathBuf>,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub target: String,
    pub inputs: u64,
    pub accepted: u64,
    pub refusals: BTreeMap<String, u64>,
    pub panics: Vec<Finding>,
    pub hangs: Vec<Finding>,
    pub peak_rss_kib: u64,
    pub wall: Duration,
}

impl Report {
    pub fn refused(&self) -> u64 {
        self.refusals.values().sum()
    }

    pub fn print(&self) {
        println!("target {}", self.target);
        println!(
            "  inputs {}  accepted {}  refused {}  panics {}  hangs {}  peak RSS {:.1} MiB  wall {:.1} s ({:.0} inputs/s)",
            self.inputs,
            self.accepted,
            self.refused(),
            self.panics.len(),
            self.hangs.len(),
            self.peak_rss_kib as f64 / 1024.0,
            self.wall.as_secs_f64(),
            self.inputs as f64 / self.wall.as_secs_f64().max(1e-9),
        );
        let mut by_count: Vec<_> = self.refusals.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        println!("  refusals by reason:");
        for (reason, n) in by_count {
            println!("    {n:>9}  {reason}");
        }
        for (what, list) in [("panic", &self.panics), ("hang", &self.hangs)] {
            for f in list {
                println!(
                    "  {what} at input {}: {} (saved: {})",
                    f.index,
                    f.message,
                    f.saved
                        .as_ref()
                        .map_or("no".into(), |p| p.display().to_string())
                );
            }
        }
    }
}

/// Peak resident set of this process (VmHWM), in KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

static HOOK: Once = Once::new();
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Panics are findings, not noise: the hook records the message instead of printing it.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Elsewhere (a test's own assertion, a pool thread inside an input) print as usual.
            let name = std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string();
            if !name.starts_with("fuzz-") {
                default(info);
            }
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(non-string panic)".into());
            let at = info
                .location()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{msg}{at}"));
        }));
    });
}

#[derive(Default)]
struct Shared {
    report: Mutex<Report>,
    /// The input index being run (u64::MAX: none) and when it started (ns since `t0`).
    current: AtomicU64,
    started_ns: AtomicU64,
    /// Next index to run.
    next: AtomicU64,
    stop: AtomicBool,
}

fn save(cfg: &RunConfig, target: &dyn Target, index: u64, kind: &str) -> Option<PathBuf> {
    let mut rng = Rng::for_input(cfg.seed, index);
    let input = target.generate(&mut rng);
    let dir = cfg.crash_dir.join(format!(
        "{}-{kind}-seed{}-input{index}",
        target.name(),
        cfg.seed
    ));
    let _ = std::fs::remove_dir_all(&dir);
    input::materialize(&dir, &target.bases()[input.base], &input).ok()
}

fn worker(target: Arc<dyn Target>, cfg: RunConfig, shared: Arc<Shared>, t0: Instant, id: u64) {
    let scratch = cfg
        .scratch
        .join(format!("{}-w{id}-{}", target.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let dirs: Vec<PathBuf> = target
        .bases()
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let d = scratch.join(format!("base{i}"));
            input::write_base(&d, b).expect("write the base files to the scratch directory");
            d
        })
        .collect();
    let out = scratch.join("out");
    std::fs::create_dir_all(&out).expect("create the scratch output directory");
    let deadline = Duration::from_secs_f64(cfg.seconds);
    loop {
        if shared.stop.load(Ordering::SeqCst) || t0.elapsed() >= deadline {
            break;
        }
        let index = shared.next.fetch_add(1, Ordering::SeqCst);
        if index >= cfg.inputs {
            break;
        }
        let mut rng = Rng::for_input(cfg.seed, index);
        let input = target.generate(&mut rng);
        let dir = &dirs[input.base];
        let on_disk = !target.in_memory();
        if on_disk {
            input::apply(dir, &input).expect("apply an input's patches");
        }
        shared
            .started_ns
            .store(t0.elapsed().as_nanos() as u64, Ordering::SeqCst);
        shared.current.store(index, Ordering::SeqCst);
        let result = catch_unwind(AssertUnwindSafe(|| target.run(dir, &out, &input)));
        shared.current.store(u64::MAX, Ordering::SeqCst);
        if shared.stop.load(Ordering::SeqCst) {
            // The watchdog gave up on this worker (a hang); its successor carries on.
            return;
        }
        if on_disk {
            input::restore(dir, &target.bases()[input.base], &input).expect("restore the base");
            for e in std::fs::read_dir(&out).into_iter().flatten().flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let mut report = shared.report.lock().unwrap_or_else(|e| e.into_inner());
        report.inputs += 1;
        match result {
            Ok(Ok(())) => report.accepted += 1,
            Ok(Err(reason)) => *report.refusals.entry(reason).or_default() += 1,
            Err(_) => {
                let message = LAST_PANIC
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .unwrap_or_default();
                drop(report);
                let saved = save(&cfg, target.as_ref(), index, "panic");
                let mut report = shared.report.lock().unwrap_or_else(|e| e.into_inner());
                report.panics.push(Finding {
                    index,
                    message,
                    saved,
                });
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Most hangs recorded before a run stops (each leaves a stuck thread behind).
const MAX_HANGS: usize = 3;

/// Runs inputs `0..cfg.inputs` of `target` (or as many as fit in `cfg.seconds`) on one worker.
pub fn run(target: Arc<dyn Target>, cfg: &RunConfig) -> Report {
    install_panic_hook();
    let t0 = Instant::now();
    let mut shared = Arc::new(Shared::default());
    shared.current.store(u64::MAX, Ordering::SeqCst);
    let spawn = |shared: &Arc<Shared>, id: u64| {
        let (t, c, s) = (target.clone(), cfg.clone(), shared.clone());
        std::thread::Builder::new()
            .name(format!("fuzz-{}-{id}", target.name()))
            // Deep recursion must be refused by the parsers, not by a small stack.
            .stack_size(64 << 20)
            .spawn(move || worker(t, c, s, t0, id))
            .expect("spawn a fuzz worker")
    };
    let mut hangs = Vec::new();
    let mut handle = spawn(&shared, 0);
    let mut last_progress = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if handle.is_finished() {
            if handle.join().is_err() {
                let msg = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
                eprintln!(
                    "fuzz worker died outside an input: {}",
                    msg.unwrap_or_default()
                );
            }
            break;
        }
        let current = shared.current.load(Ordering::SeqCst);
        let started = Duration::from_nanos(shared.started_ns.load(Ordering::SeqCst));
        if current != u64::MAX
            && t0.elapsed().saturating_sub(started).as_secs_f64() > cfg.hang_seconds
        {
            if shared.current.load(Ordering::SeqCst) != current {
                continue;
            }
            // Abandon the stuck worker; a fresh one (own scratch copy) continues after it.
            shared.stop.store(true, Ordering::SeqCst);
            let saved = save(cfg, target.as_ref(), current, "hang");
            hangs.push(Finding {
                index: current,
                message: format!("still running after {:.1} s", cfg.hang_seconds),
                saved,
            });
            let old = shared
                .report
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let next = Arc::new(Shared::default());
            next.current.store(u64::MAX, Ordering::SeqCst);
            next.next.store(current + 1, Ordering::SeqCst);
            *next.report.lock().unwrap() = Report {
                inputs: old.inputs + 1,
                ..old
            };
            shared = next;
            if hangs.len() >= MAX_HANGS {
                break;
            }
            handle = spawn(&shared, hangs.len() as u64);
        }
        if cfg.progress_seconds > 0.0
            && last_progress.elapsed().as_secs_f64() >= cfg.progress_seconds
        {
            last_progress = Instant::now();
            let r = shared.report.lock().unwrap_or_else(|e| e.into_inner());
            eprintln!(
                "[{}] {:.0} s: {} inputs, {} accepted, {} refused, {} panics, {} hangs, peak RSS {:.1} MiB",
                target.name(),
                t0.elapsed().as_secs_f64(),
                r.inputs,
                r.accepted,
                r.refused(),
                r.panics.len(),
                hangs.len(),
                peak_rss_kib() as f64 / 1024.0
            );
        }
    }
    let mut report = shared
        .report
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    report.target = target.name().to_string();
    report.hangs = hangs;
    report.peak_rss_kib = peak_rss_kib();
    report.wall = t0.elapsed();
    report
}

/// Runs one input by hand (for replaying a saved index): the input materialized in `dir`.
pub fn run_one(target: &dyn Target, seed: u64, index: u64, dir: &Path) -> Result<(), String> {
    let mut rng = Rng::for_input(seed, index);
    let input = target.generate(&mut rng);
    input::materialize(dir, &target.bases()[input.base], &input).map_err(|e| e.to_string())?;
    let out = dir.join("out");
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    target.run(dir, &out, &input)
}
