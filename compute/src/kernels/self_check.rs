//! The run-time check a SIMD path passes before it is used: a few small cases that reach each of its
//! code paths (the GEMV and the row tiles, a short last panel, K tails, the extreme codes) are run on
//! it and on the portable path, and every output must have the same bits.
//!
//! Why at run time: the VNNI path (`vpdpbusd`) is tested on the machines this project is built on
//! only with the instruction emulated; the first CPU that really has it is a user's. A path that
//! differs there is not used (`Isa::best` falls back to the next one and says so once on stderr),
//! so a mistake in an untested instruction costs speed, not a silently different model.

use super::{ActivationLayout, Activations, Isa, Kernels};
use half::bf16;
use packs::quant::{q4_byte, q4_to_panels, Q4_GROUP};
use packs::LinearData;
use std::fmt;

/// splitmix64: reproducible inputs without a dependency (the kernel tests use it too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(crate) fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// The first case on which a path's output differed from the portable path's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Which case: weight kind, rows, K, N, the first weight row, and what differed.
    pub case: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "differs from the portable kernels on {}", self.case)
    }
}

impl std::error::Error for Mismatch {}

/// The weight of one case, owned (q4 codes in the pack layout).
enum Weight {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    I8(Vec<i8>, Vec<f32>),
    Q4(Vec<u8>, Vec<bf16>),
}

impl Weight {
    fn data(&self) -> LinearData<'_> {
        match self {
            Weight::F32(w) => LinearData::F32(w),
            Weight::Bf16(w) => LinearData::Bf16(w),
            Weight::I8(codes, scales) => LinearData::I8 { codes, scales },
            Weight::Q4(codes, scales) => LinearData::Q4 { codes, scales },
        }
    }
    fn layout(&self) -> Option<ActivationLayout> {
        match self {
            Weight::I8(..) => Some(ActivationLayout::Natural),
            Weight::Q4(..) => Some(ActivationLayout::Q4Groups),
            Weight::F32(_) | Weight::Bf16(_) => None,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Weight::F32(_) => "f32",
            Weight::Bf16(_) => "bf16",
            Weight::I8(..) => "i8",
            Weight::Q4(..) => "q4",
        }
    }
}

struct Case {
    weight: Weight,
    /// Activation rows, `rows x k`.
    x: Vec<f32>,
    rows: usize,
    k: usize,
    n: usize,
}

/// Rows that take the GEMV, the few-row kernels (3, 8, 9: passes and their remainders) and the
/// prefill kernels (17: tiles plus a remainder); N with a short last panel (and 37 for q4: several
/// panels of 8 and of 16 rows).
const ROWS: [usize; 5] = [1, 3, 8, 9, 17];
const N: usize = 13;

fn cases() -> Vec<Case> {
    let mut rng = Rng(0x5e1f_c4ec);
    let mut cases = Vec::new();
    let random_x = |rng: &mut Rng, rows: usize, k: usize| -> Vec<f32> {
        (0..rows * k).map(|_| rng.unit() * 3.0).collect()
    };
    for rows in ROWS {
        // i8: K below, at and past the 32-byte step; random codes.
        for k in [17, 64, 100] {
            let x = random_x(&mut rng, rows, k);
            let codes = (0..N * k).map(|_| rng.byte() as i8).collect();
            let scales = (0..N).map(|_| rng.unit().abs() * 0.02).collect();
            cases.push(Case {
                weight: Weight::I8(codes, scales),
                x,
                rows,
                k,
                n: N,
            });
        }
        // i8 extremes: activation codes all ±127 against weights -128, -127 and 127 (the largest
        // pair sums a sign trick or an unsigned offset meets).
        for (a_sign, w_byte) in [(1.0f32, -128i8), (-1.0, -128), (1.0, 127), (-1.0, -127)] {
            let k = 96;
            cases.push(Case {
                weight: Weight::I8(vec![w_byte; N * k], vec![1.0; N]),
                x: vec![a_sign; rows * k],
                rows,
                k,
                n: N,
            });
        }
        // q4: one group, a pair plus an unpaired group, a whole block of 8 groups and one more;
        // random nibbles; 37 weight rows: two whole 16-row panels and a short one.
        for k in [32, 96, 288] {
            let n = 37;
            let x = random_x(&mut rng, rows, k);
            let codes: Vec<u8> = (0..n * k / 2).map(|_| rng.byte()).collect();
            let scales = (0..n * k / Q4_GROUP)
                .map(|_| bf16::from_f32(rng.unit() * 0.05))
                .collect();
            cases.push(Case {
                weight: Weight::Q4(q4_to_panels(&codes, n, k), scales),
                x,
                rows,
                k,
                n,
            });
        }
        // q4 extremes: every code -8 or 7 against activation codes all ±127.
        for (a_sign, (lo, hi)) in [
            (1.0f32, (-8, -8)),
            (-1.0, (-8, -8)),
            (1.0, (7, 7)),
            (-1.0, (-8, 7)),
        ] {
            let byte = q4_byte(lo, hi);
            let k = 288;
            let scales = (0..N * k / Q4_GROUP)
                .map(|g| bf16::from_f32(0.01 * (1 + g % 7) as f32))
                .collect();
            cases.push(Case {
                weight: Weight::Q4(vec![byte; N * k / 2], scales),
                x: vec![a_sign; rows * k],
                rows,
                k,
                n: N,
            });
        }
        // f32 and bf16: K around the 16-lane order and its tail.
        for k in [1, 17, 100] {
            let x = random_x(&mut rng, rows, k);
            let w: Vec<f32> = (0..N * k).map(|_| rng.unit()).collect();
            let wb = w.iter().map(|&v| bf16::from_f32(v)).collect();
            cases.push(Case {
                weight: Weight::F32(w),
                x: x.clone(),
                rows,
                k,
                n: N,
            });
            cases.push(Case {
                weight: Weight::Bf16(wb),
                x,
                rows,
                k,
                n: N,
            });
        }
    }
    cases
}

