//! The device-hold ticket: an exclusive, first-come-first-served, cross-process lease on the NPU,
//! taken before the device is opened and held for the whole session.
//!
//! Nothing in XRT or the driver serialises independent processes (DEVICE.md), so every program of
//! this project takes this lease first. In the hold directory:
//! - `lease.lock`: the lease itself, an exclusive `flock`; the kernel drops it when the holder
//!   dies, however it dies.
//! - `holder.json`: the holder's record (pid, program, purpose, since), written after taking the
//!   lease, removed on release (a stale one is ignored: the lease says who holds it).
//! - `counter`: the next ticket number, read and bumped under its own `flock`.
//! - `queue/ticket-N`: one file per waiter, holding its record and locked by it. Tickets are taken
//!   and their files created under the counter lock, so a waiter sees every earlier ticket; it
//!   waits until no live ticket is older than its own, then takes the lease (FIFO). A ticket whose
//!   lock is free belongs to a dead waiter and is removed.

mod lock;
mod record;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lock::{try_lock, LockKind};
pub use record::HolderRecord;

/// Overrides the hold directory.
pub const HOLD_DIR_ENV: &str = "XDNA_VL_HOLD_DIR";
/// Set by `npu-hold run` for its command: the pid holding the lease on the command's behalf, so a
/// program run under it does not wait for its own parent.
pub const INHERITED_ENV: &str = "XDNA_VL_HOLD_INHERITED";

const SYSTEM_DIR: &str = "/run/lock/xdna-vl";
const FALLBACK_DIR: &str = "xdna-vl-hold";
const LEASE_FILE: &str = "lease.lock";
const HOLDER_FILE: &str = "holder.json";
const COUNTER_FILE: &str = "counter";
const QUEUE_DIR: &str = "queue";
const TICKET_PREFIX: &str = "ticket-";
/// How often a waiter looks at the queue and the lease: bounds how late a release is noticed.
const POLL: Duration = Duration::from_millis(20);
/// Overrides the poll interval in milliseconds (1..=1000); tests use it to make a later waiter
/// more eager than an earlier one, which FIFO order must not reward.
pub const POLL_MS_ENV: &str = "XDNA_VL_HOLD_POLL_MS";

fn poll_interval() -> Duration {
    std::env::var(POLL_MS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms.clamp(1, 1000)))
        .unwrap_or(POLL)
}

#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("device-hold directory {path}: {message}")]
    Dir { path: PathBuf, message: String },
    #[error("device-hold file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error(
        "timed out after {:.1} s waiting for the NPU: {}",
        .waited.as_secs_f64(),
        describe_holder(.holder.as_ref(), *.ahead)
    )]
    Timeout {
        waited: Duration,
        holder: Option<HolderRecord>,
        ahead: usize,
    },
    #[error("this process (pid {pid}) already holds the NPU ({record}); waiting would never end")]
    AlreadyHeld { pid: u32, record: HolderRecord },
}

fn describe_holder(holder: Option<&HolderRecord>, ahead: usize) -> String {
    let mut text = match holder {
        Some(record) => format!("held by {record} for {:.1} s", record.age().as_secs_f64()),
        None => "the lease is between holders".to_string(),
    };
    if ahead > 0 {
        text.push_str(&format!("; {ahead} waiting ahead"));
    }
    text
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> HoldError {
    HoldError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// What a process asks the lease for.
#[derive(Clone, Debug)]
pub struct HoldOptions {
    /// The hold directory; None for [`hold_dir`].
    pub dir: Option<PathBuf>,
    pub program: String,
    pub purpose: String,
    /// Give up after this long (an error naming the holder); None waits as long as it takes.
    pub timeout: Option<Duration>,
    /// Print nothing (waiting, acquiring, releasing).
    pub quiet: bool,
}

impl HoldOptions {
    pub fn new(program: impl Into<String>, purpose: impl Into<String>) -> HoldOptions {
        HoldOptions {
            dir: None,
            program: program.into(),
            purpose: purpose.into(),
            timeout: None,
            quiet: false,
        }
    }
}

/// The hold directory: `XDNA_VL_HOLD_DIR`, else `/run/lock/xdna-vl` when it can be used, else
/// `xdna-vl-hold` in the temporary directory. Created (world-writable, sticky) when missing.
pub fn hold_dir() -> Result<PathBuf, HoldError> {
    if let Some(dir) = std::env::var_os(HOLD_DIR_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        prepare_dir(&dir)?;
        return Ok(dir);
    }
    let system = PathBuf::from(SYSTEM_DIR);
    if prepare_dir(&system).is_ok() {
        return Ok(system);
    }
    let fallback = std::env::temp_dir().join(FALLBACK_DIR);
    prepare_dir(&fallback)?;
    Ok(fallback)
}

/// Creates the directory and its queue, and checks the lease file can be opened for writing.
fn prepare_dir(dir: &Path) -> Result<(), HoldError> {
    let dir_error = |e: std::io::Error| HoldError::Dir {
        path: dir.to_path_buf(),
        message: e.to_string(),
    };
    for path in [dir.to_path_buf(), dir.join(QUEUE_DIR)] {
        if !path.is_dir() {
            fs::create_dir_all(&path).map_err(dir_error)?;
            share_with_all_users(&path, 0o1777);
        }
    }
    open_shared_file(&dir.join(LEASE_FILE))?;
    Ok(())
}

/// Best effort: other users' programs must be able to queue in the same directory.
fn share_with_all_users(path: &Path, mode: u32) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode));
    }
    #[cfg(not(unix))]
    let _ = (path, mode);
}

