//! Finding mlir-aie's tools: the compiler `aiecc.py`, the Peano (llvm-aie) C++ compiler for the
//! kernels, and a Python that imports mlir-aie's IRON API (`aie.iron`).
//!
//! - `aiecc.py` (or the native `aiecc` of newer releases): in `$MLIR_AIE_INSTALL_DIR/bin` when
//!   that variable is set, else on `PATH`;
//! - Peano: `$PEANO_INSTALL_DIR/bin/clang++` (the variable mlir-aie's own Makefiles use);
//! - Python: `$XDNA_VL_PYTHON`, else `python3` on `PATH`; it must import `aie.iron`. mlir-aie's
//!   root (for the kernels' `aie_api` headers in `<root>/include`) is `$MLIR_AIE_INSTALL_DIR`, else
//!   what `aie.utils.config.root_path()` says, as mlir-aie's Makefiles ask it.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const INSTALL_DIR_VAR: &str = "MLIR_AIE_INSTALL_DIR";
pub const PEANO_DIR_VAR: &str = "PEANO_INSTALL_DIR";
pub const PYTHON_VAR: &str = "XDNA_VL_PYTHON";
pub const AIECC: &str = "aiecc.py";
/// Newer mlir-aie releases also ship the compiler driver as a native `aiecc`.
pub const AIECC_NATIVE: &str = "aiecc";

const GUIDANCE: &str = "install mlir-aie and llvm-aie (Peano) as mlir-aie's README describes \
(https://github.com/Xilinx/mlir-aie, \"Getting Started for Linux\"), activate its environment, \
and see npu-sys/README.md \"Building the designs on a Ryzen AI machine\"";

/// The tools a build runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolchain {
    pub aiecc: PathBuf,
    pub peano: PathBuf,
    pub python: PathBuf,
    /// mlir-aie's root: `<root>/include` holds `aie_api`.
    pub mlir_aie_root: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolchainError {
    #[error(
        "mlir-aie is not installed: {AIECC} (mlir-aie's compiler) is not in {looked}; {GUIDANCE}"
    )]
    NoAiecc { looked: String },
    #[error("the Peano compiler for AIE kernels (llvm-aie) was not found: {found}; set {PEANO_DIR_VAR} to the llvm-aie install directory (the one holding bin/clang++); {GUIDANCE}")]
    NoPeano { found: String },
    #[error("mlir-aie's Python API is not importable: `{python} -c \"import aie.iron\"` failed ({message}); run npu-designs build inside mlir-aie's Python environment or set {PYTHON_VAR} to its python; {GUIDANCE}")]
    NoIron { python: String, message: String },
}

/// The environment the search reads (injectable for tests).
pub struct SearchEnv {
    pub path: Option<OsString>,
    pub install_dir: Option<OsString>,
    pub peano_dir: Option<OsString>,
    pub python: Option<OsString>,
}

