//! The entropy-coded segment as a bit stream, and Huffman decoding, as libjpeg(-turbo) reads them:
//! `FF 00` is a stuffed `FF`; any other `FF xx` is a marker, where the stream stops and, as in libjpeg,
//! reads on as zero bits.

use super::JpegError;

/// A Huffman table (ITU T.81 Annex C): `maxcode`/`valptr` for every length, plus a 9-bit lookahead.
pub struct HuffTable {
    /// Largest code of each length 1..=16 (-1: none), index 17 a sentinel.
    maxcode: [i32; 18],
    /// `huffval` index of the first code of each length, minus that code.
    valoffset: [i32; 17],
    huffval: Vec<u8>,
    /// For the next 9 bits: (code length, symbol), length 0 when the code is longer.
    lookahead: Vec<(u8, u8)>,
}

const LOOKAHEAD: u32 = 9;

impl HuffTable {
    /// `counts[l]` codes of length `l + 1`, then their symbols in order.
    pub fn new(counts: &[u8; 16], huffval: Vec<u8>) -> Result<HuffTable, JpegError> {
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        if total != huffval.len() || total > 256 {
            return Err(JpegError::Corrupt(
                "a Huffman table's counts do not match its symbols",
            ));
        }
        let mut maxcode = [-1i32; 18];
        let mut valoffset = [0i32; 17];
        let mut lookahead = vec![(0u8, 0u8); 1 << LOOKAHEAD];
        let mut code: i32 = 0;
        let mut k = 0usize;
        let mut started = false;
        for len in 1..=16usize {
            let n = counts[len - 1] as usize;
            if n > 0 {
                valoffset[len] = k as i32 - code;
                for _ in 0..n {
                    if code >= (1 << len) {
                        return Err(JpegError::Corrupt(
                            "a Huffman table has more codes than its lengths allow",
                        ));
                    }
                    if len as u32 <= LOOKAHEAD {
                        let shift = LOOKAHEAD - len as u32;
                        let first = (code as usize) << shift;
                        for slot in &mut lookahead[first..first + (1 << shift)] {
                            *slot = (len as u8, huffval[k]);
                        }
                    }
                    code += 1;
                    k += 1;
                }
                maxcode[len] = code - 1;
            }
            // libjpeg's check (jdhuff.c): from the first length in use, the codes must leave the
            // all-ones code of each length free.
            started |= n > 0;
            if started && code >= (1 << len) {
                return Err(JpegError::Corrupt(
                    "a Huffman table has more codes than its lengths allow",
                ));
            }
            code <<= 1;
        }
        maxcode[17] = i32::MAX;
        Ok(HuffTable {
            maxcode,
            valoffset,
            huffval,
            lookahead,
        })
    }
}

/// MSB-first bits of one entropy-coded segment.
pub struct BitReader<'a> {
    data: &'a [u8],
    /// Next byte to read (stops at a marker).
    pub pos: usize,
    acc: u64,
    bits: u32,
    /// How many of `bits` came from the data (the rest are zeros read on at a marker).
    real: u32,
    at_marker: bool,
    /// A bit past the data was consumed: libjpeg's `insufficient_data`.
    out_of_data: bool,
}

impl<'a> BitReader<'a> {
    pub fn new(data: &'a [u8], pos: usize) -> BitReader<'a> {
        BitReader {
            data,
            pos,
            acc: 0,
            bits: 0,
            real: 0,
            at_marker: false,
            out_of_data: false,
        }
    }

    fn fill(&mut self) {
        while self.bits <= 56 {
            let byte = if self.at_marker {
                0
            } else {
                match self.data.get(self.pos) {
                    Some(0xFF) => {
                        // libjpeg (jdhuff.c) reads any run of FF followed by 00 as one FF byte.
                        let mut next = self.pos + 1;
                        while self.data.get(next) == Some(&0xFF) {
                            next += 1;
                        }
                        if self.data.get(next) == Some(&0x00) {
                            self.pos = next + 1;
                            self.real += 8;
                            0xFF
                        } else {
                            // A marker (or the end of the file): zeros from here, as libjpeg does.
                            self.at_marker = true;
                            0
                        }
                    }
                    Some(&b) => {
                        self.pos += 1;
                        self.real += 8;
                        b
                    }
                    None => {
                        self.at_marker = true;
                        0
                    }
                }
            };
            self.acc |= (byte as u64) << (56 - self.bits);
            self.bits += 8;
        }
    }

    fn peek(&mut self, n: u32) -> u32 {
        if self.bits < n {
            self.fill();
        }
        (self.acc >> (64 - n)) as u32
    }

    fn consume(&mut self, n: u32) {
        self.acc <<= n;
        self.bits -= n;
        if n > self.real {
            self.out_of_data = true;
        }
        self.real = self.real.saturating_sub(n);
    }

    /// A reader that starts with libjpeg's out-of-data state `ended` (kept across a restart that
    /// found no restart marker).
    pub fn with_out_of_data(mut self, ended: bool) -> BitReader<'a> {
        self.out_of_data = ended;
        self
    }