fn open_shared_file(path: &Path) -> Result<File, HoldError> {
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| file_error(path, e))?;
    if !existed {
        share_with_all_users(path, 0o666);
    }
    Ok(file)
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A held lease. Dropping it releases the lease (and says how long it was held).
#[derive(Debug)]
pub struct Hold {
    dir: PathBuf,
    /// The locked lease file; None when the lease is held by the parent `npu-hold run`.
    lease: Option<File>,
    record: HolderRecord,
    acquired: Instant,
    quiet: bool,
}

impl Hold {
    /// Takes the lease, waiting in FIFO order behind earlier waiters.
    pub fn acquire(options: &HoldOptions) -> Result<Hold, HoldError> {
        let dir = match &options.dir {
            Some(dir) => {
                prepare_dir(dir)?;
                dir.clone()
            }
            None => hold_dir()?,
        };
        let lease_path = dir.join(LEASE_FILE);
        let lease = open_shared_file(&lease_path)?;
        let pid = std::process::id();
        if let Some(holder) = current_holder(&dir)? {
            if holder.pid == pid {
                return Err(HoldError::AlreadyHeld {
                    pid,
                    record: holder,
                });
            }
            let inherited_from = std::env::var(INHERITED_ENV)
                .ok()
                .and_then(|v| v.parse::<u32>().ok());
            if inherited_from == Some(holder.pid) {
                if !options.quiet {
                    eprintln!("npu-hold: using the lease of {holder}");
                }
                return Ok(Hold {
                    dir,
                    lease: None,
                    record: holder,
                    acquired: Instant::now(),
                    quiet: true,
                });
            }
        }
        let mut record = HolderRecord {
            pid,
            program: options.program.clone(),
            purpose: options.purpose.clone(),
            since_unix_ms: now_unix_ms(),
            ticket: 0,
        };
        let ticket = Ticket::take(&dir, &mut record)?;
        let started = Instant::now();
        let poll = poll_interval();
        let mut reported: Option<(Option<(u32, u64)>, usize)> = None;
        loop {
            let ahead = live_tickets_before(&dir, ticket.number)?;
            if ahead.is_empty()
                && try_lock(&lease, LockKind::Exclusive).map_err(|e| file_error(&lease_path, e))?
            {
                break;
            }
            let holder = current_holder(&dir)?;
            let waited = started.elapsed();
            if let Some(timeout) = options.timeout {
                if waited >= timeout {
                    return Err(HoldError::Timeout {
                        waited,
                        holder,
                        ahead: ahead.len(),
                    });
                }
            }
            let now = (holder.as_ref().map(|h| (h.pid, h.ticket)), ahead.len());
            if !options.quiet && reported.as_ref() != Some(&now) {
                eprintln!(
                    "npu-hold: waiting for the NPU: {}",
                    describe_holder(holder.as_ref(), ahead.len())
                );
                reported = Some(now);
            }
            std::thread::sleep(poll);
        }
        record.since_unix_ms = now_unix_ms();
        write_holder(&dir, &record)?;
        drop(ticket);
        if !options.quiet {
            let waited = started.elapsed();
            if reported.is_some() {
                eprintln!(
                    "npu-hold: holding the NPU after waiting {:.1} s",
                    waited.as_secs_f64()
                );
            }
        }
        Ok(Hold {
            dir,
            lease: Some(lease),
            record,
            acquired: Instant::now(),
            quiet: options.quiet,
        })
    }

