//! Pixel rows -> image rows and DeepStack sets, as transformers' Qwen3-VL vision model
//! (`Qwen3VLVisionModel`): patch embedding, interpolated learned positions, `depth` LayerNorm
//! blocks with 2-D rotary attention within each image, the 2×2 patch merger and the DeepStack
//! mergers tapped after the blocks `deepstack_visual_indexes`.
//!
//! Every linear goes through the `compute` runtime the tower was made on (shared with the
//! decoder); LayerNorm, attention, GELU and rotary run on the CPU, forked on the runtime's pool.
//! A bf16 tower multiplies by f32 products (its weights widened), or by bf16 products (the
//! activations rounded to bf16, `vdpbf16ps`) when its pack says so (`--vision-products bf16`) and
//! the host kernels have AVX-512 BF16 ([`compute::Products::resolve`]); [`Tower::arithmetic`]
//! says which. Attention follows the products ([`attention_operands_for`]).

pub mod gelu;
pub mod layer_norm;
mod pos_embed;
pub mod positions;
mod rotary;
mod weights;

use std::sync::Arc;
use std::time::{Duration, Instant};

use compute::attention::segments::{attend_segments, SegmentScratch};
use compute::attention::Operands;
use compute::ops::rows::{add_bias, grow};
use compute::timing::TimeSpent;
use compute::{LinearHandle, PackLinear, Products, Runtime};
use packs::semantics::VisionSemantics;
use packs::Pack;
use rayon::prelude::*;

use crate::preprocess::PixelPatches;
use weights::{BlockLinear, Merger, Params, TowerWeights};

#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error("{path}: this pack has no vision tower (build it again with `packs build` from a checkpoint that has model.visual.*)")]
    NoTower { path: String },
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Pack(#[from] packs::PackError),
    #[error(transparent)]
    Backend(#[from] compute::BackendError),
}

/// What the tower gives the decoder for a prompt's images, in prompt order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VisionOutput {
    /// `[tokens, out_hidden]`: every image's rows, image after image.
    pub image_embeds: Vec<f32>,
    /// `[sets, tokens, out_hidden]`: DeepStack set l for every image row.
    pub deepstack: Vec<f32>,
    pub sets: usize,
    /// Image tokens of each image.
    pub tokens_per_image: Vec<usize>,
    /// `(t, h, w)` in patches per image.
    pub grids: Vec<[usize; 3]>,
}

/// Deliberate mistakes, for controls: the tests show the references catch each one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TowerAblation {
    /// Position embeddings and rotary read the rows as raster order instead of merge-block order.
    pub raster_positions: bool,
    /// Interpolate the position table with half-pixel centres instead of aligned corners.
    pub pos_embed_half_pixel: bool,
    /// The tanh GELU in the mergers instead of the erf one.
    pub merger_gelu_tanh: bool,
    /// Tap DeepStack set j before block `deepstack_visual_indexes[j]` instead of after it.
    pub deepstack_before_block: bool,
    /// One attention segment over all images instead of one per image.
    pub joint_attention: bool,
}

/// Reusable activations, grown to the largest encode seen (sized once per encode, never per layer).
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    mlp: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    attn_scratch: SegmentScratch,
    merge_a: Vec<f32>,
    merge_b: Vec<f32>,
    pos: Vec<f32>,
}

