//! Byte-level mutation: flips, edge values, inserted and deleted runs, truncation. `focus` is the
//! range most mutations land in (a file's header), so they reach parsing rather than data.

use std::ops::Range;

use crate::rng::Rng;

pub fn mutate(rng: &mut Rng, data: &[u8], focus: Range<usize>) -> Vec<u8> {
    let mut out = data.to_vec();
    for _ in 0..rng.range(1, 4) {
        let focus = focus.start.min(out.len())..focus.end.min(out.len());
        let at = |rng: &mut Rng, len: usize| {
            if !focus.is_empty() && rng.chance(4, 5) {
                rng.range(focus.start, focus.end - 1)
            } else {
                rng.below(len.max(1))
            }
        };
        match rng.below(8) {
            0 | 1 if !out.is_empty() => {
                let i = at(rng, out.len());
                out[i] ^= 1 << rng.below(8);
            }
            2 if !out.is_empty() => {
                let i = at(rng, out.len());
                out[i] = *rng.pick(&[
                    0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'}', b'[', b']', b',', b':', b'-', b'9',
                    b'\\',
                ]);
            }
            3 if out.len() >= 8 => {
                let i = at(rng, out.len() - 7).min(out.len() - 8);
                out[i..i + 8].copy_from_slice(&rng.interesting().to_le_bytes());
            }
            4 => {
                let i = at(rng, out.len() + 1).min(out.len());
                let n = rng.range(1, 64);
                let ins = rng.bytes(n);
                out.splice(i..i, ins);
            }
            5 if !out.is_empty() => {
                let i = at(rng, out.len());
                let n = rng.range(1, 64).min(out.len() - i);
                out.drain(i..i + n);
            }
            6 => {
                let n = if rng.chance(1, 2) {
                    at(rng, out.len() + 1)
                } else {
                    rng.below(out.len() + 1)
                };
                out.truncate(n);
            }
            _ if !out.is_empty() => {
                // Duplicate a run (repeated keys, repeated chunks).
                let i = at(rng, out.len());
                let n = rng.range(1, 256).min(out.len() - i);
                let run = out[i..i + n].to_vec();
                out.splice(i..i, run);
            }
            _ => out.push(rng.next_u64() as u8),
        }
    }
    out
}