    pub fn record(&self) -> &HolderRecord {
        &self.record
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True when the lease is held by a parent `npu-hold run`, not by this value.
    pub fn is_inherited(&self) -> bool {
        self.lease.is_none()
    }

    pub fn held_for(&self) -> Duration {
        self.acquired.elapsed()
    }

    /// Releases the lease; returns how long it was held.
    pub fn release(mut self) -> Duration {
        self.release_now()
    }

    fn release_now(&mut self) -> Duration {
        let held = self.acquired.elapsed();
        let Some(lease) = self.lease.take() else {
            return held;
        };
        // Remove our record before unlocking, so the next holder's record is never removed.
        let holder_path = self.dir.join(HOLDER_FILE);
        if read_holder(&holder_path)
            .is_some_and(|r| r.pid == self.record.pid && r.ticket == self.record.ticket)
        {
            let _ = fs::remove_file(&holder_path);
        }
        drop(lease);
        if !self.quiet {
            eprintln!(
                "npu-hold: released the NPU after {:.2} s",
                held.as_secs_f64()
            );
        }
        held
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release_now();
    }
}

/// A waiter's place in the queue: its locked ticket file. Dropping it leaves the queue.
struct Ticket {
    number: u64,
    path: PathBuf,
    _file: File,
}

impl Ticket {
    /// Takes the next number and creates its locked file, both under the counter lock.
    fn take(dir: &Path, record: &mut HolderRecord) -> Result<Ticket, HoldError> {
        let counter_path = dir.join(COUNTER_FILE);
        let mut counter = open_shared_file(&counter_path)?;
        let counter_error = |e: std::io::Error| file_error(&counter_path, e);
        lock::lock(&counter, LockKind::Exclusive).map_err(counter_error)?;
        let mut text = String::new();
        counter.read_to_string(&mut text).map_err(counter_error)?;
        let number = match text.trim() {
            "" => 0,
            value => value.parse::<u64>().map_err(|_| {
                file_error(
                    &counter_path,
                    format!("holds {value:?}, not a ticket number"),
                )
            })?,
        };
        counter.set_len(0).map_err(counter_error)?;
        counter.seek(SeekFrom::Start(0)).map_err(counter_error)?;
        counter
            .write_all(format!("{}\n", number + 1).as_bytes())
            .map_err(counter_error)?;
        record.ticket = number;

        let queue = dir.join(QUEUE_DIR);
        let temp = queue.join(format!(".{TICKET_PREFIX}{number}.{}.tmp", record.pid));
        let path = queue.join(format!("{TICKET_PREFIX}{number:020}"));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| file_error(&temp, e))?;
        // Locked before it becomes visible under its ticket name, so it is never taken for stale.
        if !try_lock(&file, LockKind::Exclusive).map_err(|e| file_error(&temp, e))? {
            return Err(file_error(
                &temp,
                "a new ticket file was locked by someone else",
            ));
        }
        file.write_all(record.to_json().as_bytes())
            .map_err(|e| file_error(&temp, e))?;
        share_with_all_users(&temp, 0o666);
        fs::rename(&temp, &path).map_err(|e| file_error(&path, e))?;
        drop(counter);
        Ok(Ticket {
            number,
            path,
            _file: file,
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

fn ticket_number(name: &str) -> Option<u64> {
    name.strip_prefix(TICKET_PREFIX)?.parse().ok()
}

/// Live waiters with a ticket older than `mine`, oldest first; removes dead waiters' tickets.
fn live_tickets_before(dir: &Path, mine: u64) -> Result<Vec<HolderRecord>, HoldError> {
    Ok(live_tickets(dir, true)?
        .into_iter()
        .filter(|record| record.ticket < mine)
        .collect())
}

/// Every live ticket, oldest first. `remove_stale` removes tickets of dead waiters.
fn live_tickets(dir: &Path, remove_stale: bool) -> Result<Vec<HolderRecord>, HoldError> {
    let queue = dir.join(QUEUE_DIR);
    let entries = fs::read_dir(&queue).map_err(|e| HoldError::Dir {
        path: queue.clone(),
        message: e.to_string(),
    })?;
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = ticket_number(&name) else {
            continue;
        };
        let path = entry.path();
        let Ok(mut file) = File::open(&path) else {
            continue; // left the queue meanwhile
        };
        let free = try_lock(&file, LockKind::Exclusive).map_err(|e| file_error(&path, e))?;
        if free {
            // Its waiter died (or just left): nobody holds the ticket's lock.
            if remove_stale {
                let _ = fs::remove_file(&path);
            }
            continue;
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let record =
            HolderRecord::from_json(&text).unwrap_or_else(|| HolderRecord::unknown(number));
        live.push(HolderRecord {
            ticket: number,
            ..record
        });
    }
    live.sort_by_key(|record| record.ticket);
    Ok(live)
}

fn read_holder(path: &Path) -> Option<HolderRecord> {
    HolderRecord::from_json(&fs::read_to_string(path).ok()?)
}

fn write_holder(dir: &Path, record: &HolderRecord) -> Result<(), HoldError> {
    let path = dir.join(HOLDER_FILE);
    let temp = dir.join(format!(".{HOLDER_FILE}.{}.tmp", record.pid));
    fs::write(&temp, record.to_json()).map_err(|e| file_error(&temp, e))?;
    share_with_all_users(&temp, 0o666);
    fs::rename(&temp, &path).map_err(|e| file_error(&path, e))
}

/// Whether the lease is held right now (a shared lock attempt that is refused).
fn lease_is_held(dir: &Path) -> Result<bool, HoldError> {
    let path = dir.join(LEASE_FILE);
    let probe = open_shared_file(&path)?;
    let free = try_lock(&probe, LockKind::Shared).map_err(|e| file_error(&path, e))?;
    Ok(!free)
}

/// The holder's record when the lease is held (None when free or the record is not written yet).
fn current_holder(dir: &Path) -> Result<Option<HolderRecord>, HoldError> {
    if !lease_is_held(dir)? {
        return Ok(None);
    }
    Ok(read_holder(&dir.join(HOLDER_FILE)))
}

/// Who holds the lease and who waits, as `npu-hold status` prints it.
#[derive(Clone, Debug)]
pub struct HoldStatus {
    pub dir: PathBuf,
    pub held: bool,
    pub holder: Option<HolderRecord>,
    pub waiting: Vec<HolderRecord>,
}

/// The lease's state in `dir` (None: [`hold_dir`]). Does not disturb holders or waiters.
pub fn status(dir: Option<&Path>) -> Result<HoldStatus, HoldError> {
    let dir = match dir {
        Some(dir) => {
            prepare_dir(dir)?;
            dir.to_path_buf()
        }
        None => hold_dir()?,
    };
    let held = lease_is_held(&dir)?;
    let holder = if held {
        read_holder(&dir.join(HOLDER_FILE))
    } else {
        None
    };
    let waiting = live_tickets(&dir, false)?;
    Ok(HoldStatus {
        dir,
        held,
        holder,
        waiting,
    })
}

impl std::fmt::Display for HoldStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hold directory {}: ", self.dir.display())?;
        match (&self.holder, self.held) {
            (Some(holder), _) => write!(
                f,
                "held by {holder} for {:.1} s",
                holder.age().as_secs_f64()
            )?,
            (None, true) => write!(f, "held (the holder's record is not written yet)")?,
            (None, false) => write!(f, "free")?,
        }
        for waiter in &self.waiting {
            write!(
                f,
                "\n  waiting: ticket {} {waiter} for {:.1} s",
                waiter.ticket,
                waiter.age().as_secs_f64()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &Path, purpose: &str) -> HoldOptions {
        HoldOptions {
            dir: Some(dir.to_path_buf()),
            program: "hold-unit-test".into(),
            purpose: purpose.into(),
            timeout: Some(Duration::from_millis(200)),
            quiet: true,
        }
    }

    #[test]
    fn acquire_status_release() {
        let dir = tempfile::tempdir().unwrap();
        let before = status(Some(dir.path())).unwrap();
        assert!(!before.held && before.holder.is_none());
        let hold = Hold::acquire(&options(dir.path(), "unit")).unwrap();
        let during = status(Some(dir.path())).unwrap();
        assert!(during.held);
        let holder = during.holder.unwrap();
        assert_eq!(holder.pid, std::process::id());
        assert_eq!(holder.purpose, "unit");
        hold.release();
        let after = status(Some(dir.path())).unwrap();
        assert!(!after.held && after.holder.is_none());
    }

    #[test]
    fn a_second_hold_in_the_same_process_is_refused_not_deadlocked() {
        let dir = tempfile::tempdir().unwrap();
        let _hold = Hold::acquire(&options(dir.path(), "first")).unwrap();
        let err = Hold::acquire(&options(dir.path(), "second")).unwrap_err();
        assert!(matches!(err, HoldError::AlreadyHeld { .. }), "{err}");
    }

    #[test]
    fn a_corrupt_counter_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        prepare_dir(dir.path()).unwrap();
        fs::write(dir.path().join(COUNTER_FILE), "seven").unwrap();
        let err = Hold::acquire(&options(dir.path(), "x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("counter") && err.contains("seven"), "{err}");
    }

    #[test]
    fn stale_tickets_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        prepare_dir(dir.path()).unwrap();
        // A dead waiter's ticket: the file exists but nobody holds its lock.
        fs::write(
            dir.path()
                .join(QUEUE_DIR)
                .join(format!("{TICKET_PREFIX}{:020}", 0)),
            "{}",
        )
        .unwrap();
        fs::write(dir.path().join(COUNTER_FILE), "1\n").unwrap();
        let hold = Hold::acquire(&options(dir.path(), "after a dead waiter")).unwrap();
        assert_eq!(hold.record().ticket, 1);
        assert!(status(Some(dir.path())).unwrap().waiting.is_empty());
    }
}
