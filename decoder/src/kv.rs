//! The KV cache. A *cache slot* is where a token's K/V live; it is a separate number from the token's
//! rotary position (after an image the position runs behind the slot).

use half::bf16;

use crate::recurrent::{RecurrentState, StateLayout};

/// Storage type of cached K/V values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvDtype {
    #[default]
    F32,
    /// Half the memory; K/V rounded to bf16 when written (attention still computes in f32).
    Bf16,
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(KvDtype::F32),
            "bf16" => Ok(KvDtype::Bf16),
            other => Err(format!(
                "unknown KV cache type {other:?} (expected f32 or bf16)"
            )),
        }
    }
}

/// An element the cache can hold.
pub trait KvElem: Copy + Send + Sync + 'static {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    /// `dst[i] = from_f32(src[i])` for a whole run of values.
    fn from_f32_slice(dst: &mut [Self], src: &[f32]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(x);
        }
    }
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    /// 8 at a time on AVX2 ([`compute::kernels::f32_to_bf16`]), the same bits as `from_f32`.
    fn from_f32_slice(dst: &mut [Self], src: &[f32]) {
        compute::kernels::f32_to_bf16(dst, src)
    }
}

/// Slots per K tile: a head's K is stored as the attention kernels read it (`compute::attention`'s
/// key tiles, `Keys::Tiles`).
pub const K_TILE: usize = compute::attention::KEY_TILE;

/// K and V for every layer, head-major, so the attention of one KV head reads one contiguous run
/// per cache (a row-major `[slot][kv_head][head_dim]` cache gave each head 512 B every 4 KB: a new
/// page per slot). Layer l's V is `[kv_head][slot][head_dim]` (`capacity` slots per head); its K is
/// `[kv_head][tile][head_dim][K_TILE]` (`capacity` rounded up to whole tiles per head), each tile
/// of [`K_TILE`] slots transposed: written once per token, where a row-major K had every step
/// transpose each tile before its dots, which in a one-row decode step cost more than the dots
/// (f32 cache, ctx 2048: 20.5-22.0 ms of attention a token, against 31.0-32.5 for the kernel
/// before the tiled one; PERF.md, "K stored as the attention's tiles").
#[derive(Debug)]
pub struct KvStore<T> {
    pub k: Vec<Vec<T>>,
    pub v: Vec<Vec<T>>,
    pub capacity: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// One layer's K and V, head-major (see [`KvStore`]).
#[derive(Clone, Copy, Debug)]
pub struct KvHeads<'a, T> {
    pub k: &'a [T],
    pub v: &'a [T],
    pub capacity: usize,
    pub head_dim: usize,
}

/// Slots a head's K holds: `capacity` rounded up to whole tiles.
fn k_slots(capacity: usize) -> usize {
    capacity.div_ceil(K_TILE) * K_TILE
}

/// Where slot `slot`'s value `c` of a head's K is, from the head's start.
fn k_index(slot: usize, c: usize, head_dim: usize) -> usize {
    (slot / K_TILE) * K_TILE * head_dim + c * K_TILE + slot % K_TILE
}

impl<'a, T: Copy> KvHeads<'a, T> {
    /// KV head g's K tiles covering its first `slots` slots (`Keys::Tiles`; the slots of the last
    /// tile past `slots` hold whatever was written there).
    pub fn k_tiles(&self, g: usize, slots: usize) -> &'a [T] {
        let start = g * k_slots(self.capacity) * self.head_dim;
        &self.k[start..start + slots.div_ceil(K_TILE) * K_TILE * self.head_dim]
    }

    /// KV head g's K over its first `slots` slots, row-major (`slots x head_dim`, slot after
    /// slot): a copy, for tests and probes.
    pub fn k_rows(&self, g: usize, slots: usize) -> Vec<T> {
        let d = self.head_dim;
        let tiles = self.k_tiles(g, slots);
        (0..slots * d)
            .map(|i| tiles[k_index(i / d, i % d, d)])
            .collect()
    }

    /// KV head g's V over its first `slots` slots.
    pub fn v_head(&self, g: usize, slots: usize) -> &'a [T] {
        let start = g * self.capacity * self.head_dim;
        &self.v[start..start + slots * self.head_dim]
    }
}

#[derive(Debug)]
pub enum KvData {
    F32(KvStore<f32>),
    Bf16(KvStore<bf16>),
}

