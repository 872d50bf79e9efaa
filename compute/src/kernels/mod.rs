//! Host GEMM kernels: `out[r][j] = x[r] · W[n0 + j]` over a block of weight rows, for every quant kind,
//! on the instruction set chosen at run time.
//!
//! Three paths produce the same bytes: portable scalar, AVX2, and AVX-512 VNNI (`vpdpbusd` at 256-bit
//! width through AVX512-VL for the GEMVs, 512-bit for many rows: `x86/wide.rs`). Between one row
//! (the GEMVs) and many (the prefill tiles), 2..=[`FEW_MAX_ROWS`] rows — several decode streams in
//! one forward, a verified draft window — take few-row kernels that read each weight panel once for
//! all rows (`x86/q4_few.rs`, `x86/i8_tiles.rs`). A SIMD path is used only after its run-time
//! self-check (`self_check.rs`). The arithmetic is `packs::quant`'s:
//! - i8: the integer dot of activation codes and weight codes is exact (any summation order), then
//!   `finish_i8(acc, s_a, s_w)`.
//! - q4: per group of 32, the exact integer dot, then `sum += acc as f32 * scale` in ascending group
//!   order (a separate multiply and add, never fused), then `finish_q4(sum, s_a)`. SIMD paths keep one
//!   f32 sum per (activation row, weight row) in a vector lane, so the order per output is unchanged.
//! - f32/bf16: the dot order of [`scalar::dot_f32`] (16 lanes, multiply then add, lanes summed
//!   ascending, then the tail), reproduced lane by lane, so every path gives the same bits.
//! - bf16 weights registered for bf16 products ([`Products::Bf16`]): activations rounded to bf16,
//!   `vdpbf16ps` arithmetic in the order [`bf16_gemm`] states (AVX-512 BF16, else its oracle).

// Every unsafe operation inside an `unsafe fn` sits in an `unsafe` block with a `// SAFETY:` reason.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod activations;
pub mod bf16_dot;
pub mod bf16_gemm;
mod row_blocks;
pub mod scalar;
mod self_check;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{round_row_bf16, transpose8};

#[cfg(test)]
mod tests;

/// Vector helpers other x86 code of the crate (attention) shares with the kernels.
#[cfg(target_arch = "x86_64")]
pub mod simd {
    pub use super::x86::{bf16x8_to_ps, transpose8};
}

use packs::LinearData;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

pub use activations::{q4_halves, ActivationLayout, Activations};
pub use bf16_gemm::{Bf16Rows, Products, PRODUCTS_ENV};
pub use self_check::Mismatch;

/// `dst[i] = bf16::from_f32(src[i])` (round to nearest, ties to even), 8 at a time on AVX2: the bf16
/// KV cache's writes. Panics unless the lengths match.
pub fn f32_to_bf16(dst: &mut [half::bf16], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "f32_to_bf16: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        // SAFETY: the CPU reported AVX2; the lengths were checked above.
        unsafe { x86::f32_to_bf16_avx2(dst, src) };
        return;
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = half::bf16::from_f32(x);
    }
}

/// Weight rows per panel: the SIMD tiles work on this many weight rows at once (a short last panel
/// repeats its last row and drops the extra lanes).
pub const PANEL: usize = 8;

/// Most activation rows the few-row kernels take (several decode streams in one forward, or a
/// verified draft window): each weight panel is read from memory once for all of them. More rows
/// take the prefill kernels.
pub const FEW_MAX_ROWS: usize = 16;

/// An instruction set the kernels can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, any CPU.
    Scalar,
    /// AVX2 + FMA (`vpmaddubsw`/`vpmaddwd` integer dots).
    Avx2,
    /// AVX-512 F + VL + BW + VNNI (`vpdpbusd` on 256-bit vectors, 512-bit for many rows), on top of
    /// AVX2.
    Avx512Vnni,
}

impl Isa {
    /// Fastest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512Vnni, Isa::Avx2, Isa::Scalar];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::has_avx512_vnni(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every path this CPU can run, fastest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The run-time self-check of a path this CPU runs (`self_check.rs`): `Err` names the first
    /// case where its bits differed from the portable path's. Run once per process and path; the
    /// portable path is the reference and passes. `None` for a path this CPU cannot run.
    pub fn self_check(self) -> Option<Result<(), Mismatch>> {
        static AVX2: OnceLock<Result<(), Mismatch>> = OnceLock::new();
        static AVX512_VNNI: OnceLock<Result<(), Mismatch>> = OnceLock::new();
        if !self.is_available() {
            return None;
        }
        let slot = match self {
            Isa::Scalar => return Some(Ok(())),
            Isa::Avx2 => &AVX2,
            Isa::Avx512Vnni => &AVX512_VNNI,
        };
        Some(slot.get_or_init(|| self_check::check_isa(self)).clone())
    }

    /// Whether the CPU runs the path and the path passed its self-check.
    pub fn is_usable(self) -> bool {
        matches!(self.self_check(), Some(Ok(())))
    }

