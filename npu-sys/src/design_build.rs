//! `npu-designs build`: every planned geometry through mlir-aie — its parameters (JSON), the IRON
//! generator (`designs/gemm_design.py` -> `aie.mlir`), the kernel (Peano `clang++` -> `.o`) and
//! `aiecc.py` (-> xclbin + instruction stream) — into a designs directory with its manifest.
//!
//! Resuming: a design counts as built when its xclbin and instruction file exist and its
//! `<name>.params.json` equals the parameters it would be built with now (so another device or
//! tiling rebuilds it). Those are kept; the others are (re)built in `DIR/.work/<name>/`, a
//! directory wiped first, so a design interrupted halfway is redone. Outputs are renamed into
//! `DIR` only after every step succeeded, the parameters last, and the manifest is rewritten
//! (atomically) after each design: it always lists exactly the designs that are complete.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::design_params::{design_params, DesignParams};
use crate::designs::{write_manifest, Designs, DesignsError, ManifestEntry};
use crate::geometry::Geometry;
use crate::tiling::{NpuTarget, TilingError};
use crate::toolchain::{Toolchain, PEANO_DIR_VAR};

/// The design sources, embedded so that the binary builds designs wherever it runs.
pub const SOURCES: [(&str, &str); 4] = [
    ("gemm_design.py", include_str!("../designs/gemm_design.py")),
    (
        "kernels/gemm_common.h",
        include_str!("../designs/kernels/gemm_common.h"),
    ),
    (
        "kernels/gemm_i8.cc",
        include_str!("../designs/kernels/gemm_i8.cc"),
    ),
    (
        "kernels/gemm_q4.cc",
        include_str!("../designs/kernels/gemm_q4.cc"),
    ),
];

/// Where builds happen inside the designs directory.
pub const WORK_DIR: &str = ".work";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Tiling(#[from] TilingError),
    #[error("cannot write {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error(transparent)]
    Step(Box<StepFailure>),
    #[error("design {design}: {step} finished but did not write {path}")]
    MissingOutput {
        design: String,
        step: &'static str,
        path: PathBuf,
    },
    #[error("design {design}: the instruction file {path} is {len} bytes, not whole 32-bit words")]
    BadInsts {
        design: String,
        path: PathBuf,
        len: u64,
    },
    #[error(transparent)]
    Manifest(#[from] DesignsError),
}

/// A build step that failed, with the end of its log.
#[derive(Debug, thiserror::Error)]
#[error("design {design}: {step} failed ({status}): {command}\nlog {log}:\n{tail}\n(the designs built so far are kept and listed in the manifest; run the same command again to resume)", log = .log.display())]
pub struct StepFailure {
    pub design: String,
    pub step: &'static str,
    pub command: String,
    pub status: String,
    pub log: PathBuf,
    pub tail: String,
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> BuildError + '_ {
    move |e| BuildError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// What a build did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BuildReport {
    pub built: Vec<String>,
    pub kept: Vec<String>,
}

/// The parameters file kept beside a built design: its resume stamp.
pub fn params_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.params.json"))
}

/// True when `params` is already built in `dir` with exactly these parameters.
pub fn is_built(dir: &Path, params: &DesignParams) -> bool {
    let stamp_matches = fs::read_to_string(params_file(dir, &params.name))
        .map(|text| text == params.to_json())
        .unwrap_or(false);
    stamp_matches && dir.join(&params.xclbin).is_file() && dir.join(&params.insts).is_file()
}

fn manifest_entry(params: &DesignParams) -> ManifestEntry {
    ManifestEntry {
        name: params.name.clone(),
        kind: params.kind,
        m_tile: params.m_tile,
        k: params.k,
        n: params.n,
        xclbin: PathBuf::from(&params.xclbin),
        insts: PathBuf::from(&params.insts),
        kernel: params.kernel_name.clone(),
    }
}

/// The parameters of every geometry, refusing (by geometry and device) one that does not tile.
pub fn plan_params(
    geometries: &[Geometry],
    target: NpuTarget,
) -> Result<Vec<DesignParams>, TilingError> {
    geometries
        .iter()
        .map(|&g| design_params(g, target))
        .collect()
}

