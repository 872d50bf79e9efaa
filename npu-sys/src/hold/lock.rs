//! `flock(2)` on an open file: the kernel drops the lock when the last descriptor of the open file
//! closes, which includes the holder's death, however it dies.

use std::fs::File;
use std::io;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockKind {
    Shared,
    Exclusive,
}

#[cfg(unix)]
fn flock(file: &File, kind: LockKind, nonblocking: bool) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut operation = match kind {
        LockKind::Shared => libc::LOCK_SH,
        LockKind::Exclusive => libc::LOCK_EX,
    };
    if nonblocking {
        operation |= libc::LOCK_NB;
    }
    loop {
        // SAFETY: the descriptor belongs to `file`, which is borrowed for the whole call, so it
        // is open; flock has no memory effects.
        let result = unsafe { libc::flock(file.as_raw_fd(), operation) };
        if result == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if nonblocking => return Ok(false),
            _ => return Err(error),
        }
    }
}

#[cfg(not(unix))]
fn flock(_file: &File, _kind: LockKind, _nonblocking: bool) -> io::Result<bool> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "the device-hold ticket needs flock (Unix)",
    ))
}

/// Takes the lock if it is free; Ok(false) when another open file holds it.
pub(crate) fn try_lock(file: &File, kind: LockKind) -> io::Result<bool> {
    flock(file, kind, true)
}

/// Waits for the lock (used only for the ticket counter, held for microseconds).
pub(crate) fn lock(file: &File, kind: LockKind) -> io::Result<()> {
    flock(file, kind, false).map(|_| ())
}
