//! Which tensors a pack holds, in which dtype and shape: one plan shared by the writer (what to
//! produce) and the reader (what to require).

use crate::container::Dtype;
use crate::names::{self, Norm, Proj, EMBED, FINAL_NORM, LM_HEAD};
use crate::quant::{QuantKind, Q4_GROUP};
use crate::semantics::Semantics;

/// What a weight is; decides how it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightRole {
    Embedding,
    Norm,
    Linear,
}

/// One logical weight of the decoder: `rows x cols` (`cols` only for norms, `rows == 1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightPlan {
    /// Name in the pack.
    pub name: String,
    /// Pack-layout name of the weight whose values it holds (the embedding for a tied head).
    pub source: String,
    pub role: WeightRole,
    pub rows: usize,
    pub cols: usize,
}

/// How a weight's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
    I8,
    Q4,
}

/// One tensor of the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn byte_len(&self) -> u64 {
        self.shape
            .iter()
            .fold(self.dtype.size() as u64, |acc, &d| acc * d as u64)
    }
}

/// A tied head in an f32/bf16 pack is the embedding itself; every other head is stored.
pub fn head_is_stored(sem: &Semantics) -> bool {
    !sem.tie_word_embeddings || sem.quant.is_integer()
}

impl WeightPlan {
    pub fn storage(&self, quant: QuantKind) -> Storage {
        match (self.role, quant) {
            (WeightRole::Norm, _) => Storage::F32,
            (WeightRole::Embedding, QuantKind::F32) => Storage::F32,
            (WeightRole::Embedding, _) => Storage::Bf16,
            (WeightRole::Linear, QuantKind::F32) => Storage::F32,
            (WeightRole::Linear, QuantKind::Bf16) => Storage::Bf16,
            (WeightRole::Linear, QuantKind::I8) => Storage::I8,
            (WeightRole::Linear, QuantKind::Q4) => Storage::Q4,
        }
    }

    /// The container tensors of this weight: the values, then the scales if quantized.
    pub fn tensors(&self, quant: QuantKind) -> Vec<TensorSpec> {
        let dims = if self.role == WeightRole::Norm {
            vec![self.cols]
        } else {
            vec![self.rows, self.cols]
        };
        let spec = |name: String, dtype, shape| TensorSpec { name, dtype, shape };
        match self.storage(quant) {
            Storage::F32 => vec![spec(self.name.clone(), Dtype::F32, dims)],
            Storage::Bf16 => vec![spec(self.name.clone(), Dtype::BF16, dims)],
            Storage::I8 => vec![
                spec(self.name.clone(), Dtype::I8, dims),
                spec(names::scales_of(&self.name), Dtype::F32, vec![self.rows]),
            ],
            Storage::Q4 => vec![
                spec(self.name.clone(), Dtype::U8, vec![self.rows, self.cols / 2]),
                spec(
                    names::scales_of(&self.name),
                    Dtype::BF16,
                    vec![self.rows, self.cols / Q4_GROUP],
                ),
            ],
        }
    }
}

/// Every weight of the pack in file order. `sem` must be validated.
pub fn weights(sem: &Semantics) -> Vec<WeightPlan> {
    let h = sem.hidden_size;
    let weight = |name: String, role, rows, cols| WeightPlan {
        source: name.clone(),
        name,
        role,
        rows,
        cols,
    };
    let norm = |name: String, len| weight(name, WeightRole::Norm, 1, len);
    let linear = |name: String, rows, cols| weight(name, WeightRole::Linear, rows, cols);
    let mut plan = vec![weight(
        EMBED.to_string(),
        WeightRole::Embedding,
        sem.vocab_size,
        h,
    )];
    for layer in 0..sem.num_layers {
        plan.push(norm(names::norm(layer, Norm::Input), h));
        for p in Proj::ALL {
            let (rows, cols) = match p {
                Proj::Q => (sem.q_dim(), h),
                Proj::K | Proj::V => (sem.kv_dim(), h),
                Proj::O => (h, sem.q_dim()),
                Proj::Gate | Proj::Up => (sem.intermediate_size, h),
                Proj::Down => (h, sem.intermediate_size),
            };
            plan.push(linear(names::proj(layer, p), rows, cols));
            if p == Proj::K {
                plan.push(norm(names::norm(layer, Norm::QNorm), sem.head_dim));
                plan.push(norm(names::norm(layer, Norm::KNorm), sem.head_dim));
            }
            if p == Proj::O {
                plan.push(norm(names::norm(layer, Norm::PostAttention), h));
            }
        }
    }
    plan.push(norm(FINAL_NORM.to_string(), h));
    if head_is_stored(sem) {
        let mut head = linear(LM_HEAD.to_string(), sem.vocab_size, h);
        if sem.tie_word_embeddings {
            head.source = EMBED.to_string();
        }
        plan.push(head);
    }
    plan
}

/// Every container tensor of the pack in file order.
pub fn tensor_specs(sem: &Semantics) -> Vec<TensorSpec> {
    weights(sem)
        .iter()
        .flat_map(|w| w.tensors(sem.quant))
        .collect()
}
