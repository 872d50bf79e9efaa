//! `npu-designs build` without mlir-aie (refused by name) and with a fake mlir-aie toolchain:
//! shell scripts standing in for `aiecc.py`, Peano's `clang++` and mlir-aie's Python, which write
//! dummy outputs and log what they were asked to build. The real toolchain and the generated
//! designs are checked only on a Ryzen AI machine (npu-sys/README.md).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use npu_sys::designs::{Designs, MANIFEST_FILE};
use npu_sys::plan::plan_pack;
use packs::{write_random, Pack, QuantKind, RandomShape};

const NPU_DESIGNS: &str = env!("CARGO_BIN_EXE_npu-designs");

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn script(path: &Path, body: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A fake mlir-aie: every tool appends a line to `log` ("<tool> <design>").
struct FakeToolchain {
    bin: PathBuf,
    peano: PathBuf,
    python: PathBuf,
    log: PathBuf,
}

impl FakeToolchain {
    fn new(dir: &Path) -> FakeToolchain {
        let bin = dir.join("bin");
        let peano = dir.join("peano");
        let python = dir.join("python");
        let log = dir.join("tools.log");
        script(
            &bin.join("aiecc.py"),
            r#"xclbin=; insts=
for a in "$@"; do
  case "$a" in
    --xclbin-name=*) xclbin="${a#--xclbin-name=}";;
    --npu-insts-name=*) insts="${a#--npu-insts-name=}";;
  esac
done
design=$(basename "$PWD")
[ -s aie.mlir ] || { echo "fake aiecc: no aie.mlir" >&2; exit 1; }
ls *.o >/dev/null 2>&1 || { echo "fake aiecc: no kernel object" >&2; exit 1; }
echo "fake xclbin of $design" > "$xclbin"
if [ "$design" = "$FAKE_AIECC_FAIL" ]; then echo "fake aiecc: planted failure in $design" >&2; exit 1; fi
printf 'ABCDEFGH' > "$insts"
echo "aiecc $design" >> "$FAKE_TOOLS_LOG""#,
        );
        script(
            &peano.join("bin/clang++"),
            r#"out=; target=; prev=
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  case "$a" in --target=*) target="${a#--target=}";; esac
  prev="$a"
done
echo "kernel $(basename "$PWD") $target" >> "$FAKE_TOOLS_LOG"
echo object > "$out""#,
        );
        script(
            &python,
            r#"if [ "$1" = "-c" ]; then echo /opt/fake-mlir-aie; exit 0; fi
[ "$2" = "--params" ] && grep -q '"format": "xdna-vl-design-params"' "$3" || { echo "fake python: bad arguments $*" >&2; exit 1; }
[ -s "$1" ] || { echo "fake python: no generator at $1" >&2; exit 1; }
echo "generate $(basename "$PWD")" >> "$FAKE_TOOLS_LOG"
echo "module { }""#,
        );
        FakeToolchain {
            bin,
            peano,
            python,
            log,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(NPU_DESIGNS);
        command
            .args(args)
            .env("PATH", format!("{}:/usr/bin:/bin", self.bin.display()))
            .env_remove("MLIR_AIE_INSTALL_DIR")
            .env("PEANO_INSTALL_DIR", &self.peano)
            .env("XDNA_VL_PYTHON", &self.python)
            .env("FAKE_TOOLS_LOG", &self.log)
            .env_remove("FAKE_AIECC_FAIL");
        command
    }

    /// The designs aiecc.py completed, in order.
    fn compiled(&self) -> Vec<String> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("aiecc "))
            .map(String::from)
            .collect()
    }

    fn log_lines(&self, prefix: &str) -> Vec<String> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect()
    }
}

fn tiny_q4_pack(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-q4.pack");
    write_random(&RandomShape::tiny(), QuantKind::Q4, 5, &path).unwrap();
    path
}

fn design_names(pack: &Path) -> Vec<String> {
    let plan = plan_pack(&Pack::open(pack).unwrap()).unwrap();
    plan.geometries().iter().map(|g| g.file_stem()).collect()
}

fn manifest_names(dir: &Path) -> Vec<String> {
    Designs::load(dir)
        .unwrap()
        .entries()
        .iter()
        .map(|e| e.name.clone())
        .collect()
}

