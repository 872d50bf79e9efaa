//! The hand-written header against the library: the same functions (the header's prototypes, the
//! cdylib's exported `xvl_` symbols per `nm -D`, and the `extern "C" fn`s of src/api.rs), the same
//! parameter types, the same `#define` values, the same struct layouts. Each check has a control: a
//! planted mistake it must report.

use crate::common;

use common::Link;
use std::collections::BTreeMap;
use std::process::Command;
use xdna_vl::{XvlAbStats, XvlHybrid, XvlMessage, XvlOpenOptions, XvlSampling, HEADER_DEFINES};

/// name -> (return type, parameter types), types normalized (`const char*`, `size_t`, ...).
type Signatures = BTreeMap<String, (String, Vec<String>)>;

fn header_text() -> String {
    std::fs::read_to_string(common::include_dir().join("xdna_vl.h")).unwrap()
}

fn api_text() -> String {
    std::fs::read_to_string(common::crate_dir().join("src/api.rs")).unwrap()
}

fn strip_c_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// `const char *` -> `const char*`: one space between words, none around `*`.
fn normalize_c_type(t: &str) -> String {
    let spaced = t.replace('*', " * ");
    let words: Vec<&str> = spaced.split_whitespace().collect();
    let mut out = String::new();
    for w in words {
        if w == "*" {
            out.push('*');
        } else {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(w);
        }
    }
    out
}

/// Splits `type name` into the type (the parameter name dropped).
fn c_param_type(param: &str) -> String {
    let p = param.trim();
    let name_start = p
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    assert!(name_start > 0, "C parameter {p:?} has no name");
    normalize_c_type(&p[..name_start])
}

/// The header's function prototypes.
fn header_signatures(header: &str) -> Signatures {
    let body: String = strip_c_comments(header)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = Signatures::new();
    for statement in body.split(';') {
        let s = statement.trim();
        let Some(open) = s.find('(') else { continue };
        if s.starts_with("typedef") || s.contains('{') || s.contains('}') {
            continue;
        }
        let head = s[..open].trim();
        let name_at = head
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = &head[name_at..];
        assert!(name.starts_with("xvl_"), "unexpected declaration {s:?}");
        let ret = normalize_c_type(&head[..name_at]);
        let close = s.rfind(')').expect("prototype without `)`");
        let params_text = s[open + 1..close].trim();
        let params = if params_text == "void" {
            Vec::new()
        } else {
            params_text.split(',').map(c_param_type).collect()
        };
        let previous = out.insert(name.to_string(), (ret, params));
        assert!(previous.is_none(), "{name} declared twice");
    }
    out
}

/// A Rust FFI type as C spells it.
fn rust_type_to_c(t: &str) -> String {
    let t = t.trim();
    if let Some(rest) = t.strip_prefix("*mut ") {
        return format!("{}*", rust_type_to_c(rest));
    }
    if let Some(rest) = t.strip_prefix("*const ") {
        return format!("const {}*", rust_type_to_c(rest));
    }
    match t {
        "u32" => "uint32_t",
        "i32" | "XvlStatus" => "xvl_status",
        "i64" => "int64_t",
        "usize" => "size_t",
        "f32" => "float",
        "c_char" => "char",
        "c_void" => "void",
        "XvlChat" => "xvl_chat",
        "XvlMessage" => "xvl_message",
        "XvlSampling" => "xvl_sampling",
        "XvlTextCallback" => "xvl_text_callback",
        "XvlForward" => "xvl_forward",
        "XvlOpenOptions" => "xvl_open_options",
        "XvlHybrid" => "xvl_hybrid",
        "XvlAbStats" => "xvl_ab_stats",
        other => panic!("src/api.rs uses {other:?} at the C boundary; teach this test its C name"),
    }
    .to_string()
}

