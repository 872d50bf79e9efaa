//! Streams one weight into its stored tensors, a block of rows at a time, so memory stays bounded
//! by the block size whatever the checkpoint size. Both `build` and `random` go through here.

use half::bf16;
use rayon::prelude::*;

use crate::error::BuildError;
use crate::layout::{Storage, WeightPlan};
use crate::names;
use crate::quant::{self, Q4_GROUP};
use crate::writer::PackWriter;

/// f32 values per block: 4 Mi values = 16 MiB, plus the encoded copy.
const BLOCK_VALUES: usize = 4 << 20;

/// Rows handed to one rayon task.
const ROWS_PER_TASK: usize = 16;

/// Writes `weight` (and its scales, if quantized). `fill(first_row, values)` must fill `values`
/// with rows `first_row ..` of the weight's f32 values (`values.len()` is a whole number of rows).
pub fn write_weight<F>(
    writer: &mut PackWriter,
    weight: &WeightPlan,
    mut fill: F,
) -> Result<(), BuildError>
where
    F: FnMut(usize, &mut [f32]) -> Result<(), BuildError>,
{
    let (rows, cols) = (weight.rows, weight.cols);
    let storage = weight.storage();
    let mut rows_per_block = (BLOCK_VALUES / cols.max(1)).clamp(1, rows.max(1));
    if storage == Storage::Q4 {
        // Whole panels per block (the last block may end with the weight's partial panel), so
        // that each block's panels are the weight's.
        rows_per_block = (rows_per_block - rows_per_block % quant::Q4_PANEL)
            .max(quant::Q4_PANEL.min(rows.max(1)));
    }
    let mut values = vec![0f32; rows_per_block * cols];
    let mut scales_bytes: Vec<u8> = Vec::new();
    writer.begin(&weight.name)?;
    let mut first_row = 0;
    while first_row < rows {
        let block_rows = rows_per_block.min(rows - first_row);
        let block = &mut values[..block_rows * cols];
        fill(first_row, block)?;
        if weight.stored_plus_one {
            // transformers' `1.0 + weight.float()`: the same f32 sum, once, at build time.
            for v in block.iter_mut() {
                *v += 1.0;
            }
        }
        if let Some(i) = first_non_finite(block) {
            return Err(BuildError::NonFinite {
                tensor: weight.source.clone(),
                row: first_row + i / cols.max(1),
                value: block[i],
            });
        }
        match storage {
            Storage::F32 => writer.write(bytemuck::cast_slice(block))?,
            Storage::Bf16 => {
                let converted: Vec<bf16> = block.par_iter().map(|&v| bf16::from_f32(v)).collect();
                writer.write(bytemuck::cast_slice(&converted))?;
            }
            Storage::I8 => {
                let mut codes = vec![0i8; block.len()];
                let mut scales = vec![0f32; block_rows];
                codes
                    .par_chunks_mut(cols * ROWS_PER_TASK)
                    .zip(block.par_chunks(cols * ROWS_PER_TASK))
                    .zip(scales.par_chunks_mut(ROWS_PER_TASK))
                    .for_each(|((codes, rows), scales)| {
                        for ((c, r), s) in codes.chunks_mut(cols).zip(rows.chunks(cols)).zip(scales)
                        {
                            *s = quant::quantize_i8_row(r, c);
                        }
                    });
                writer.write(bytemuck::cast_slice(&codes))?;
                scales_bytes.extend_from_slice(bytemuck::cast_slice(&scales));
            }
            Storage::Q4 => {
                let groups = cols / Q4_GROUP;
                let mut codes = vec![0u8; block.len() / 2];
                let mut scales = vec![bf16::ZERO; block_rows * groups];
                codes
                    .par_chunks_mut(cols / 2 * ROWS_PER_TASK)
                    .zip(block.par_chunks(cols * ROWS_PER_TASK))
                    .zip(scales.par_chunks_mut(groups * ROWS_PER_TASK))
                    .for_each(|((codes, rows), scales)| {
                        for ((c, r), s) in codes
                            .chunks_mut(cols / 2)
                            .zip(rows.chunks(cols))
                            .zip(scales.chunks_mut(groups))
                        {
                            quant::quantize_q4_row(r, c, s);
                        }
                    });
                writer.write(&quant::q4_to_panels(&codes, block_rows, cols))?;
                scales_bytes.extend_from_slice(bytemuck::cast_slice(&scales));
            }
        }
        first_row += block_rows;
    }
    writer.end()?;
    if matches!(storage, Storage::I8 | Storage::Q4) {
        writer.write_tensor(&names::scales_of(&weight.name), &scales_bytes)?;
    }
    Ok(())
}

/// Index of the first NaN or infinity. Checked a chunk per task: per-element rayon items cost
/// more than the check itself.
pub fn first_non_finite(values: &[f32]) -> Option<usize> {
    const CHUNK: usize = 1 << 14;
    let chunk = values
        .par_chunks(CHUNK)
        .position_first(|c| c.iter().any(|v| !v.is_finite()))?;
    let start = chunk * CHUNK;
    values[start..]
        .iter()
        .position(|v| !v.is_finite())
        .map(|i| start + i)
}
