//! libjpeg-turbo's islow inverse DCT (`JDCT_ISLOW`, the default) as its x86-64 AVX2 kernel computes
//! it (simd/x86_64/jidctint-avx2.asm), which is what Pillow runs on the machines this targets. It is
//! jidctint.c's arithmetic with 16-bit lanes where the C code has `int`: the dequantizing multiply,
//! `in0 +- in4` and the odd part's `in7 + in3` / `in5 + in1` wrap at 16 bits, each pass's outputs
//! saturate to 16 bits (`packssdw`), the samples saturate to -128..=127 before the +128 (where C wraps
//! through its range-limit table), and the all-zero shortcut is taken per block (rows 1..7 of the
//! coefficients all zero), not per column. On ordinary data both agree; on large coefficients (a
//! noisy picture at high quality) they differ, and there Pillow gives the AVX2 bytes.

const CONST_BITS: u32 = 13;
const PASS1_BITS: u32 = 2;
const F_0_298: i32 = 2446;
const F_0_390: i32 = 3196;
const F_0_541: i32 = 4433;
const F_0_765: i32 = 6270;
const F_0_899: i32 = 7373;
const F_1_175: i32 = 9633;
const F_1_501: i32 = 12299;
const F_1_847: i32 = 15137;
const F_1_961: i32 = 16069;
const F_2_053: i32 = 16819;
const F_2_562: i32 = 20995;
const F_3_072: i32 = 25172;

/// Eight lanes of 16 bits, as one AVX2 register holds a block's row (pass 1) or column (pass 2).
type Lanes = [i16; 8];

fn lanes(f: impl Fn(usize) -> i32) -> [i32; 8] {
    std::array::from_fn(f)
}

/// `pmaddwd` of one pair per lane.
fn madd(a: &Lanes, ca: i32, b: &Lanes, cb: i32) -> [i32; 8] {
    lanes(|i| (a[i] as i32 * ca).wrapping_add(b[i] as i32 * cb))
}

/// `paddw`.
fn add16(a: &Lanes, b: &Lanes) -> Lanes {
    std::array::from_fn(|i| a[i].wrapping_add(b[i]))
}

/// One 1-D islow pass over eight lanes at once (the `DODCT` macro): `x[k]` holds coefficient `k`
/// of each lane; the result `[k]` holds output `k`, descaled by `shift` and saturated to 16 bits.
fn dodct(x: &[Lanes; 8], shift: u32) -> [Lanes; 8] {
    // Even part.
    let tmp3 = madd(&x[2], F_0_541 + F_0_765, &x[6], F_0_541);
    let tmp2 = madd(&x[6], F_0_541 - F_1_847, &x[2], F_0_541);
    let sum04 = add16(&x[0], &x[4]);
    let neg4: Lanes = std::array::from_fn(|i| x[4][i].wrapping_neg());
    let diff04 = add16(&x[0], &neg4);
    let tmp0 = lanes(|i| (sum04[i] as i32) << CONST_BITS);
    let tmp1 = lanes(|i| (diff04[i] as i32) << CONST_BITS);
    // Odd part.
    let z3 = add16(&x[7], &x[3]);
    let z4 = add16(&x[5], &x[1]);
    let z3s = madd(&z3, F_1_175 - F_1_961, &z4, F_1_175);
    let z4s = madd(&z4, F_1_175 - F_0_390, &z3, F_1_175);
    let t0 = madd(&x[7], F_0_298 - F_0_899, &x[1], -F_0_899);
    let t1 = madd(&x[5], F_2_053 - F_2_562, &x[3], -F_2_562);
    let t3 = madd(&x[7], -F_0_899, &x[1], F_1_501 - F_0_899);
    let t2 = madd(&x[5], -F_2_562, &x[3], F_3_072 - F_2_562);
    let round = 1i32 << (shift - 1);
    let mut out = [[0i16; 8]; 8];
    for i in 0..8 {
        let (t0, t1) = (t0[i].wrapping_add(z3s[i]), t1[i].wrapping_add(z4s[i]));
        let (t2, t3) = (t2[i].wrapping_add(z3s[i]), t3[i].wrapping_add(z4s[i]));
        let (tmp10, tmp13) = (tmp0[i].wrapping_add(tmp3[i]), tmp0[i].wrapping_sub(tmp3[i]));
        let (tmp11, tmp12) = (tmp1[i].wrapping_add(tmp2[i]), tmp1[i].wrapping_sub(tmp2[i]));
        // `packssdw`: saturated to 16 bits.
        let o = |v: i32| {
            (v.wrapping_add(round) >> shift).clamp(i16::MIN as i32, i16::MAX as i32) as i16
        };
        out[0][i] = o(tmp10.wrapping_add(t3));
        out[1][i] = o(tmp11.wrapping_add(t2));
        out[2][i] = o(tmp12.wrapping_add(t1));
        out[3][i] = o(tmp13.wrapping_add(t0));
        out[4][i] = o(tmp13.wrapping_sub(t0));
        out[5][i] = o(tmp12.wrapping_sub(t1));
        out[6][i] = o(tmp11.wrapping_sub(t2));
        out[7][i] = o(tmp10.wrapping_sub(t3));
    }
    out
}

