//! The KV cache. A *cache slot* is where a token's K/V live; it is a separate number from the token's
//! rotary position (after an image the position runs behind the slot).

use half::bf16;

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
}

/// K and V for every layer, `capacity` slots of `kv_dim` values each, in one type.
#[derive(Debug)]
pub struct KvStore<T> {
    pub k: Vec<Vec<T>>,
    pub v: Vec<Vec<T>>,
}

#[derive(Debug)]
pub enum KvData {
    F32(KvStore<f32>),
    Bf16(KvStore<bf16>),
}

/// The cache: `len` slots are filled (0..len); the next write goes to slot `len`.
#[derive(Debug)]
pub struct KvCache {
    pub data: KvData,
    pub capacity: usize,
    pub kv_dim: usize,
    len: usize,
}

fn store<T: KvElem>(layers: usize, capacity: usize, kv_dim: usize) -> KvStore<T> {
    let zero = T::from_f32(0.0);
    KvStore {
        k: (0..layers).map(|_| vec![zero; capacity * kv_dim]).collect(),
        v: (0..layers).map(|_| vec![zero; capacity * kv_dim]).collect(),
    }
}

impl KvCache {
    pub fn new(dtype: KvDtype, layers: usize, capacity: usize, kv_dim: usize) -> KvCache {
        let data = match dtype {
            KvDtype::F32 => KvData::F32(store(layers, capacity, kv_dim)),
            KvDtype::Bf16 => KvData::Bf16(store(layers, capacity, kv_dim)),
        };
        KvCache {
            data,
            capacity,
            kv_dim,
            len: 0,
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
        debug_assert!(new_len <= self.capacity);
        self.len = new_len;
    }

    /// Forget everything (the buffers stay allocated).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Drop slots `len..` so decoding can continue from an earlier point.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
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
        2 * layers * self.kv_dim * elem
    }

    /// Bytes the cache holds allocated (all slots).
    pub fn bytes_allocated(&self) -> usize {
        self.bytes_per_token() * self.capacity
    }
}

impl<T: KvElem> KvStore<T> {
    /// Writes one row of K and V (each `kv_dim`) at `slot` of `layer`.
    pub fn write(&mut self, layer: usize, slot: usize, kv_dim: usize, k: &[f32], v: &[f32]) {
        let range = slot * kv_dim..(slot + 1) * kv_dim;
        for (d, &s) in self.k[layer][range.clone()].iter_mut().zip(k) {
            *d = T::from_f32(s);
        }
        for (d, &s) in self.v[layer][range].iter_mut().zip(v) {
            *d = T::from_f32(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_counts_k_and_v_of_every_layer() {
        let c = KvCache::new(KvDtype::F32, 28, 4, 8 * 128);
        assert_eq!(c.bytes_per_token(), 2 * 28 * 1024 * 4);
        let b = KvCache::new(KvDtype::Bf16, 28, 4, 8 * 128);
        assert_eq!(b.bytes_per_token() * 2, c.bytes_per_token());
        assert_eq!(c.bytes_allocated(), 4 * c.bytes_per_token());
    }

    #[test]
    fn truncate_never_grows() {
        let mut c = KvCache::new(KvDtype::F32, 1, 8, 2);
        c.commit(5);
        c.truncate(7);
        assert_eq!(c.len(), 5);
        c.truncate(2);
        assert_eq!(c.len(), 2);
    }
}
