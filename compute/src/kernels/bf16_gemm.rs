//! "bf16 products": the arithmetic of bf16 weights on AVX-512 BF16 (`vdpbf16ps`), and its portable
//! oracle.
//!
//! Two arithmetics exist for a bf16-stored weight, and which one a linear uses is chosen when it is
//! registered ([`Products`]), never by the CPU alone:
//! - **f32 products** ([`Products::F32`]): the weight widened to f32 (exact), the f32 activations
//!   multiplied and added in [`super::scalar::dot_f32`]'s order. Every path (scalar, AVX2, AVX-512)
//!   gives the same bits. The decoder's bf16 packs use it.
//! - **bf16 products** ([`Products::Bf16`]): each activation row is rounded to bf16 first
//!   ([`bf16_dot::to_bf16`]: `vcvtne2ps2bf16`, RNE, denormals read as zero), then every output is
//!   [`dot_bf16_products`]:
//!   1. 16 f32 lanes start at +0. K is walked in blocks of 32 elements (the last one padded with
//!      zeros in both operands); lane i takes the pair `(32b + 2i, 32b + 2i + 1)` of block b, blocks
//!      ascending, as one [`bf16_dot::dot_pair`] (the odd element's fused multiply-add first, then
//!      the even one's; DAZ/FTZ).
//!   2. The 16 lanes are summed as a halving tree: `s8[i] = l[i] + l[i + 8]`,
//!      `s4[i] = s8[i] + s8[i + 4]`, `s2[i] = s4[i] + s4[i + 2]`, `sum = s2[0] + s2[1]` (plain f32
//!      adds) — [`sum_lanes`].
//!
//!   The AVX-512 BF16 kernel (`x86/bf16_gemm.rs`) keeps one output per `zmm` accumulator, so step 1
//!   is one `vdpbf16ps` per block, and sums 16 accumulators' lanes together with the tree of step 2
//!   (15 adds for 16 outputs); the tile and the row blocks decide only which outputs run together,
//!   never an output's order. On a CPU without the instructions (or with the host kernels forced
//!   below AVX-512), bf16 products run as this file's loops: the same bits, but 0.08 GMAC/s where
//!   the widening kernels ran 33.6 on one thread (`portable_bf16_products_timing`, load 10), so a
//!   weight that asks for bf16 products takes f32 products there unless
//!   [`PRODUCTS_ENV`] insists ([`Products::resolve`]), and the model says which it took.

use super::bf16_dot::{self, dot_pair};
use super::row_blocks::{row_blocks, BF16_BLOCK_BYTES};
use super::{Isa, Kernels};
use half::bf16;
use rayon::prelude::*;
use std::fmt;
use std::sync::OnceLock;

/// Elements per block of the dot: 16 lanes of one bf16 pair.
pub const BF16_BLOCK: usize = 32;
/// Lanes of the dot (one `zmm` of f32).
pub const BF16_LANES: usize = 16;

/// How a bf16-stored weight multiplies (module docs). Weights stored f32, i8 or q4 have one
/// arithmetic each and ignore it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Products {
    /// The weight widened to f32; f32 products in `dot_f32`'s order.
    #[default]
    F32,
    /// Activations rounded to bf16; bf16 products with f32 accumulation (`vdpbf16ps`).
    Bf16,
}

/// Environment variable that overrides [`Products::resolve`] (`bf16` or `f32`): to compare the
/// two arithmetics on one bf16 pack, or to run bf16 products on a CPU without AVX-512 BF16
/// (slowly, with the same bits).
pub const PRODUCTS_ENV: &str = "XDNA_VL_BF16_PRODUCTS";

impl Products {
    pub fn name(self) -> &'static str {
        match self {
            Products::F32 => "f32 products",
            Products::Bf16 => "bf16 products",
        }
    }

    /// The arithmetic bf16 weights that ask for `asked` run with, and why: [`PRODUCTS_ENV`] when
    /// set; f32 products when asked; bf16 products when the host kernels run them on `vdpbf16ps`
    /// ([`Kernels::runs_bf16_products`]); else f32 products (the portable loops are too slow to be
    /// taken unasked: module docs).
    pub fn resolve(asked: Products) -> (Products, &'static str) {
        match std::env::var(PRODUCTS_ENV).as_deref() {
            Ok("bf16") => return (Products::Bf16, "set by XDNA_VL_BF16_PRODUCTS"),
            Ok("f32") => return (Products::F32, "set by XDNA_VL_BF16_PRODUCTS"),
            Ok(other) => {
                eprintln!("xdna-vl: {PRODUCTS_ENV}={other}: expected bf16 or f32; ignored")
            }
            Err(_) => {}
        }
        if asked == Products::F32 {
            (Products::F32, "as the pack says")
        } else if Kernels::best().runs_bf16_products() {
            (Products::Bf16, "as the pack says, on AVX-512 BF16")
        } else {
            // Once per process: a default i8/q4 pack's tower asks for bf16 products, and a user
            // on a CPU without them should know why its tower is slower and what to do.
            static TOLD: std::sync::Once = std::sync::Once::new();
            TOLD.call_once(|| {
                eprintln!(
                    "xdna-vl: the pack's tower asks for bf16 products, but the host kernels in \
                     use have no AVX-512 BF16 (the CPU lacks it, or XDNA_VL_KERNELS chose another \
                     path): it runs f32 products on the same bf16 weights, which is slower. A q4 \
                     tower (`packs build ... --vision-quant q4`) is faster there but further from \
                     transformers (README, \"The tower's precision\")."
                )
            });
            (
                Products::F32,
                "the pack asks for bf16 products, but the host kernels have no AVX-512 BF16",
            )
        }
    }
}

