//! The pack reader: one memory map, zero-copy typed slices, everything validated at open so the
//! forward can index without further checks.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::bf16;
use memmap2::Mmap;

use crate::container::{self, Dtype, HeaderError, LEN_PREFIX};
use crate::layout::{self, WeightRole};
use crate::names::{self, EMBED, LM_HEAD};
use crate::quant::QuantKind;
use crate::semantics::{Semantics, SemanticsError};
use crate::writer::{ALIGN, FORMAT};

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a pack: {source}")]
    Header { path: PathBuf, source: HeaderError },
    #[error("{path}: __metadata__.format is {found:?}, expected {FORMAT:?} ({why}: build it again with this version of packs: {rebuild})")]
    Format {
        path: PathBuf,
        found: Option<String>,
        /// What differs in that format, when it is a known older one.
        why: &'static str,
        /// The command that makes the pack again in this format.
        rebuild: String,
    },
    #[error("{path}: __metadata__.semantics: {what}")]
    SemanticsJson { path: PathBuf, what: String },
    #[error("{path}: invalid semantics: {source}")]
    Semantics {
        path: PathBuf,
        source: SemanticsError,
    },
    #[error("{path}: tensor {name}: starts at file offset {offset}, not {ALIGN}-byte aligned")]
    Misaligned {
        path: PathBuf,
        name: String,
        offset: u64,
    },
    #[error("{path}: padding entry {name} is {dtype} {shape:?}, expected a 1-D U8 tensor")]
    BadPadding {
        path: PathBuf,
        name: String,
        dtype: Dtype,
        shape: Vec<usize>,
    },
    #[error("{path}: required tensor {name} is missing")]
    Missing { path: PathBuf, name: String },
    #[error("{path}: tensor {name} is {found_dtype} {found_shape:?}, expected {dtype} {shape:?}")]
    WrongShape {
        path: PathBuf,
        name: String,
        found_dtype: Dtype,
        found_shape: Vec<usize>,
        dtype: Dtype,
        shape: Vec<usize>,
    },
    #[error("{path}: __metadata__.semantics.{field} = {value}, but the file holds only {tensors} tensors (at least one per layer or block)")]
    TooManyLayers {
        path: PathBuf,
        field: &'static str,
        value: usize,
        tensors: usize,
    },
    #[error("{path}: no tensor named {name}")]
    NotFound { path: PathBuf, name: String },
    #[error("{path}: tensor {name} is not a {what}")]
    WrongRole {
        path: PathBuf,
        name: String,
        what: &'static str,
    },
}

/// A tensor of the pack (padding entries excluded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute file offset of the first byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// What the tensor is in the model.
    pub kind: TensorKind,
}

/// A norm weight's place in a pack's tensor table ([`Pack::norm_index`]).
#[derive(Clone, Copy, Debug)]
pub struct NormIndex(usize);

/// A linear weight's place, and its scales' place, in a pack's tensor table ([`Pack::linear_index`]).
#[derive(Clone, Copy, Debug)]
pub struct LinearIndex {
    tensor: usize,
    scales: Option<usize>,
}

/// The embedding matrix [vocab x hidden].
#[derive(Clone, Copy, Debug)]
pub enum Embedding<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

/// A linear weight W [n x k] (out x in) in its stored form.
#[derive(Clone, Copy, Debug)]
pub struct Linear<'a> {
    pub name: &'a str,
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    pub data: LinearData<'a>,
}