    /// The kernels every host GEMM runs on (decided once): the fastest usable path, or the one
    /// [`KERNELS_ENV`] names. A path the CPU runs but that failed its self-check is skipped, with
    /// one line on stderr saying which and why; so is a [`KERNELS_ENV`] this CPU cannot honour.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let mut fastest = Isa::Scalar; // the portable path is always available and passes
            for isa in Isa::available() {
                match isa.self_check() {
                    Some(Ok(())) => {
                        fastest = isa;
                        break;
                    }
                    Some(Err(why)) => eprintln!(
                        "xdna-vl: not using the {isa} kernels: they {why}. The next path gives the \
                         same results, slower. Please report this with your CPU model."
                    ),
                    None => {}
                }
            }
            let requested = std::env::var(KERNELS_ENV).ok();
            let (isa, warning) = choose(requested.as_deref(), Isa::is_usable, fastest);
            if let Some(w) = warning {
                eprintln!("xdna-vl: {w}");
            }
            isa
        })
    }
}

/// Environment variable that picks the host kernels (`avx512vnni`, `avx2` or `scalar`) instead
/// of the fastest usable ones: every path gives the same bits, so it only changes speed (to
/// compare paths end to end, e.g. `XDNA_VL_KERNELS=avx2 bench`).
pub const KERNELS_ENV: &str = "XDNA_VL_KERNELS";

/// The path to use: `requested` (the value of [`KERNELS_ENV`]) when it names a usable one, else
/// `fastest`, with the warning that says why the request was not followed.
fn choose(
    requested: Option<&str>,
    usable: impl Fn(Isa) -> bool,
    fastest: Isa,
) -> (Isa, Option<String>) {
    let Some(name) = requested else {
        return (fastest, None);
    };
    match name.parse::<Isa>() {
        Ok(isa) if usable(isa) => (isa, None),
        Ok(isa) => (
            fastest,
            Some(format!(
                "{KERNELS_ENV}={name}: this CPU cannot use the {isa} kernels (missing \
                 instructions or a failed self-check); using {fastest}"
            )),
        ),
        Err(e) => (
            fastest,
            Some(format!("{KERNELS_ENV}: {e}; using {fastest}")),
        ),
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Isa, String> {
        Isa::ALL.into_iter().find(|i| i.name() == s).ok_or_else(|| {
            format!("unknown instruction set {s:?} (expected avx512vnni, avx2 or scalar)")
        })
    }
}

/// The kernels of one instruction set. A value exists only for a path the CPU can run, which is what
/// makes calling the SIMD code sound (and, outside the self-check itself, only for one that passed
/// its self-check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    isa: Isa,
}

impl Kernels {
    /// The kernels of `isa`, or `None` when this CPU cannot run it or it failed its self-check
    /// ([`Isa::self_check`]).
    pub fn new(isa: Isa) -> Option<Kernels> {
        isa.is_usable().then_some(Kernels { isa })
    }

    /// The fastest kernels this CPU can run.
    pub fn best() -> Kernels {
        Kernels { isa: Isa::best() }
    }

    pub fn isa(self) -> Isa {
        self.isa
    }

