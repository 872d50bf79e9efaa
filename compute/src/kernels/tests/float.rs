//! f32 and bf16 weights on every path against `scalar::dot_f32`, bit for bit, and the bf16 cache's
//! conversion against `half`.

use super::*;

#[test]
fn f32_and_bf16_match_the_scalar_dot_bit_for_bit() {
    let mut rng = Rng(4);
    for k in [1, 15, 16, 17, 33, 100, 2048] {
        for rows in [1, 2, 3] {
            for n in [1, 4, 7] {
                let x = activations(&mut rng, rows, k);
                let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
                let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
                let wbf: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
                let mut expect = vec![0f32; rows * n];
                let mut expect_b = vec![0f32; rows * n];
                for r in 0..rows {
                    for j in 0..n {
                        let xr = &x[r * k..(r + 1) * k];
                        expect[r * n + j] = scalar::dot_f32(xr, &w[j * k..(j + 1) * k]);
                        expect_b[r * n + j] = scalar::dot_f32(xr, &wbf[j * k..(j + 1) * k]);
                    }
                }
                check_all_paths("f32", &LinearData::F32(&w), k, n, &x, rows, None, &expect);
                check_all_paths(
                    "bf16",
                    &LinearData::Bf16(&wb),
                    k,
                    n,
                    &x,
                    rows,
                    None,
                    &expect_b,
                );
            }
        }
    }
}

#[test]
fn the_f32_order_matters_so_the_bit_check_can_fail() {
    // Control for the f32 test: a plain left-to-right sum of the same products differs in the last
    // bits on these inputs, so matching `dot_f32` bit for bit is a real constraint.
    let mut rng = Rng(5);
    let a: Vec<f32> = (0..2048).map(|_| rng.unit()).collect();
    let b: Vec<f32> = (0..2048).map(|_| rng.unit()).collect();
    let plain = a.iter().zip(&b).fold(0f32, |s, (x, y)| s + x * y);
    assert_ne!(plain.to_bits(), scalar::dot_f32(&a, &b).to_bits());
}

/// The bf16 cache's writes give `half::bf16::from_f32`'s bits on every element: ties to even either
/// way, the largest finite values rounding to infinity, infinities, NaNs with payloads, subnormals,
/// lengths around the 8-lane blocks. The control (plain truncation) differs on these inputs.
#[test]
fn f32_to_bf16_gives_halfs_bits() {
    let special: Vec<u32> = vec![
        0x0000_0000,
        0x8000_0000,
        0x3F80_8000,
        0x3F81_8000,
        0x3F80_8001,
        0x3F80_7FFF,
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        0x7F80_0000,
        0xFF80_0000,
        0x7F80_0001,
        0xFFC1_2345,
        0x7FFF_FFFF,
        0x0000_8000,
        0x0001_8000,
        0x807F_FFFF,
    ];
    let mut rng = Rng(17);
    let random: Vec<u32> = (0..1000).map(|_| rng.next() as u32).collect();
    for len in [0, 1, 7, 8, 9, 16, 17, special.len()] {
        let src: Vec<f32> = special
            .iter()
            .cycle()
            .take(len)
            .map(|&b| f32::from_bits(b))
            .collect();
        let mut got = vec![bf16::ZERO; len];
        f32_to_bf16(&mut got, &src);
        let want: Vec<u16> = src.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        let got: Vec<u16> = got.iter().map(|b| b.to_bits()).collect();
        assert_eq!(got, want, "len {len}");
    }
    let src: Vec<f32> = random.iter().map(|&b| f32::from_bits(b)).collect();
    let mut got = vec![bf16::ZERO; src.len()];
    f32_to_bf16(&mut got, &src);
    for (x, g) in src.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            bf16::from_f32(*x).to_bits(),
            "{:#010x}",
            x.to_bits()
        );
    }
    // Control: truncating instead of rounding gives other bits on the ties and near-ties above.
    let truncated: Vec<u16> = special.iter().map(|&b| (b >> 16) as u16).collect();
    let rounded: Vec<u16> = special
        .iter()
        .map(|&b| bf16::from_f32(f32::from_bits(b)).to_bits())
        .collect();
    assert_ne!(truncated, rounded);
}