impl fmt::Display for Products {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The halving-tree sum of the 16 lanes (module docs, step 2).
#[inline]
pub fn sum_lanes(l: [f32; BF16_LANES]) -> f32 {
    let s8: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
    let s4: [f32; 4] = std::array::from_fn(|i| s8[i] + s8[i + 4]);
    let s2: [f32; 2] = std::array::from_fn(|i| s4[i] + s4[i + 2]);
    s2[0] + s2[1]
}

/// One output of bf16 products: activation row `a` (already bf16, at least `w.len()` values; any
/// beyond are ignored) times weight row `w` (module docs).
pub fn dot_bf16_products(a: &[bf16], w: &[bf16]) -> f32 {
    let k = w.len();
    assert!(
        a.len() >= k,
        "bf16 products: row of {} for K = {k}",
        a.len()
    );
    let at = |v: &[bf16], j: usize| if j < k { v[j] } else { bf16::ZERO };
    let mut lanes = [0f32; BF16_LANES];
    for b in 0..k.div_ceil(BF16_BLOCK) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let j = b * BF16_BLOCK + 2 * i;
            *lane = dot_pair(*lane, [at(a, j), at(a, j + 1)], [at(w, j), at(w, j + 1)]);
        }
    }
    sum_lanes(lanes)
}

/// Activation rows rounded to bf16 for bf16 products: `rows` rows of `stride` values (K rounded up
/// to a whole block, the padding zero), so the kernels read whole blocks.
#[derive(Debug, Default)]
pub struct Bf16Rows {
    rows: usize,
    k: usize,
    stride: usize,
    values: Vec<bf16>,
}

impl Bf16Rows {
    /// Rounds `rows` rows of `x` (`rows x k`) to bf16 ([`bf16_dot::to_bf16`] on every element),
    /// forking over the calling rayon pool for many rows.
    pub fn prepare(&mut self, kernels: Kernels, x: &[f32], rows: usize, k: usize) {
        self.prepare_with(kernels.runs_bf16_products(), x, rows, k);
    }

