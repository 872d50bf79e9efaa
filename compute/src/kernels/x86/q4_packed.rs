//! q4, many rows: a panel of 16 weight rows is unpacked once into [group][chunk][row][4 bytes] with
//! each nibble in a byte of its own, then every activation row broadcasts 4 codes at a time against
//! it; lanes are weight rows throughout. A whole pack panel unpacks by splitting its nibbles (the
//! pack's chunks already hold the rows side by side); other rows are gathered 8 at a time and
//! transposed (`q4_pack_panel`). The 16-lane vectors are `wide.rs`'s.

use super::{copy_live, map_n, panel_rows, transpose8};
use crate::kernels::row_blocks::{row_blocks, INT_BLOCK_BYTES};
use crate::kernels::{q4_halves, Activations, Q4Codes, PANEL};
use half::bf16;
use packs::quant::{Q4_CHUNK, Q4_CHUNKS, Q4_GROUP};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Activation rows per packed q4 tile.
pub(super) const Q4_TILE_ROWS: usize = 4;
/// Most weight rows the packed q4 kernel unpacks at once (256 x K bytes; a host task's whole chunk).
const Q4_PACKED_ROWS: usize = 256;

thread_local! {
    static Q4_PANEL: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// One q4 group (16 bytes) as its 32 unsigned nibbles (`code + 8`, as stored): the 16 low nibbles
/// (even elements), then the 16 high nibbles (odd elements) — the `Q4Groups` activation order.
///
/// # Safety
/// The CPU must support AVX2; `p` must point to 16 readable bytes.
#[inline(always)]
unsafe fn expand_q4(p: *const u8) -> __m256i {
    // SAFETY: AVX2, which the caller guarantees; the load reads the 16 bytes at `p`, readable by
    // this function's contract.
    unsafe {
        let b = _mm_loadu_si128(p as *const __m128i);
        let w = _mm256_srlv_epi64(
            _mm256_broadcastsi128_si256(b),
            _mm256_set_epi64x(4, 4, 0, 0),
        );
        _mm256_and_si256(w, _mm256_set1_epi8(0x0F))
    }
}

/// Activation chunk j (4 codes) of a packed-panel group, as an i32 to broadcast.
///
/// # Safety
/// `j` must be below 8, and `even` and `odd` must each point to 16 readable codes.
#[inline(always)]
pub(super) unsafe fn chunk(even: *const i8, odd: *const i8, j: usize) -> i32 {
    // SAFETY: chunk j < 4 reads codes `4j..4j + 4` of `even`, chunk j >= 4 codes
    // `4(j - 4)..4(j - 4) + 4` of `odd`: inside their 16 for j < 8, by this function's contract.
    unsafe {
        let p = if j < 4 {
            even.add(4 * j)
        } else {
            odd.add(4 * (j - 4))
        };
        (p as *const i32).read_unaligned()
    }
}

/// Unpacks groups `from..` of the 8 weight rows `js` into lanes `8 * half ..` of a packed panel
/// `lanes` rows wide:
/// `wp` holds per group and chunk j (4 codes) the `lanes` rows' 4 bytes side by side
/// (`groups x 8 x 4 * lanes` bytes), `sp` per group the rows' scales (`groups x lanes`). The 8-lane
/// kernels use one half; the 16-lane (`wide`) ones two.
///
/// # Safety
/// The CPU must support AVX2; `8 * (half + 1) <= lanes` and `wp.len() >= k / 32 * 32 * lanes`
/// (its stores are unchecked; every other access is checked).
#[inline(always)]
pub(super) unsafe fn q4_pack_panel(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    (k, from): (usize, usize),
    js: [usize; PANEL],
    (lanes, half): (usize, usize),
    wp: &mut [u8],
    sp: &mut [f32],
) {
    let groups = k / Q4_GROUP;
    debug_assert!(wp.len() >= groups * 32 * lanes && sp.len() >= groups * lanes);
    for g in from..groups {
        // SAFETY: AVX2, which the caller guarantees; each `expand_q4` reads one group's 16 bytes
        // (a checked slice); each store writes 32 bytes at `at`, and `at + 32 <= (g + 1) * 32 *
        // lanes <= wp.len()` as `32 * (half + 1) <= 4 * lanes`, both by this function's contract.
        unsafe {
            let mut e = [_mm256_setzero_ps(); PANEL];
            for c in 0..PANEL {
                let bytes = codes.group(js[c], g);
                e[c] = _mm256_castsi256_ps(expand_q4(bytes.as_ptr()));
            }
            // Chunk j (4 codes) of every row side by side.
            for (j, t) in transpose8(e).into_iter().enumerate() {
                let at = g * 32 * lanes + 4 * lanes * j + 32 * half;
                _mm256_storeu_ps(wp.as_mut_ptr().add(at) as *mut f32, t);
            }
        }
        for (c, &jr) in js.iter().enumerate() {
            sp[g * lanes + PANEL * half + c] = scales[jr * groups + g].to_f32();
        }
    }
}

/// The bf16 scales of 8 groups of 8 weight rows (`s[c]` points at row c's first) as f32, transposed:
/// vector g holds group g, lane c = row c.
///
/// # Safety
/// The CPU must support AVX2; every `s[c]` must point to 8 readable bf16 values.
#[inline(always)]
unsafe fn scales8x8(s: [*const bf16; PANEL]) -> [__m256; 8] {
    // SAFETY: AVX2, which the caller guarantees; each load reads 8 bf16 values (16 bytes) at an
    // `s[c]`, readable by this function's contract.
    unsafe {
        // Rows c and c + 4 share a register (low and high 128 bits).
        let mut r = [_mm256_setzero_si256(); 4];
        for c in 0..4 {
            r[c] = _mm256_loadu2_m128i(s[c + 4] as *const __m128i, s[c] as *const __m128i);
        }
        let a_lo = _mm256_unpacklo_epi16(r[0], r[1]);
        let a_hi = _mm256_unpackhi_epi16(r[0], r[1]);
        let b_lo = _mm256_unpacklo_epi16(r[2], r[3]);
        let b_hi = _mm256_unpackhi_epi16(r[2], r[3]);
        // Groups (0, 1), (2, 3), (4, 5), (6, 7): four rows of each per 128 bits.
        let q = [
            _mm256_unpacklo_epi32(a_lo, b_lo),
            _mm256_unpackhi_epi32(a_lo, b_lo),
            _mm256_unpacklo_epi32(a_hi, b_hi),
            _mm256_unpackhi_epi32(a_hi, b_hi),
        ];
        // bf16 to f32: the 16 bits become the high half of a 32-bit lane.
        let z = _mm256_setzero_si256();
        let mut out = [_mm256_setzero_ps(); 8];
        for (i, &qi) in q.iter().enumerate() {
            out[2 * i] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, qi));
            out[2 * i + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, qi));
        }
        out
    }
}