#[test]
fn without_mlir_aie_the_build_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny_q4_pack(dir.path());
    let out = dir.path().join("designs");
    let empty = dir.path().join("empty-bin");
    fs::create_dir_all(&empty).unwrap();
    let result = Command::new(NPU_DESIGNS)
        .args(["build", pack.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .args(["--device", "npu2"])
        .env("PATH", &empty)
        .env_remove("MLIR_AIE_INSTALL_DIR")
        .env_remove("PEANO_INSTALL_DIR")
        .env_remove("XDNA_VL_PYTHON")
        .output()
        .unwrap();
    let message = text(&result);
    assert_eq!(result.status.code(), Some(2), "{message}");
    assert!(message.contains("mlir-aie is not installed"), "{message}");
    assert!(message.contains("aiecc.py"), "{message}");
    assert!(message.contains("MLIR_AIE_INSTALL_DIR"), "{message}");
    assert!(message.contains("npu-sys/README.md"), "{message}");
    assert!(!out.join(MANIFEST_FILE).exists(), "nothing is written");

    // With aiecc.py but no Peano, Peano is named.
    let fake = FakeToolchain::new(dir.path());
    let result = fake
        .command(&["build", pack.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .args(["--device", "npu2"])
        .env_remove("PEANO_INSTALL_DIR")
        .output()
        .unwrap();
    assert_eq!(result.status.code(), Some(2));
    assert!(
        text(&result).contains("PEANO_INSTALL_DIR is not set"),
        "{}",
        text(&result)
    );
}

#[test]
fn a_fake_toolchain_builds_every_design_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny_q4_pack(dir.path());
    let names = design_names(&pack);
    assert_eq!(names.len(), 10);
    let fake = FakeToolchain::new(dir.path());
    let out = dir.path().join("designs");
    let args = [
        "build",
        pack.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--device",
        "npu2",
    ];

    let first = fake.command(&args).output().unwrap();
    let report = text(&first);
    assert!(first.status.success(), "{report}");
    assert!(
        report.contains("[1/10]") && report.contains("[10/10]"),
        "{report}"
    );
    assert!(report.contains("10 built, 0 kept"), "{report}");
    assert_eq!(
        fake.compiled(),
        names,
        "every design compiled once, in plan order"
    );
    assert_eq!(manifest_names(&out), names);
    for name in &names {
        let params = fs::read_to_string(out.join(format!("{name}.params.json"))).unwrap();
        assert!(params.contains("\"device\": \"npu2\""), "{name}");
        assert!(
            !out.join(".work").join(name).exists(),
            "work dir of {name} removed"
        );
    }
    // npu2 kernels are compiled for AIE2P.
    let kernels = fake.log_lines("kernel ");
    assert_eq!(kernels.len(), 10);
    assert!(
        kernels
            .iter()
            .all(|l| l.ends_with("aie2p-none-unknown-elf")),
        "{kernels:?}"
    );
    // The designs directory covers the pack.
    let check = Command::new(NPU_DESIGNS)
        .args([
            "check",
            out.to_str().unwrap(),
            "--pack",
            pack.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check));

    // Second run: nothing to build.
    let second = fake.command(&args).output().unwrap();
    let report = text(&second);
    assert!(second.status.success(), "{report}");
    assert!(report.contains("0 built, 10 kept"), "{report}");
    assert!(report.contains("built before, kept"), "{report}");
    assert_eq!(fake.compiled().len(), 10, "no design compiled again");

    // Control: another device changes the parameters, so every design is rebuilt.
    let npu1 = [&args[..5], &["npu1"]].concat();
    let third = fake.command(&npu1).output().unwrap();
    assert!(third.status.success(), "{}", text(&third));
    assert!(
        text(&third).contains("10 built, 0 kept"),
        "{}",
        text(&third)
    );
    assert_eq!(fake.compiled().len(), 20);
    let kernels = fake.log_lines("kernel ");
    assert!(
        kernels[10..]
            .iter()
            .all(|l| l.ends_with(" aie2-none-unknown-elf")),
        "{kernels:?}"
    );
}

#[test]
fn an_interrupted_build_keeps_what_was_built_and_a_valid_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny_q4_pack(dir.path());
    let names = design_names(&pack);
    let fake = FakeToolchain::new(dir.path());
    let out = dir.path().join("designs");
    let args = [
        "build",
        pack.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--device",
        "npu1",
    ];
    let failing = &names[3];
    let result = fake
        .command(&args)
        .env("FAKE_AIECC_FAIL", failing)
        .output()
        .unwrap();
    let message = text(&result);
    assert_eq!(result.status.code(), Some(2), "{message}");
    assert!(
        message.contains(&format!("design {failing}: aiecc.py failed")),
        "{message}"
    );
    assert!(
        message.contains("planted failure"),
        "the log tail is shown: {message}"
    );
    assert!(
        message.contains("run the same command again to resume"),
        "{message}"
    );
    // The three designs before it are complete and listed; the failed one is not, and its
    // partial xclbin stayed in its work directory.
    assert_eq!(manifest_names(&out), names[..3]);
    assert!(!out.join(format!("{failing}.xclbin")).exists());
    assert!(out
        .join(".work")
        .join(failing)
        .join(format!("{failing}.xclbin"))
        .exists());
    assert!(!out.join(format!("{MANIFEST_FILE}.partial")).exists());

    // Resume: the three are kept, the failed one is redone, the rest built.
    let resumed = fake.command(&args).output().unwrap();
    let report = text(&resumed);
    assert!(resumed.status.success(), "{report}");
    assert!(report.contains("7 built, 3 kept"), "{report}");
    assert_eq!(fake.compiled(), names, "each design completed exactly once");
    assert_eq!(manifest_names(&out), names);
}

#[test]
fn a_stale_design_without_its_stamp_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny_q4_pack(dir.path());
    let names = design_names(&pack);
    let fake = FakeToolchain::new(dir.path());
    let out = dir.path().join("designs");
    let args = [
        "build",
        pack.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--device",
        "npu2",
    ];
    assert!(fake.command(&args).output().unwrap().status.success());
    // A design whose files are there but whose parameters were lost (as if interrupted
    // between its outputs and its stamp) is not trusted.
    fs::remove_file(out.join(format!("{}.params.json", names[5]))).unwrap();
    let again = fake.command(&args).output().unwrap();
    assert!(text(&again).contains("1 built, 9 kept"), "{}", text(&again));
    assert_eq!(fake.compiled().last(), Some(&names[5]));
}

#[test]
fn a_bad_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pack = tiny_q4_pack(dir.path());
    let fake = FakeToolchain::new(dir.path());
    let out = dir.path().join("designs");
    let result = fake
        .command(&["build", pack.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .args(["--device", "npu3"])
        .output()
        .unwrap();
    assert_eq!(result.status.code(), Some(2));
    assert!(text(&result).contains("--device npu3"), "{}", text(&result));
}