/// Builds every design of `all` not yet built in `out`, calling `progress` with one line per
/// design. Stops at the first failure, leaving the complete designs and a valid manifest.
pub fn build_designs(
    all: &[DesignParams],
    out: &Path,
    tools: &Toolchain,
    progress: &mut dyn FnMut(&str),
) -> Result<BuildReport, BuildError> {
    let src = out.join(WORK_DIR).join("src");
    for (name, text) in SOURCES {
        let path = src.join(name);
        fs::create_dir_all(path.parent().unwrap_or(&src)).map_err(io_error(&path))?;
        fs::write(&path, text).map_err(io_error(&path))?;
    }
    let mut done: Vec<bool> = all.iter().map(|p| is_built(out, p)).collect();
    let write_done = |done: &[bool]| {
        let entries = all
            .iter()
            .zip(done)
            .filter(|(_, d)| **d)
            .map(|(p, _)| manifest_entry(p))
            .collect();
        write_manifest(out, entries)
    };
    write_done(&done)?;
    let mut report = BuildReport::default();
    let total = all.len();
    for (i, params) in all.iter().enumerate() {
        let head = format!(
            "[{}/{total}] {} ({}: {} columns x {} rows, core tile {}x{}x{})",
            i + 1,
            params.name,
            params.device,
            params.columns,
            params.rows,
            params.m,
            params.k_tile,
            params.n_tile
        );
        if done[i] {
            progress(&format!("{head}: built before, kept"));
            report.kept.push(params.name.clone());
            continue;
        }
        progress(&format!("{head}: building"));
        let started = Instant::now();
        build_one(params, out, &src, tools)?;
        done[i] = true;
        write_done(&done)?;
        progress(&format!(
            "{head}: built in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        report.built.push(params.name.clone());
    }
    Designs::load(out)?;
    Ok(report)
}

struct Step<'a> {
    design: &'a str,
    log: &'a Path,
    cwd: &'a Path,
}

impl Step<'_> {
    /// Runs `command` in the work directory, its stderr (and stdout unless `stdout` is given)
    /// appended to the log.
    fn run(
        &self,
        step: &'static str,
        mut command: Command,
        stdout: Option<&Path>,
    ) -> Result<(), BuildError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log)
            .map_err(io_error(self.log))?;
        let shown = format!("{command:?}");
        writeln!(log, "$ {shown}").map_err(io_error(self.log))?;
        let err_log = log.try_clone().map_err(io_error(self.log))?;
        let out = match stdout {
            Some(path) => Stdio::from(File::create(path).map_err(io_error(path))?),
            None => Stdio::from(log.try_clone().map_err(io_error(self.log))?),
        };
        command
            .current_dir(self.cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::from(err_log));
        let status = command.status().map_err(|e| {
            BuildError::Step(Box::new(StepFailure {
                design: self.design.to_string(),
                step,
                command: shown.clone(),
                status: format!("could not start: {e}"),
                log: self.log.to_path_buf(),
                tail: String::new(),
            }))
        })?;
        if status.success() {
            return Ok(());
        }
        let text = fs::read_to_string(self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        Err(BuildError::Step(Box::new(StepFailure {
            design: self.design.to_string(),
            step,
            command: shown,
            status: status.to_string(),
            log: self.log.to_path_buf(),
            tail,
        })))
    }
}

fn require_file(design: &str, step: &'static str, path: &Path) -> Result<(), BuildError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(BuildError::MissingOutput {
            design: design.to_string(),
            step,
            path: path.to_path_buf(),
        })
    }
}

fn build_one(
    params: &DesignParams,
    out: &Path,
    src: &Path,
    tools: &Toolchain,
) -> Result<(), BuildError> {
    let name = params.name.as_str();
    // A stamp from an earlier build no longer vouches for files about to be replaced.
    let stamp = params_file(out, name);
    if stamp.exists() {
        fs::remove_file(&stamp).map_err(io_error(&stamp))?;
    }
    let work = out.join(WORK_DIR).join(name);
    if work.exists() {
        fs::remove_dir_all(&work).map_err(io_error(&work))?;
    }
    fs::create_dir_all(&work).map_err(io_error(&work))?;
    let params_path = work.join("params.json");
    fs::write(&params_path, params.to_json()).map_err(io_error(&params_path))?;
    let log = work.join("build.log");
    let step = Step {
        design: name,
        log: &log,
        cwd: &work,
    };

    let mlir = work.join("aie.mlir");
    let mut generator = Command::new(&tools.python);
    generator
        .arg(src.join("gemm_design.py"))
        .arg("--params")
        .arg(&params_path);
    step.run("the IRON generator", generator, Some(&mlir))?;
    require_file(name, "the IRON generator", &mlir)?;

    let mut kernel = Command::new(tools.peano.join("bin").join("clang++"));
    kernel
        .args(["-O2", "-std=c++20", "-DNDEBUG"])
        .arg(format!("--target={}", params.kernel.triple))
        .arg("-I")
        .arg(tools.mlir_aie_root.join("include"))
        .arg("-I")
        .arg(src.join("kernels"));
    for (define, value) in &params.kernel.defines {
        kernel.arg(format!("-D{define}={value}"));
    }
    kernel
        .arg("-c")
        .arg(src.join(&params.kernel.source))
        .arg("-o")
        .arg(&params.kernel.object);
    step.run("the kernel compiler (Peano clang++)", kernel, None)?;
    require_file(
        name,
        "the kernel compiler",
        &work.join(&params.kernel.object),
    )?;

    let mut aiecc = Command::new(&tools.aiecc);
    aiecc
        .env(PEANO_DIR_VAR, &tools.peano)
        .args([
            "--aie-generate-xclbin",
            "--no-compile-host",
            "--no-xchesscc",
            "--no-xbridge",
        ])
        .arg(format!("--xclbin-name={}", params.xclbin))
        .arg(format!("--xclbin-kernel-name={}", params.kernel_name))
        .arg("--peano")
        .arg(&tools.peano)
        .arg("--aie-generate-npu-insts")
        .arg(format!("--npu-insts-name={}", params.insts))
        .arg("aie.mlir");
    step.run("aiecc.py", aiecc, None)?;
    let (xclbin, insts) = (work.join(&params.xclbin), work.join(&params.insts));
    require_file(name, "aiecc.py", &xclbin)?;
    require_file(name, "aiecc.py", &insts)?;
    let len = fs::metadata(&insts).map_err(io_error(&insts))?.len();
    if len == 0 || len % 4 != 0 {
        return Err(BuildError::BadInsts {
            design: name.to_string(),
            path: insts,
            len,
        });
    }

    // Outputs first, the parameters (the resume stamp) last.
    for (from, to) in [
        (&xclbin, out.join(&params.xclbin)),
        (&insts, out.join(&params.insts)),
    ] {
        fs::rename(from, &to).map_err(io_error(&to))?;
    }
    let partial = work.join("params.stamp");
    fs::write(&partial, params.to_json()).map_err(io_error(&partial))?;
    fs::rename(&partial, &stamp).map_err(io_error(&stamp))?;
    fs::remove_dir_all(&work).map_err(io_error(&work))?;
    Ok(())
}