impl SearchEnv {
    pub fn from_process() -> SearchEnv {
        let non_empty = |name: &str| env::var_os(name).filter(|v| !v.is_empty());
        SearchEnv {
            path: env::var_os("PATH"),
            install_dir: non_empty(INSTALL_DIR_VAR),
            peano_dir: non_empty(PEANO_DIR_VAR),
            python: non_empty(PYTHON_VAR),
        }
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn on_path(name: &str, path: Option<&OsString>) -> Option<PathBuf> {
    env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Finds every tool, refusing by name (with install guidance) the first one missing.
pub fn find_toolchain(search: &SearchEnv) -> Result<Toolchain, ToolchainError> {
    let aiecc = match &search.install_dir {
        Some(dir) => {
            let bin = PathBuf::from(dir).join("bin");
            [AIECC, AIECC_NATIVE]
                .iter()
                .map(|name| bin.join(name))
                .find(|candidate| is_executable(candidate))
                .ok_or_else(|| ToolchainError::NoAiecc {
                    looked: format!("{INSTALL_DIR_VAR}/bin ({})", bin.display()),
                })?
        }
        None => [AIECC, AIECC_NATIVE]
            .iter()
            .find_map(|name| on_path(name, search.path.as_ref()))
            .ok_or_else(|| ToolchainError::NoAiecc {
                looked: format!("PATH, and {INSTALL_DIR_VAR} is not set"),
            })?,
    };
    let peano = match &search.peano_dir {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if !is_executable(&dir.join("bin").join("clang++")) {
                return Err(ToolchainError::NoPeano {
                    found: format!("{PEANO_DIR_VAR}={} has no bin/clang++", dir.display()),
                });
            }
            dir
        }
        None => {
            return Err(ToolchainError::NoPeano {
                found: format!("{PEANO_DIR_VAR} is not set"),
            })
        }
    };
    let python = match &search.python {
        Some(p) => PathBuf::from(p),
        None => on_path("python3", search.path.as_ref()).ok_or_else(|| ToolchainError::NoIron {
            python: "python3".into(),
            message: "python3 is not on PATH".into(),
        })?,
    };
    let probe = Command::new(&python)
        .args([
            "-c",
            "import aie.iron\nfrom aie.utils.config import root_path\nprint(root_path())",
        ])
        .env("PATH", search.path.clone().unwrap_or_default())
        .output()
        .map_err(|e| ToolchainError::NoIron {
            python: python.display().to_string(),
            message: e.to_string(),
        })?;
    if !probe.status.success() {
        let stderr = String::from_utf8_lossy(&probe.stderr);
        return Err(ToolchainError::NoIron {
            python: python.display().to_string(),
            message: stderr
                .lines()
                .last()
                .unwrap_or("no message")
                .trim()
                .to_string(),
        });
    }
    let mlir_aie_root = match &search.install_dir {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(String::from_utf8_lossy(&probe.stdout).trim()),
    };
    Ok(Toolchain {
        aiecc,
        peano,
        python,
        mlir_aie_root,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> SearchEnv {
        SearchEnv {
            path: Some(OsString::new()),
            install_dir: None,
            peano_dir: None,
            python: None,
        }
    }

    fn script(path: &Path, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn each_missing_tool_is_named() {
        let err = find_toolchain(&empty()).unwrap_err().to_string();
        assert!(
            err.contains("aiecc.py") && err.contains(INSTALL_DIR_VAR),
            "{err}"
        );
        assert!(err.contains("npu-sys/README.md"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        script(&bin.join(AIECC), "exit 0");
        let mut search = empty();
        search.path = Some(bin.clone().into_os_string());
        let err = find_toolchain(&search).unwrap_err().to_string();
        assert!(
            err.contains("Peano") && err.contains("PEANO_INSTALL_DIR is not set"),
            "{err}"
        );

        let peano = dir.path().join("peano");
        script(&peano.join("bin/clang++"), "exit 0");
        search.peano_dir = Some(peano.into_os_string());
        let python = dir.path().join("python");
        script(
            &python,
            "echo 'ModuleNotFoundError: No module named aie' >&2; exit 1",
        );
        search.python = Some(python.clone().into_os_string());
        let err = find_toolchain(&search).unwrap_err().to_string();
        assert!(err.contains("No module named aie"), "{err}");

        // Control: a python that imports aie.iron completes the toolchain.
        script(&python, "echo /opt/mlir_aie");
        let found = find_toolchain(&search).unwrap();
        assert_eq!(found.aiecc, bin.join(AIECC));
        assert_eq!(found.mlir_aie_root, PathBuf::from("/opt/mlir_aie"));
    }

    #[test]
    fn a_native_aiecc_is_found_too() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        script(&bin.join(AIECC_NATIVE), "exit 0");
        let peano = dir.path().join("peano");
        script(&peano.join("bin/clang++"), "exit 0");
        let python = dir.path().join("python");
        script(&python, "echo /opt/mlir_aie");
        let search = SearchEnv {
            path: Some(bin.clone().into_os_string()),
            install_dir: None,
            peano_dir: Some(peano.into_os_string()),
            python: Some(python.into_os_string()),
        };
        assert_eq!(
            find_toolchain(&search).unwrap().aiecc,
            bin.join(AIECC_NATIVE)
        );
    }

    #[test]
    fn the_install_dir_wins_and_must_hold_aiecc() {
        let dir = tempfile::tempdir().unwrap();
        let mut search = empty();
        search.install_dir = Some(dir.path().as_os_str().to_owned());
        let err = find_toolchain(&search).unwrap_err().to_string();
        assert!(err.contains("MLIR_AIE_INSTALL_DIR/bin"), "{err}");
        // A non-executable aiecc.py is not a compiler.
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin").join(AIECC), "").unwrap();
        assert!(find_toolchain(&search).is_err());
    }
}
