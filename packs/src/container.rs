//! The safetensors container, read defensively: used for packs and for hub checkpoint shards.
//!
//! Layout: 8-byte little-endian header length n, n bytes of JSON header, then the data section.
//! Every entry's `data_offsets` are relative to the start of the data section.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// Element types of the safetensors format (byte-sized ones; packs use F32, BF16, I8, U8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl Dtype {
    const ALL: [Dtype; 15] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E5M2 | Dtype::F8E4M3 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// The safetensors spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Bytes reserved for the header-length prefix.
pub const LEN_PREFIX: u64 = 8;
/// Refuse headers beyond this (safetensors' own limit): a corrupt length must not make us
/// allocate gigabytes.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor entry of a container header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range relative to the data section.
    pub start: u64,
    pub end: u64,
}

impl Entry {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    pub fn numel(&self) -> usize {
        // Checked when the header was parsed.
        self.shape.iter().product()
    }
}

/// A parsed and bounds-checked header.
#[derive(Clone, Debug)]
pub struct Header {
    /// Absolute file offset of the data section.
    pub data_start: u64,
    pub metadata: BTreeMap<String, String>,
    pub entries: Vec<Entry>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("file is {len} bytes, too short for the 8-byte header length")]
    TooShort { len: u64 },
    #[error("header length {header_len} does not fit in the {file_len}-byte file")]
    HeaderLength { header_len: u64, file_len: u64 },
    #[error("header is not valid JSON: {0}")]
    Json(String),
    #[error("header is not a JSON object")]
    NotObject,
    #[error("__metadata__ must be an object of string values, found {found}")]
    Metadata { found: String },
    #[error("tensor {name}: {what}")]
    BadEntry { name: String, what: String },
    #[error("tensor {name}: dtype {dtype:?} is not a byte-sized safetensors dtype")]
    UnknownDtype { name: String, dtype: String },
    #[error(
        "tensor {name}: data_offsets [{start}, {end}) lie outside the {data_len}-byte data section"
    )]
    OutOfBounds {
        name: String,
        start: u64,
        end: u64,
        data_len: u64,
    },
    #[error("tensor {name}: {dtype} {shape:?} needs {expected} bytes, data_offsets give {actual}")]
    SizeMismatch {
        name: String,
        dtype: Dtype,
        shape: Vec<usize>,
        expected: u64,
        actual: u64,
    },
    #[error(
        "tensors {first} and {second} overlap: data_offsets {first_range:?} and {second_range:?}"
    )]
    Overlap {
        first: String,
        second: String,
        first_range: [u64; 2],
        second_range: [u64; 2],
    },
}

/// Reads the header length from the first 8 bytes; checks it against the file size.
pub fn header_len(prefix: &[u8], file_len: u64) -> Result<u64, HeaderError> {
    let bytes: [u8; 8] = prefix
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(HeaderError::TooShort { len: file_len })?;
    let header_len = u64::from_le_bytes(bytes);
    if header_len > MAX_HEADER_LEN || header_len > file_len.saturating_sub(LEN_PREFIX) {
        return Err(HeaderError::HeaderLength {
            header_len,
            file_len,
        });
    }
    Ok(header_len)
}

/// Parses the JSON header and checks every entry against a data section of `data_len` bytes:
/// known dtype, shape product times dtype size equal to the byte range, range inside the data,
/// no two ranges overlapping. Entries come back sorted by offset.
pub fn parse_header(json: &[u8], data_start: u64, data_len: u64) -> Result<Header, HeaderError> {
    let value: Value =
        serde_json::from_slice(json).map_err(|e| HeaderError::Json(e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(HeaderError::NotObject);
    };
    let mut metadata = BTreeMap::new();
    let mut entries = Vec::with_capacity(map.len());
    for (name, v) in map {
        if name == "__metadata__" {
            let Value::Object(m) = v else {
                return Err(HeaderError::Metadata { found: short(&v) });
            };
            for (k, v) in m {
                let Value::String(s) = v else {
                    return Err(HeaderError::Metadata {
                        found: format!("{k}: {}", short(&v)),
                    });
                };
                metadata.insert(k, s);
            }
            continue;
        }
        entries.push(parse_entry(name, &v, data_len)?);
    }
    entries.sort_by_key(|e| (e.start, e.end));
    for pair in entries.windows(2) {
        if pair[1].start < pair[0].end {
            return Err(HeaderError::Overlap {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
                first_range: [pair[0].start, pair[0].end],
                second_range: [pair[1].start, pair[1].end],
            });
        }
    }
    Ok(Header {
        data_start,
        metadata,
        entries,
    })
}

/// A JSON value for a message, cut to a readable length.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

fn parse_entry(name: String, v: &Value, data_len: u64) -> Result<Entry, HeaderError> {
    let bad = |what: &str| HeaderError::BadEntry {
        name: name.clone(),
        what: what.to_string(),
    };
    let obj = v
        .as_object()
        .ok_or_else(|| bad("entry is not a JSON object"))?;
    let dtype_str = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing string \"dtype\""))?;
    let dtype = Dtype::parse(dtype_str).ok_or_else(|| HeaderError::UnknownDtype {
        name: name.clone(),
        dtype: dtype_str.to_string(),
    })?;
    let shape = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing array \"shape\""))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| bad("\"shape\" must hold non-negative integers"))?;
    let offsets = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
        .ok_or_else(|| bad("\"data_offsets\" must be two non-negative integers"))?;
    let (start, end) = offsets;
    if start > end || end > data_len {
        return Err(HeaderError::OutOfBounds {
            name,
            start,
            end,
            data_len,
        });
    }
    let expected = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| bad("shape overflows"))?;
    if expected != end - start {
        return Err(HeaderError::SizeMismatch {
            name,
            dtype,
            shape,
            expected,
            actual: end - start,
        });
    }
    Ok(Entry {
        name,
        dtype,
        shape,
        start,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_len_is_checked_against_the_file() {
        assert_eq!(
            header_len(&[1, 2, 3], 3),
            Err(HeaderError::TooShort { len: 3 })
        );
        let prefix = 100u64.to_le_bytes();
        assert_eq!(header_len(&prefix, 108), Ok(100));
        assert_eq!(
            header_len(&prefix, 107),
            Err(HeaderError::HeaderLength {
                header_len: 100,
                file_len: 107
            })
        );
    }

    #[test]
    fn entries_are_checked() {
        let ok = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        assert_eq!(parse_header(ok, 0, 8).unwrap().entries.len(), 1);
        let e = parse_header(ok, 0, 7).unwrap_err();
        assert!(matches!(e, HeaderError::OutOfBounds { .. }), "{e}");
        let size = br#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        assert!(matches!(
            parse_header(size, 0, 8),
            Err(HeaderError::SizeMismatch { .. })
        ));
        let overlap = br#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                           "b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}}"#;
        assert!(matches!(
            parse_header(overlap, 0, 8),
            Err(HeaderError::Overlap { .. })
        ));
        let dtype = br#"{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}"#;
        assert!(matches!(
            parse_header(dtype, 0, 8),
            Err(HeaderError::UnknownDtype { .. })
        ));
        let overflow =
            br#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#;
        assert!(matches!(
            parse_header(overflow, 0, 8),
            Err(HeaderError::BadEntry { .. })
        ));
    }
}