/// The scales of the block's 16 weight rows `j0..j0 + 16` as f32, a panel's order: `sp[g * 16 + c]`
/// is row `j0 + c`'s scale of group g. 8 groups of 8 rows at a time through [`scales8x8`], then the
/// groups past the last multiple of 8 one by one.
///
/// # Safety
/// The CPU must support AVX2; `scales` must hold the scales of the rows `j0..j0 + 16` (`groups`
/// each, row-major) and `sp` at least `groups * 16` floats (its stores are unchecked).
#[inline(always)]
pub(super) unsafe fn panel_scales(scales: &[bf16], j0: usize, groups: usize, sp: &mut [f32]) {
    const LANES: usize = MAX_LANES;
    assert!(scales.len() >= (j0 + LANES) * groups);
    debug_assert!(sp.len() >= groups * LANES);
    let blocks = groups / 8;
    for half in 0..2 {
        let rows = map_n(
            std::array::from_fn(|c| j0 + PANEL * half + c),
            |j: usize| &scales[j * groups..(j + 1) * groups],
        );
        for b in 0..blocks {
            // SAFETY: AVX2, which the caller guarantees; each row holds `groups >= 8 b + 8` scales;
            // the stores write floats `(8 b + i) * 16 + 8 half..+8` of `sp`, below `groups * 16`.
            unsafe {
                let scale = scales8x8(map_n(rows, |r| r.as_ptr().add(8 * b)));
                for (i, v) in scale.into_iter().enumerate() {
                    _mm256_storeu_ps(sp.as_mut_ptr().add((8 * b + i) * LANES + PANEL * half), v);
                }
            }
        }
        for g in 8 * blocks..groups {
            for (c, r) in rows.iter().enumerate() {
                sp[g * LANES + PANEL * half + c] = r[g].to_f32();
            }
        }
    }
}