/// The vision tower of a pack, weights resolved once.
pub struct Tower {
    pack: Arc<Pack>,
    sem: VisionSemantics,
    weights: TowerWeights,
    inv_freq: Vec<f32>,
    runtime: Runtime,
    /// The linears, by the tower's local weight index (`weights.rs`).
    linears: Vec<LinearHandle>,
    /// The arithmetic of bf16-stored linears, and why.
    products: (Products, &'static str),
    ablation: TowerAblation,
    scratch: Scratch,
    /// Time in attention (the blocks' softmax(q·kᵀ)·v, K/V relayout included) since the last take.
    attention_time: TimeSpent,
    attention_operands: Operands,
}

impl Tower {
    /// Resolves the tower's weights in `pack` and registers its linears on `runtime`; refuses a
    /// pack without a tower by name.
    pub fn new(pack: &Arc<Pack>, runtime: &Runtime) -> Result<Tower, VisionError> {
        let path = pack.path().display().to_string();
        let sem = pack
            .semantics()
            .vision
            .clone()
            .ok_or(VisionError::NoTower { path: path.clone() })?;
        check_semantics(&sem).map_err(|e| VisionError::Input(format!("{path}: {e}")))?;
        let weights = TowerWeights::resolve(pack, &sem)?;
        let at: Vec<PackLinear> = (0..weights.count())
            .map(|l| PackLinear::Table(weights.linear_index(l)))
            .collect();
        let asked = if sem.quant == packs::QuantKind::Bf16 && sem.bf16_products {
            Products::Bf16
        } else {
            Products::F32
        };
        let products = Products::resolve(asked);
        let linears = runtime.register_with(pack, &at, products.0)?;
        let attention_operands =
            attention_operands_for(sem.quant, products.0, Operands::Bf16.has_simd());
        Ok(Tower {
            pack: pack.clone(),
            inv_freq: rotary::inv_freq(sem.rope_theta, sem.head_dim()),
            sem,
            weights,
            runtime: runtime.clone(),
            linears,
            products,
            ablation: TowerAblation::default(),
            scratch: Scratch::default(),
            attention_time: TimeSpent::default(),
            attention_operands,
        })
    }

    pub fn semantics(&self) -> &VisionSemantics {
        &self.sem
    }

    /// How many linears the tower registered on its runtime.
    pub fn linear_count(&self) -> usize {
        self.linears.len()
    }

    /// How the tower's linears multiply, for logs: `"q4"`, or for a bf16 tower `"bf16, bf16
    /// products (AVX-512 BF16)"` / `"bf16, f32 products (...)"`.
    pub fn arithmetic(&self) -> String {
        match self.sem.quant {
            packs::QuantKind::Bf16 => {
                format!("bf16, {} ({})", self.products.0, self.products.1)
            }
            kind => kind.to_string(),
        }
    }

    /// The arithmetic the tower's bf16-stored linears were registered with.
    pub fn products(&self) -> Products {
        self.products.0
    }

    /// The runtime the tower's GEMMs run on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Time the encodes since the last call spent in attention (benchmarks split the tower's time
    /// into GEMMs, from the backend's stats, attention, and the rest).
    pub fn take_attention_time(&mut self) -> Duration {
        self.attention_time.take()
    }

    /// What the tower's attention multiplies: [`attention_operands_for`] the tower's products,
    /// unless [`Tower::use_bf16_attention`] overrode it.
    pub fn attention_operands(&self) -> Operands {
        self.attention_operands
    }

    /// Overrides the attention's operands: bf16 ones (f32 sums, AVX-512 BF16's `vdpbf16ps`) for a
    /// tower stored in bf16 on a CPU that has the instructions, or f32 ones; returns whether the
    /// attention now runs bf16 operands. (A bf16 tower with f32 products, held to transformers
    /// within 1e-4, keeps f32 operands by default: bf16 operands move the wide fixture's rows
    /// 4.7e-4.)
    pub fn use_bf16_attention(&mut self, on: bool) -> bool {
        let can = self.sem.quant == packs::QuantKind::Bf16 && Operands::Bf16.has_simd();
        self.attention_operands = if on && can {
            Operands::Bf16
        } else {
            Operands::F32
        };
        on && can
    }

    /// Sets deliberate mistakes (controls only).
    pub fn set_ablation(&mut self, ablation: TowerAblation) {
        self.ablation = ablation;
    }

