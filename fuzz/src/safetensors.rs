//! Structured mutation of safetensors files (packs, checkpoint shards, hybrid inputs): the header
//! length field, truncation, every entry's dtype, shape and data_offsets (past the end, reversed,
//! overlapping another tensor, huge dimensions, shapes that keep the byte size but not the plan),
//! renamed, removed and duplicated tensors, the metadata, and non-finite or extreme values planted
//! in the data. The result is a list of patches to the file.

use serde_json::{json, Map, Value};

use crate::bytes;
use crate::input::{FilePatch, Patch};
use crate::json;
use crate::rng::Rng;

/// Every dtype spelling safetensors has, and some it does not.
const DTYPES: [&str; 19] = [
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
    "F64", "I64", "U64", "F4", "f32", "", "C64",
];

/// Mutates `__metadata__` (the target knows what its keys mean).
pub type MetaHook<'a> = &'a dyn Fn(&mut Rng, &mut Map<String, Value>);

/// A parsed safetensors file: its header length and the header object.
pub fn parse(bytes: &[u8]) -> Option<(usize, Map<String, Value>)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let json = bytes.get(8..8usize.checked_add(n)?)?;
    match serde_json::from_slice(json).ok()? {
        Value::Object(m) => Some((n, m)),
        _ => None,
    }
}

type Parsed = Option<(usize, Map<String, Value>)>;

thread_local! {
    /// Base files are parsed once per worker (keyed by their address: bases live as long as
    /// their target), not once per input.
    static PARSED: std::cell::RefCell<std::collections::HashMap<(usize, usize), Parsed>> =
        Default::default();
}

fn parse_cached(bytes: &[u8]) -> Parsed {
    let key = (bytes.as_ptr() as usize, bytes.len());
    PARSED.with(|c| {
        c.borrow_mut()
            .entry(key)
            .or_insert_with(|| parse(bytes))
            .clone()
    })
}

fn tensor_names(m: &Map<String, Value>) -> Vec<String> {
    m.keys().filter(|k| *k != "__metadata__").cloned().collect()
}

fn offsets(v: &Value) -> Option<(u64, u64)> {
    let a = v.get("data_offsets")?.as_array()?;
    Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?))
}