/// A whole pack panel (16 rows, chunk-major) as a packed panel of 16 lanes: per group, chunk t's
/// 64 bytes split into its low nibbles (packed chunk t: even elements) and high nibbles (packed
/// chunk 4 + t: odd elements). No transpose: the pack's chunks already hold the 16 rows side by
/// side.
///
/// # Safety
/// The CPU must support AVX2; `base` must point to a whole pack panel of `groups` groups
/// (`256 * groups` readable bytes); `wp` must hold at least `groups * 512` bytes (its stores are
/// unchecked).
#[inline(always)]
unsafe fn unpack_whole_panel(base: *const u8, groups: usize, wp: &mut [u8]) {
    const LANES: usize = MAX_LANES;
    debug_assert!(wp.len() >= groups * 32 * LANES);
    let chunks = Q4_CHUNKS;
    // SAFETY: AVX2, which the caller guarantees; group g < `groups` reads bytes
    // `256 g..256 (g + 1)` at `base` and writes bytes `512 g..512 (g + 1)` of `wp`, both inside by
    // this function's contract.
    unsafe {
        let to = wp.as_mut_ptr();
        for g in 0..groups {
            for t in 0..chunks {
                for h in 0..2 {
                    let at = base.add(Q4_CHUNK * LANES * (chunks * g + t) + 32 * h);
                    let (lo, hi) =
                        super::q4_few::split_nibbles(_mm256_loadu_si256(at as *const __m256i));
                    let w = to.add(32 * LANES * g + 32 * h);
                    _mm256_storeu_si256(w.add(Q4_CHUNK * LANES * t) as *mut __m256i, lo);
                    _mm256_storeu_si256(w.add(Q4_CHUNK * LANES * (chunks + t)) as *mut __m256i, hi);
                }
            }
        }
    }
}

/// Most weight rows of a packed panel (the 512-bit kernels').
pub(super) const MAX_LANES: usize = 2 * PANEL;