    /// [`Bf16Rows::prepare`] on `vcvtne2ps2bf16` (`simd`) or the portable loop.
    fn prepare_with(&mut self, simd: bool, x: &[f32], rows: usize, k: usize) {
        assert_eq!(x.len(), rows * k, "Bf16Rows::prepare: x is not rows x k");
        let stride = k.div_ceil(BF16_BLOCK) * BF16_BLOCK;
        (self.rows, self.k, self.stride) = (rows, k, stride);
        self.values.resize(rows * stride, bf16::ZERO);
        if k == 0 {
            return;
        }
        let row_job = |(src, dst): (&[f32], &mut [bf16])| round_row(simd, src, dst);
        if rows >= 4 {
            x.par_chunks_exact(k)
                .zip(self.values.par_chunks_exact_mut(stride))
                .for_each(row_job);
        } else {
            x.chunks_exact(k)
                .zip(self.values.chunks_exact_mut(stride))
                .for_each(row_job);
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Values per row: K rounded up to a whole block.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Row r, `stride` values (zeros past K).
    pub fn row(&self, r: usize) -> &[bf16] {
        &self.values[r * self.stride..(r + 1) * self.stride]
    }
}

/// One activation row rounded to bf16, padded with zeros to `dst.len()`: on `vcvtne2ps2bf16` when
/// `simd` (the caller checked the CPU), else [`bf16_dot::to_bf16`] per element.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn round_row(simd: bool, src: &[f32], dst: &mut [bf16]) {
    assert!(dst.len() >= src.len(), "round_row: destination too short");
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only when `Kernels::runs_bf16_products` saw AVX-512 F/BW/BF16 (or
        // by its own check, after the same detection); `dst` is at least as long as `src`.
        unsafe { super::x86::round_row_bf16(src, dst) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_dot::to_bf16(s);
    }
    dst[src.len()..].fill(bf16::ZERO);
}

/// The portable loops, in the kernel's row blocks (which outputs run together changes no bit).
pub(crate) fn block_rows_scalar(w: &[bf16], k: usize, rows: &Bf16Rows, out: &mut [&mut [f32]]) {
    for rb in row_blocks(out.len(), 2 * rows.stride(), BF16_BLOCK_BYTES, 1) {
        for (j, wr) in w.chunks_exact(k.max(1)).enumerate() {
            for r in rb.clone() {
                out[r][j] = dot_bf16_products(rows.row(r), wr);
            }
        }
    }
}

impl Kernels {
    /// Whether these kernels run bf16 products on `vdpbf16ps`: the AVX-512 path, a CPU with AVX-512
    /// BF16, and the kernel passed its run-time check against [`dot_bf16_products`] (else the
    /// portable loops run them, with the same bits).
    pub fn runs_bf16_products(self) -> bool {
        static CHECKED: OnceLock<bool> = OnceLock::new();
        self.isa == Isa::Avx512Vnni
            && bf16_dot::has_avx512_bf16()
            && *CHECKED.get_or_init(|| match self_check() {
                Ok(()) => true,
                Err(why) => {
                    eprintln!(
                        "xdna-vl: not using the AVX-512 BF16 kernel: {why}. bf16 products run on \
                         the portable path (same results, slower). Please report this with your \
                         CPU model."
                    );
                    false
                }
            })
    }

    /// bf16 products of weight rows `n0 .. n0 + out[0].len()` of `w` (`k` values each, row-major)
    /// against every prepared row: `out[r][j]` is row r times weight row `n0 + j`. Panics on
    /// mismatched lengths (a caller bug).
    pub fn bf16_products_block(
        self,
        w: &[bf16],
        k: usize,
        n0: usize,
        rows: &Bf16Rows,
        out: &mut [&mut [f32]],
    ) {
        let nb = out.first().map_or(0, |o| o.len());
        if out.is_empty() || nb == 0 {
            return;
        }
        assert!(
            out.iter().all(|o| o.len() == nb),
            "bf16_products_block: ragged output rows"
        );
        assert!(
            rows.k() == k && rows.rows() >= out.len(),
            "bf16_products_block: rows prepared {} x {}, need {} x {k}",
            rows.rows(),
            rows.k(),
            out.len()
        );
        let w = &w[n0 * k..(n0 + nb) * k];
        #[cfg(target_arch = "x86_64")]
        if self.runs_bf16_products() {
            // SAFETY: `runs_bf16_products` holds only on a CPU with AVX-512 F/BW/VL/BF16; `w`
            // holds `nb` rows of `k` values and `rows` at least `out.len()` rows of whole blocks
            // for this `k` (checked above).
            unsafe { super::x86::bf16_products_avx512(w, k, rows, out) };
            return;
        }
        block_rows_scalar(w, k, rows, out);
    }
}

/// The kernel against the portable loops on the shapes that reach every branch of it (tiles of 4
/// rows and their remainders, a short last panel, K in whole blocks, with a tail, odd, below one
/// block), with denormal and huge values among normal ones.
fn self_check() -> Result<(), String> {
    let mut rng = super::self_check::Rng(0xbf16);
    for (rows, k, n) in [(1, 32, 5), (5, 33, 7), (9, 97, 4), (6, 7, 9), (17, 160, 13)] {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| match i % 53 {
                7 => f32::from_bits(1 + (rng.next() as u32 & 0x7f_ffff)),
                11 => 3.0e38,
                _ => rng.unit() * 4.0,
            })
            .collect();
        let w: Vec<bf16> = (0..n * k)
            .map(|i| match i % 61 {
                5 => bf16::from_bits(0x0001 + (rng.next() as u16 & 0x7f)),
                _ => bf16::from_f32(rng.unit()),
            })
            .collect();
        let scalar = Kernels { isa: Isa::Scalar };
        let mut prepared = Bf16Rows::default();
        prepared.prepare(scalar, &x, rows, k);
        let mut want = vec![vec![0f32; n]; rows];
        block_rows_scalar(
            &w,
            k,
            &prepared,
            &mut want.iter_mut().map(|o| &mut o[..]).collect::<Vec<_>>(),
        );
        #[cfg(target_arch = "x86_64")]
        {
            let mut simd_rows = Bf16Rows::default();
            simd_rows.prepare_with(true, &x, rows, k);
            if simd_rows.values != prepared.values {
                return Err(format!("rows {rows} k {k}: the rounded activations differ"));
            }
            let mut got = vec![vec![f32::NAN; n]; rows];
            // SAFETY: only called from `runs_bf16_products` after the CPU reported AVX-512
            // F/BW/VL/BF16; `w` holds `n` rows of `k`, the prepared rows `rows` rows of whole
            // blocks.
            unsafe {
                super::x86::bf16_products_avx512(
                    &w,
                    k,
                    &simd_rows,
                    &mut got.iter_mut().map(|o| &mut o[..]).collect::<Vec<_>>(),
                )
            };
            for r in 0..rows {
                for j in 0..n {
                    if got[r][j].to_bits() != want[r][j].to_bits() {
                        return Err(format!(
                            "rows {rows} k {k} n {n}: output [{r}][{j}] is {} where the portable \
                             path gives {}",
                            got[r][j], want[r][j]
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