/// A sequence's cache: `len` slots are filled (0..len); the next write goes to slot `len`. A
/// Qwen3.5 sequence also holds the recurrent state of its Gated DeltaNet layers (its K/V are
/// those of the full-attention layers only).
#[derive(Debug)]
pub struct KvCache {
    pub data: KvData,
    len: usize,
    pub recurrent: Option<RecurrentState>,
}

fn store<T: KvElem>(
    layers: usize,
    capacity: usize,
    kv_heads: usize,
    head_dim: usize,
) -> KvStore<T> {
    filled_store(layers, capacity, kv_heads, head_dim, T::from_f32(0.0))
}

/// A store whose every value (written or not) is `x`.
pub(crate) fn filled_store<T: KvElem>(
    layers: usize,
    capacity: usize,
    kv_heads: usize,
    head_dim: usize,
    x: T,
) -> KvStore<T> {
    let len = capacity * kv_heads * head_dim;
    let k_len = k_slots(capacity) * kv_heads * head_dim;
    KvStore {
        k: (0..layers).map(|_| vec![x; k_len]).collect(),
        v: (0..layers).map(|_| vec![x; len]).collect(),
        capacity,
        kv_heads,
        head_dim,
    }
}

impl KvCache {
    /// A cache of `capacity` slots for `kv_heads` heads of `head_dim` values in each layer.
    pub fn new(
        dtype: KvDtype,
        layers: usize,
        capacity: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> KvCache {
        let data = match dtype {
            KvDtype::F32 => KvData::F32(store(layers, capacity, kv_heads, head_dim)),
            KvDtype::Bf16 => KvData::Bf16(store(layers, capacity, kv_heads, head_dim)),
        };
        KvCache {
            data,
            len: 0,
            recurrent: None,
        }
    }

    /// The cache with a recurrent state of `layout` beside its K/V (Qwen3.5).
    pub fn with_recurrent(mut self, layout: StateLayout) -> KvCache {
        self.recurrent = Some(RecurrentState::new(layout));
        self
    }

    /// A cache of no slots (a placeholder while the real one is lent out).
    pub(crate) fn empty() -> KvCache {
        KvCache::new(KvDtype::F32, 0, 0, 0, 0)
    }

    /// Layers the cache holds.
    pub fn layers(&self) -> usize {
        match &self.data {
            KvData::F32(s) => s.k.len(),
            KvData::Bf16(s) => s.k.len(),
        }
    }

    /// Values of one head's K (or V).
    pub fn head_dim(&self) -> usize {
        match &self.data {
            KvData::F32(s) => s.head_dim,
            KvData::Bf16(s) => s.head_dim,
        }
    }

    /// Slots per layer.
    pub fn capacity(&self) -> usize {
        match &self.data {
            KvData::F32(s) => s.capacity,
            KvData::Bf16(s) => s.capacity,
        }
    }

    /// Values of one token's K (or V) in one layer: KV heads x head_dim.
    pub fn kv_dim(&self) -> usize {
        match &self.data {
            KvData::F32(s) => s.kv_heads * s.head_dim,
            KvData::Bf16(s) => s.kv_heads * s.head_dim,
        }
    }

    /// Filled slots.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Marks slots `len..new_len` as filled (after a step succeeded).
    pub(crate) fn commit(&mut self, new_len: usize) {
        debug_assert!(new_len <= self.capacity());
        self.len = new_len;
    }

    /// Forget everything (the buffers stay allocated).
    pub fn reset(&mut self) {
        self.len = 0;
        if let Some(r) = &mut self.recurrent {
            r.reset();
        }
    }

    /// Drop slots `len..` so decoding can continue from an earlier point; returns the slots kept.
    /// K/V rows can be cut anywhere; a recurrent state only back to a row of the last step (a
    /// draft window, `recurrent::MAX_ROLLBACK_ROWS`) or to a prompt state (`checkpoint`) at or
    /// before `len`, else the whole cache is forgotten and 0 is returned: the caller prefills the
    /// rows past what is kept instead of continuing on a wrong state.
    #[must_use = "a recurrent cache may keep fewer slots than asked"]
    pub fn truncate(&mut self, len: usize) -> usize {
        let mut len = self.len.min(len);
        if let Some(r) = &mut self.recurrent {
            match r.restore(len, self.len) {
                Some(kept) => len = kept,
                None => {
                    self.reset();
                    return 0;
                }
            }
        }
        self.len = len;
        len
    }

    /// Keeps the recurrent state after the filled slots as a prompt state (Qwen3.5; nothing to
    /// keep for K/V, which can be cut anywhere): a later `truncate` to at least this many slots
    /// resumes from it instead of from nothing.
    pub fn checkpoint(&mut self) {
        if let Some(r) = &mut self.recurrent {
            r.checkpoint(self.len);
        }
    }

    /// How many of `src`'s first `rows` rows [`KvCache::copy_prefix`] would bring: all of them
    /// (up to its filled slots) for K/V; for a recurrent (Qwen3.5) cache only up to the latest
    /// prompt state `src` keeps within them (its DeltaNet state cannot be cut anywhere else), 0
    /// when it keeps none.
    pub fn copyable_prefix(&self, rows: usize) -> usize {
        let rows = rows.min(self.len);
        match &self.recurrent {
            Some(r) => r.prompt_state_within(rows).unwrap_or(0),
            None => rows,
        }
    }

    /// This cache forgets what it held and takes `src`'s first rows as if it had prefilled them:
    /// K/V slots `0..n` of every layer, and for a recurrent cache the prompt state `src` kept
    /// after those `n` rows, where `n` is [`KvCache::copyable_prefix`]`(rows)`. Returns `n`. A
    /// new sequence that starts as a running one started (a shared system prompt, the same
    /// picture) copies its rows instead of prefilling them: the copy is this cache's own slots,
    /// so it counts against the pool as a prefill would. Both caches must come from one model
    /// and pool (same dtype and shape).
    pub fn copy_prefix(&mut self, src: &KvCache, rows: usize) -> usize {
        let n = src.copyable_prefix(rows);
        self.copy_rows(src, n, n);
        n
    }

    /// A control for the tests of [`KvCache::copy_prefix`] only: as it, but the last copied slot
    /// keeps what this cache held there (a copy one row short that claims the whole prefix).
    #[doc(hidden)]
    pub fn copy_prefix_but_last_row(&mut self, src: &KvCache, rows: usize) -> usize {
        let n = src.copyable_prefix(rows);
        self.copy_rows(src, n, n.saturating_sub(1));
        n
    }

    /// Copies K/V slots `0..written` of every layer from `src` and holds `rows` slots.
    fn copy_rows(&mut self, src: &KvCache, rows: usize, written: usize) {
        assert!(
            self.dtype() == src.dtype()
                && self.layers() == src.layers()
                && self.kv_dim() == src.kv_dim()
                && self.head_dim() == src.head_dim()
                && self.recurrent.is_some() == src.recurrent.is_some()
                && rows <= self.capacity()
                && rows <= src.len(),
            "kv copy of {rows} rows: from a {:?} cache of {} layers x {} values ({} filled) to a {:?} \
             cache of {} layers x {} values, {} slots",
            src.dtype(),
            src.layers(),
            src.kv_dim(),
            src.len(),
            self.dtype(),
            self.layers(),
            self.kv_dim(),
            self.capacity()
        );
        self.reset();
        if rows == 0 {
            return;
        }
        if let (Some(dst), Some(from)) = (&mut self.recurrent, &src.recurrent) {
            let started = dst.start_from(from, rows);
            debug_assert!(started, "copyable_prefix named a prompt state src keeps");
        }
        match (&mut self.data, &src.data) {
            (KvData::F32(d), KvData::F32(s)) => d.copy_slots(s, written),
            (KvData::Bf16(d), KvData::Bf16(s)) => d.copy_slots(s, written),
            _ => unreachable!("the dtypes were checked"),
        }
        self.len = rows;
    }

    pub fn dtype(&self) -> KvDtype {
        match self.data {
            KvData::F32(_) => KvDtype::F32,
            KvData::Bf16(_) => KvDtype::Bf16,
        }
    }

    /// Bytes one token occupies across all layers (K and V).
    pub fn bytes_per_token(&self) -> usize {
        let (layers, elem) = match &self.data {
            KvData::F32(s) => (s.k.len(), 4),
            KvData::Bf16(s) => (s.k.len(), 2),
        };
        2 * layers * self.kv_dim() * elem
    }

    /// Bytes the cache holds allocated (all slots, K's last tile whole, and the recurrent state).
    pub fn bytes_allocated(&self) -> usize {
        let kv = match &self.data {
            KvData::F32(s) => 4 * s.values(),
            KvData::Bf16(s) => 2 * s.values(),
        };
        kv + self.recurrent.as_ref().map_or(0, |r| r.bytes_allocated())
    }
}

impl<T: KvElem> KvStore<T> {
    /// Writes one token's K and V (each `kv_heads x head_dim`, heads in order) at `slot` of `layer`.
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let d = self.head_dim;
        assert!(
            slot < self.capacity && k.len() == self.kv_heads * d && v.len() == k.len(),
            "kv write: slot {slot} of {}, {} K and {} V values for {} heads of {d}",
            self.capacity,
            k.len(),
            v.len(),
            self.kv_heads
        );
        let k_head = k_slots(self.capacity) * d;
        for g in 0..self.kv_heads {
            let at = (g * self.capacity + slot) * d;
            T::from_f32_slice(&mut self.v[layer][at..at + d], &v[g * d..(g + 1) * d]);
            let (kl, head) = (&mut self.k[layer][g * k_head..], &k[g * d..(g + 1) * d]);
            for (c, &x) in head.iter().enumerate() {
                kl[k_index(slot, c, d)] = T::from_f32(x);
            }
        }
    }