/// A vector of weight-row lanes a packed q4 panel is read in: 8 (`ymm`) or 16 (`zmm`, or two `ymm`
/// in the tests), packed by [`q4_pack_panel`] 8 rows at a time, and the operations of
/// [`q4_packed_tile`].
///
/// Every method needs the CPU to support the implementing type's instructions (*`Self`'s
/// features*: AVX2 for the `ymm` pairs, AVX-512 F and VNNI for `zmm`).
pub(crate) trait PanelLanes {
    /// Weight rows per vector: a multiple of 8, at most [`MAX_LANES`] (the tiles' output rows).
    const LANES: usize;
    /// i32 lanes.
    type I: Copy;
    /// f32 lanes.
    type F: Copy;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn zero_f() -> Self::F;
    /// # Safety
    /// The CPU must support `Self`'s features; `p` must point to `LANES` readable floats.
    unsafe fn load_f(p: *const f32) -> Self::F;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn set1_i(x: i32) -> Self::I;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn set1_f(x: f32) -> Self::F;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn sub_i(a: Self::I, b: Self::I) -> Self::I;
    /// i32 to f32, rounded to nearest (as `as f32`).
    ///
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn cvt(a: Self::I) -> Self::F;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    /// # Safety
    /// The CPU must support `Self`'s features; `p` must point to `LANES` writable floats.
    unsafe fn store_f(p: *mut f32, v: Self::F);
    /// `from` plus one q4 group of a packed panel against one activation row: lane c is `from +
    /// Σ_j wg[j][c] · a_j` over the 8 chunks, where chunk j < 4 reads `even[4j..]` and chunk j >= 4
    /// `odd[4(j-4)..]` (`from` = minus the group's offset sum: the exact integer the kernels
    /// scale; a form may start its accumulator there).
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; `wg` must point to the group's `32 * LANES` readable
    /// bytes, `even` and `odd` to 16 readable codes each.
    unsafe fn group_dot(wg: *const u8, from: i32, even: *const i8, odd: *const i8) -> Self::I;
    /// One group of a whole pack panel of 16 rows (chunk-major): vector t holds every row's chunk
    /// t (bytes `4 t..4 t + 4` of its group), lane = row. Their low nibbles are the group's packed
    /// chunks 0..4 (even elements), the high ones chunks 4..8 (odd elements).
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; `p` must point to 256 readable bytes.
    unsafe fn group_codes16(p: *const u8) -> [Self::I; 4];
    /// A vector's bytes as their (low, high) nibbles, each a byte 0..=15.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features.
    unsafe fn nibbles(x: Self::I) -> (Self::I, Self::I);
    /// `from` plus [`PanelLanes::group_dot`] with the group's 8 chunks in registers (`w[j]`:
    /// chunk j, lanes weight rows) instead of a packed panel in memory: the same exact integer dot
    /// (`from` = minus the group's offset sum saves the subtraction that follows the dot).
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; `even` and `odd` must point to 16 readable codes
    /// each.
    unsafe fn group_dot_regs(
        w: &[Self::I; 8],
        from: i32,
        even: *const i8,
        odd: *const i8,
    ) -> Self::I;
    /// Every activation row against group `g` of a whole pack panel (`p`: the group's 256 bytes,
    /// `scale`: its 16 scales), continuing `sum[r]` by `(dot - corr) as f32 * scale` — the
    /// operations of [`q4_packed_tile`] per output, so its bits. This form splits the group's 4
    /// chunk vectors into 8 nibble vectors once and takes every row's dot from them
    /// ([`PanelLanes::group_dot_regs`]); lanes with few registers have their own.
    ///
    /// # Safety
    /// The CPU must support `Self`'s features; `p` must point to 256 readable bytes; every row of
    /// `a` and `corr` must hold the codes and the sum of group `g` of `groups` (`Q4Groups`); `sum`
    /// holds at least `a.len()` vectors.
    #[inline(always)]
    unsafe fn direct_group(
        p: *const u8,
        scale: Self::F,
        (g, groups): (usize, usize),
        a: &[&[i8]],
        corr: &[&[i32]],
        sum: &mut [Self::F],
    ) where
        Self: Sized,
    {
        // SAFETY: `direct_group_regs`'s contract is this one.
        unsafe { direct_group_regs::<Self>(p, scale, (g, groups), a, corr, sum) }
    }
    /// [`q4_packed_tile`] for [`Q4_TILE_ROWS`] rows, unless the lanes have a tuned form (same
    /// operations per output, so the same bits).
    ///
    /// # Safety
    /// As [`q4_packed_tile`].
    #[inline(always)]
    unsafe fn tile4(
        wp: &[u8],
        sp: &[f32],
        a: [&[i8]; Q4_TILE_ROWS],
        corr: [&[i32]; Q4_TILE_ROWS],
        a_scale: [f32; Q4_TILE_ROWS],
        groups: usize,
    ) -> [[f32; MAX_LANES]; Q4_TILE_ROWS]
    where
        Self: Sized,
    {
        // SAFETY: `q4_packed_tile`'s contract is this one.
        unsafe { q4_packed_tile::<Self, Q4_TILE_ROWS>(wp, sp, a, corr, a_scale, groups) }
    }
}

