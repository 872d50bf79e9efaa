//! Rotary position embedding with Qwen3-VL's three position planes.
//!
//! Every token has three positions (t, h, w). Rotary frequency `j` takes its angle from one of them;
//! which one is decided by [`RopeLayout::plane_of`], the single home of the axis rule.

use packs::Semantics;

/// Which plane (0 = t, 1 = h, 2 = w) each rotary frequency reads its position from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// No MRoPE: every frequency uses the single position (stored on all three planes).
    Plain,
    /// Qwen2-VL: the first `s[0]` frequencies t, the next `s[1]` h, the next `s[2]` w, the rest t.
    Contiguous([usize; 3]),
    /// Qwen3-VL (`mrope_interleaved: true`): h at j % 3 == 1 below `3*s[1]`, w at j % 3 == 2 below `3*s[2]`,
    /// t everywhere else — transformers' `apply_interleaved_mrope`.
    Interleaved([usize; 3]),
}

pub const PLANE_NAMES: [&str; 3] = ["t", "h", "w"];

impl RopeLayout {
    /// The layout a pack declares. `Semantics::validate` has already refused MRoPE without sections.
    pub fn from_semantics(s: &Semantics) -> RopeLayout {
        match (s.mrope, s.mrope_section) {
            (true, Some(section)) if s.mrope_interleaved => RopeLayout::Interleaved(section),
            (true, Some(section)) => RopeLayout::Contiguous(section),
            _ => RopeLayout::Plain,
        }
    }

    /// The plane frequency `j` (0 ≤ j < head_dim/2) takes its position from.
    pub fn plane_of(&self, j: usize) -> usize {
        match *self {
            RopeLayout::Plain => 0,
            RopeLayout::Contiguous([t, h, w]) => {
                if j < t {
                    0
                } else if j < t + h {
                    1
                } else if j < t + h + w {
                    2
                } else {
                    0
                }
            }
            RopeLayout::Interleaved([_, h, w]) => {
                if j % 3 == 1 && j < 3 * h {
                    1
                } else if j % 3 == 2 && j < 3 * w {
                    2
                } else {
                    0
                }
            }
        }
    }

    /// `plane_of` for every frequency of a head of `head_dim` values.
    pub fn planes(&self, head_dim: usize) -> Vec<u8> {
        (0..head_dim / 2).map(|j| self.plane_of(j) as u8).collect()
    }

    pub fn is_mrope(&self) -> bool {
        !matches!(self, RopeLayout::Plain)
    }
}

/// `inv_freq[j] = 1 / theta^(2j/d)`, in f32 as transformers computes it.
pub fn inv_freq(theta: f64, head_dim: usize) -> Vec<f32> {
    let base = theta as f32;
    (0..head_dim / 2)
        .map(|j| 1.0 / base.powf((2 * j) as f32 / head_dim as f32))
        .collect()
}

/// Rotation tables for one head geometry: the per-frequency plane and inverse frequency.
#[derive(Clone, Debug)]
pub struct Rotary {
    pub layout: RopeLayout,
    pub head_dim: usize,
    inv_freq: Vec<f32>,
    plane: Vec<u8>,
}

impl Rotary {
    pub fn new(layout: RopeLayout, theta: f64, head_dim: usize) -> Rotary {
        Rotary {
            layout,
            head_dim,
            inv_freq: inv_freq(theta, head_dim),
            plane: layout.planes(head_dim),
        }
    }

    /// The angle of every frequency for a token at positions (t, h, w):
    /// `position[plane_of(j)] as f32 * inv_freq[j]`.
    pub fn angles(&self, pos: [i64; 3], out: &mut [f32]) {
        for ((o, &f), &p) in out.iter_mut().zip(&self.inv_freq).zip(&self.plane) {
            *o = pos[p as usize] as f32 * f;
        }
    }

    /// cos and sin of every frequency for one token (each `head_dim/2` long).
    pub fn cos_sin(&self, pos: [i64; 3], cos: &mut [f32], sin: &mut [f32]) {
        self.angles(pos, cos);
        for (c, s) in cos.iter_mut().zip(sin.iter_mut()) {
            let a = *c;
            *c = a.cos();
            *s = a.sin();
        }
    }
}

/// Rotate one head in place, rotate-half pairing: element j pairs with j + d/2.
pub fn rotate_half(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (lo, hi) = x.split_at_mut(half);
    for j in 0..half {
        let (a, b) = (lo[j], hi[j]);
        lo[j] = a * cos[j] - b * sin[j];
        hi[j] = b * cos[j] + a * sin[j];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3_VL: RopeLayout = RopeLayout::Interleaved([24, 20, 20]);

    #[test]
    fn interleaved_counts_and_members_at_24_20_20() {
        let planes = QWEN3_VL.planes(128);
        let count = |p| planes.iter().filter(|&&x| x == p).count();
        assert_eq!((count(0), count(1), count(2)), (24, 20, 20));
        let h: Vec<usize> = (0..64).filter(|&j| planes[j] == 1).collect();
        let w: Vec<usize> = (0..64).filter(|&j| planes[j] == 2).collect();
        assert_eq!(h, (1..=58).step_by(3).collect::<Vec<_>>());
        assert_eq!(w, (2..=59).step_by(3).collect::<Vec<_>>());
    }

    #[test]
    fn interleaved_window_edges_57_to_63() {
        // j = 57 is t (57 % 3 == 0), 58 the last h, 59 the last w, 60..63 fall back to t.
        let got: Vec<usize> = (57..64).map(|j| QWEN3_VL.plane_of(j)).collect();
        assert_eq!(got, vec![0, 1, 2, 0, 0, 0, 0]);
    }

    #[test]
    fn contiguous_reading_disagrees_on_43_of_64() {
        let contiguous = RopeLayout::Contiguous([24, 20, 20]);
        let differ = (0..64)
            .filter(|&j| contiguous.plane_of(j) != QWEN3_VL.plane_of(j))
            .count();
        assert_eq!(differ, 43);
        // Same histogram: only the assignment tells them apart.
        let hist = |l: RopeLayout| {
            let mut c = [0; 3];
            for j in 0..64 {
                c[l.plane_of(j)] += 1;
            }
            c
        };
        assert_eq!(hist(contiguous), hist(QWEN3_VL));
    }

    #[test]
    fn contiguous_edges() {
        let c = RopeLayout::Contiguous([6, 5, 5]);
        let got: Vec<usize> = (0..16).map(|j| c.plane_of(j)).collect();
        assert_eq!(got, vec![0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
    }

    #[test]
    fn equal_planes_are_plain_rope() {
        let a = Rotary::new(QWEN3_VL, 5e6, 128);
        let b = Rotary::new(RopeLayout::Plain, 5e6, 128);
        let (mut x, mut y) = (vec![0.0; 64], vec![0.0; 64]);
        a.angles([37, 37, 37], &mut x);
        b.angles([37, 0, 0], &mut y);
        assert_eq!(x, y);
        // Control: unequal planes move the angles.
        a.angles([37, 3, 5], &mut x);
        assert_ne!(x, y);
    }

    #[test]
    fn rotate_half_pairs_j_with_j_plus_half() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        // 90 degrees on frequency 0 only.
        rotate_half(&mut x, &[0.0, 1.0], &[1.0, 0.0]);
        assert_eq!(x, vec![-3.0, 2.0, 1.0, 4.0]);
    }
}