    /// Whether a bit past the segment's data was read: libjpeg then leaves the rest of the
    /// segment's MCUs untouched (zero, i.e. gray, in a sequential scan).
    pub fn out_of_data(&self) -> bool {
        self.out_of_data
    }

    /// `n` (0..=16) bits as an unsigned number.
    pub fn bits(&mut self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        let v = self.peek(n);
        self.consume(n);
        v
    }

    pub fn bit(&mut self) -> bool {
        self.bits(1) == 1
    }

    /// One Huffman symbol.
    pub fn decode(&mut self, table: &HuffTable) -> Result<u8, JpegError> {
        let ahead = self.peek(LOOKAHEAD) as usize;
        let (len, sym) = table.lookahead[ahead];
        if len > 0 {
            self.consume(len as u32);
            return Ok(sym);
        }
        let mut len = LOOKAHEAD as usize + 1;
        let mut code = self.peek(len as u32) as i32;
        while code > table.maxcode[len] {
            len += 1;
            if len > 16 {
                return Err(JpegError::Corrupt("a Huffman code longer than 16 bits"));
            }
            code = self.peek(len as u32) as i32;
        }
        self.consume(len as u32);
        let at = (code + table.valoffset[len]) as usize;
        table
            .huffval
            .get(at)
            .copied()
            .ok_or(JpegError::Corrupt("a Huffman code outside its table"))
    }

    /// T.81's EXTEND: `n` bits as a signed magnitude category `n` value.
    pub fn receive_extend(&mut self, n: u32) -> i32 {
        if n == 0 {
            return 0;
        }
        let v = self.bits(n) as i32;
        if v < (1 << (n - 1)) {
            v + ((-1) << n) + 1
        } else {
            v
        }
    }

    /// Drops the buffered bits and moves to the next marker (libjpeg's restart and end of scan):
    /// returns its position (the `FF`), or None at the end of the data.
    pub fn next_marker(&mut self) -> Option<usize> {
        self.acc = 0;
        self.bits = 0;
        self.real = 0;
        self.at_marker = false;
        let mut at = self.pos;
        while at + 1 < self.data.len() {
            if self.data[at] == 0xFF && self.data[at + 1] != 0x00 && self.data[at + 1] != 0xFF {
                self.pos = at;
                return Some(at);
            }
            at += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three 1-bit codes cannot exist; nor may a length's codes use the all-ones code (libjpeg
    /// refuses both). Found by the fuzzer as a panic while filling the lookahead table.
    #[test]
    fn overfull_tables_are_refused() {
        let mut counts = [0u8; 16];
        counts[0] = 3;
        assert!(HuffTable::new(&counts, vec![1, 2, 3]).is_err());
        counts[0] = 2; // codes 0 and 1: 1 is all ones
        assert!(HuffTable::new(&counts, vec![1, 2]).is_err());
        counts[0] = 1;
        counts[1] = 2; // 0, 10, 11: 11 is all ones
        assert!(HuffTable::new(&counts, vec![1, 2, 3]).is_err());
        counts[1] = 1; // 0, 10: fine
        assert!(HuffTable::new(&counts, vec![1, 2]).is_ok());
    }

    /// FF 00 is a stuffed FF, and so (libjpeg's leniency) is FF FF 00; at a marker the stream reads
    /// on as zeros and stays before it.
    #[test]
    fn stuffing_and_markers() {
        let data = [0xFF, 0x00, 0xA5, 0xFF, 0xFF, 0x00, 0x5A, 0xFF, 0xD9];
        let mut r = BitReader::new(&data, 0);
        assert_eq!(r.bits(8), 0xFF);
        assert_eq!(r.bits(8), 0xA5);
        assert_eq!(r.bits(8), 0xFF);
        assert_eq!(r.bits(8), 0x5A);
        assert!(!r.out_of_data());
        assert_eq!(r.bits(16), 0);
        assert!(r.out_of_data());
        assert_eq!(r.next_marker(), Some(7));
        // Codes: 0 -> symbol 7, 10 -> symbol 9; bits 0 10 0 ... decode 7, 9, 7.
        let mut counts = [0u8; 16];
        counts[0] = 1;
        counts[1] = 1;
        let t = HuffTable::new(&counts, vec![7, 9]).unwrap();
        let mut r = BitReader::new(&[0b0100_0000], 0);
        assert_eq!(
            [r.decode(&t), r.decode(&t), r.decode(&t)],
            [Ok(7), Ok(9), Ok(7)]
        );
        // EXTEND: category 3, bits 010 -> -5; 110 -> 6.
        let mut r = BitReader::new(&[0b0101_1000], 0);
        assert_eq!((r.receive_extend(3), r.receive_extend(3)), (-5, 6));
    }
}