/// The `#[no_mangle] extern "C" fn`s of src/api.rs.
fn rust_signatures(source: &str) -> Signatures {
    let mut out = Signatures::new();
    let mut rest = source;
    while let Some(i) = rest.find("#[no_mangle]") {
        rest = &rest[i + "#[no_mangle]".len()..];
        let fn_at = rest.find("fn ").expect("#[no_mangle] without fn");
        let decl = &rest[..fn_at];
        assert!(
            decl.contains("extern \"C\""),
            "#[no_mangle] item is not extern \"C\": {decl:?}"
        );
        let after = &rest[fn_at + 3..];
        let open = after.find('(').unwrap();
        let name = after[..open].trim().to_string();
        let close = after.find(')').unwrap();
        let params: Vec<String> = after[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (_, ty) = p.split_once(':').expect("parameter without type");
                normalize_c_type(&rust_type_to_c(ty))
            })
            .collect();
        let tail = &after[close + 1..after.find('{').unwrap()];
        let ret = match tail.trim().strip_prefix("->") {
            Some(t) => normalize_c_type(&rust_type_to_c(t)),
            None => "void".into(),
        };
        out.insert(name, (ret, params));
    }
    out
}

/// Differences between two signature sets, one line each.
fn compare(left: &str, a: &Signatures, right: &str, b: &Signatures) -> Vec<String> {
    let mut diffs = Vec::new();
    for (name, sig) in a {
        match b.get(name) {
            None => diffs.push(format!("{name} is in {left} but not in {right}")),
            Some(other) if other != sig => {
                diffs.push(format!("{name}: {left} has {sig:?}, {right} has {other:?}"))
            }
            Some(_) => {}
        }
    }
    for name in b.keys().filter(|n| !a.contains_key(*n)) {
        diffs.push(format!("{name} is in {right} but not in {left}"));
    }
    diffs
}

/// The `xvl_` functions the cdylib exports (`nm -D --defined-only`, text symbols).
fn exported_symbols() -> Vec<String> {
    let lib = common::cdylib();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("running nm (binutils) on the cdylib");
    assert!(out.status.success(), "nm {} failed", lib.display());
    let mut names: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[1] == "T" && f[2].starts_with("xvl_")).then(|| f[2].to_string())
        })
        .collect();
    names.sort();
    names
}

#[test]
fn header_prototypes_equal_the_rust_definitions_and_the_exported_symbols() {
    let header = header_signatures(&header_text());
    let rust = rust_signatures(&api_text());
    assert_eq!(header.len(), 23, "prototypes parsed: {:?}", header.keys());
    let diffs = compare("xdna_vl.h", &header, "src/api.rs", &rust);
    assert!(diffs.is_empty(), "header vs Rust:\n{}", diffs.join("\n"));

    let exported = exported_symbols();
    let declared: Vec<String> = header.keys().cloned().collect();
    assert_eq!(
        exported, declared,
        "libxdna_vl.so exports (left) vs xdna_vl.h declares (right)"
    );

    // Controls: a changed parameter type, a missing and an extra function are each reported.
    let planted = header_text().replace(
        "xvl_status xvl_truncate(xvl_forward *f, size_t len);",
        "xvl_status xvl_truncate(xvl_forward *f, uint32_t len);\nvoid xvl_extra(void);",
    );
    let planted_sigs = header_signatures(&planted);
    let diffs = compare("planted", &planted_sigs, "src/api.rs", &rust);
    assert!(
        diffs.iter().any(|d| d.starts_with("xvl_truncate:"))
            && diffs
                .iter()
                .any(|d| d.starts_with("xvl_extra is in planted")),
        "{diffs:?}"
    );
    let mut fewer = header.clone();
    fewer.remove("xvl_reset");
    let diffs = compare("fewer", &fewer, "src/api.rs", &rust);
    assert_eq!(
        diffs,
        ["xvl_reset is in src/api.rs but not in fewer"],
        "a dropped prototype"
    );
}

