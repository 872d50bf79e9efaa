//! The frame's coefficients, and the scans that fill them: baseline (sequential Huffman) and the four
//! kinds of progressive scan, as libjpeg's jdhuff.c and jdphuff.c decode them.

use super::bits::{BitReader, HuffTable};
use super::JpegError;

/// Zig-zag index -> natural (row-major) index, with libjpeg's 16 extra entries of 63 so a corrupt
/// run past the block's end lands on the last coefficient instead of outside it.
pub const NATURAL_ORDER: [usize; 80] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
    63, 63, 63, 63, 63, 63,
];

/// libjpeg smooths blocks whose first `SAVED_COEFS` coefficients are not fully refined (jdcoefct.c).
const SAVED_COEFS: usize = 10;

pub struct Component {
    pub id: u8,
    pub h: usize,
    pub v: usize,
    pub tq: usize,
    /// The quantization table latched at the component's first scan.
    pub quant: Option<[u16; 64]>,
    /// Blocks covering whole MCUs (the padded size).
    pub blocks_w: usize,
    pub blocks_h: usize,
    /// Blocks covering the component's own samples (what a single-component scan walks).
    pub scan_blocks_w: usize,
    pub scan_blocks_h: usize,
    coefs: Vec<[i16; 64]>,
    /// Per zig-zag coefficient, the last successive-approximation bit received (-1: none).
    coef_bits: [i32; 64],
}

impl Component {
    pub fn block(&self, bx: usize, by: usize) -> &[i16; 64] {
        &self.coefs[by * self.blocks_w + bx]
    }
}

pub struct Frame {
    pub width: usize,
    pub height: usize,
    pub progressive: bool,
    pub max_h: usize,
    pub max_v: usize,
    pub mcus_x: usize,
    pub mcus_y: usize,
    pub components: Vec<Component>,
}

impl Frame {
    pub fn parse(seg: &[u8], progressive: bool, max_pixels: u64) -> Result<Frame, JpegError> {
        if seg.len() < 6 {
            return Err(JpegError::Corrupt("a short frame header"));
        }
        if seg[0] != 8 {
            return Err(JpegError::Unsupported(
                "a sample precision other than 8 bits",
            ));
        }
        let height = u16::from_be_bytes([seg[1], seg[2]]) as usize;
        let width = u16::from_be_bytes([seg[3], seg[4]]) as usize;
        let n = seg[5] as usize;
        if height == 0 {
            return Err(JpegError::Unsupported("a height given by a DNL marker"));
        }
        if width == 0 || n == 0 || n > 4 || seg.len() < 6 + 3 * n {
            return Err(JpegError::Corrupt("a bad frame header"));
        }
        if width as u64 * height as u64 > max_pixels {
            return Err(JpegError::Unsupported("more pixels than allowed"));
        }
        let mut comps = Vec::with_capacity(n);
        for c in seg[6..6 + 3 * n].chunks_exact(3) {
            let (h, v) = ((c[1] >> 4) as usize, (c[1] & 15) as usize);
            if !(1..=4).contains(&h) || !(1..=4).contains(&v) || c[2] > 3 {
                return Err(JpegError::Corrupt(
                    "a bad sampling factor or quantization table id",
                ));
            }
            comps.push((c[0], h, v, c[2] as usize));
        }
        let max_h = comps.iter().map(|c| c.1).max().unwrap_or(1);
        let max_v = comps.iter().map(|c| c.2).max().unwrap_or(1);
        let mcus_x = width.div_ceil(8 * max_h);
        let mcus_y = height.div_ceil(8 * max_v);
        let components = comps
            .into_iter()
            .map(|(id, h, v, tq)| {
                let (blocks_w, blocks_h) = (mcus_x * h, mcus_y * v);
                Component {
                    id,
                    h,
                    v,
                    tq,
                    quant: None,
                    blocks_w,
                    blocks_h,
                    scan_blocks_w: (width * h).div_ceil(max_h).div_ceil(8),
                    scan_blocks_h: (height * v).div_ceil(max_v).div_ceil(8),
                    coefs: vec![[0i16; 64]; blocks_w * blocks_h],
                    coef_bits: [-1; 64],
                }
            })
            .collect();
        Ok(Frame {
            width,
            height,
            progressive,
            max_h,
            max_v,
            mcus_x,
            mcus_y,
            components,
        })
    }