impl<'a> Linear<'a> {
    /// The weight's first `rows` output rows, as a weight of its own: `None` when `rows` is 0 or
    /// more than `n`, or for q4 when it is neither `n` nor a whole number of panels (the pack
    /// layout keeps whole panels of [`crate::quant::Q4_PANEL`] rows in row order, so such a prefix
    /// is the first bytes of the codes).
    pub fn first_rows(&self, rows: usize) -> Option<Linear<'a>> {
        use crate::quant::{Q4_GROUP, Q4_PANEL};
        if rows == 0 || rows > self.n {
            return None;
        }
        let k = self.k;
        let data = match self.data {
            LinearData::F32(w) => LinearData::F32(&w[..rows * k]),
            LinearData::Bf16(w) => LinearData::Bf16(&w[..rows * k]),
            LinearData::I8 { codes, scales } => LinearData::I8 {
                codes: &codes[..rows * k],
                scales: &scales[..rows],
            },
            LinearData::Q4 { codes, scales } => {
                if rows != self.n && !rows.is_multiple_of(Q4_PANEL) {
                    return None;
                }
                LinearData::Q4 {
                    codes: &codes[..rows * k / 2],
                    scales: &scales[..rows * k / Q4_GROUP],
                }
            }
        };
        Some(Linear {
            name: self.name,
            n: rows,
            k,
            data,
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub enum LinearData<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    /// codes [n*k] row-major, scales [n].
    I8 {
        codes: &'a [i8],
        scales: &'a [f32],
    },
    /// codes [n * k/2] (element 2i low nibble, 2i+1 high) in the panel layout
    /// ([`crate::quant::Q4_PANEL`], [`crate::quant::q4_group_chunks`]), scales [n * k/32] row-major.
    Q4 {
        codes: &'a [u8],
        scales: &'a [bf16],
    },
}

/// The role of a pack tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    Embedding,
    Norm,
    /// The values (or codes) of a linear weight.
    Linear,
    /// The scales of a quantized linear weight.
    Scales,
    /// An f32 parameter kept as it is (the tower's biases, LayerNorms, position table).
    Param,
    /// A file carried beside the tensors (`__asset__.<file>`: tokenizer, chat template, ...).
    Asset,
    /// Not required by the semantics; ignored by the forward.
    Extra,
}

impl TensorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TensorKind::Embedding => "embedding",
            TensorKind::Norm => "norm",
            TensorKind::Linear => "linear",
            TensorKind::Scales => "scales",
            TensorKind::Param => "param",
            TensorKind::Asset => "asset",
            TensorKind::Extra => "extra",
        }
    }
}

pub struct Pack {
    path: PathBuf,
    map: Mmap,
    semantics: Semantics,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for Pack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pack")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Pack {
    /// Maps the file and validates everything: header length and JSON, offsets inside the file,
    /// no overlap, dtype and shape agreeing with byte sizes, 64-byte alignment, the format string,
    /// the semantics, and every tensor the semantics require present with the right dtype and shape.
    pub fn open(path: impl AsRef<Path>) -> Result<Pack, PackError> {
        Pack::open_path(path.as_ref())
    }