    /// Runs the tower over `images` (each attends only to itself) on the runtime.
    pub fn encode(&mut self, images: &[&PixelPatches]) -> Result<VisionOutput, VisionError> {
        self.check_images(images)?;
        let mut s = std::mem::take(&mut self.scratch);
        let (runtime, pool) = (self.runtime.clone(), Arc::clone(self.runtime.pool()));
        let result = runtime.pass(|| self.run(&pool, images, &mut s));
        self.scratch = s;
        let (out, attention) = result?;
        self.attention_time.add(attention);
        Ok(out)
    }

    fn check_images(&self, images: &[&PixelPatches]) -> Result<(), VisionError> {
        let v = &self.sem;
        let (row_len, merge) = (v.patch_row_len(), v.spatial_merge_size);
        if images.is_empty() {
            return Err(VisionError::Input("no images to encode".into()));
        }
        for (i, im) in images.iter().enumerate() {
            let bad = |what: String| Err(VisionError::Input(format!("image {i}: {what}")));
            let [t, h, w] = im.grid;
            if im.row_len != row_len {
                return bad(format!(
                    "pixel rows hold {} values, the tower's patch rows hold {row_len} (channels {} x temporal {} x patch {}²)",
                    im.row_len, v.in_channels, v.temporal_patch_size, v.patch_size
                ));
            }
            if t == 0 || h == 0 || w == 0 || h % merge != 0 || w % merge != 0 {
                return bad(format!(
                    "grid (t, h, w) = ({t}, {h}, {w}): every side must be > 0 and h, w multiples of the merge size {merge}"
                ));
            }
            let rows = t
                .checked_mul(h)
                .and_then(|x| x.checked_mul(w))
                .ok_or_else(|| {
                    VisionError::Input(format!("image {i}: grid ({t}, {h}, {w}) overflows"))
                })?;
            if Some(im.values.len()) != rows.checked_mul(row_len) {
                return bad(format!(
                    "{} pixel values, grid ({t}, {h}, {w}) needs {rows} rows x {row_len} = {}",
                    im.values.len(),
                    rows.saturating_mul(row_len)
                ));
            }
            if let Some(at) = packs::first_non_finite(&im.values) {
                return bad(format!(
                    "pixel value [{}, {}] is {} (not finite)",
                    at / row_len,
                    at % row_len,
                    im.values[at]
                ));
            }
        }
        Ok(())
    }

    /// `y = x · Wᵀ` for the tower's linear `local` (its bias left to the pass that reads `y`).
    fn linear(
        &self,
        local: usize,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), VisionError> {
        self.runtime
            .gemm(&self.pack, self.linears[local], x, rows, y)?;
        Ok(())
    }