    /// The coefficient visits a file may ask for: eight passes over every coefficient of every
    /// block. libjpeg's own progressive script makes about three; a crafted file of a few KB could
    /// otherwise ask for hundreds (as many as `MAX_SCANS`) over a frame of 8192x8192.
    pub fn work_budget(&self) -> usize {
        let blocks: usize = self
            .components
            .iter()
            .map(|c| c.blocks_w * c.blocks_h)
            .sum();
        blocks * 64 * 8
    }

    /// Refuses what libjpeg would not output as plain coefficients: a component no scan filled, a
    /// progressive file left for block smoothing.
    pub fn check_complete(&self) -> Result<(), JpegError> {
        for c in &self.components {
            if c.quant.is_none() {
                return Err(JpegError::Unsupported("a component that is in no scan"));
            }
            if self.progressive && c.coef_bits[..SAVED_COEFS].iter().any(|&b| b != 0) {
                return Err(JpegError::Unsupported(
                    "a progressive file whose first coefficients are not fully refined (libjpeg smooths it)",
                ));
            }
        }
        Ok(())
    }
}

pub struct ScanComponent {
    pub index: usize,
    td: usize,
    ta: usize,
}

impl ScanHeader {
    /// Coefficient visits of this scan: its blocks times its band.
    pub fn work(&self, frame: &Frame) -> usize {
        let band = if frame.progressive {
            self.se.saturating_sub(self.ss) + 1
        } else {
            64
        };
        let blocks: usize = self
            .components
            .iter()
            .map(|sc| {
                let c = &frame.components[sc.index];
                c.scan_blocks_w * c.scan_blocks_h
            })
            .sum();
        blocks * band
    }
}

pub struct ScanHeader {
    pub components: Vec<ScanComponent>,
    ss: usize,
    se: usize,
    ah: u32,
    al: u32,
}

impl ScanHeader {
    pub fn parse(seg: &[u8], frame: &Frame) -> Result<ScanHeader, JpegError> {
        let n = *seg
            .first()
            .ok_or(JpegError::Corrupt("an empty scan header"))? as usize;
        if n == 0 || n > 4 || seg.len() < 4 + 2 * n {
            return Err(JpegError::Corrupt("a bad scan header"));
        }
        let mut components = Vec::with_capacity(n);
        for c in seg[1..1 + 2 * n].chunks_exact(2) {
            let index =
                frame
                    .components
                    .iter()
                    .position(|fc| fc.id == c[0])
                    .ok_or(JpegError::Corrupt(
                        "a scan names a component the frame does not have",
                    ))?;
            if components
                .iter()
                .any(|sc: &ScanComponent| sc.index == index)
            {
                return Err(JpegError::Corrupt("a scan names a component twice"));
            }
            components.push(ScanComponent {
                index,
                td: (c[1] >> 4) as usize,
                ta: (c[1] & 15) as usize,
            });
        }
        let p = &seg[1 + 2 * n..];
        let (ss, se, ah, al) = (
            p[0] as usize,
            p[1] as usize,
            (p[2] >> 4) as u32,
            (p[2] & 15) as u32,
        );
        let header = ScanHeader {
            components,
            ss,
            se,
            ah,
            al,
        };
        let blocks: usize = header
            .components
            .iter()
            .map(|sc| frame.components[sc.index].h * frame.components[sc.index].v)
            .sum();
        if n > 1 && blocks > 10 {
            return Err(JpegError::Corrupt("more than 10 blocks in an MCU"));
        }
        if header.components.iter().any(|sc| sc.td > 3 || sc.ta > 3) {
            return Err(JpegError::Corrupt("a Huffman table id above 3"));
        }
        if frame.progressive {
            let dc = ss == 0;
            if (dc && se != 0) || (!dc && (se < ss || se > 63 || n != 1)) || al > 13 || ah > 13 {
                return Err(JpegError::Corrupt("a bad progressive scan"));
            }
        } else if ss != 0 || se != 63 || ah != 0 || al != 0 {
            // libjpeg warns and decodes as baseline; so do we.
        }
        Ok(header)
    }
}

