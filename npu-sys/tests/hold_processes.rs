//! The device-hold ticket with real processes (`npu-hold`): FIFO order of waiters, release when
//! the holder is killed, a timeout naming the holder, and a program under `npu-hold run` using
//! its parent's lease instead of waiting for it.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use npu_sys::hold;

const NPU_HOLD: &str = env!("CARGO_BIN_EXE_npu-hold");

/// Polls `condition` until it holds; panics naming `what` after a generous deadline (this bounds
/// a hang, it does not time anything).
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn npu_hold(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(NPU_HOLD);
    command
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.env_remove(hold::INHERITED_ENV);
    command
}

/// A holder that keeps the lease until the file `release` appears in `dir`.
fn spawn_holder(dir: &Path, purpose: &str) -> Child {
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.02; done",
        dir.join("release").display()
    );
    npu_hold(
        dir,
        &["run", "--purpose", purpose, "--", "sh", "-c", &script],
    )
    .spawn()
    .unwrap()
}

fn holder_pid(dir: &Path) -> Option<u32> {
    hold::status(Some(dir)).unwrap().holder.map(|h| h.pid)
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn three_waiters_get_the_lease_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let holder = spawn_holder(dir.path(), "first");
    let holder_id = holder.id();
    wait_until("the holder holds", || {
        holder_pid(dir.path()) == Some(holder_id)
    });
    let order = dir.path().join("order");
    let mut waiters = Vec::new();
    // Later arrivals look more often (poll 150, 20, 2 ms): without FIFO order the most eager
    // would win; with it, arrival order does.
    for (i, (name, poll_ms)) in [("w1", "150"), ("w2", "20"), ("w3", "2")]
        .into_iter()
        .enumerate()
    {
        let script = format!("echo {name} >> '{}'; sleep 0.05", order.display());
        let waiter = npu_hold(
            dir.path(),
            &["run", "--purpose", name, "--", "sh", "-c", &script],
        )
        .env(hold::POLL_MS_ENV, poll_ms)
        .spawn()
        .unwrap();
        // Each arrives only after the previous one is queued, so arrival order is known.
        wait_until(&format!("{name} queued"), || {
            hold::status(Some(dir.path())).unwrap().waiting.len() == i + 1
        });
        waiters.push(waiter);
    }
    let queued: Vec<String> = hold::status(Some(dir.path()))
        .unwrap()
        .waiting
        .into_iter()
        .map(|w| w.purpose)
        .collect();
    assert_eq!(queued, ["w1", "w2", "w3"]);
    std::fs::write(dir.path().join("release"), b"").unwrap();
    let holder_out = holder.wait_with_output().unwrap();
    assert!(holder_out.status.success());
    assert!(
        stderr_of(&holder_out).contains("released the NPU after"),
        "{}",
        stderr_of(&holder_out)
    );
    let mut first_waiter_stderr = String::new();
    for (i, waiter) in waiters.into_iter().enumerate() {
        let out = waiter.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr_of(&out));
        if i == 0 {
            first_waiter_stderr = stderr_of(&out);
        }
    }
    assert_eq!(std::fs::read_to_string(&order).unwrap(), "w1\nw2\nw3\n");
    // Waiting said who held the lease.
    let said = format!(
        "waiting for the NPU: held by pid {holder_id} (npu-hold run sh, purpose \"first\") for"
    );
    assert!(first_waiter_stderr.contains(&said), "{first_waiter_stderr}");
}

#[test]
fn a_holder_killed_with_sigkill_releases_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let child_pid = dir.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 30", child_pid.display());
    let mut holder = npu_hold(
        dir.path(),
        &["run", "--purpose", "doomed", "--", "sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    wait_until("the holder holds", || {
        holder_pid(dir.path()) == Some(holder.id()) && child_pid.exists()
    });
    let waiter = npu_hold(
        dir.path(),
        &["run", "--timeout", "20", "--purpose", "next", "--", "true"],
    )
    .spawn()
    .unwrap();
    wait_until("the waiter queued", || {
        hold::status(Some(dir.path())).unwrap().waiting.len() == 1
    });

    holder.kill().unwrap(); // SIGKILL: no destructor, no cleanup
    holder.wait().unwrap();
    let killed_at = Instant::now();
    let out = waiter.wait_with_output().unwrap();
    let released_after = killed_at.elapsed();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        released_after < Duration::from_secs(1),
        "the waiter got the lease {released_after:?} after the kill"
    );
    assert!(!hold::status(Some(dir.path())).unwrap().held);

    // The killed holder's command outlives it; end it (it never held the lease's descriptor).
    let pid = std::fs::read_to_string(&child_pid).unwrap();
    let _ = Command::new("kill").arg(pid.trim()).status();
}

#[test]
fn a_timeout_names_the_holder_and_how_long_it_has_held() {
    let dir = tempfile::tempdir().unwrap();
    let holder = spawn_holder(dir.path(), "long job");
    wait_until("the holder holds", || {
        holder_pid(dir.path()) == Some(holder.id())
    });
    let out = npu_hold(dir.path(), &["run", "--timeout", "0.3", "--", "true"])
        .output()
        .unwrap();
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error: timed out after"), "{stderr}");
    assert!(
        stderr.contains(&format!("held by pid {}", holder.id())),
        "{stderr}"
    );
    assert!(stderr.contains("purpose \"long job\") for"), "{stderr}");
    // The timed-out waiter left the queue.
    assert!(hold::status(Some(dir.path())).unwrap().waiting.is_empty());

    let status = npu_hold(dir.path(), &["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("held by pid {}", holder.id())) && text.contains("long job"),
        "{text}"
    );
    std::fs::write(dir.path().join("release"), b"").unwrap();
    holder.wait_with_output().unwrap();
    let status = npu_hold(dir.path(), &["status"]).output().unwrap();
    assert!(String::from_utf8_lossy(&status.stdout).contains("free"));
}

#[test]
fn a_program_under_npu_hold_run_uses_its_parents_lease_and_exit_codes_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    // npu-hold inside npu-hold: the inner one must not wait for the outer one.
    let out = npu_hold(
        dir.path(),
        &[
            "run",
            "--timeout",
            "5",
            "--",
            NPU_HOLD,
            "--dir",
            dir_arg,
            "run",
            "--timeout",
            "1",
            "--",
            "sh",
            "-c",
            "exit 7",
        ],
    )
    .output()
    .unwrap();
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("using the lease of pid"), "{stderr}");
    // Control: without the inherited marker, a second holder does wait (and here times out).
    let holder = spawn_holder(dir.path(), "outer");
    wait_until("the holder holds", || {
        holder_pid(dir.path()) == Some(holder.id())
    });
    let out = npu_hold(dir.path(), &["run", "--timeout", "0.2", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    std::fs::write(dir.path().join("release"), b"").unwrap();
    holder.wait_with_output().unwrap();
}
