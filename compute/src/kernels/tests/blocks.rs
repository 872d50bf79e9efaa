//! Row blocks: many activation rows in L2-sized blocks give the oracle's bits in every kind, and a
//! block skipped or cut short is caught.

use super::*;

#[test]
fn row_blocks_of_every_kernel_match_the_oracle() {
    // Many rows in blocks of 8 (the test height; tiles of 4 and single rows inside), row counts
    // below, at and past a block and not a multiple of it, K with and without tails, panels whole
    // and short.
    let _ = paths(); // self-checks first, with the ordinary blocks
    let mut rng = Rng(10);
    let _blocks = row_blocks::test_hooks::set(8, None);
    for k in [32, 96, 100, 288] {
        for rows in [1, 3, 4, 7, 8, 9, 13, 16, 21, 37] {
            for n in [5, 17, 40] {
                if let Some(m) = all_kinds_mismatch(&mut rng, rows, k, n) {
                    panic!("blocks of 8: {m}");
                }
            }
        }
    }
}

#[test]
fn prefill_sized_row_counts_in_natural_blocks_match_the_oracle() {
    // K = 2048 as in the 2B decoder: blocks of 128 i8 rows, 112 q4 rows, 64 f32 rows; 300 rows
    // span three to five blocks, the last one short.
    let _ = paths();
    let mut rng = Rng(11);
    let (rows, k, n) = (300, 2048, 19);
    if let Some(m) = all_kinds_mismatch(&mut rng, rows, k, n) {
        panic!("{m}");
    }
}

#[test]
fn a_skipped_or_short_row_block_fails_the_oracle_check() {
    // Controls for the two tests above: the same comparison catches a last block never computed
    // and blocks that each stop one row short, in every kind (the outputs start as NaN).
    use row_blocks::test_hooks::{set, Fault};
    let _ = paths();
    let mut rng = Rng(12);
    let (rows, k, n) = (21, 96, 17);
    for fault in [Fault::SkipLast, Fault::ShortByOne] {
        let _blocks = set(8, Some(fault));
        let x = activations(&mut rng, rows, k);
        let codes: Vec<i8> = (0..n * k).map(|_| rng.byte() as i8).collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.unit().abs() * 0.02).collect();
        let (codes4, scales4) = q4_weight(&mut rng, n, k);
        let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
        assert!(
            i8_mismatch(rows, k, n, &x, &codes, &scales).is_some(),
            "i8 {fault:?}"
        );
        assert!(
            q4_mismatch(rows, k, n, &x, &codes4, &scales4).is_some(),
            "q4 {fault:?}"
        );
        for as_bf16 in [false, true] {
            assert!(
                f32_mismatch(rows, k, n, &x, &w, as_bf16).is_some(),
                "f32 (bf16 {as_bf16}) {fault:?}"
            );
        }
    }
}