#[test]
fn header_defines_equal_the_library_constants() {
    let header = header_text();
    let mut defines = BTreeMap::new();
    for line in header.lines() {
        let Some(rest) = line.trim().strip_prefix("#define XVL_") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let name = format!("XVL_{}", words.next().unwrap());
        let value: i64 = words
            .next()
            .unwrap_or_else(|| panic!("{name} has no value"))
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        defines.insert(name, value);
    }
    let rust: BTreeMap<String, i64> = HEADER_DEFINES
        .iter()
        .map(|&(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(
        defines, rust,
        "xdna_vl.h #defines (left) vs the crate's (right)"
    );
    // Control: the comparison sees a changed value.
    let mut planted = defines.clone();
    planted.insert("XVL_ERR_SLOT".into(), 6);
    assert_ne!(planted, rust);
    // Status names are the define names.
    for &(name, value) in HEADER_DEFINES
        .iter()
        .filter(|(n, _)| n.starts_with("XVL_OK") || n.starts_with("XVL_ERR_"))
    {
        let got = xdna_vl::status_name(value as i32).trim_end_matches('\0');
        assert_eq!(got, name);
    }
}

/// The size of a field's type, named by a projection (no value needed).
fn field_size<T, F>(_project: fn(&T) -> &F) -> usize {
    std::mem::size_of::<F>()
}

#[test]
fn struct_layouts_and_linked_functions_agree_with_the_c_compiler() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::compile("layout.c", dir.path(), Link::Dynamic);
    let out = String::from_utf8(common::run(&exe, &[]).stdout).unwrap();
    let c: BTreeMap<String, Vec<String>> = out
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace().map(String::from);
            (w.next().unwrap(), w.collect())
        })
        .collect();
    let num = |k: &str, i: usize| -> usize {
        c.get(k)
            .unwrap_or_else(|| panic!("layout.c printed no {k}"))[i]
            .parse()
            .unwrap()
    };
    let mut checked = 0;
    macro_rules! layout {
        ($ty:ty, $c:literal, [$($f:ident),*]) => {{
            assert_eq!(num($c, 0), std::mem::size_of::<$ty>(), "sizeof {}: C (left) vs Rust", $c);
            assert_eq!(num($c, 1), std::mem::align_of::<$ty>(), "alignof {}: C (left) vs Rust", $c);
            $(
                let key = concat!($c, ".", stringify!($f));
                assert_eq!(num(key, 0), std::mem::offset_of!($ty, $f), "{key} offset: C (left) vs Rust");
                assert_eq!(num(key, 1), field_size::<$ty, _>(|v| &v.$f), "{key} size: C (left) vs Rust");
                checked += 1;
            )*
        }};
    }
    layout!(
        XvlOpenOptions,
        "xvl_open_options",
        [
            struct_size,
            gemm,
            capacity,
            threads,
            kv_dtype,
            runtime_path,
            designs_dir
        ]
    );
    layout!(
        XvlHybrid,
        "xvl_hybrid",
        [
            planes,
            planes_len,
            start_pos,
            image_rows,
            image_rows_len,
            deepstack,
            deepstack_len,
            deepstack_sets
        ]
    );
    layout!(
        XvlAbStats,
        "xvl_ab_stats",
        [gemms, differing_gemms, differing_values, max_abs_diff]
    );
    layout!(
        XvlMessage,
        "xvl_message",
        [role, text, image_paths, image_paths_len]
    );
    layout!(
        XvlSampling,
        "xvl_sampling",
        [struct_size, temperature, top_k, top_p, seed, max_tokens]
    );
    assert_eq!(checked, 29);
    // Every field C printed was compared (a field added to the header but not here is caught).
    let printed_fields = c.keys().filter(|k| k.contains('.')).count();
    assert_eq!(
        printed_fields, checked,
        "layout.c prints fields this test does not compare"
    );
    // layout.c took the address of every declared function and linked.
    assert_eq!(num("functions", 0), header_signatures(&header_text()).len());
    assert_eq!(c["version"], [env!("CARGO_PKG_VERSION")]);
    // Control: a struct_size other than the library's is refused by xvl_open (see bad_args.c); here,
    // the Rust size the check uses is the C size.
    assert_eq!(XvlOpenOptions::SIZE as usize, num("xvl_open_options", 0));
    assert_eq!(XvlSampling::SIZE as usize, num("xvl_sampling", 0));
}
