//! A GIF's first frame as Pillow lays it out, read from the file's blocks: where the frame sits on the
//! logical screen, its colour table and transparent index.
//!
//! Why: Pillow opens a GIF as its first frame on the whole screen, the area outside the frame filled with
//! the transparent index (else index 0), and keeps the transparent index as the colour `convert_to_rgb`
//! whitens. The `image` crate leaves that area transparent black and does not report the palette.

pub struct GifFirstFrame {
    pub left: usize,
    pub top: usize,
    pub width: usize,
    pub height: usize,
    /// The frame's colour table (its local one, else the global one), RGB triples.
    table: Vec<u8>,
    pub transparent_index: Option<u8>,
}

impl GifFirstFrame {
    /// The first image descriptor and the Graphic Control Extension before it; `None` when the blocks
    /// cannot be walked (the decoder then reports the damage).
    pub fn parse(bytes: &[u8]) -> Option<GifFirstFrame> {
        let screen = bytes.get(6..13)?;
        let mut at = 13usize;
        let mut global: &[u8] = &[];
        if screen[4] & 0x80 != 0 {
            let len = 3usize << ((screen[4] & 7) + 1);
            global = bytes.get(at..at + len)?;
            at += len;
        }
        let mut transparent_index = None;
        loop {
            match *bytes.get(at)? {
                0x21 => {
                    let label = *bytes.get(at + 1)?;
                    at += 2;
                    if label == 0xF9 {
                        let block = bytes.get(at..at + 5)?;
                        transparent_index = (block[1] & 1 != 0).then_some(block[4]);
                    }
                    // Skip the data sub-blocks.
                    loop {
                        let len = *bytes.get(at)? as usize;
                        at += 1 + len;
                        if len == 0 {
                            break;
                        }
                    }
                }
                0x2C => {
                    let d = bytes.get(at + 1..at + 10)?;
                    let u16_at = |i: usize| u16::from_le_bytes([d[i], d[i + 1]]) as usize;
                    let table = if d[8] & 0x80 != 0 {
                        let len = 3usize << ((d[8] & 7) + 1);
                        bytes.get(at + 10..at + 10 + len)?
                    } else {
                        global
                    };
                    return Some(GifFirstFrame {
                        left: u16_at(0),
                        top: u16_at(2),
                        width: u16_at(4),
                        height: u16_at(6),
                        table: table.to_vec(),
                        transparent_index,
                    });
                }
                _ => return None,
            }
        }
    }

    /// The colour of a palette index; black past the table, as PIL reads it.
    pub fn color(&self, index: u8) -> [u8; 3] {
        let i = index as usize * 3;
        self.table
            .get(i..i + 3)
            .map_or([0, 0, 0], |c| [c[0], c[1], c[2]])
    }

    /// What Pillow puts on the screen outside the first frame.
    pub fn fill_color(&self) -> [u8; 3] {
        self.color(self.transparent_index.unwrap_or(0))
    }

    /// Whether pixel (x, y) of the screen lies inside the first frame.
    pub fn covers(&self, x: usize, y: usize) -> bool {
        (self.left..self.left + self.width).contains(&x)
            && (self.top..self.top + self.height).contains(&y)
    }
}
