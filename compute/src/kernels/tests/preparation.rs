//! Activation rows prepared for the integer kernels: the quantizer's bytes, the q4 group layout and
//! sums, and the reuse of a preparation only for the same bits.

use super::*;

/// Inputs for the quantizer: ties at exactly .5 after the division, values at the clamp, zeros,
/// signed zeros, subnormals, huge and non-finite values, lengths around the vector widths.
fn quantizer_rows() -> Vec<Vec<f32>> {
    let mut rng = Rng(6);
    let mut rows = Vec::new();
    for len in [0, 1, 7, 8, 9, 31, 32, 33, 100, 2048] {
        rows.push((0..len).map(|_| rng.unit() * 10.0).collect::<Vec<f32>>());
    }
    // max = 127 makes the scale exactly 1: x.5 values are exact ties.
    let mut ties: Vec<f32> = (-127..127).map(|i| i as f32 + 0.5).collect();
    ties.push(127.0);
    rows.push(ties);
    // max = 254: scale 2, odd integers are ties after the division.
    rows.push(
        (-127..=127)
            .map(|i| (2 * i + 1) as f32)
            .chain([254.0])
            .collect(),
    );
    rows.push(vec![0.0; 40]);
    rows.push(vec![-0.0; 40]);
    rows.push(
        (0..40)
            .map(|i| if i % 2 == 0 { -0.0 } else { 1e-40 })
            .collect(),
    );
    rows.push((0..40).map(|i| f32::from_bits(1 + i)).collect());
    rows.push(
        (0..40)
            .map(|i| if i == 17 { f32::MAX } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| if i == 3 { f32::NAN } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| if i == 39 { f32::NAN } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| if i == 5 { f32::INFINITY } else { i as f32 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| {
                if i == 5 {
                    f32::NEG_INFINITY
                } else {
                    -(i as f32)
                }
            })
            .collect(),
    );
    rows
}

#[test]
fn the_q4_layout_is_the_same_on_every_path() {
    // Every instruction set reorders codes and sums groups as the portable form does: extreme and
    // random codes, K from one group to an unpaired last group past the 2B shapes.
    let mut rng = Rng(10);
    for groups in [1usize, 2, 3, 8, 9, 64, 193] {
        for fill in 0..3 {
            let codes: Vec<i8> = (0..groups * Q4_GROUP)
                .map(|i| match fill {
                    0 => rng.byte() as i8,
                    1 => 127,
                    _ => [-127, -128, 127][i % 3],
                })
                .collect();
            let mut want = codes.clone();
            let mut want_sums = vec![0i32; groups];
            activations::q4_groups_row_scalar(&mut want, &mut want_sums);
            for kern in Isa::available()
                .into_iter()
                .map(|i| Kernels::new(i).unwrap())
            {
                let mut got = codes.clone();
                let mut sums = vec![1i32; groups];
                kern.q4_groups_row(&mut got, &mut sums);
                assert_eq!(got, want, "{kern:?} {groups} groups fill {fill}");
                assert_eq!(sums, want_sums, "{kern:?} {groups} groups fill {fill}");
            }
        }
    }
}

#[test]
fn quantizer_gives_the_oracle_bytes() {
    for kern in Isa::available()
        .into_iter()
        .map(|i| Kernels::new(i).unwrap())
    {
        for (i, x) in quantizer_rows().iter().enumerate() {
            let mut want = vec![0i8; x.len()];
            let mut got = vec![1i8; x.len()];
            let s_want = quant::quantize_activation_row(x, &mut want);
            let s_got = kern.quantize_row(x, &mut got);
            assert_eq!(s_got.to_bits(), s_want.to_bits(), "{kern:?} row {i} scale");
            assert_eq!(got, want, "{kern:?} row {i} codes");
        }
    }
}

#[test]
fn the_tie_rows_hold_real_ties() {
    // Control: round-half-to-even gives other codes on the tie rows, so they test the rounding rule.
    let rows = quantizer_rows();
    let ties = rows
        .iter()
        .find(|r| r.len() == 255 && r[0] == -126.5)
        .expect("tie row");
    let differs = ties
        .iter()
        .filter(|&&v| v.round() != v.round_ties_even())
        .count();
    assert!(differs > 100, "{differs}");
}

#[test]
fn prepared_activations_are_reused_only_for_the_same_bits() {
    let kern = Kernels::best();
    let mut acts = Activations::default();
    let mut x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
    assert!(acts.prepare(kern, ActivationLayout::Natural, &x, 2, 32));
    assert!(!acts.prepare(kern, ActivationLayout::Natural, &x, 2, 32));
    // Another layout, shape, or a single changed bit recomputes.
    assert!(acts.prepare(kern, ActivationLayout::Q4Groups, &x, 2, 32));
    assert!(acts.prepare(kern, ActivationLayout::Q4Groups, &x, 1, 64));
    x[63] = f32::from_bits(x[63].to_bits() ^ 1);
    assert!(acts.prepare(kern, ActivationLayout::Q4Groups, &x, 1, 64));
    // The q4 layout of a pair: evens of group 0, evens of group 1, odds of 0, odds of 1; sums are
    // 8 x each group's sum.
    let mut natural = vec![0i8; 64];
    let s = quant::quantize_activation_row(&x, &mut natural);
    assert_eq!(acts.scale(0), s);
    let c = acts.codes(0);
    assert_eq!((c[0], c[1], c[15]), (natural[0], natural[2], natural[30]));
    assert_eq!((c[16], c[17]), (natural[32], natural[34]));
    assert_eq!(
        (c[32], c[33], c[48], c[63]),
        (natural[1], natural[3], natural[33], natural[63])
    );
    // A last unpaired group keeps its evens, then its odds.
    assert_eq!(q4_halves(2, 3), (64, 80));
    assert_eq!(q4_halves(1, 3), (16, 48));
    let group_sum: i32 = natural[32..].iter().map(|&v| v as i32).sum();
    assert_eq!(acts.sums(0)[1], 8 * group_sum);
}