    /// [`Pack::open`] without the generic: its body is compiled once, here, not again in
    /// every crate and test binary that opens one.
    fn open_path(path: &Path) -> Result<Pack, PackError> {
        let path = path.to_path_buf();
        let io = |source| PackError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let header_err = |source| PackError::Header {
            path: path.clone(),
            source,
        };
        if file_len < LEN_PREFIX {
            return Err(header_err(HeaderError::TooShort { len: file_len }));
        }
        // SAFETY: the map is read-only and we never hand out references past its length (every
        // range is checked against it below). Like every memory-mapped reader, we rely on the
        // file not being truncated or rewritten while the pack is open; packs are written once
        // by rename and never modified in place.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let map_len = map.len() as u64;
        let header_len = container::header_len(&map, map_len).map_err(header_err)?;
        let data_start = LEN_PREFIX + header_len;
        let header = container::parse_header(
            &map[LEN_PREFIX as usize..data_start as usize],
            data_start,
            map_len - data_start,
        )
        .map_err(header_err)?;

        let format = header.metadata.get("format").cloned();
        if format.as_deref() != Some(FORMAT) {
            let semantics = header.metadata.get("semantics").map(String::as_str);
            return Err(PackError::Format {
                why: older_format_change(format.as_deref()),
                rebuild: rebuild_command(&path, semantics),
                path,
                found: format,
            });
        }
        let semantics_json =
            header
                .metadata
                .get("semantics")
                .ok_or_else(|| PackError::SemanticsJson {
                    path: path.clone(),
                    what: "missing".into(),
                })?;
        let semantics: Semantics =
            serde_json::from_str(semantics_json).map_err(|e| PackError::SemanticsJson {
                path: path.clone(),
                what: e.to_string(),
            })?;
        semantics
            .validate()
            .map_err(|source| PackError::Semantics {
                path: path.clone(),
                source,
            })?;

        let mut tensors = Vec::with_capacity(header.entries.len());
        for e in header.entries {
            if names::is_padding(&e.name) {
                if e.dtype != Dtype::U8 || e.shape.len() != 1 {
                    return Err(PackError::BadPadding {
                        path,
                        name: e.name,
                        dtype: e.dtype,
                        shape: e.shape,
                    });
                }
                continue;
            }
            let offset = data_start + e.start;
            if !offset.is_multiple_of(ALIGN) {
                return Err(PackError::Misaligned {
                    path,
                    name: e.name,
                    offset,
                });
            }
            let len = e.len();
            tensors.push(TensorInfo {
                name: e.name,
                dtype: e.dtype,
                shape: e.shape,
                offset,
                len,
                kind: TensorKind::Extra,
            });
        }
        let index: HashMap<String, usize> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();

        // The plan is a few weights per layer: bound the layer counts by the tensors the file
        // holds before planning (semantics allow 2^24 layers, a plan of tens of GB).
        for (field, value) in [
            ("num_layers", semantics.num_layers),
            (
                "vision.depth",
                semantics.vision.as_ref().map_or(0, |v| v.depth),
            ),
        ] {
            if value > tensors.len() {
                return Err(PackError::TooManyLayers {
                    path,
                    field,
                    value,
                    tensors: tensors.len(),
                });
            }
        }
        // A sparse layer plans three weights per expert: bound experts x sparse layers too.
        if let Some(m) = &semantics.moe {
            let sparse = (0..semantics.num_layers)
                .filter(|&l| semantics.is_sparse(l))
                .count();
            if sparse.saturating_mul(m.num_experts) > tensors.len() {
                return Err(PackError::TooManyLayers {
                    path,
                    field: "moe.num_experts (x sparse layers)",
                    value: sparse.saturating_mul(m.num_experts),
                    tensors: tensors.len(),
                });
            }
        }
        let mut plan = layout::weights(&semantics);
        if !layout::head_is_stored(&semantics) && index.contains_key(LM_HEAD) {
            // A tied f32/bf16 pack need not store the head; if it does, it must be well formed.
            let mut untied = semantics.clone();
            untied.tie_word_embeddings = false;
            plan.extend(
                layout::weights(&untied)
                    .into_iter()
                    .filter(|w| w.name == LM_HEAD),
            );
        }
        for weight in &plan {
            for (i, spec) in weight.tensors().into_iter().enumerate() {
                let Some(&slot) = index.get(&spec.name) else {
                    return Err(PackError::Missing {
                        path,
                        name: spec.name,
                    });
                };
                let t = &mut tensors[slot];
                if t.dtype != spec.dtype || t.shape != spec.shape {
                    return Err(PackError::WrongShape {
                        path,
                        name: spec.name,
                        found_dtype: t.dtype,
                        found_shape: t.shape.clone(),
                        dtype: spec.dtype,
                        shape: spec.shape,
                    });
                }
                t.kind = match (weight.role, i) {
                    (_, 1) => TensorKind::Scales,
                    (WeightRole::Embedding, _) => TensorKind::Embedding,
                    (WeightRole::Norm, _) => TensorKind::Norm,
                    (WeightRole::Linear, _) => TensorKind::Linear,
                    (WeightRole::Param, _) => TensorKind::Param,
                };
            }
        }
        for t in tensors.iter_mut() {
            if t.name.starts_with(names::ASSET_PREFIX) {
                if t.dtype != Dtype::U8 || t.shape.len() != 1 {
                    return Err(PackError::WrongShape {
                        path,
                        name: t.name.clone(),
                        found_dtype: t.dtype,
                        found_shape: t.shape.clone(),
                        dtype: Dtype::U8,
                        shape: vec![t.len as usize],
                    });
                }
                t.kind = TensorKind::Asset;
            }
        }
        Ok(Pack {
            path,
            map,
            semantics,
            tensors,
            index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn semantics(&self) -> &Semantics {
        &self.semantics
    }

    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Every tensor (padding entries hidden), in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor.
    pub fn bytes(&self, name: &str) -> Result<&[u8], PackError> {
        let t = self.tensor(name).ok_or_else(|| self.not_found(name))?;
        Ok(self.bytes_of(t))
    }

    fn bytes_of(&self, t: &TensorInfo) -> &[u8] {
        // In range: checked against the map length at open.
        &self.map[t.offset as usize..(t.offset + t.len) as usize]
    }

    fn not_found(&self, name: &str) -> PackError {
        PackError::NotFound {
            path: self.path.clone(),
            name: name.to_string(),
        }
    }

    fn typed<T: bytemuck::Pod>(&self, t: &TensorInfo) -> &[T] {
        // Cannot fail: offsets are 64-byte aligned in a page-aligned map, and byte lengths are
        // whole multiples of the element size (dtype times shape, checked at open).
        bytemuck::try_cast_slice(self.bytes_of(t)).expect("pack tensor validated at open")
    }

    fn lookup(
        &self,
        name: &str,
        want: TensorKind,
        what: &'static str,
    ) -> Result<&TensorInfo, PackError> {
        Ok(&self.tensors[self.index_of(name, want, what)?])
    }

    /// The table position of tensor `name`, which must have the role `want`.
    fn index_of(
        &self,
        name: &str,
        want: TensorKind,
        what: &'static str,
    ) -> Result<usize, PackError> {
        let &i = self.index.get(name).ok_or_else(|| self.not_found(name))?;
        if self.tensors[i].kind != want {
            return Err(PackError::WrongRole {
                path: self.path.clone(),
                name: name.to_string(),
                what,
            });
        }
        Ok(i)
    }

    /// The embedding [vocab x hidden]: f32 in f32 packs, bf16 otherwise.
    pub fn embedding(&self) -> Embedding<'_> {
        let t = self
            .lookup(EMBED, TensorKind::Embedding, "embedding")
            .expect("embedding validated at open");
        match t.dtype {
            Dtype::F32 => Embedding::F32(self.typed(t)),
            _ => Embedding::Bf16(self.typed(t)),
        }
    }

    /// A file the pack carries (`tokenizer.json`, `chat_template.jinja`, ...; see
    /// `layout::ASSETS`), if the checkpoint it was built from had it.
    pub fn asset(&self, file: &str) -> Option<&[u8]> {
        let t = self
            .index
            .get(&names::asset(file))
            .map(|&i| &self.tensors[i])
            .filter(|t| t.kind == TensorKind::Asset)?;
        Some(&self.map[t.offset as usize..(t.offset + t.len) as usize])
    }

    /// An f32 tensor kept as it is: a norm weight, or one of the tower's biases, LayerNorm
    /// weights and biases, or its position table.
    pub fn f32_tensor(&self, name: &str) -> Result<&[f32], PackError> {
        let &i = self.index.get(name).ok_or_else(|| self.not_found(name))?;
        let t = &self.tensors[i];
        if !matches!(t.kind, TensorKind::Norm | TensorKind::Param) || t.dtype != Dtype::F32 {
            return Err(PackError::WrongRole {
                path: self.path.clone(),
                name: name.to_string(),
                what: "f32 parameter",
            });
        }
        Ok(self.typed(t))
    }

    /// A norm weight (f32).
    pub fn norm(&self, name: &str) -> Result<&[f32], PackError> {
        Ok(self.norm_at(self.norm_index(name)?))
    }

    /// Where norm weight `name` sits, for [`Pack::norm_at`].
    pub fn norm_index(&self, name: &str) -> Result<NormIndex, PackError> {
        Ok(NormIndex(self.index_of(
            name,
            TensorKind::Norm,
            "norm weight",
        )?))
    }

    /// The norm weight at `at` (from this pack's [`Pack::norm_index`]), without a name lookup.
    pub fn norm_at(&self, at: NormIndex) -> &[f32] {
        self.typed(&self.tensors[at.0])
    }

    /// A linear weight: one of the seven projections of a layer, the stored head, or a linear of
    /// the vision tower.
    pub fn linear(&self, name: &str) -> Result<Linear<'_>, PackError> {
        Ok(self.linear_at(self.linear_index(name)?))
    }

    /// Where linear weight `name` and its scales sit, for [`Pack::linear_at`].
    pub fn linear_index(&self, name: &str) -> Result<LinearIndex, PackError> {
        let tensor = self.index_of(name, TensorKind::Linear, "linear weight")?;
        let scales = match storage_of(self.tensors[tensor].dtype) {
            QuantKind::F32 | QuantKind::Bf16 => None,
            QuantKind::I8 | QuantKind::Q4 => {
                Some(self.index_of(&names::scales_of(name), TensorKind::Scales, "scales tensor")?)
            }
        };
        Ok(LinearIndex { tensor, scales })
    }

    /// The linear weight at `at` (from this pack's [`Pack::linear_index`]), without a name lookup:
    /// the decoder resolves its weights once, not at every step.
    pub fn linear_at(&self, at: LinearIndex) -> Linear<'_> {
        let t = &self.tensors[at.tensor];
        let n = t.shape[0];
        let scales = || {
            &self.tensors[at
                .scales
                .expect("a quantized weight's index holds its scales")]
        };
        // The tensor's own dtype says how it is stored: the tower may be stored in another kind
        // than the decoder (`--vision-quant`); open() checked each against its plan.
        let (k, data) = match storage_of(t.dtype) {
            QuantKind::F32 => (t.shape[1], LinearData::F32(self.typed(t))),
            QuantKind::Bf16 => (t.shape[1], LinearData::Bf16(self.typed(t))),
            QuantKind::I8 => (
                t.shape[1],
                LinearData::I8 {
                    codes: self.typed(t),
                    scales: self.typed(scales()),
                },
            ),
            QuantKind::Q4 => (
                t.shape[1] * 2,
                LinearData::Q4 {
                    codes: self.typed(t),
                    scales: self.typed(scales()),
                },
            ),
        };
        Linear {
            name: &t.name,
            n,
            k,
            data,
        }
    }