    /// Quantizes one activation row exactly as `packs::quant::quantize_activation_row`; returns the scale.
    pub fn quantize_row(self, x: &[f32], codes: &mut [i8]) -> f32 {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Kernels` holding a SIMD isa exists only when the CPU reported its features.
            Isa::Avx2 | Isa::Avx512Vnni => unsafe { x86::quantize_row_avx2(x, codes) },
            _ => packs::quant::quantize_activation_row(x, codes),
        }
    }

    /// `dst.copy_from_slice(src)`, returning whether `dst` already held `src`, in one pass and without
    /// `memcpy` on SIMD paths: glibc's `rep movsb` copy into a buffer 16 bytes past the source
    /// modulo 4 KB measured about 40x slower than at other offsets, most of preparing a decode row.
    pub(crate) fn copy_bits(self, dst: &mut [u32], src: &[u32]) -> bool {
        assert_eq!(dst.len(), src.len(), "copy_bits: lengths differ");
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Kernels` holding a SIMD isa exists only when the CPU reported its features;
            // the lengths were checked above.
            Isa::Avx2 | Isa::Avx512Vnni => unsafe { x86::copy_u32_avx2(dst, src) },
            _ => {
                let same = dst == src;
                dst.copy_from_slice(src);
                same
            }
        }
    }

    /// Reorders one row of natural-order activation codes into the `Q4Groups` layout in place and
    /// writes its group sums (8 x each group's code sum). Panics unless `codes.len()` is
    /// `32 x sums.len()`.
    pub(crate) fn q4_groups_row(self, codes: &mut [i8], sums: &mut [i32]) {
        assert_eq!(
            codes.len(),
            sums.len() * packs::quant::Q4_GROUP,
            "q4_groups_row: codes and sums disagree"
        );
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Kernels` holding a SIMD isa exists only when the CPU reported its features;
            // the lengths were checked above.
            Isa::Avx2 | Isa::Avx512Vnni => unsafe { x86::q4_groups_row_avx2(codes, sums) },
            _ => activations::q4_groups_row_scalar(codes, sums),
        }
    }

    /// Weight rows `n0 .. n0 + out[0].len()` of `w` against every activation row: `out[r][j]` is
    /// activation row r times weight row `n0 + j`. `x` holds the f32 rows (`out.len() x k`) for f32
    /// and bf16 weights; `acts` the prepared integer rows for i8 (layout `Natural`) and q4
    /// (layout `Q4Groups`). Panics on mismatched lengths (a caller bug).
    pub fn gemm_block(
        self,
        w: &LinearData<'_>,
        k: usize,
        n0: usize,
        x: &[f32],
        acts: &Activations,
        out: &mut [&mut [f32]],
    ) {
        let rows = out.len();
        let nb = out.first().map_or(0, |o| o.len());
        if rows == 0 || nb == 0 {
            return;
        }
        assert!(
            out.iter().all(|o| o.len() == nb),
            "gemm_block: ragged output rows"
        );
        let block = WeightBlock::new(w, k, n0, nb);
        match block {
            WeightBlock::F32(_) | WeightBlock::Bf16(_) => {
                assert!(
                    x.len() >= rows * k,
                    "gemm_block: x holds {} values, need {rows} x {k}",
                    x.len()
                )
            }
            WeightBlock::I8 { .. } => acts.check(ActivationLayout::Natural, rows, k),
            WeightBlock::Q4 { .. } => acts.check(ActivationLayout::Q4Groups, rows, k),
        }
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: this `Kernels` exists only because the CPU reported AVX2 + FMA; the block and
            // the activations were checked against `k`, `rows` and `nb` above.
            Isa::Avx2 => unsafe { x86::gemm_block_avx2(&block, k, x, acts, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for AVX-512 F/BW/VL/VNNI on top of AVX2 + FMA.
            Isa::Avx512Vnni => unsafe { x86::gemm_block_vnni(&block, k, x, acts, out) },
            _ => scalar::gemm_block(&block, k, x, acts, out),
        }
    }
}

/// The weight rows of one block, sliced out of a linear weight.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WeightBlock<'a> {
    /// `nb` rows of `k` values.
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
    /// codes `nb x k`, one scale per row.
    I8 {
        codes: &'a [i8],
        scales: &'a [f32],
    },
    /// The block's rows of the whole weight's codes (pack layout), scales `nb x k/32`.
    Q4 {
        codes: Q4Codes<'a>,
        scales: &'a [half::bf16],
    },
}

/// A q4 weight's codes in the pack layout (`packs::quant::Q4_PANEL`), seen from a block whose first
/// row is `n0`: row numbers below are the block's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q4Codes<'a> {
    /// The whole weight's codes.
    all: &'a [u8],
    /// The weight's rows and K.
    n: usize,
    k: usize,
    n0: usize,
}

impl<'a> Q4Codes<'a> {
    /// The block's row `j`, group `g`: its 16 bytes in row-major order.
    #[inline(always)]
    pub(crate) fn group(&self, j: usize, g: usize) -> [u8; packs::quant::Q4_GROUP / 2] {
        packs::quant::q4_group_bytes(self.all, self.n, self.k, self.n0 + j, g)
    }

    /// Where the whole pack panel (`packs::quant::Q4_PANEL` rows, chunk-major) that begins at the
    /// block's row `j` starts in the whole weight's codes; `None` when no whole panel begins there
    /// (a row inside one, or a row-major row past the last).
    #[inline(always)]
    pub(crate) fn panel_at(&self, j: usize) -> Option<usize> {
        let row = self.n0 + j;
        let whole = self.n / packs::quant::Q4_PANEL * packs::quant::Q4_PANEL;
        (row.is_multiple_of(packs::quant::Q4_PANEL) && row < whole).then(|| row * self.k / 2)
    }

    /// The whole weight's codes.
    pub(crate) fn all(&self) -> &'a [u8] {
        self.all
    }
}

impl<'a> WeightBlock<'a> {
    fn new(w: &LinearData<'a>, k: usize, n0: usize, nb: usize) -> WeightBlock<'a> {
        let rows = n0..n0 + nb;
        match *w {
            LinearData::F32(v) => WeightBlock::F32(&v[rows.start * k..rows.end * k]),
            LinearData::Bf16(v) => WeightBlock::Bf16(&v[rows.start * k..rows.end * k]),
            LinearData::I8 { codes, scales } => WeightBlock::I8 {
                codes: &codes[rows.start * k..rows.end * k],
                scales: &scales[rows],
            },
            LinearData::Q4 { codes, scales } => {
                let g = k / packs::quant::Q4_GROUP;
                assert_eq!(g * packs::quant::Q4_GROUP, k, "q4 weight with K = {k}");
                // K = 0 has no codes to place: any row count fits.
                let n = if k == 0 {
                    rows.end
                } else {
                    codes.len() / (k / 2)
                };
                assert!(rows.end <= n, "q4 block rows {rows:?} of {n}");
                WeightBlock::Q4 {
                    codes: Q4Codes {
                        all: codes,
                        n,
                        k,
                        n0,
                    },
                    scales: &scales[rows.start * g..rows.end * g],
                }
            }
        }
    }
}
