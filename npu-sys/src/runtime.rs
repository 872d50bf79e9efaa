//! Finding and opening an NPU runtime library (the C ABI of `include/xdna_vl_runtime.h`).

use std::ffi::{c_int, CStr};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::Library;

use crate::abi;

/// The environment variable naming the runtime library when no explicit path is given.
pub const RUNTIME_ENV: &str = "XDNA_VL_RUNTIME";

/// Where the installed XRT shim is looked for, in order.
pub const LIBRARY_DIRS: [&str; 4] = [
    "/opt/xilinx/xrt/lib",
    "/usr/local/lib",
    "/usr/lib",
    "/usr/lib/x86_64-linux-gnu",
];

/// How the runtime's path was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeSource {
    /// Passed explicitly (a CLI's `--runtime`).
    Explicit,
    /// From `XDNA_VL_RUNTIME`.
    Environment,
    /// The installed shim found in a library directory.
    Installed,
}

impl fmt::Display for RuntimeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuntimeSource::Explicit => "--runtime",
            RuntimeSource::Environment => RUNTIME_ENV,
            RuntimeSource::Installed => "the installed runtime",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "no NPU runtime: pass --runtime PATH or set {RUNTIME_ENV} (the software NPU is libnpu_emu.so); \
         looked for {name} in {tried}",
        name = abi::XRT_RUNTIME_NAME,
        tried = display_paths(.tried)
    )]
    NotFound { tried: Vec<PathBuf> },
    #[error("NPU runtime {path} (from {source_of}) does not exist")]
    Missing {
        path: PathBuf,
        source_of: RuntimeSource,
    },
    #[error("cannot load NPU runtime {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("NPU runtime {path} lacks the symbol `{symbol}` of the xdna-vl runtime ABI")]
    MissingSymbol { path: PathBuf, symbol: String },
    #[error(
        "NPU runtime {path} implements ABI version {found}, this build of npu-sys needs version {expected}"
    )]
    AbiMismatch {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An opened runtime library. Cheap to clone; devices opened from it keep it loaded.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

pub(crate) struct RuntimeInner {
    pub(crate) fns: abi::Functions,
    path: PathBuf,
    source: RuntimeSource,
    flags: u32,
    // Declared last: the function pointers above point into it, so it must outlive every use.
    _library: Library,
}

/// A failed runtime call: which call, its code, and the runtime's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed ({code} {}): {message}", abi::code_name(*.code))]
pub struct CallError {
    pub call: &'static str,
    pub code: i32,
    pub message: String,
}

impl RuntimeInner {
    /// The runtime's text for the last failure on this thread.
    pub(crate) fn last_error(&self) -> String {
        // SAFETY: the symbol was resolved from the loaded library with the ABI's signature; it
        // takes no arguments and returns NULL or a NUL-terminated string valid until the next call
        // on this thread, which we copy before making another call.
        unsafe {
            let text = (self.fns.last_error)();
            if text.is_null() {
                String::new()
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        }
    }

    /// Turns a return code into a result, fetching the runtime's text on failure.
    pub(crate) fn check(&self, call: &'static str, code: c_int) -> Result<(), CallError> {
        if code == abi::OK {
            Ok(())
        } else {
            let mut message = self.last_error();
            if message.is_empty() {
                message = "(the runtime gave no message)".to_string();
            }
            Err(CallError {
                call,
                code,
                message,
            })
        }
    }
}

impl Runtime {
    /// Chooses the runtime path: `explicit` (a CLI's `--runtime`), else `XDNA_VL_RUNTIME`, else the
    /// installed shim in the usual library directories.
    pub fn locate(explicit: Option<&Path>) -> Result<(PathBuf, RuntimeSource), RuntimeError> {
        let env = std::env::var_os(RUNTIME_ENV).filter(|v| !v.is_empty());
        locate_in(
            explicit,
            env.as_deref().map(Path::new),
            &LIBRARY_DIRS.map(PathBuf::from),
        )
    }

    /// Locates and opens the runtime, resolving and checking every symbol of the ABI.
    pub fn open(explicit: Option<&Path>) -> Result<Runtime, RuntimeError> {
        let (path, source) = Runtime::locate(explicit)?;
        Runtime::open_path(&path, source)
    }

    /// Opens the runtime at `path` (no search).
    pub fn open_path(path: &Path, source: RuntimeSource) -> Result<Runtime, RuntimeError> {
        if !path.exists() {
            return Err(RuntimeError::Missing {
                path: path.to_path_buf(),
                source_of: source,
            });
        }
        // SAFETY: loading a library runs its initialisers. The libraries this loads are runtimes
        // of this project's ABI (the XRT shim or the software NPU), chosen by the user.
        let library = unsafe { Library::new(path) }.map_err(|e| RuntimeError::Load {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;

        macro_rules! resolve {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the symbol's type is the signature the ABI header declares for this
                // name; the copied function pointer is used only while `library` stays loaded
                // (it is stored next to it in RuntimeInner).
                let symbol = unsafe { library.get::<$ty>(concat!($name, "\0").as_bytes()) };
                match symbol {
                    Ok(symbol) => *symbol,
                    Err(_) => {
                        return Err(RuntimeError::MissingSymbol {
                            path: path.to_path_buf(),
                            symbol: $name.to_string(),
                        })
                    }
                }
            }};
        }

        // The version first: a runtime of another version may have other symbols.
        let abi_version = resolve!("xdna_vl_abi_version", abi::AbiVersionFn);
        // SAFETY: resolved above with the ABI's signature; takes nothing, returns a u32.
        let found = unsafe { abi_version() };
        if found != abi::ABI_VERSION {
            return Err(RuntimeError::AbiMismatch {
                path: path.to_path_buf(),
                found,
                expected: abi::ABI_VERSION,
            });
        }
        let fns = abi::Functions {
            runtime_flags: resolve!("xdna_vl_runtime_flags", abi::RuntimeFlagsFn),
            last_error: resolve!("xdna_vl_last_error", abi::LastErrorFn),
            device_open: resolve!("xdna_vl_device_open", abi::DeviceOpenFn),
            device_close: resolve!("xdna_vl_device_close", abi::DeviceCloseFn),
            design_load: resolve!("xdna_vl_design_load", abi::DesignLoadFn),
            design_unload: resolve!("xdna_vl_design_unload", abi::DesignUnloadFn),
            buffer_alloc: resolve!("xdna_vl_buffer_alloc", abi::BufferAllocFn),
            buffer_map: resolve!("xdna_vl_buffer_map", abi::BufferMapFn),
            buffer_sync: resolve!("xdna_vl_buffer_sync", abi::BufferSyncFn),
            buffer_free: resolve!("xdna_vl_buffer_free", abi::BufferFreeFn),
            run_start: resolve!("xdna_vl_run_start", abi::RunStartFn),
            run_wait: resolve!("xdna_vl_run_wait", abi::RunWaitFn),
            run_free: resolve!("xdna_vl_run_free", abi::RunFreeFn),
        };
        // SAFETY: resolved above with the ABI's signature; takes nothing, returns a u32.
        let flags = unsafe { (fns.runtime_flags)() };
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                fns,
                path: path.to_path_buf(),
                source,
                flags,
                _library: library,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn source(&self) -> &RuntimeSource {
        &self.inner.source
    }

    /// The runtime's ABI version (equal to this crate's, or it would not have opened).
    pub fn abi_version(&self) -> u32 {
        abi::ABI_VERSION
    }

    /// A software NPU (computes on the CPU; needs no device node).
    pub fn is_software(&self) -> bool {
        self.inner.flags & abi::RUNTIME_SOFTWARE != 0
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("path", &self.inner.path)
            .field("source", &self.inner.source)
            .field("software", &self.is_software())
            .finish()
    }
}

/// The search of [`Runtime::locate`], with the environment value and directories given.
pub fn locate_in(
    explicit: Option<&Path>,
    env_value: Option<&Path>,
    library_dirs: &[PathBuf],
) -> Result<(PathBuf, RuntimeSource), RuntimeError> {
    if let Some(path) = explicit {
        return Ok((path.to_path_buf(), RuntimeSource::Explicit));
    }
    if let Some(path) = env_value {
        return Ok((path.to_path_buf(), RuntimeSource::Environment));
    }
    let tried: Vec<PathBuf> = library_dirs
        .iter()
        .map(|d| d.join(abi::XRT_RUNTIME_NAME))
        .collect();
    match tried.iter().find(|p| p.is_file()) {
        Some(found) => Ok((found.clone(), RuntimeSource::Installed)),
        None => Err(RuntimeError::NotFound { tried }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_then_environment_then_installed() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        let installed = dir.path().join("lib");
        std::fs::create_dir_all(&installed).unwrap();
        std::fs::write(installed.join(abi::XRT_RUNTIME_NAME), b"").unwrap();
        let dirs = vec![empty.clone(), installed.clone()];
        let explicit = Path::new("/x/explicit.so");
        let env = Path::new("/x/env.so");

        let (path, source) = locate_in(Some(explicit), Some(env), &dirs).unwrap();
        assert_eq!(
            (path.as_path(), source),
            (explicit, RuntimeSource::Explicit)
        );
        let (path, source) = locate_in(None, Some(env), &dirs).unwrap();
        assert_eq!((path.as_path(), source), (env, RuntimeSource::Environment));
        let (path, source) = locate_in(None, None, &dirs).unwrap();
        assert_eq!(path, installed.join(abi::XRT_RUNTIME_NAME));
        assert_eq!(source, RuntimeSource::Installed);

        let err = locate_in(None, None, std::slice::from_ref(&empty))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(RUNTIME_ENV) && err.contains("--runtime"),
            "{err}"
        );
        assert!(
            err.contains(&empty.join(abi::XRT_RUNTIME_NAME).display().to_string()),
            "{err}"
        );
    }
}
