//! YCbCr -> RGB as libjpeg(-turbo)'s `ycc_rgb_convert` (jdcolor.c): 16-bit fixed-point tables, the
//! green term rounded once, results clamped to 0..=255.

const SCALEBITS: u32 = 16;
const ONE_HALF: i64 = 1 << (SCALEBITS - 1);

const fn fix(x: f64) -> i64 {
    (x * (1i64 << SCALEBITS) as f64 + 0.5) as i64
}

pub struct YccTables {
    cr_r: [i32; 256],
    cb_b: [i32; 256],
    cr_g: [i64; 256],
    cb_g: [i64; 256],
}

impl YccTables {
    pub fn new() -> YccTables {
        let mut t = YccTables {
            cr_r: [0; 256],
            cb_b: [0; 256],
            cr_g: [0; 256],
            cb_g: [0; 256],
        };
        for i in 0..256usize {
            let x = i as i64 - 128;
            t.cr_r[i] = ((fix(1.40200) * x + ONE_HALF) >> SCALEBITS) as i32;
            t.cb_b[i] = ((fix(1.77200) * x + ONE_HALF) >> SCALEBITS) as i32;
            t.cr_g[i] = -fix(0.71414) * x;
            t.cb_g[i] = -fix(0.34414) * x + ONE_HALF;
        }
        t
    }

    pub fn rgb(&self, y: u8, cb: u8, cr: u8) -> [u8; 3] {
        let y = y as i32;
        let (cb, cr) = (cb as usize, cr as usize);
        let clamp = |v: i32| v.clamp(0, 255) as u8;
        let g = ((self.cb_g[cb] + self.cr_g[cr]) >> SCALEBITS) as i32;
        [
            clamp(y + self.cr_r[cr]),
            clamp(y + g),
            clamp(y + self.cb_b[cb]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_hold_libjpegs_constants() {
        assert_eq!(
            [fix(1.402), fix(1.772), fix(0.71414), fix(0.34414)],
            [91881, 116130, 46802, 22554]
        );
        let t = YccTables::new();
        // Neutral chroma leaves gray; full-scale Cr pushes red up by 1.402 * 127 = 178.
        assert_eq!(t.rgb(100, 128, 128), [100, 100, 100]);
        assert_eq!(t.cr_r[255], 178);
        assert_eq!(t.rgb(0, 128, 0), [0, 91, 0]);
    }
}