    /// Slots `0..slots` of every layer and head from `src` (same heads and head size; the
    /// capacities may differ, so each head's run is copied on its own).
    fn copy_slots(&mut self, src: &KvStore<T>, slots: usize) {
        let d = self.head_dim;
        let n = slots * d;
        for (dst, from) in self.v.iter_mut().zip(&src.v) {
            for g in 0..self.kv_heads {
                let (at, from_at) = (g * self.capacity * d, g * src.capacity * d);
                dst[at..at + n].copy_from_slice(&from[from_at..from_at + n]);
            }
        }
        // K: the whole tiles, then the last tile's first `slots % K_TILE` slots of each value row.
        let (whole, rest) = (slots / K_TILE * K_TILE * d, slots % K_TILE);
        let (head, src_head) = (k_slots(self.capacity) * d, k_slots(src.capacity) * d);
        for (dst, from) in self.k.iter_mut().zip(&src.k) {
            for g in 0..self.kv_heads {
                let (at, from_at) = (g * head, g * src_head);
                dst[at..at + whole].copy_from_slice(&from[from_at..from_at + whole]);
                for c in 0..d {
                    let (a, b) = (at + whole + c * K_TILE, from_at + whole + c * K_TILE);
                    dst[a..a + rest].copy_from_slice(&from[b..b + rest]);
                }
            }
        }
    }