/// One GEMM block as a path computes it: `(weight, k, n0, x, prepared activations, out)`.
pub(crate) type BlockFn<'a> =
    dyn Fn(&LinearData<'_>, usize, usize, &[f32], &Activations, &mut [&mut [f32]]) + 'a;

/// Runs every case through `run` (with activations `prepare` made) and through the portable path;
/// the first case whose activations or outputs differ in any bit is the error.
pub(crate) fn check_path(prepare: Kernels, run: &BlockFn<'_>) -> Result<(), Mismatch> {
    let scalar = Kernels { isa: Isa::Scalar };
    for case in cases() {
        let (rows, k, n) = (case.rows, case.k, case.n);
        let w = case.weight.data();
        let kind = case.weight.kind();
        // The activations once per case: they do not depend on the weight rows.
        let (mut want_acts, mut got_acts) = (Activations::default(), Activations::default());
        if let Some(layout) = case.weight.layout() {
            want_acts.prepare(scalar, layout, &case.x, rows, k);
            got_acts.prepare(prepare, layout, &case.x, rows, k);
            for r in 0..rows {
                if got_acts.codes(r) != want_acts.codes(r)
                    || got_acts.scale(r).to_bits() != want_acts.scale(r).to_bits()
                    || got_acts.sums(r) != want_acts.sums(r)
                {
                    return Err(Mismatch {
                        case: format!(
                            "{kind} rows {rows} k {k}: the prepared activations of row {r}"
                        ),
                    });
                }
            }
        }
        for n0 in [0, 5] {
            let nb = n - n0;
            let what = |detail: &str| Mismatch {
                case: format!("{kind} rows {rows} k {k} weight rows {n0}..{n}: {detail}"),
            };
            let mut want = vec![vec![0f32; nb]; rows];
            let mut got = vec![vec![f32::NAN; nb]; rows];
            {
                let mut spans: Vec<&mut [f32]> = want.iter_mut().map(|o| &mut o[..]).collect();
                scalar.gemm_block(&w, k, n0, &case.x, &want_acts, &mut spans);
                let mut spans: Vec<&mut [f32]> = got.iter_mut().map(|o| &mut o[..]).collect();
                run(&w, k, n0, &case.x, &got_acts, &mut spans);
            }
            for r in 0..rows {
                for j in 0..nb {
                    if got[r][j].to_bits() != want[r][j].to_bits() {
                        return Err(what(&format!(
                            "output row {r} column {j}: {} where the portable path gives {}",
                            got[r][j], want[r][j]
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks an instruction set this CPU runs (the caller made sure of that) against the portable path.
pub(crate) fn check_isa(isa: Isa) -> Result<(), Mismatch> {
    debug_assert!(isa.is_available());
    let kern = Kernels { isa };
    check_path(kern, &|w, k, n0, x, acts, out| {
        kern.gemm_block(w, k, n0, x, acts, out)
    })
}
