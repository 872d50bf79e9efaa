//! Shared by the C ABI tests: where cargo put libxdna_vl, compiling the C programs against it, and
//! the rendered pkg-config file.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// forward-capi/.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn include_dir() -> PathBuf {
    crate_dir().join("include")
}

pub fn c_source(name: &str) -> PathBuf {
    crate_dir().join("tests/c").join(name)
}

/// The directory holding libxdna_vl.so and libxdna_vl.a of this test's profile. `cargo test` builds
/// the crate's library (all its crate types, cdylib and staticlib included) before linking this test
/// executable, into the same `deps` directory the executable sits in.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the test executable's directory");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        if dir.join("libxdna_vl.so").exists() && dir.join("libxdna_vl.a").exists() {
            return dir.to_path_buf();
        }
    }
    panic!(
        "libxdna_vl.so / libxdna_vl.a not found in {} or its parent (cargo builds them with the crate's tests)",
        deps.display()
    );
}

pub fn cdylib() -> PathBuf {
    lib_dir().join("libxdna_vl.so")
}

/// The system C compiler ($CC, else `cc`).
pub fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// How a C program links the library.
#[derive(Clone, Copy, Debug)]
pub enum Link {
    /// `-L dir -lxdna_vl` with an rpath to it.
    Dynamic,
    /// `libxdna_vl.a` and the native libraries the Rust standard library needs.
    Static,
}

/// The rendered pkg-config file (variables substituted): its `Cflags`, `Libs` and the static pieces.
pub struct PkgConfig {
    pub cflags: Vec<String>,
    pub libs: Vec<String>,
    pub staticlib: String,
    pub native_static_libs: Vec<String>,
    pub text: String,
}

/// Renders `xdna_vl.pc.in` for this build and reads it back the way pkg-config does (variables, then
/// `Key: value` fields with `${var}` substituted).
pub fn pkg_config() -> PkgConfig {
    let template =
        std::fs::read_to_string(crate_dir().join("xdna_vl.pc.in")).expect("xdna_vl.pc.in");
    let text = template
        .replace("@LIBDIR@", &lib_dir().display().to_string())
        .replace("@INCLUDEDIR@", &include_dir().display().to_string())
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let expand = |value: &str, vars: &[(String, String)]| {
        let mut out = value.to_string();
        for (k, v) in vars.iter().rev() {
            out = out.replace(&format!("${{{k}}}"), v);
        }
        assert!(!out.contains("${"), "unexpanded variable in {value:?}");
        out
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let eq = line.find('=');
        let colon = line.find(':');
        match (eq, colon) {
            (Some(e), c) if c.is_none_or(|c| e < c) => {
                let value = expand(line[e + 1..].trim(), &vars);
                vars.push((line[..e].trim().to_string(), value));
            }
            (_, Some(c)) => {
                let value = expand(line[c + 1..].trim(), &vars);
                fields.push((line[..c].trim().to_string(), value));
            }
            _ => panic!("xdna_vl.pc.in: line {line:?} is neither `var=value` nor `Key: value`"),
        }
    }
    let field = |k: &str| {
        fields
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("xdna_vl.pc.in has no `{k}:`"))
    };
    let var = |k: &str| {
        vars.iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("xdna_vl.pc.in has no `{k}=`"))
    };
    let words = |s: String| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    PkgConfig {
        cflags: words(field("Cflags")),
        libs: words(field("Libs")),
        staticlib: var("staticlib"),
        native_static_libs: words(var("native_static_libs")),
        text,
    }
}

/// Compiles one C program from tests/c with warnings as errors, linked the given way through the
/// flags of the rendered pkg-config file.
pub fn compile(source: &str, out_dir: &Path, link: Link) -> PathBuf {
    compile_path(&c_source(source), out_dir, link)
}

/// As `compile`, for a C file anywhere.
pub fn compile_path(source: &Path, out_dir: &Path, link: Link) -> PathBuf {
    let pc = pkg_config();
    let stem = source.file_stem().expect("a C file name").to_string_lossy();
    let exe = out_dir.join(format!(
        "{stem}-{}",
        match link {
            Link::Dynamic => "dynamic",
            Link::Static => "static",
        }
    ));
    let mut cmd = Command::new(c_compiler());
    cmd.args([
        "-std=c11",
        "-O1",
        "-pthread",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
    ])
    .args(&pc.cflags)
    .arg(source)
    .arg("-o")
    .arg(&exe);
    match link {
        Link::Dynamic => {
            cmd.args(&pc.libs)
                .arg(format!("-Wl,-rpath,{}", lib_dir().display()));
        }
        Link::Static => {
            cmd.arg(&pc.staticlib).args(&pc.native_static_libs);
        }
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {:?}: {e}", c_compiler()));
    assert!(
        output.status.success(),
        "compiling {} ({link:?}) failed: {cmd:?}\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    exe
}

/// Runs a compiled program; panics with its output unless it exits 0.
pub fn run(exe: &Path, args: &[&std::ffi::OsStr]) -> Output {
    let output = Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    assert!(
        output.status.success(),
        "{} exited with {}\nstdout:\n{}\nstderr:\n{}",
        exe.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}