    /// Values held, K and V of every layer.
    fn values(&self) -> usize {
        self.k.iter().chain(&self.v).map(Vec::len).sum()
    }

    /// Layer l's K and V.
    pub fn layer(&self, layer: usize) -> KvHeads<'_, T> {
        KvHeads {
            k: &self.k[layer],
            v: &self.v[layer],
            capacity: self.capacity,
            head_dim: self.head_dim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_counts_k_and_v_of_every_layer() {
        let c = KvCache::new(KvDtype::F32, 28, 4, 8, 128);
        assert_eq!(c.bytes_per_token(), 2 * 28 * 1024 * 4);
        let b = KvCache::new(KvDtype::Bf16, 28, 4, 8, 128);
        assert_eq!(b.bytes_per_token() * 2, c.bytes_per_token());
        // V's 4 slots, K's whole tile of K_TILE slots, 28 layers of 1024 values, 4 bytes.
        assert_eq!(c.bytes_allocated(), (4 + K_TILE) * 28 * 1024 * 4);
    }

    /// A written token lands at each head's own run, slot after slot; the control (the row-major
    /// index) would put head 1 where head 0's next slot lives.
    #[test]
    fn heads_are_contiguous_runs_of_slots() {
        let (cap, heads, d) = (3, 2, 4);
        let mut s = store::<f32>(1, cap, heads, d);
        for slot in 0..cap {
            let k: Vec<f32> = (0..heads * d)
                .map(|i| (100 * slot + 10 * (i / d) + i % d) as f32)
                .collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            s.write(0, slot, &k, &v);
        }
        let l = s.layer(0);
        for g in 0..heads {
            let k = l.k_rows(g, cap);
            for slot in 0..cap {
                for j in 0..d {
                    let want = (100 * slot + 10 * g + j) as f32;
                    assert_eq!(k[slot * d + j], want, "head {g} slot {slot} elem {j}");
                    // K tiles: slot after slot along each value row of the tile.
                    assert_eq!(l.k_tiles(g, cap)[j * K_TILE + slot], want);
                    assert_eq!(l.v_head(g, cap)[slot * d + j], -want);
                }
            }
        }
        // Control: V's row-major position of (slot 1, head 0) holds head 1 of slot 0 here, and K's
        // row-major position of (slot 1, value 0) is not slot 1's (K is tiled).
        let row_major = heads * d;
        assert_ne!(s.v[0][row_major], -100.0);
        assert_ne!(s.k[0][d], 100.0);
        assert_eq!(l.k_tiles(1, 1).len(), d * K_TILE);
    }

    /// A copied prefix is the source's slots, head by head, between caches of different
    /// capacities, and nothing past it; the control (one row short) leaves the last slot as the
    /// destination held it.
    #[test]
    fn a_copied_prefix_holds_the_sources_slots() {
        let (heads, d) = (2, 3);
        let value = |slot: usize, i: usize| (100 * slot + i) as f32 + 0.5;
        let mut src = KvCache::new(KvDtype::Bf16, 2, 6, heads, d);
        let KvData::Bf16(s) = &mut src.data else {
            unreachable!()
        };
        for layer in 0..2 {
            for slot in 0..5 {
                let k: Vec<f32> = (0..heads * d).map(|i| value(slot, i)).collect();
                let v: Vec<f32> = k.iter().map(|x| -x - layer as f32).collect();
                s.write(layer, slot, &k, &v);
            }
        }
        src.commit(5);
        let check = |dst: &KvCache, slots: usize| -> Vec<(usize, usize, usize)> {
            let (KvData::Bf16(a), KvData::Bf16(b)) = (&dst.data, &src.data) else {
                unreachable!()
            };
            let mut wrong = Vec::new();
            for layer in 0..2 {
                let (x, y) = (a.layer(layer), b.layer(layer));
                for g in 0..heads {
                    for slot in 0..slots {
                        let r = slot * d..(slot + 1) * d;
                        if x.k_rows(g, slots)[r.clone()] != y.k_rows(g, slots)[r.clone()]
                            || x.v_head(g, slots)[r.clone()] != y.v_head(g, slots)[r]
                        {
                            wrong.push((layer, g, slot));
                        }
                    }
                }
            }
            wrong
        };
        let mut dst = KvCache::new(KvDtype::Bf16, 2, 9, heads, d);
        dst.commit(7); // what it held before is forgotten
        assert_eq!(dst.copy_prefix(&src, 4), 4);
        assert_eq!(dst.len(), 4);
        assert!(check(&dst, 4).is_empty(), "{:?}", check(&dst, 4));
        // Never past the source's filled slots.
        assert_eq!(dst.copy_prefix(&src, 8), 5);
        // Control: a copy one row short is caught at its last slot only.
        let mut short = KvCache::new(KvDtype::Bf16, 2, 9, heads, d);
        assert_eq!(short.copy_prefix_but_last_row(&src, 4), 4);
        assert_eq!(
            check(&short, 4),
            vec![(0, 0, 3), (0, 1, 3), (1, 0, 3), (1, 1, 3)]
        );
    }

    #[test]
    #[should_panic(expected = "kv copy of 3 rows: from a F32 cache")]
    fn a_copy_between_dtypes_is_refused() {
        let mut src = KvCache::new(KvDtype::F32, 1, 4, 1, 2);
        src.commit(3);
        KvCache::new(KvDtype::Bf16, 1, 4, 1, 2).copy_prefix(&src, 3);
    }

    #[test]
    fn truncate_never_grows() {
        let mut c = KvCache::new(KvDtype::F32, 1, 8, 1, 2);
        c.commit(5);
        assert_eq!(c.truncate(7), 5);
        assert_eq!(c.len(), 5);
        assert_eq!(c.truncate(2), 2);
        assert_eq!(c.len(), 2);
    }
}