enum Kind {
    Baseline,
    DcFirst,
    DcRefine,
    AcFirst,
    AcRefine,
}

/// Decodes one scan starting at byte `at` (just after its header); returns where the next marker is.
#[allow(clippy::too_many_arguments)]
pub fn decode_scan(
    bytes: &[u8],
    at: usize,
    frame: &mut Frame,
    header: &ScanHeader,
    dc_tables: &[Option<HuffTable>; 4],
    ac_tables: &[Option<HuffTable>; 4],
    restart_interval: usize,
) -> Result<usize, JpegError> {
    let kind = match (frame.progressive, header.ss == 0, header.ah == 0) {
        (false, _, _) => Kind::Baseline,
        (true, true, true) => Kind::DcFirst,
        (true, true, false) => Kind::DcRefine,
        (true, false, true) => Kind::AcFirst,
        (true, false, false) => Kind::AcRefine,
    };
    let (ss, se, al) = if frame.progressive {
        (header.ss, header.se, header.al)
    } else {
        (0, 63, 0)
    };
    let needs_dc = matches!(kind, Kind::Baseline | Kind::DcFirst);
    let needs_ac = matches!(kind, Kind::Baseline | Kind::AcFirst | Kind::AcRefine);
    let mut dc = Vec::new();
    let mut ac = Vec::new();
    for sc in &header.components {
        dc.push(if needs_dc {
            Some(
                dc_tables[sc.td]
                    .as_ref()
                    .ok_or(JpegError::Corrupt("a scan uses an undefined DC table"))?,
            )
        } else {
            None
        });
        ac.push(if needs_ac {
            Some(
                ac_tables[sc.ta]
                    .as_ref()
                    .ok_or(JpegError::Corrupt("a scan uses an undefined AC table"))?,
            )
        } else {
            None
        });
        if frame.progressive {
            let bits = &mut frame.components[sc.index].coef_bits;
            for b in &mut bits[ss..=se] {
                *b = al as i32;
            }
        }
    }

    let single = header.components.len() == 1;
    let (mcus_x, mcus_y) = if single {
        let c = &frame.components[header.components[0].index];
        (c.scan_blocks_w, c.scan_blocks_h)
    } else {
        (frame.mcus_x, frame.mcus_y)
    };
    let mut r = BitReader::new(bytes, at);
    let mut preds = [0i32; 4];
    let mut eobrun = 0u32;
    let mut next_rst = 0u8;
    for m in 0..mcus_x * mcus_y {
        if restart_interval > 0 && m > 0 && m % restart_interval == 0 {
            r = restart(bytes, r, next_rst)?;
            next_rst = (next_rst + 1) & 7;
            preds = [0; 4];
            eobrun = 0;
        }
        if r.out_of_data() {
            // jdhuff.c / jdphuff.c: past the data, the segment's remaining MCUs are not touched.
            continue;
        }
        let (mx, my) = (m % mcus_x, m / mcus_x);
        for (i, sc) in header.components.iter().enumerate() {
            let comp = &mut frame.components[sc.index];
            let (bh, bv) = if single { (1, 1) } else { (comp.h, comp.v) };
            for v in 0..bv {
                for h in 0..bh {
                    let (bx, by) = if single {
                        (mx, my)
                    } else {
                        (mx * comp.h + h, my * comp.v + v)
                    };
                    let w = comp.blocks_w;
                    let block = &mut comp.coefs[by * w + bx];
                    match kind {
                        Kind::Baseline => {
                            baseline_block(&mut r, dc[i], ac[i], &mut preds[i], block)?
                        }
                        Kind::DcFirst => dc_first(&mut r, dc[i], &mut preds[i], block, al)?,
                        Kind::DcRefine => {
                            if r.bit() {
                                block[0] |= 1i16.wrapping_shl(al);
                            }
                        }
                        Kind::AcFirst => ac_first(&mut r, ac[i], &mut eobrun, block, ss, se, al)?,
                        Kind::AcRefine => ac_refine(&mut r, ac[i], &mut eobrun, block, ss, se, al)?,
                    }
                }
            }
        }
    }
    r.next_marker()
        .ok_or(JpegError::Corrupt("no marker after a scan"))
}

