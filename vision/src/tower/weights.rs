//! The tower's tensors in a pack, resolved and shape-checked once (`Tower::new`), and their local
//! ids: 0 the patch embedding, then per block qkv, proj, fc1, fc2, then the merger's fc1, fc2, then
//! each DeepStack merger's fc1, fc2. `Tower::new` registers them on the runtime in this order and
//! keeps the handles by local id.

use packs::names::visual;
use packs::semantics::VisionSemantics;
use packs::{LinearIndex, Pack};

use super::VisionError;

/// A block's linears, in id order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockLinear {
    Qkv = 0,
    Proj = 1,
    Fc1 = 2,
    Fc2 = 3,
}
const BLOCK_LINEARS: [(BlockLinear, &str); 4] = [
    (BlockLinear::Qkv, "attn.qkv"),
    (BlockLinear::Proj, "attn.proj"),
    (BlockLinear::Fc1, "mlp.linear_fc1"),
    (BlockLinear::Fc2, "mlp.linear_fc2"),
];

/// Which merger: the final one or DeepStack set `j`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merger {
    Final,
    DeepStack(usize),
}

/// Names and places of every tower tensor.
pub struct TowerWeights {
    /// Linear weights by local id.
    linears: Vec<LinearIndex>,
    /// The bias name of each linear, by local id.
    biases: Vec<String>,
    /// norm1.weight, norm1.bias, norm2.weight, norm2.bias of every block.
    block_norms: Vec<[String; 4]>,
    /// norm.weight, norm.bias of the final merger, then of each DeepStack merger.
    merger_norms: Vec<[String; 2]>,
    depth: usize,
}