fn transpose(m: &[Lanes; 8]) -> [Lanes; 8] {
    std::array::from_fn(|r| std::array::from_fn(|c| m[c][r]))
}

/// One 8x8 block: `coef` and `quant` in natural (row-major) order; writes 8 rows of 8 samples at
/// `out[row * stride ..]`.
pub fn idct_islow(coef: &[i16; 64], quant: &[u16; 64], out: &mut [u8], stride: usize) {
    // `pmullw`: the low 16 bits of the product. Row r of the block, its 8 columns as lanes.
    let rows: [Lanes; 8] = std::array::from_fn(|r| {
        std::array::from_fn(|c| coef[r * 8 + c].wrapping_mul(quant[r * 8 + c] as i16))
    });
    // Pass 1 (columns): workspace[k] = output k of every column.
    let ws = if coef[8..].iter().all(|&c| c == 0) {
        let dc: Lanes = std::array::from_fn(|c| rows[0][c].wrapping_shl(PASS1_BITS));
        [dc; 8]
    } else {
        dodct(&rows, CONST_BITS - PASS1_BITS)
    };
    // Pass 2 (rows): lanes are the block's rows, inputs its columns.
    let samples = dodct(&transpose(&ws), CONST_BITS + PASS1_BITS + 3);
    for (r, line) in out.chunks_mut(stride).take(8).enumerate() {
        for (c, o) in line[..8].iter_mut().enumerate() {
            // `packsswb`, then `paddb 128`.
            *o = (samples[c][r].clamp(-128, 127) + 128) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DC-only block is flat at DC*q/8 + 128, clamped.
    #[test]
    fn dc_only_block() {
        let quant = [1u16; 64];
        for (dc, want) in [(80i16, 138u8), (-80, 118), (2000, 255), (-2000, 0)] {
            let mut coef = [0i16; 64];
            coef[0] = dc;
            let mut out = [0u8; 64];
            idct_islow(&coef, &quant, &mut out, 8);
            assert!(out.iter().all(|&v| v == want), "{dc}: {out:?}");
        }
    }

    /// Where C and AVX2 part: the dequantizing multiply wraps at 16 bits (pmullw), and so does the
    /// block shortcut's `<< 2`. jidctint.c's `int` arithmetic gives 255 for both blocks (DC 40 000 / 8
    /// and 9 000 * 4 / 32, clamped); the AVX2 kernel, and so Pillow, gives 0.
    #[test]
    fn sixteen_bit_lanes_wrap_as_the_avx2_kernel() {
        let mut out = [0u8; 64];
        // Full path (an AC coefficient in row 1): 1000 * 40 = 40 000 wraps to -25 536.
        let mut coef = [0i16; 64];
        coef[0] = 1000;
        coef[8] = 1;
        let mut quant = [1u16; 64];
        quant[0] = 40;
        idct_islow(&coef, &quant, &mut out, 8);
        assert_eq!(out[0], 0, "{out:?}");
        // Shortcut (rows 1..7 zero): 9000 << 2 = 36 000 wraps to -29 536.
        let mut coef = [0i16; 64];
        coef[0] = 9000;
        idct_islow(&coef, &[1u16; 64], &mut out, 8);
        assert!(out.iter().all(|&v| v == 0), "{out:?}");
        // Control: without the wrap (DC 4000) the block is 255 on both.
        coef[0] = 4000;
        idct_islow(&coef, &[1u16; 64], &mut out, 8);
        assert!(out.iter().all(|&v| v == 255), "{out:?}");
    }
}
