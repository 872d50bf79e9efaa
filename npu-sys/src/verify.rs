//! Checking a design against the pack's scalar oracle: random weights and activations through
//! [`GemmDesign`], compared with `packs::quant::gemm_*_ref`. On the software NPU the results are
//! byte-identical; on a real NPU this is the check that a built design computes what the manifest
//! says (`npu-designs verify`).

use half::bf16;
use packs::quant::{gemm_i8_ref, gemm_q4_ref, quantize_activation_row, Q4_GROUP};

use crate::designs::DesignEntry;
use crate::device::Device;
use crate::gemm::{GemmDesign, GemmError};
use crate::geometry::DesignKind;

/// A deliberately wrong B layout, to show a comparison can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedLayoutError {
    /// i8: B uploaded as [K x N] (W transposed) instead of [N x K].
    TransposedB,
    /// q4: the two nibbles of every code byte exchanged.
    SwappedNibbles,
}

/// Random inputs for one design, in the pack's layouts.
#[derive(Clone, Debug)]
pub struct GemmCase {
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    pub a: Vec<i8>,
    pub a_scales: Vec<f32>,
    /// i8: codes [n*k]; q4: packed codes [n*k/2] (as u8 bit patterns).
    pub w_codes: Vec<u8>,
    pub w_scales_i8: Vec<f32>,
    pub w_scales_q4: Vec<bf16>,
}

/// A small deterministic generator (splitmix64): tests and the CLI need no rand crate.
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

impl GemmCase {
    /// `rows` activation rows quantized with the pack's activation rule, and random weights of
    /// `kind` (codes across the full range, scales of varied magnitude).
    pub fn random(kind: DesignKind, rows: usize, k: usize, n: usize, seed: u64) -> GemmCase {
        let mut rng = SplitMix::new(seed);
        let mut a = vec![0i8; rows * k];
        let mut a_scales = Vec::with_capacity(rows);
        for row in a.chunks_exact_mut(k) {
            let magnitude = 0.1 + 4.0 * (rng.unit() + 1.0);
            let x: Vec<f32> = (0..k).map(|_| rng.unit() * magnitude).collect();
            a_scales.push(quantize_activation_row(&x, row));
        }
        let mut case = GemmCase {
            rows,
            k,
            n,
            a,
            a_scales,
            w_codes: Vec::new(),
            w_scales_i8: Vec::new(),
            w_scales_q4: Vec::new(),
        };
        match kind {
            DesignKind::I8 => {
                case.w_codes = (0..n * k)
                    .map(|_| (rng.next_u64() % 255) as u8 ^ 0x80)
                    .collect();
                case.w_scales_i8 = (0..n).map(|_| (rng.unit() + 1.5) * 0.01).collect();
            }
            DesignKind::Q4 => {
                case.w_codes = (0..n * k / 2).map(|_| rng.next_u64() as u8).collect();
                case.w_scales_q4 = (0..n * k / Q4_GROUP)
                    .map(|_| bf16::from_f32(rng.unit() * 0.05))
                    .collect();
            }
        }
        case
    }

    fn w_i8(&self) -> &[i8] {
        bytemuck_i8(&self.w_codes)
    }

    /// The oracle's output [rows x n].
    pub fn expected(&self, kind: DesignKind) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.n];
        let (m, k, n) = (self.rows, self.k, self.n);
        match kind {
            DesignKind::I8 => gemm_i8_ref(
                &self.a,
                &self.a_scales,
                m,
                k,
                self.w_i8(),
                &self.w_scales_i8,
                n,
                &mut out,
            ),
            DesignKind::Q4 => gemm_q4_ref(
                &self.a,
                &self.a_scales,
                m,
                k,
                &self.w_codes,
                &self.w_scales_q4,
                n,
                &mut out,
            ),
        }
        out
    }

    /// The weight codes as uploaded, with an optional planted layout error.
    pub fn uploaded_codes(&self, planted: Option<PlantedLayoutError>) -> Vec<u8> {
        match planted {
            None => self.w_codes.clone(),
            Some(PlantedLayoutError::SwappedNibbles) => {
                self.w_codes.iter().map(|b| b.rotate_left(4)).collect()
            }
            Some(PlantedLayoutError::TransposedB) => {
                let (k, n) = (self.k, self.n);
                let mut transposed = vec![0u8; n * k];
                for row in 0..n {
                    for col in 0..k {
                        // Element (row, col) of [N x K] stored where [K x N] keeps it.
                        transposed[col * n + row] = self.w_codes[row * k + col];
                    }
                }
                transposed
            }
        }
    }
}

fn bytemuck_i8(bytes: &[u8]) -> &[i8] {
    bytemuck::cast_slice(bytes)
}

/// How a design's results compared with the oracle.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyReport {
    pub design: String,
    pub elements: usize,
    /// Elements whose f32 bits equal the oracle's.
    pub identical: usize,
    pub max_abs_diff: f32,
}

impl VerifyReport {
    pub fn byte_identical(&self) -> bool {
        self.identical == self.elements
    }
}

/// Uploads the case's weights into `entry`'s design, runs the case's rows and compares every
/// output with the oracle. `rows` may be less than the design's M tile (the tile is padded).
pub fn verify_design(
    device: &Device,
    entry: &DesignEntry,
    case: &GemmCase,
    planted: Option<PlantedLayoutError>,
) -> Result<VerifyReport, GemmError> {
    let g = entry.geometry;
    let codes = case.uploaded_codes(planted);
    let mut gemm = match g.kind {
        DesignKind::I8 => GemmDesign::new_i8(
            device,
            entry,
            bytemuck_i8(&codes),
            &case.w_scales_i8,
            case.n,
        )?,
        DesignKind::Q4 => GemmDesign::new_q4(device, entry, &codes, &case.w_scales_q4, case.n)?,
    };
    let mut got = vec![0f32; case.rows * case.n];
    gemm.run_scaled(&case.a, &case.a_scales, case.rows, &mut got, case.n)?;
    let expected = case.expected(g.kind);
    let identical = got
        .iter()
        .zip(&expected)
        .filter(|(a, b)| a.to_bits() == b.to_bits())
        .count();
    let max_abs_diff = got
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    Ok(VerifyReport {
        design: entry.name.clone(),
        elements: got.len(),
        identical,
        max_abs_diff,
    })
}
