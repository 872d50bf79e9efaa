//! npu-designs: which GEMM designs a pack needs, a software-NPU designs directory for it, and
//! checks of a designs directory (its manifest, its coverage of a pack, its arithmetic on a device).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use npu_sys::design_build::{build_designs, plan_params};
use npu_sys::designs::{write_emu_designs, Designs};
use npu_sys::detect::find_npus;
use npu_sys::plan::{plan_pack, Plan};
use npu_sys::tiling::NpuTarget;
use npu_sys::toolchain::{find_toolchain, SearchEnv};
use npu_sys::verify::{verify_design, GemmCase};
use npu_sys::NpuSession;
use packs::Pack;

#[derive(Parser)]
#[command(
    name = "npu-designs",
    about = "GEMM designs for the NPU: plan, build with mlir-aie, software stubs, checks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the design geometries PACK needs (kind, K, N, M tiles, roles): what to build with mlir-aie.
    Plan {
        pack: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Build every design PACK needs with mlir-aie (IRON generator, Peano, aiecc.py) into DIR.
    /// Resumes: designs already built with the same parameters are kept.
    Build {
        pack: PathBuf,
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
        /// npu1 (XDNA: Phoenix, Hawk Point; 4 columns) or npu2 (XDNA2: Strix, Krackan, Strix
        /// Halo; 8 columns). Default: the NPU of this machine.
        #[arg(long)]
        device: Option<String>,
    },
    /// Write the parameters of every design PACK needs (what `build` gives the IRON generator)
    /// as DIR/<name>.params.json, without building anything.
    Params {
        pack: PathBuf,
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
        /// npu1 or npu2.
        #[arg(long)]
        device: String,
    },
    /// Write a designs directory for the software NPU covering PACK (manifest + stub files).
    Emu {
        pack: PathBuf,
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Validate DIR's manifest; with --pack, refuse if a geometry the pack needs is missing.
    Check {
        dir: PathBuf,
        #[arg(long)]
        pack: Option<PathBuf>,
    },
    /// Run every design of DIR once on random data and compare with the pack's scalar oracle.
    /// Takes the device-hold ticket first (a hardware runtime only).
    Verify {
        dir: PathBuf,
        /// The runtime library (else XDNA_VL_RUNTIME, else the installed libxdna_vl_xrt.so).
        #[arg(long)]
        runtime: Option<PathBuf>,
        /// Activation rows per launch (at most the design's M tile; default: the whole tile).
        #[arg(long)]
        rows: Option<usize>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn plan_of(pack: &Path) -> Result<Plan, String> {
    let pack = Pack::open(pack).map_err(|e| e.to_string())?;
    plan_pack(&pack).map_err(|e| e.to_string())
}

fn parse_device(name: &str) -> Result<NpuTarget, String> {
    NpuTarget::parse(name).ok_or_else(|| {
        format!("--device {name}: expected npu1 (XDNA, 4 columns) or npu2 (XDNA2, 8 columns)")
    })
}

/// The design target of this machine's NPU, or a refusal asking for --device.
fn detected_target() -> Result<NpuTarget, String> {
    let why = match find_npus() {
        Ok(nodes) => match nodes.iter().find_map(|n| n.target()) {
            Some(target) => return Ok(target),
            None => format!(
                "found {} but not its generation",
                nodes
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        Err(e) => e.to_string(),
    };
    Err(format!(
        "no --device given and this machine's NPU generation is unknown ({why}); pass --device npu1 (XDNA: Phoenix, Hawk Point) or --device npu2 (XDNA2: Strix, Krackan, Strix Halo)"
    ))
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.command {
        Command::Plan { pack, json } => {
            let plan = plan_of(&pack)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&plan).map_err(|e| e.to_string())?
                );
            } else {
                println!("{plan}");
            }
        }
        Command::Build { pack, out, device } => {
            let plan = plan_of(&pack)?;
            let tools = find_toolchain(&SearchEnv::from_process()).map_err(|e| e.to_string())?;
            let target = match device {
                Some(name) => parse_device(&name)?,
                None => detected_target()?,
            };
            let all = plan_params(&plan.geometries(), target).map_err(|e| e.to_string())?;
            println!(
                "building {} designs for {} into {} (aiecc {}, Peano {}, python {})",
                all.len(),
                target.as_str(),
                out.display(),
                tools.aiecc.display(),
                tools.peano.display(),
                tools.python.display()
            );
            let report = build_designs(&all, &out, &tools, &mut |line| println!("{line}"))
                .map_err(|e| e.to_string())?;
            println!(
                "{} built, {} kept; manifest {}",
                report.built.len(),
                report.kept.len(),
                out.join(npu_sys::designs::MANIFEST_FILE).display()
            );
        }
        Command::Params { pack, out, device } => {
            let plan = plan_of(&pack)?;
            let target = parse_device(&device)?;
            let all = plan_params(&plan.geometries(), target).map_err(|e| e.to_string())?;
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            for params in &all {
                let path = npu_sys::design_build::params_file(&out, &params.name);
                std::fs::write(&path, params.to_json())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            println!("wrote {} design parameters to {}", all.len(), out.display());
        }
        Command::Emu { pack, out } => {
            let plan = plan_of(&pack)?;
            let designs = write_emu_designs(&out, &plan.geometries()).map_err(|e| e.to_string())?;
            println!(
                "wrote {} software NPU designs to {}",
                designs.entries().len(),
                designs.manifest_path().display()
            );
        }
        Command::Check { dir, pack } => {
            let designs = Designs::load(&dir).map_err(|e| e.to_string())?;
            for entry in designs.entries() {
                println!(
                    "{:<28} {}  kernel {}",
                    entry.name, entry.geometry, entry.kernel
                );
            }
            if let Some(pack) = pack {
                let plan = plan_of(&pack)?;
                let missing: Vec<String> = plan
                    .geometries()
                    .into_iter()
                    .filter_map(|g| designs.find(g.kind, g.k, g.n, g.m_tile).err())
                    .map(|e| e.to_string())
                    .collect();
                if !missing.is_empty() {
                    return Err(missing.join("\n"));
                }
                println!("covers every geometry of {}", pack.display());
            }
        }
        Command::Verify {
            dir,
            runtime,
            rows,
            seed,
        } => {
            let designs = Designs::load(&dir).map_err(|e| e.to_string())?;
            let purpose = format!("verify {}", dir.display());
            let session = NpuSession::open(runtime.as_deref(), "npu-designs verify", &purpose)
                .map_err(|e| e.to_string())?;
            let device = session.device();
            let info = device.info();
            println!(
                "device {} ({}, {} columns), runtime {}",
                info.name,
                info.firmware,
                info.columns,
                session.runtime().path().display()
            );
            let mut failed = 0;
            for entry in designs.entries() {
                let g = entry.geometry;
                let case_rows = rows.unwrap_or(g.m_tile).clamp(1, g.m_tile);
                let case = GemmCase::random(g.kind, case_rows, g.k, g.n, seed);
                let report =
                    verify_design(device, entry, &case, None).map_err(|e| e.to_string())?;
                let verdict = if report.byte_identical() {
                    "byte-identical"
                } else {
                    failed += 1;
                    "DIFFERS"
                };
                println!(
                    "{:<28} {verdict}: {}/{} identical, max |diff| {:e}",
                    entry.name, report.identical, report.elements, report.max_abs_diff
                );
            }
            if failed > 0 {
                return Err(format!("{failed} designs differ from the oracle"));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