    /// `y = x · Wᵀ + bias` for the tower's linear `local`.
    fn gemm(
        &self,
        pool: &rayon::ThreadPool,
        local: usize,
        bias: &[f32],
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<(), VisionError> {
        self.linear(local, x, rows, y)?;
        add_bias(pool, y, bias);
        Ok(())
    }

    fn run(
        &self,
        pool: &rayon::ThreadPool,
        images: &[&PixelPatches],
        s: &mut Scratch,
    ) -> Result<(VisionOutput, Duration), VisionError> {
        let v = &self.sem;
        let ab = self.ablation;
        let w = &self.weights;
        let p: Params<'_> = w.params(&self.pack)?;
        let (h, inter, d, heads) = (
            v.hidden_size,
            v.intermediate_size,
            v.head_dim(),
            v.num_heads,
        );
        let (merge, unit) = (
            v.spatial_merge_size,
            v.spatial_merge_size * v.spatial_merge_size,
        );
        let eps = v.layer_norm_eps as f32;
        let grids: Vec<[usize; 3]> = images.iter().map(|im| im.grid).collect();
        let n: usize = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
        let tokens = n / unit;
        let half = d / 2;
        let coords = positions::patch_coords(&grids, merge, ab.raster_positions);
        let segments = positions::segments(&grids, ab.joint_attention);
        let tasks = pool.current_num_threads().max(1);

        // Patch embedding: one GEMM per image over its pixel rows, the bias after.
        let x = grow(&mut s.x, n * h);
        let mut at = 0;
        for im in images {
            let rows = im.values.len() / im.row_len;
            self.gemm(
                pool,
                w.patch_embed_id(),
                p.biases[w.patch_embed_id()],
                &im.values,
                rows,
                &mut x[at * h..(at + rows) * h],
            )?;
            at += rows;
        }
        // Position embeddings and the rotary tables, per row from its (row, col).
        let side = weights::isqrt(v.num_position_embeddings);
        let frame_of: Vec<(usize, usize)> = grids
            .iter()
            .flat_map(|&[t, gh, gw]| std::iter::repeat_n((gh, gw), t * gh * gw))
            .collect();
        let pos = grow(&mut s.pos, tasks * h);
        let per_task = n.div_ceil(tasks).max(1);
        x.par_chunks_mut(per_task * h)
            .zip(pos.par_chunks_mut(h))
            .enumerate()
            .for_each(|(t, (xs, acc))| {
                for (i, row) in xs.chunks_exact_mut(h).enumerate() {
                    let r = t * per_task + i;
                    pos_embed::add_pos_embed(
                        row,
                        p.pos_embed,
                        side,
                        coords[r],
                        frame_of[r],
                        !ab.pos_embed_half_pixel,
                        acc,
                    );
                }
            });
        let (cos, sin) = (grow(&mut s.cos, n * half), grow(&mut s.sin, n * half));
        cos.par_chunks_mut(half)
            .zip(sin.par_chunks_mut(half))
            .enumerate()
            .for_each(|(r, (c, sn))| rotary::cos_sin(&self.inv_freq, coords[r], c, sn));

        let sets = v.deepstack_visual_indexes.len();
        let out_h = v.out_hidden_size;
        let mut out = VisionOutput {
            image_embeds: vec![0.0; tokens * out_h],
            deepstack: vec![0.0; sets * tokens * out_h],
            sets,
            tokens_per_image: grids.iter().map(|g| g[0] * g[1] * g[2] / unit).collect(),
            grids: grids.clone(),
        };
        let tap = |block: usize, before: bool| -> Option<usize> {
            if before != ab.deepstack_before_block {
                return None;
            }
            v.deepstack_visual_indexes.iter().position(|&i| i == block)
        };

        let mut attention_time = Duration::ZERO;
        // Each block's norm1 is taken with the residual before it (the first one here).
        let [n1w, n1b, ..] = p.block_norms[0];
        norm_rows(&s.x[..n * h], h, n1w, n1b, eps, grow(&mut s.xn, n * h));
        for b in 0..v.depth {
            if let Some(j) = tap(b, true) {
                let set = &mut out.deepstack[j * tokens * out_h..(j + 1) * tokens * out_h];
                self.merger(
                    pool,
                    &p,
                    Merger::DeepStack(j),
                    &s.x[..n * h],
                    n,
                    (&mut s.merge_a, &mut s.merge_b),
                    set,
                )?;
            }
            let [_, _, n2w, n2b] = p.block_norms[b];
            // Attention: (norm1), qkv with its bias and rotary on q and k, attention within
            // segments, proj, residual (and norm2).
            let qkv_id = w.block_id(b, BlockLinear::Qkv);
            let qkv = grow(&mut s.qkv, n * 3 * h);
            self.linear(qkv_id, &s.xn[..n * h], n, qkv)?;
            let (cos, sin, qkv_bias) = (&s.cos[..n * half], &s.sin[..n * half], p.biases[qkv_id]);
            qkv.par_chunks_mut(3 * h).enumerate().for_each(|(r, row)| {
                let (c, sn) = (
                    &cos[r * half..(r + 1) * half],
                    &sin[r * half..(r + 1) * half],
                );
                for (v, b) in row.iter_mut().zip(qkv_bias) {
                    *v += b;
                }
                for head in row[..2 * h].chunks_exact_mut(d) {
                    rotary::rotate_half(head, c, sn);
                }
            });
            let t_attn = Instant::now();
            attend_segments(
                &s.qkv[..n * 3 * h],
                heads,
                d,
                &segments,
                self.attention_operands(),
                &mut s.attn_scratch,
                grow(&mut s.attn, n * h),
            );
            attention_time += t_attn.elapsed();
            let proj_id = w.block_id(b, BlockLinear::Proj);
            self.linear(proj_id, &s.attn[..n * h], n, grow(&mut s.proj, n * h))?;
            residual_then_norm(
                &mut s.x[..n * h],
                &s.proj[..n * h],
                p.biases[proj_id],
                Some([n2w, n2b]),
                eps,
                grow(&mut s.xn, n * h),
            );
            // MLP: (norm2), fc1 with its bias and the tanh GELU, fc2, residual (and the next
            // block's norm1).
            let fc1 = w.block_id(b, BlockLinear::Fc1);
            let mlp = grow(&mut s.mlp, n * inter);
            self.linear(fc1, &s.xn[..n * h], n, mlp)?;
            let fc1_bias = p.biases[fc1];
            mlp.par_chunks_mut(inter)
                .for_each(|row| gelu::bias_gelu_tanh_inplace(row, Some(fc1_bias)));
            let fc2 = w.block_id(b, BlockLinear::Fc2);
            self.linear(fc2, &s.mlp[..n * inter], n, grow(&mut s.proj, n * h))?;
            let next_norm1 = p.block_norms.get(b + 1).map(|[nw, nb, ..]| [*nw, *nb]);
            residual_then_norm(
                &mut s.x[..n * h],
                &s.proj[..n * h],
                p.biases[fc2],
                next_norm1,
                eps,
                grow(&mut s.xn, n * h),
            );
            if let Some(j) = tap(b, false) {
                let set = &mut out.deepstack[j * tokens * out_h..(j + 1) * tokens * out_h];
                self.merger(
                    pool,
                    &p,
                    Merger::DeepStack(j),
                    &s.x[..n * h],
                    n,
                    (&mut s.merge_a, &mut s.merge_b),
                    set,
                )?;
            }
        }
        self.merger(
            pool,
            &p,
            Merger::Final,
            &s.x[..n * h],
            n,
            (&mut s.merge_a, &mut s.merge_b),
            &mut out.image_embeds,
        )?;
        Ok((out, attention_time))
    }

    /// A patch merger over the `n` rows of `x`: LayerNorm (per patch for the final merger, after
    /// concatenating each merge block's patches for DeepStack's), fc1, erf GELU, fc2 into `out`.
    #[allow(clippy::too_many_arguments)]
    fn merger(
        &self,
        pool: &rayon::ThreadPool,
        p: &Params<'_>,
        m: Merger,
        x: &[f32],
        n: usize,
        (normed, hidden): (&mut Vec<f32>, &mut Vec<f32>),
        out: &mut [f32],
    ) -> Result<(), VisionError> {
        let v = &self.sem;
        let (h, merged) = (v.hidden_size, v.merged_hidden());
        let tokens = n * h / merged;
        let eps = v.layer_norm_eps as f32;
        let [nw, nb] = p.merger_norms[self.weights.merger_norm_slot(m)];
        let width = match m {
            Merger::Final => h,
            Merger::DeepStack(_) => merged,
        };
        norm_rows(x, width, nw, nb, eps, grow(normed, n * h));
        let (fc1, fc2) = self.weights.merger_ids(m);
        let hid = grow(hidden, tokens * merged);
        self.linear(fc1, &normed[..n * h], tokens, hid)?;
        let (tanh, fc1_bias) = (self.ablation.merger_gelu_tanh, p.biases[fc1]);
        hid.par_chunks_mut(merged).for_each(|row| {
            for (v, b) in row.iter_mut().zip(fc1_bias) {
                *v += b;
            }
            if tanh {
                gelu::gelu_tanh_inplace(row)
            } else {
                gelu::gelu_erf_inplace(row)
            }
        });
        self.gemm(
            pool,
            fc2,
            p.biases[fc2],
            &hidden[..tokens * merged],
            tokens,
            out,
        )?;
        Ok(())
    }
}

/// The attention's operands for a tower stored as `quant` whose bf16 linears run `products`, on
/// a CPU that has (`bf16_simd`) or lacks AVX-512 BF16's attention kernel: bf16 operands exactly
/// when the products are bf16 and the kernel exists, f32 otherwise (`XDNA_VL_BF16_PRODUCTS=f32`
/// thus turns both off). A bf16-products tower rounds its activations to bf16 before every
/// linear already (3.0e-3 from transformers on the wide fixture); rounding q, k and v too moves
/// it little (3.0e-3 to 3.3e-3, README "The tower's precision") and cut the attention of a 448x448
/// picture on the 2B shape from 391 ms to 289 ms.
pub fn attention_operands_for(
    quant: packs::QuantKind,
    products: Products,
    bf16_simd: bool,
) -> Operands {
    if quant == packs::QuantKind::Bf16 && products == Products::Bf16 && bf16_simd {
        Operands::Bf16
    } else {
        Operands::F32
    }
}

/// Refuses vision facts the tower cannot run.
fn check_semantics(v: &VisionSemantics) -> Result<(), String> {
    if v.num_heads == 0 || !v.hidden_size.is_multiple_of(v.num_heads) {
        return Err(format!(
            "vision hidden_size {} is not a multiple of num_heads {}",
            v.hidden_size, v.num_heads
        ));
    }
    if !v.head_dim().is_multiple_of(4) {
        return Err(format!(
            "vision head_dim {} must be a multiple of 4 (2-D rotary: head_dim/4 frequencies per axis)",
            v.head_dim()
        ));
    }
    if v.spatial_merge_size == 0 || v.depth == 0 || v.num_position_embeddings == 0 {
        return Err(
            "vision spatial_merge_size, depth and num_position_embeddings must be > 0".into(),
        );
    }
    if let Some(&i) = v.deepstack_visual_indexes.iter().find(|&&i| i >= v.depth) {
        return Err(format!(
            "deepstack_visual_indexes holds {i}, the tower has {} blocks",
            v.depth
        ));
    }
    if v.hidden_act != "gelu_pytorch_tanh" {
        return Err(format!(
            "vision hidden_act {:?} is not supported (expected \"gelu_pytorch_tanh\")",
            v.hidden_act
        ));
    }
    Ok(())
}

/// Rows per task of the row passes below: [`layer_norm::layer_norm_rows`] normalizes 8 rows in
/// lockstep.
const ROWS_PER_TASK: usize = 8;

/// LayerNorm over every `width`-wide row of `x` into `out`.
fn norm_rows(x: &[f32], width: usize, w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    out.par_chunks_mut(ROWS_PER_TASK * width)
        .zip(x.par_chunks(ROWS_PER_TASK * width))
        .for_each(|(o, r)| layer_norm::layer_norm_rows(r, w, b, eps, o));
}

/// The residual `x += y + bias` (a linear's output `y` and its bias: the bits of adding the bias to
/// `y` first), then, when `norm` (weight, bias) is given, `xn = LayerNorm(x)` of the same rows
/// while they are in cache: one pass over the rows instead of three.
fn residual_then_norm(
    x: &mut [f32],
    y: &[f32],
    bias: &[f32],
    norm: Option<[&[f32]; 2]>,
    eps: f32,
    xn: &mut [f32],
) {
    let width = bias.len();
    let task = ROWS_PER_TASK * width;
    x.par_chunks_mut(task)
        .zip(y.par_chunks(task))
        .zip(xn.par_chunks_mut(task))
        .for_each(|((xs, ys), xns)| {
            for (xr, yr) in xs.chunks_exact_mut(width).zip(ys.chunks_exact(width)) {
                for ((a, &y), &b) in xr.iter_mut().zip(yr).zip(bias) {
                    *a += y + b;
                }
            }
            if let Some([w, b]) = norm {
                layer_norm::layer_norm_rows(xs, w, b, eps, xns);
            }
        });
}