/// The f32 tensors of one encode, looked up once per call.
pub struct Params<'p> {
    pub pos_embed: &'p [f32],
    pub biases: Vec<&'p [f32]>,
    pub block_norms: Vec<[&'p [f32]; 4]>,
    pub merger_norms: Vec<[&'p [f32]; 2]>,
}

impl TowerWeights {
    pub fn resolve(pack: &Pack, v: &VisionSemantics) -> Result<TowerWeights, VisionError> {
        let (h, inter, merged, out) = (
            v.hidden_size,
            v.intermediate_size,
            v.merged_hidden(),
            v.out_hidden_size,
        );
        let mut w = TowerWeights {
            linears: Vec::new(),
            biases: Vec::new(),
            block_norms: Vec::new(),
            merger_norms: Vec::new(),
            depth: v.depth,
        };
        w.linear(
            pack,
            visual::PATCH_EMBED,
            visual::PATCH_EMBED_BIAS.to_string(),
            h,
            v.patch_row_len(),
        )?;
        for b in 0..v.depth {
            for (which, stem) in BLOCK_LINEARS {
                let (n, k) = match which {
                    BlockLinear::Qkv => (3 * h, h),
                    BlockLinear::Proj => (h, h),
                    BlockLinear::Fc1 => (inter, h),
                    BlockLinear::Fc2 => (h, inter),
                };
                w.linear(
                    pack,
                    &visual::block(b, &format!("{stem}.weight")),
                    visual::block(b, &format!("{stem}.bias")),
                    n,
                    k,
                )?;
            }
            let norms = ["norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"]
                .map(|s| visual::block(b, s));
            for n in &norms {
                check_f32(pack, n, h)?;
            }
            w.block_norms.push(norms);
        }
        let mergers = std::iter::once(Merger::Final)
            .chain((0..v.deepstack_visual_indexes.len()).map(Merger::DeepStack));
        for m in mergers {
            let name = |s: &str| match m {
                Merger::Final => visual::merger(s),
                Merger::DeepStack(j) => visual::deepstack_merger(j, s),
            };
            w.linear(
                pack,
                &name("linear_fc1.weight"),
                name("linear_fc1.bias"),
                merged,
                merged,
            )?;
            w.linear(
                pack,
                &name("linear_fc2.weight"),
                name("linear_fc2.bias"),
                out,
                merged,
            )?;
            let norm_len = if m == Merger::Final { h } else { merged };
            let norms = [name("norm.weight"), name("norm.bias")];
            for n in &norms {
                check_f32(pack, n, norm_len)?;
            }
            w.merger_norms.push(norms);
        }
        let side = isqrt(v.num_position_embeddings);
        check_f32(pack, visual::POS_EMBED, v.num_position_embeddings * h)?;
        if side == 0 {
            return Err(VisionError::Input(format!(
                "{}: num_position_embeddings is 0",
                pack.path().display()
            )));
        }
        Ok(w)
    }

    fn linear(
        &mut self,
        pack: &Pack,
        name: &str,
        bias: String,
        n: usize,
        k: usize,
    ) -> Result<(), VisionError> {
        let index = pack.linear_index(name)?;
        let lin = pack.linear_at(index);
        if (lin.n, lin.k) != (n, k) {
            return Err(VisionError::Input(format!(
                "{}: {name} is [{}, {}], the vision config needs [{n}, {k}]",
                pack.path().display(),
                lin.n,
                lin.k
            )));
        }
        check_f32(pack, &bias, n)?;
        self.linears.push(index);
        self.biases.push(bias);
        Ok(())
    }

    /// How many backend ids the tower uses.
    pub fn count(&self) -> usize {
        self.linears.len()
    }

    pub fn patch_embed_id(&self) -> usize {
        0
    }

    pub fn block_id(&self, block: usize, which: BlockLinear) -> usize {
        1 + 4 * block + which as usize
    }

    /// Local ids of a merger's fc1 and fc2.
    pub fn merger_ids(&self, m: Merger) -> (usize, usize) {
        let base = 1 + 4 * self.depth;
        let j = match m {
            Merger::Final => 0,
            Merger::DeepStack(j) => j + 1,
        };
        (base + 2 * j, base + 2 * j + 1)
    }

    pub fn merger_norm_slot(&self, m: Merger) -> usize {
        match m {
            Merger::Final => 0,
            Merger::DeepStack(j) => j + 1,
        }
    }

    pub fn linear_index(&self, local: usize) -> LinearIndex {
        self.linears[local]
    }

    /// The f32 tensors, by name (checked in `resolve`, so a lookup fails only on a different pack).
    pub fn params<'p>(&self, pack: &'p Pack) -> Result<Params<'p>, VisionError> {
        let get = |n: &str| pack.f32_tensor(n).map_err(VisionError::from);
        Ok(Params {
            pos_embed: get(visual::POS_EMBED)?,
            biases: self
                .biases
                .iter()
                .map(|n| get(n))
                .collect::<Result<_, _>>()?,
            block_norms: self
                .block_norms
                .iter()
                .map(|ns| Ok([get(&ns[0])?, get(&ns[1])?, get(&ns[2])?, get(&ns[3])?]))
                .collect::<Result<_, VisionError>>()?,
            merger_norms: self
                .merger_norms
                .iter()
                .map(|ns| Ok([get(&ns[0])?, get(&ns[1])?]))
                .collect::<Result<_, VisionError>>()?,
        })
    }
}

fn check_f32(pack: &Pack, name: &str, len: usize) -> Result<(), VisionError> {
    let t = pack.f32_tensor(name)?;
    if t.len() != len {
        return Err(VisionError::Input(format!(
            "{}: {name} holds {} values, the vision config needs {len}",
            pack.path().display(),
            t.len()
        )));
    }
    Ok(())
}

/// `int(n ** 0.5)`: the side of the square position table.
pub fn isqrt(n: usize) -> usize {
    let mut s = (n as f64).sqrt() as usize;
    while s * s > n {
        s -= 1;
    }
    while (s + 1) * (s + 1) <= n {
        s += 1;
    }
    s
}