/// [`PanelLanes::direct_group`]'s general form: the group's 4 chunk vectors split into 8 nibble
/// vectors once, and every row's dot taken from them ([`PanelLanes::group_dot_regs`]).
///
/// # Safety
/// As [`PanelLanes::direct_group`].
#[inline(always)]
pub(super) unsafe fn direct_group_regs<V: PanelLanes>(
    p: *const u8,
    scale: V::F,
    (g, groups): (usize, usize),
    a: &[&[i8]],
    corr: &[&[i32]],
    sum: &mut [V::F],
) {
    // SAFETY: `V`'s features, which the caller guarantees; the group's bytes and every row's codes
    // and sum are inside by this function's contract (`q4_halves` puts both halves of group g
    // inside the row).
    unsafe {
        let t = V::group_codes16(p);
        let mut ch = [t[0]; 8];
        for j in 0..4 {
            (ch[j], ch[4 + j]) = V::nibbles(t[j]);
        }
        let (even, odd) = q4_halves(g, groups);
        for r in 0..a.len() {
            let ar = a[r].as_ptr();
            let from = -*corr[r].as_ptr().add(g);
            let dot = V::group_dot_regs(&ch, from, ar.add(even), ar.add(odd));
            sum[r] = V::add_f(sum[r], V::mul_f(V::cvt(dot), scale));
        }
    }
}

/// R activation rows against a packed panel of `V::LANES` weight rows, finished (`finish_q4`):
/// `done[r][c]` for weight row c (c < `V::LANES`). Per output: exact integer group dots, then
/// `sum + acc as f32 * scale` per group in ascending order (multiply, then add), in its own lane.
///
/// # Safety
/// The CPU must support `V`'s features. Read unchecked: `groups * 32 * V::LANES` bytes of `wp`,
/// `groups * V::LANES` floats of `sp` and `32 * groups` codes of every `a[r]` (`Q4Groups` layout).
#[inline(always)]
pub(super) unsafe fn q4_packed_tile<V: PanelLanes, const R: usize>(
    wp: &[u8],
    sp: &[f32],
    a: [&[i8]; R],
    corr: [&[i32]; R],
    a_scale: [f32; R],
    groups: usize,
) -> [[f32; MAX_LANES]; R] {
    // SAFETY: `V`'s features, which the caller guarantees. For g < `groups`: the scales read are
    // floats `g * LANES..(g + 1) * LANES` of `sp`, the group's weights bytes `g * 32 * LANES..(g +
    // 1) * 32 * LANES` of `wp`, and `q4_halves` puts both 16-code halves of group g below
    // `32 * groups` in every row, all inside by this function's contract; each store writes
    // `LANES <= MAX_LANES` floats of a `done` row.
    unsafe {
        let mut sum = [V::zero_f(); R];
        for g in 0..groups {
            let scale = V::load_f(sp.as_ptr().add(g * V::LANES));
            let wg = wp.as_ptr().add(g * 32 * V::LANES);
            let (even, odd) = q4_halves(g, groups);
            for r in 0..R {
                let ar = a[r].as_ptr();
                let acc = V::group_dot(wg, corr[r][g].wrapping_neg(), ar.add(even), ar.add(odd));
                sum[r] = V::add_f(sum[r], V::mul_f(V::cvt(acc), scale));
            }
        }
        let mut done = [[0f32; MAX_LANES]; R];
        for r in 0..R {
            V::store_f(
                done[r].as_mut_ptr(),
                V::mul_f(sum[r], V::set1_f(a_scale[r])),
            );
        }
        done
    }
}