enum Resync {
    /// Swallow the marker and decode on after it.
    Resume,
    /// Look for the next marker and decide again.
    Skip,
    /// Leave the marker for later: the segment is empty.
    Leave,
}

/// libjpeg's `read_restart_marker` and its default `jpeg_resync_to_restart` (jdmarker.c): the
/// expected RSTn is swallowed and decoding resumes after it; a marker that is not a restart, or one of
/// the next two restarts, is left for later and the segment reads as empty (zeros; with the
/// out-of-data state kept); an earlier restart or a reserved marker is skipped in search of the next
/// marker; any other restart is swallowed as if it were the expected one.
fn restart<'a>(
    bytes: &'a [u8],
    mut r: BitReader<'a>,
    want: u8,
) -> Result<BitReader<'a>, JpegError> {
    let ended = r.out_of_data();
    let mut pos = r
        .next_marker()
        .ok_or(JpegError::Corrupt("the data ends before a restart marker"))?;
    loop {
        let marker = bytes[pos + 1];
        let rst = |k: u8| 0xD0 + (k & 7);
        let ahead = marker == rst(want.wrapping_add(1)) || marker == rst(want.wrapping_add(2));
        let behind = marker == rst(want.wrapping_sub(1)) || marker == rst(want.wrapping_sub(2));
        let action = match marker {
            m if m == rst(want) => Resync::Resume,
            0x00..=0xBF => Resync::Skip,
            0xD0..=0xD7 if ahead => Resync::Leave,
            0xD0..=0xD7 if behind => Resync::Skip,
            0xD0..=0xD7 => Resync::Resume,
            _ => Resync::Leave,
        };
        match action {
            Resync::Resume => return Ok(BitReader::new(bytes, pos + 2)),
            Resync::Skip => {
                let mut skip = BitReader::new(bytes, pos + 2);
                pos = skip.next_marker().ok_or(JpegError::Corrupt(
                    "the data ends while looking for a restart marker",
                ))?;
            }
            Resync::Leave => return Ok(BitReader::new(bytes, pos).with_out_of_data(ended)),
        }
    }
}

fn table(t: Option<&HuffTable>) -> Result<&HuffTable, JpegError> {
    t.ok_or(JpegError::Corrupt("a missing Huffman table"))
}

fn dc_diff(r: &mut BitReader, dc: Option<&HuffTable>) -> Result<i32, JpegError> {
    let s = r.decode(table(dc)?)? as u32;
    if s > 15 {
        return Err(JpegError::Corrupt("a DC magnitude category above 15"));
    }
    Ok(r.receive_extend(s))
}

/// A sequential block: the DC difference, then the whole AC band (jdhuff.c's `decode_mcu`; an EOBr
/// symbol ends the block whatever its r).
fn baseline_block(
    r: &mut BitReader,
    dc: Option<&HuffTable>,
    ac: Option<&HuffTable>,
    pred: &mut i32,
    block: &mut [i16; 64],
) -> Result<(), JpegError> {
    dc_first(r, dc, pred, block, 0)?;
    ac_band(r, table(ac)?, block, 1, 63, 0)?;
    Ok(())
}

