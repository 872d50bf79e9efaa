//! Which path runs: every path this CPU runs passes its self-check, the check refuses a wrong bit
//! or a saturating i8 form, and the kernels variable is honoured or explained.

use super::*;

#[test]
fn every_path_this_cpu_runs_passes_its_self_check() {
    for isa in Isa::available() {
        assert_eq!(isa.self_check(), Some(Ok(())), "{isa}");
    }
    if std::env::var_os(KERNELS_ENV).is_none() {
        assert_eq!(Isa::best(), Isa::available()[0]);
    }
    // The VNNI bodies, with the instruction emulated, pass the same check.
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        let kern = Kernels::new(Isa::Avx2).unwrap();
        check_path(kern, &|w, k, n0, x, acts, out| {
            let block = WeightBlock::new(w, k, n0, out[0].len());
            // SAFETY: AVX2 + FMA checked above; the self-check builds matching shapes.
            unsafe { x86::gemm_block_emulated_vnni(&block, k, x, acts, out) }
        })
        .unwrap();
    }
}

#[test]
fn the_self_check_refuses_one_wrong_bit_and_names_the_case() {
    // Control: the portable path with the last bit of one q4 output flipped (9 rows, the last
    // row's last column) is refused, so the check reads every output of every case.
    let scalar = Kernels::new(Isa::Scalar).unwrap();
    let err = check_path(scalar, &|w, k, n0, x, acts, out| {
        scalar.gemm_block(w, k, n0, x, acts, out);
        if matches!(w, LinearData::Q4 { .. }) && out.len() == 9 && k == 288 {
            let last = out[8].len() - 1;
            out[8][last] = f32::from_bits(out[8][last].to_bits() ^ 1);
        }
    })
    .unwrap_err();
    assert!(
        err.case
            .starts_with("q4 rows 9 k 288 weight rows 0..37: output row 8 column 36"),
        "{err}"
    );
    // And the unmodified portable path passes.
    check_path(scalar, &|w, k, n0, x, acts, out| {
        scalar.gemm_block(w, k, n0, x, acts, out)
    })
    .unwrap();
}

#[test]
fn the_self_check_refuses_a_saturating_i8_offset() {
    // Control: i8 done as `vpmaddubsw` would do the VNNI offset form — pair sums of (w + 128) * a
    // saturated to i16 — is refused at the first i8 case, so a VNNI instruction (or an emulation
    // of one) that saturated would not be used.
    let scalar = Kernels::new(Isa::Scalar).unwrap();
    let err = check_path(scalar, &|w, k, n0, x, acts, out| {
        let LinearData::I8 { codes, scales } = *w else {
            return scalar.gemm_block(w, k, n0, x, acts, out);
        };
        for (r, o) in out.iter_mut().enumerate() {
            let a = acts.codes(r);
            for (j, o) in o.iter_mut().enumerate() {
                let wr = &codes[(n0 + j) * k..(n0 + j + 1) * k];
                let pair = |i: usize| {
                    let p = |t: usize| wr.get(t).map_or(0, |&c| (c as i32 + 128) * a[t] as i32);
                    (p(2 * i) + p(2 * i + 1)).clamp(i16::MIN as i32, i16::MAX as i32)
                };
                let sum_a: i32 = a.iter().map(|&c| c as i32).sum();
                let acc = (0..k.div_ceil(2)).map(pair).sum::<i32>() - 128 * sum_a;
                *o = quant::finish_i8(acc, acts.scale(r), scales[n0 + j]);
            }
        }
    })
    .unwrap_err();
    assert!(err.case.starts_with("i8 rows 1 k 17"), "{err}");
}

#[test]
fn the_kernels_variable_picks_a_usable_path_and_explains_otherwise() {
    let only_avx2 = |i: Isa| i != Isa::Avx512Vnni;
    assert_eq!(choose(None, only_avx2, Isa::Avx2), (Isa::Avx2, None));
    assert_eq!(
        choose(Some("scalar"), only_avx2, Isa::Avx2),
        (Isa::Scalar, None)
    );
    // Controls: a path the CPU cannot use, and a name that is no path, keep the fastest and say why.
    let (isa, why) = choose(Some("avx512vnni"), only_avx2, Isa::Avx2);
    assert_eq!(isa, Isa::Avx2);
    assert!(why.unwrap().contains("cannot use the avx512vnni kernels"));
    let (isa, why) = choose(Some("avx-2"), only_avx2, Isa::Avx2);
    assert_eq!(isa, Isa::Avx2);
    assert!(why.unwrap().contains("unknown instruction set \"avx-2\""));
}
