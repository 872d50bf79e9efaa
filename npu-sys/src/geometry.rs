//! What a GEMM design computes and the sizes of its buffers (the layouts are in the C header).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Elements of K sharing one bf16 scale in the q4 layout.
pub use packs::quant::Q4_GROUP;

/// The arithmetic of a design.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesignKind {
    /// A int8 x B int8 -> C int32.
    I8,
    /// A int8 x B q4 (groups of 32, bf16 scale) -> C f32.
    Q4,
}

impl DesignKind {
    /// The `XDNA_VL_KIND_*` value of the C ABI.
    pub fn abi_value(self) -> u32 {
        match self {
            DesignKind::I8 => crate::abi::KIND_I8,
            DesignKind::Q4 => crate::abi::KIND_Q4,
        }
    }

    pub fn from_abi_value(value: u32) -> Option<DesignKind> {
        match value {
            crate::abi::KIND_I8 => Some(DesignKind::I8),
            crate::abi::KIND_Q4 => Some(DesignKind::Q4),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DesignKind::I8 => "i8",
            DesignKind::Q4 => "q4",
        }
    }
}

impl fmt::Display for DesignKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DesignKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "i8" => Ok(DesignKind::I8),
            "q4" => Ok(DesignKind::Q4),
            other => Err(format!("unknown design kind `{other}` (expected i8 or q4)")),
        }
    }
}

/// The shape a design was built for: C [m_tile x n] = A [m_tile x k] x B [n x k]^T.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Geometry {
    pub kind: DesignKind,
    pub m_tile: usize,
    pub k: usize,
    pub n: usize,
}

/// Which argument a data buffer is bound to; the value is the kernel argument group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgGroup {
    A,
    B,
    C,
}

impl ArgGroup {
    pub const ALL: [ArgGroup; 3] = [ArgGroup::A, ArgGroup::B, ArgGroup::C];

    /// The `XDNA_VL_GROUP_*` value (XRT `kernel.group_id`).
    pub fn abi_value(self) -> u32 {
        match self {
            ArgGroup::A => crate::abi::GROUP_A,
            ArgGroup::B => crate::abi::GROUP_B,
            ArgGroup::C => crate::abi::GROUP_C,
        }
    }

    pub fn from_abi_value(value: u32) -> Option<ArgGroup> {
        ArgGroup::ALL.into_iter().find(|g| g.abi_value() == value)
    }
}

impl fmt::Display for ArgGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ArgGroup::A => "A",
            ArgGroup::B => "B",
            ArgGroup::C => "C",
        })
    }
}

/// Why a geometry cannot describe a design.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error("geometry {0}: m_tile, k and n must all be positive")]
    Zero(Geometry),
    #[error("geometry {0}: a q4 design needs K a multiple of {Q4_GROUP}")]
    Q4GroupK(Geometry),
    #[error("geometry {0}: buffer sizes overflow")]
    Overflow(Geometry),
}

impl Geometry {
    pub fn new(kind: DesignKind, m_tile: usize, k: usize, n: usize) -> Geometry {
        Geometry { kind, m_tile, k, n }
    }

    /// Refuses zero sizes, a q4 K that is not whole groups, and sizes that overflow u64.
    pub fn validate(&self) -> Result<(), GeometryError> {
        if self.m_tile == 0 || self.k == 0 || self.n == 0 {
            return Err(GeometryError::Zero(*self));
        }
        if self.kind == DesignKind::Q4 && !self.k.is_multiple_of(Q4_GROUP) {
            return Err(GeometryError::Q4GroupK(*self));
        }
        for group in ArgGroup::ALL {
            if self.checked_buffer_len(group).is_none() {
                return Err(GeometryError::Overflow(*self));
            }
        }
        Ok(())
    }

    /// Bytes of the buffer bound to `group`, or None on overflow.
    pub fn checked_buffer_len(&self, group: ArgGroup) -> Option<usize> {
        let (m, k, n) = (self.m_tile, self.k, self.n);
        let len = match (group, self.kind) {
            (ArgGroup::A, _) => m.checked_mul(k)?,
            (ArgGroup::B, DesignKind::I8) => n.checked_mul(k)?,
            (ArgGroup::B, DesignKind::Q4) => {
                let codes = n.checked_mul(k / 2)?;
                let scales = n.checked_mul(k / Q4_GROUP)?.checked_mul(2)?;
                codes.checked_add(scales)?
            }
            (ArgGroup::C, _) => m.checked_mul(n)?.checked_mul(4)?,
        };
        u64::try_from(len).ok()?;
        Some(len)
    }

    /// Bytes of the buffer bound to `group`. Call on a validated geometry.
    pub fn buffer_len(&self, group: ArgGroup) -> usize {
        self.checked_buffer_len(group).unwrap_or(usize::MAX)
    }

    /// Byte offset of the q4 scales inside the B buffer (the codes come first).
    pub fn q4_scales_offset(&self) -> usize {
        self.n * (self.k / 2)
    }

    /// A short name for files and messages, e.g. `q4_m16_k2048_n6144`.
    pub fn file_stem(&self) -> String {
        format!("{}_m{}_k{}_n{}", self.kind, self.m_tile, self.k, self.n)
    }
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} M{} K{} N{}", self.kind, self.m_tile, self.k, self.n)
    }
}