/// q4 weight rows against every activation row of `acts` (K at least one group), a packed panel of
/// `V::LANES` weight rows at a time: tiles of [`Q4_TILE_ROWS`] rows, then one row at a time.
///
/// # Safety
/// The CPU must support `V`'s features; the rows `0..out.len()` of `acts` must hold at least `k`
/// codes (the tiles read them unchecked).
#[inline(always)]
pub(super) unsafe fn q4_block_packed<V: PanelLanes>(
    codes: Q4Codes<'_>,
    scales: &[bf16],
    k: usize,
    acts: &Activations,
    out: &mut [&mut [f32]],
) {
    let groups = k / Q4_GROUP;
    let (rows, nb) = (out.len(), out[0].len());
    let lanes = V::LANES;
    let (pb, ps) = (groups * 32 * lanes, groups * lanes);
    // The buffers leave the thread-local while the kernel runs: no SIMD code inside a closure
    // (closures do not inherit the entry point's target features).
    let (mut wp, mut sp) = Q4_PANEL.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // Up to Q4_PACKED_ROWS weight rows are unpacked once into consecutive panels; then each block of
    // activation rows passes over all of them.
    for c0 in (0..nb).step_by(Q4_PACKED_ROWS) {
        let panels = (nb - c0).min(Q4_PACKED_ROWS).div_ceil(lanes);
        wp.resize(panels * pb, 0);
        sp.resize(panels * ps, 0.0);
        for p in 0..panels {
            let j0 = c0 + p * lanes;
            let (wpp, spp) = (&mut wp[p * pb..(p + 1) * pb], &mut sp[p * ps..(p + 1) * ps]);
            match codes.panel_at(j0).filter(|_| j0 + lanes <= nb) {
                // A whole pack panel: its chunks already hold the 16 rows side by side.
                // SAFETY: `V`'s features include AVX2; the panel at `at` is a whole pack panel of
                // `groups` groups inside the codes (`panel_at`), `wpp` is `groups * 32 * 16` bytes
                // and `spp` `groups * 16` floats, and the rows `j0..j0 + 16` are rows of the block
                // with `groups` scales each.
                Some(at) if lanes == 2 * PANEL => unsafe {
                    unpack_whole_panel(codes.all().as_ptr().add(at), groups, wpp);
                    panel_scales(scales, j0, groups, spp);
                },
                _ => {
                    for half in 0..lanes / PANEL {
                        let js = panel_rows::<PANEL>(j0 + PANEL * half, nb);
                        // SAFETY: `V`'s features include AVX2; `half < lanes / 8` and `wpp` is
                        // `groups * 32 * lanes` bytes.
                        unsafe {
                            q4_pack_panel(codes, scales, (k, 0), js, (lanes, half), wpp, spp)
                        };
                    }
                }
            }
        }
        for rb in row_blocks(rows, k + 4 * groups, INT_BLOCK_BYTES, Q4_TILE_ROWS) {
            for p in 0..panels {
                let j0 = c0 + p * lanes;
                let (wpp, spp) = (&wp[p * pb..(p + 1) * pb], &sp[p * ps..(p + 1) * ps]);
                let live = (nb - j0).min(lanes);
                let mut r = rb.start;
                while r + Q4_TILE_ROWS <= rb.end {
                    let rs: [usize; Q4_TILE_ROWS] = std::array::from_fn(|i| r + i);
                    // SAFETY: `V`'s features, which the caller guarantees; `wpp` and `spp` are one
                    // packed panel of `groups` groups; the activation rows (below `rows`) hold at
                    // least `k >= 32 * groups` codes by this function's contract.
                    let done = unsafe {
                        V::tile4(
                            wpp,
                            spp,
                            map_n(rs, |i| acts.codes(i)),
                            map_n(rs, |i| acts.sums(i)),
                            map_n(rs, |i| acts.scale(i)),
                            groups,
                        )
                    };
                    for (i, d) in done.iter().enumerate() {
                        copy_live(&mut out[r + i][j0..], d, lanes, live);
                    }
                    r += Q4_TILE_ROWS;
                }
                while r < rb.end {
                    // SAFETY: as for the tiles above.
                    let [d] = unsafe {
                        q4_packed_tile::<V, 1>(
                            wpp,
                            spp,
                            [acts.codes(r)],
                            [acts.sums(r)],
                            [acts.scale(r)],
                            groups,
                        )
                    };
                    copy_live(&mut out[r][j0..], &d, lanes, live);
                    r += 1;
                }
            }
        }
    }
    Q4_PANEL.with(|cell| *cell.borrow_mut() = (wp, sp));
}