fn shape(v: &Value) -> Vec<u64> {
    v.get("shape")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// Patches that rewrite the header to `header`, keeping the data section: in place (padded with
/// spaces to the old length) when it fits, else the whole file with a new length, the data
/// section kept 64-aligned as packs require.
fn rewrite_header(file: &str, bytes: &[u8], old_len: usize, header: &[u8]) -> Vec<FilePatch> {
    let data = &bytes[(8 + old_len).min(bytes.len())..];
    if header.len() <= old_len {
        let mut h = header.to_vec();
        h.resize(old_len, b' ');
        return vec![FilePatch {
            file: file.into(),
            patch: Patch::Write {
                offset: 8,
                bytes: h,
            },
        }];
    }
    let len = (8 + header.len()).next_multiple_of(64) - 8;
    let mut out = Vec::with_capacity(8 + len + data.len());
    out.extend_from_slice(&(len as u64).to_le_bytes());
    out.extend_from_slice(header);
    out.resize(8 + len, b' ');
    out.extend_from_slice(data);
    vec![FilePatch {
        file: file.into(),
        patch: Patch::Replace(out),
    }]
}

/// One mutation of an entry or of the header as a whole.
fn mutate_header(rng: &mut Rng, m: &mut Map<String, Value>, data_len: u64, meta: MetaHook) {
    let names = tensor_names(m);
    if names.is_empty() || rng.chance(1, 8) {
        if let Some(Value::Object(md)) = m.get_mut("__metadata__") {
            if rng.chance(3, 4) {
                meta(rng, md);
                return;
            }
        }
        let mut v = Value::Object(std::mem::take(m));
        json::mutate_value(rng, &mut v);
        match v {
            Value::Object(x) => *m = x,
            other => {
                m.insert("__metadata__".into(), other);
            }
        }
        return;
    }
    let name = rng.pick(&names).clone();
    let other = rng.pick(&names).clone();
    let other_v = m[&other].clone();
    let e = m.get_mut(&name).expect("picked from the keys");
    if !e.is_object() {
        // An earlier mutation made the entry something else; indexing it would panic here.
        json::mutate_value(rng, e);
        return;
    }
    let (start, end) = offsets(e).unwrap_or((0, 0));
    match rng.below(16) {
        0 => {
            e["dtype"] = if rng.chance(7, 8) {
                json!(rng.pick(&DTYPES))
            } else {
                json::edge_value(rng)
            }
        }
        1 => {
            // One dimension to an edge value (huge, zero, overflowing products).
            let mut s = shape(e);
            let d = rng.interesting();
            if s.is_empty() || rng.chance(1, 4) {
                s.push(d);
            } else {
                let i = rng.below(s.len());
                s[i] = d;
            }
            e["shape"] = json!(s);
        }
        2 => {
            let mut s = shape(e);
            match rng.below(3) {
                0 => {
                    s.pop();
                }
                1 => s.insert(rng.below(s.len() + 1), 1),
                _ => s.reverse(),
            }
            e["shape"] = json!(s);
        }
        3 => {
            // The same byte size in another shape: passes the container, not the plan.
            let n: u64 = shape(e).iter().product();
            let s = match rng.below(4) {
                0 => vec![n],
                1 => vec![1, n],
                2 => vec![n, 1],
                _ => vec![],
            };
            e["shape"] = json!(s);
        }
        4 => e["data_offsets"] = json!([start, data_len + rng.below(64) as u64 + 1]),
        5 => e["data_offsets"] = json!([end, start]),
        6 => {
            // Overlap: the other tensor's start, with this one's length (sizes still agree).
            let (os, _) = offsets(&other_v).unwrap_or((0, 0));
            e["data_offsets"] = json!([os, os + (end - start.min(end))]);
        }
        7 => {
            let d = rng.interesting();
            e["data_offsets"] = json!([start.wrapping_add(d), end.wrapping_add(d)]);
        }
        8 => e["data_offsets"] = json!([rng.interesting(), rng.interesting()]),
        9 => {
            let e_v = e.clone();
            m.insert(name.clone(), other_v);
            m.insert(other, e_v);
        }
        10 => {
            m.remove(&name);
        }
        11 => {
            // A second name for the same bytes, or a reserved-looking one.
            let v = e.clone();
            let new = match rng.below(4) {
                0 => format!("{name}.copy"),
                1 => format!("__pad__{}", rng.below(1000)),
                2 => "__asset__.tokenizer.json".into(),
                _ => format!("{name}_scales"),
            };
            m.insert(new, v);
        }
        12 => {
            let v = e.clone();
            let new = rng.pick(&names).clone();
            m.remove(&name);
            m.insert(new, v);
        }
        13 => e["data_offsets"] = json::edge_value(rng),
        14 => e["shape"] = json::edge_value(rng),
        _ => {
            json::mutate_value(rng, e);
        }
    }
}

/// Planted values: NaN, infinities and extremes in float data; edge integers in integer data.
fn plant_value(
    rng: &mut Rng,
    bytes: &[u8],
    header: &Map<String, Value>,
    data_start: u64,
) -> Option<FilePatch> {
    let names = tensor_names(header);
    let name = rng.pick(&names);
    let e = header.get(name)?;
    let (start, end) = offsets(e)?;
    let dtype = e.get("dtype")?.as_str()?;
    let size = match dtype {
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I64" | "U64" | "F64" => 8,
        _ => 1,
    };
    let count = end.checked_sub(start)? / size;
    if count == 0 {
        return None;
    }
    let at = data_start + start + rng.below(count as usize) as u64 * size;
    if at + size > bytes.len() as u64 {
        return None;
    }
    let v: Vec<u8> = match dtype {
        "F32" => rng
            .pick(&[
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::MAX,
                -0.0,
                1e-45,
            ])
            .to_le_bytes()
            .to_vec(),
        "BF16" => rng
            .pick(&[0x7fc0u16, 0x7f80, 0xff80, 0x7f7f, 0xffff])
            .to_le_bytes()
            .to_vec(),
        "F16" => rng
            .pick(&[0x7e00u16, 0x7c00, 0xfc00, 0x7bff])
            .to_le_bytes()
            .to_vec(),
        "I64" => (match rng.below(3) {
            0 => rng.interesting() as i64,
            1 => -(rng.below(1000) as i64),
            _ => rng.below(300_000) as i64,
        })
        .to_le_bytes()
        .to_vec(),
        _ => rng.bytes(size as usize),
    };
    Some(FilePatch {
        file: String::new(),
        patch: Patch::Write {
            offset: at,
            bytes: v,
        },
    })
}

/// Patches that mutate only `__metadata__` of `file` (through `meta`), 1-3 times.
pub fn mutate_metadata(rng: &mut Rng, file: &str, bytes: &[u8], meta: MetaHook) -> Vec<FilePatch> {
    let Some((header_len, mut header)) = parse_cached(bytes) else {
        return Vec::new();
    };
    if let Some(Value::Object(md)) = header.get_mut("__metadata__") {
        for _ in 0..rng.range(1, 3) {
            meta(rng, md);
        }
    }
    let text = serde_json::to_vec(&Value::Object(header)).expect("a Value serializes");
    rewrite_header(file, bytes, header_len, &text)
}

/// Patches that mutate the safetensors file `file` (contents `bytes`).
pub fn mutate(rng: &mut Rng, file: &str, bytes: &[u8], meta: MetaHook) -> Vec<FilePatch> {
    let Some((header_len, header)) = parse_cached(bytes) else {
        let new = bytes::mutate(rng, bytes, 0..bytes.len().min(4096));
        return vec![FilePatch {
            file: file.into(),
            patch: Patch::Replace(new),
        }];
    };
    let data_start = 8 + header_len as u64;
    let data_len = (bytes.len() as u64).saturating_sub(data_start);
    let one = |patch| {
        vec![FilePatch {
            file: file.into(),
            patch,
        }]
    };
    match rng.below(20) {
        0 => {
            // The header length field.
            let real = header_len as u64;
            let len = match rng.below(4) {
                0 => rng.interesting(),
                1 => real.wrapping_add(rng.range(1, 9) as u64),
                2 => real.saturating_sub(rng.range(1, 9) as u64),
                _ => bytes.len() as u64 - 8 + rng.below(3) as u64,
            };
            one(Patch::Write {
                offset: 0,
                bytes: len.to_le_bytes().to_vec(),
            })
        }
        1 => {
            let n = match rng.below(3) {
                0 => rng.below(data_start as usize + 16),
                1 => bytes.len().saturating_sub(rng.range(1, 64)),
                _ => rng.below(bytes.len()),
            };
            one(Patch::SetLen(n as u64))
        }
        2 | 3 => {
            // Raw damage inside the header text.
            let h = &bytes[8..data_start as usize];
            let damaged = bytes::mutate(rng, h, 0..h.len());
            rewrite_header(file, bytes, header_len, &damaged)
        }
        4 => {
            let n = rng.range(1, 8);
            let at = rng.below(bytes.len());
            one(Patch::Write {
                offset: at as u64,
                bytes: rng.bytes(n),
            })
        }
        5 | 6 => match plant_value(rng, bytes, &header, data_start) {
            Some(mut p) => {
                p.file = file.into();
                vec![p]
            }
            None => one(Patch::SetLen(bytes.len() as u64 + 1)),
        },
        _ => {
            // A header that grows means rewriting the whole file (and restoring it after): keep
            // one in eight of those, retry the others, so big shards stay cheap to mutate.
            let grow = rng.chance(1, 8);
            let mut text = Vec::new();
            for _ in 0..4 {
                let mut h = header.clone();
                for _ in 0..rng.range(1, 3) {
                    mutate_header(rng, &mut h, data_len, meta);
                }
                text = serde_json::to_vec(&Value::Object(h)).expect("a Value serializes");
                if grow || text.len() <= header_len {
                    break;
                }
            }
            rewrite_header(file, bytes, header_len, &text)
        }
    }
}
