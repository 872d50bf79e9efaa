//! What the `bench` CLI tests share: the binary run as a process.

use std::process::Command;

/// Runs `bench` with `args` (the kernels the machine picks): exit code, stdout, stderr.
pub fn bench(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env_remove("XDNA_VL_KERNELS")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