    /// The output head: `lm_head.weight` when stored, else (tied f32/bf16 packs) the embedding
    /// viewed as a linear [vocab x hidden].
    pub fn head(&self) -> Linear<'_> {
        if self.index.contains_key(LM_HEAD) {
            return self.linear(LM_HEAD).expect("head validated at open");
        }
        let t = self.tensor(EMBED).expect("embedding validated at open");
        let data = match self.embedding() {
            Embedding::F32(w) => LinearData::F32(w),
            Embedding::Bf16(w) => LinearData::Bf16(w),
        };
        Linear {
            name: &t.name,
            n: t.shape[0],
            k: t.shape[1],
            data,
        }
    }
}

/// How a linear weight tensor of this dtype is stored (the plan gives each kind its own dtype:
/// F32, BF16, I8 codes, U8 q4 codes).
fn storage_of(dtype: Dtype) -> QuantKind {
    match dtype {
        Dtype::BF16 => QuantKind::Bf16,
        Dtype::I8 => QuantKind::I8,
        Dtype::U8 => QuantKind::Q4,
        _ => QuantKind::F32,
    }
}

/// What an older pack format stored differently (FORMAT.md, `format`).
fn older_format_change(found: Option<&str>) -> &'static str {
    match found {
        Some("xdna-vl-pack/1") => "that format stored q4 codes row-major",
        Some("xdna-vl-pack/2") => "that format had no vision tower and no assets",
        Some("xdna-vl-pack/3") => "that format stored q4 codes as two's complement nibbles",
        Some("xdna-vl-pack/4") => "that format stored q4 codes in 8-row panels by group pair",
        _ => "a pack from another version of packs, or not a pack",
    }
}

