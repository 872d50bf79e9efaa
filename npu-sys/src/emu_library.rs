//! Where the software NPU (`libnpu_emu.so`) is, for the tests and tools that run the device path
//! without an NPU: `NPU_EMU_LIB` if set, else next to the running binary — a test binary in
//! `target/<profile>/deps` finds the one its npu-emu dev-dependency built there, or the one
//! `cargo build -p npu-emu` put in `target/<profile>/`.

use std::path::PathBuf;

/// The library's file name.
pub const EMU_LIBRARY: &str = "libnpu_emu.so";

/// The software NPU library, or what was looked at and how to build it.
pub fn emu_library() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("NPU_EMU_LIB") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| format!("the running binary's path: {e}"))?;
    let dir = exe.parent().ok_or("the running binary has no directory")?;
    let candidates = [
        dir.join(EMU_LIBRARY),
        dir.parent().unwrap_or(dir).join(EMU_LIBRARY),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "the software NPU library is not built (looked at {candidates:?}); run \
             `cargo build -p npu-emu` or set NPU_EMU_LIB"
            )
        })
}