fn dc_first(
    r: &mut BitReader,
    dc: Option<&HuffTable>,
    pred: &mut i32,
    block: &mut [i16; 64],
    al: u32,
) -> Result<(), JpegError> {
    *pred = pred.wrapping_add(dc_diff(r, dc)?);
    block[0] = (*pred as u32).wrapping_shl(al) as i16;
    Ok(())
}

/// Coefficients `ss..=se` of one block, scaled by `2^al`, up to the band's end or an end-of-band
/// symbol EOBr, whose r it returns.
fn ac_band(
    r: &mut BitReader,
    ac: &HuffTable,
    block: &mut [i16; 64],
    ss: usize,
    se: usize,
    al: u32,
) -> Result<Option<u32>, JpegError> {
    let mut k = ss;
    while k <= se {
        let rs = r.decode(ac)?;
        let (run, s) = ((rs >> 4) as u32, (rs & 15) as u32);
        if s != 0 {
            k += run as usize;
            let v = r.receive_extend(s);
            block[NATURAL_ORDER[k]] = (v as u32).wrapping_shl(al) as i16;
        } else if run == 15 {
            k += 15;
        } else {
            return Ok(Some(run));
        }
        k += 1;
    }
    Ok(None)
}

/// A progressive first AC scan's block (jdphuff.c's `decode_mcu_AC_first`): EOBr starts a run of
/// 2^r + (r more bits) blocks with nothing more in this band.
fn ac_first(
    r: &mut BitReader,
    ac: Option<&HuffTable>,
    eobrun: &mut u32,
    block: &mut [i16; 64],
    ss: usize,
    se: usize,
    al: u32,
) -> Result<(), JpegError> {
    if *eobrun > 0 {
        *eobrun -= 1;
        return Ok(());
    }
    if let Some(run) = ac_band(r, table(ac)?, block, ss, se, al)? {
        *eobrun = (1 << run) + r.bits(run) - 1;
    }
    Ok(())
}

/// jdphuff.c's `decode_mcu_AC_refine`, step for step.
fn ac_refine(
    r: &mut BitReader,
    ac: Option<&HuffTable>,
    eobrun: &mut u32,
    block: &mut [i16; 64],
    ss: usize,
    se: usize,
    al: u32,
) -> Result<(), JpegError> {
    let p1 = 1i16.wrapping_shl(al);
    let m1 = (-1i16).wrapping_shl(al);
    let refine = |r: &mut BitReader, coef: &mut i16| {
        if *coef != 0 && r.bit() && (*coef & p1) == 0 {
            *coef = coef.wrapping_add(if *coef >= 0 { p1 } else { m1 });
        }
    };
    let mut k = ss;
    if *eobrun == 0 {
        let ac = table(ac)?;
        while k <= se {
            let rs = r.decode(ac)?;
            let mut run = (rs >> 4) as i32;
            let s = rs & 15;
            let mut value = 0i16;
            if s != 0 {
                value = if r.bit() { p1 } else { m1 };
            } else if run != 15 {
                *eobrun = (1 << run) + r.bits(run as u32);
                break;
            }
            // Past already-nonzero coefficients (each takes a correction bit) and `run` zero ones.
            while k <= se {
                let pos = NATURAL_ORDER[k];
                if block[pos] != 0 {
                    refine(r, &mut block[pos]);
                } else {
                    run -= 1;
                    if run < 0 {
                        break;
                    }
                }
                k += 1;
            }
            if value != 0 {
                block[NATURAL_ORDER[k]] = value;
            }
            k += 1;
        }
    }
    if *eobrun > 0 {
        while k <= se {
            refine(r, &mut block[NATURAL_ORDER[k]]);
            k += 1;
        }
        *eobrun -= 1;
    }
    Ok(())
}