/// The command that makes the pack at `path` again, from what its semantics say it was made from
/// (`source`, `quant`, the tower's `quant`); placeholders where they say nothing usable.
fn rebuild_command(path: &Path, semantics: Option<&str>) -> String {
    let sem: serde_json::Value = semantics
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    let quant = text(&sem["quant"]).unwrap_or_else(|| "<f32|bf16|i8|q4>".into());
    let out = path.display();
    let source = text(&sem["source"]).unwrap_or_default();
    // `random:<shape>:seed=<n>` (shapes.rs) is a random pack.
    let random = source.strip_prefix("random:").and_then(|rest| {
        let (shape, seed) = rest.split_once(":seed=")?;
        Some((shape.to_string(), seed.parse::<u64>().ok()?))
    });
    if let Some((shape, seed)) = random {
        return format!("`packs random --shape {shape} --quant {quant} --seed {seed} -o {out}`");
    }
    let checkpoint = if source.is_empty() {
        "<HF_DIR>".to_string()
    } else {
        source
    };
    let mut command = format!("packs build {checkpoint} -o {out} --quant {quant}");
    match &sem["vision"] {
        serde_json::Value::Null if sem.get("vision").is_some() => command += " --no-vision",
        vision => {
            if let Some(vq) = text(&vision["quant"]).filter(|vq| *vq != quant) {
                command += &format!(" --vision-quant {vq}");
            }
        }
    }
    format!("`{command}`")
}
