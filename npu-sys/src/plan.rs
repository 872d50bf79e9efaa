//! Which design geometries a model needs: one per distinct (kind, K, N) of its quantized linears,
//! for each M tile (decode and prefill). The forward's device backend dispatches by the same rules.

use std::collections::BTreeMap;
use std::fmt;

use packs::names;
use packs::{LinearData, Pack, PackError};
use serde::Serialize;

use crate::geometry::{DesignKind, Geometry};

/// M tile for decode steps (a few rows; smaller M deadlocked a generic design, see DEVICE.md).
pub const DECODE_M_TILE: usize = 16;
/// M tile for prefill (the whole-array designs' usual M).
pub const PREFILL_M_TILE: usize = 128;
/// The M tiles a plan asks for, ascending.
pub const M_TILES: [usize; 2] = [DECODE_M_TILE, PREFILL_M_TILE];
/// Widest design N: a linear with more outputs (the LM head) is split into chunks of this many
/// rows of B, the last one zero-padded.
pub const MAX_DESIGN_N: usize = 8192;

/// The N of the design(s) a linear with `n` outputs runs on.
pub fn design_n(n: usize) -> usize {
    n.min(MAX_DESIGN_N)
}

/// How many launches of a `design_n`-wide design cover `n` outputs.
pub fn n_chunks(n: usize, design_n: usize) -> usize {
    n.div_ceil(design_n.max(1))
}

/// The smallest M tile of `tiles` (ascending) that holds `rows`, or the largest when none does
/// (the caller then loops over tiles).
pub fn m_tile_for(rows: usize, tiles: &[usize]) -> Option<usize> {
    tiles
        .iter()
        .copied()
        .find(|&t| t >= rows)
        .or_else(|| tiles.last().copied())
}

/// One linear of a model as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearShape {
    /// e.g. `q_proj`, `down_proj`, `lm_head`.
    pub role: String,
    /// The design kind its storage needs, or None when it is stored unquantized (host only).
    pub kind: Option<DesignKind>,
    pub k: usize,
    pub n: usize,
}

/// One (kind, K, N) the model needs, with the roles using it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedShape {
    pub kind: DesignKind,
    pub k: usize,
    /// The design's N (after splitting a wide linear).
    pub n: usize,
    /// Roles and how many linears of each (`q_proj` x 28).
    pub roles: Vec<(String, usize)>,
    /// Launches per use: more than 1 when a wide linear is split along N.
    pub n_chunks: usize,
    pub m_tiles: Vec<usize>,
}

impl PlannedShape {
    pub fn geometries(&self) -> impl Iterator<Item = Geometry> + '_ {
        self.m_tiles
            .iter()
            .map(|&m| Geometry::new(self.kind, m, self.k, self.n))
    }
}

/// Linears that stay on the host (stored unquantized).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostLinear {
    pub role: String,
    pub count: usize,
    pub k: usize,
    pub n: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub shapes: Vec<PlannedShape>,
    pub host_only: Vec<HostLinear>,
}

impl Plan {
    /// Every geometry to build, in order.
    pub fn geometries(&self) -> Vec<Geometry> {
        self.shapes.iter().flat_map(|s| s.geometries()).collect()
    }
}

/// The design kind a stored linear needs: None for unquantized storage (host only).
pub fn kind_of(data: &LinearData<'_>) -> Option<DesignKind> {
    match data {
        LinearData::I8 { .. } => Some(DesignKind::I8),
        LinearData::Q4 { .. } => Some(DesignKind::Q4),
        LinearData::F32(_) | LinearData::Bf16(_) => None,
    }
}

/// Every linear the runtime makes resident, in the pack's order: each linear tensor (the
/// decoder's layers of either family, Qwen3.5's DeltaNet and gated attention projections, the
/// experts, the MTP head's, the vision tower's; they share the device session:
/// `Tower::prepare`), and the LM head when it is the tied embedding (no tensor of its own). A
/// draft vocabulary's first head rows (`--draft-vocab`) run on the head's design.
pub fn pack_linears(pack: &Pack) -> Result<Vec<LinearShape>, PackError> {
    let mut linears = Vec::new();
    for t in pack.tensors() {
        if t.kind != packs::TensorKind::Linear {
            continue;
        }
        let linear = pack.linear(&t.name)?;
        let role = if t.name.starts_with(VISION_PREFIX) {
            vision_role(&t.name)
        } else if t.name == names::LM_HEAD {
            "lm_head".to_string()
        } else {
            decoder_role(&t.name).to_string()
        };
        linears.push(LinearShape {
            role,
            kind: kind_of(&linear.data),
            k: linear.k,
            n: linear.n,
        });
    }
    let head = pack.head();
    if head.name != names::LM_HEAD {
        linears.push(LinearShape {
            role: "lm_head (tied embedding)".into(),
            kind: kind_of(&head.data),
            k: head.k,
            n: head.n,
        });
    }
    Ok(linears)
}

/// `q_proj`, `in_proj_qkv`, `gate_proj`, ...: a decoder linear's name in the checkpoint without
/// its path (the layer, the expert, the block kind).
fn decoder_role(name: &str) -> &str {
    let without_weight = name.strip_suffix(".weight").unwrap_or(name);
    without_weight.rsplit('.').next().unwrap_or(without_weight)
}

const VISION_PREFIX: &str = "model.visual.";

/// `vision qkv`, `vision merger.linear_fc1`, ...: a tower linear's name without the block index.
fn vision_role(name: &str) -> String {
    let rest = name
        .strip_prefix(VISION_PREFIX)
        .unwrap_or(name)
        .trim_end_matches(".weight");
    let rest = match rest.strip_prefix("blocks.") {
        Some(b) => b.split_once('.').map_or(b, |(_, r)| r),
        None => rest,
    };
    let rest = match rest.strip_prefix("deepstack_merger_list.") {
        Some(d) => {
            return format!(
                "vision deepstack_merger.{}",
                d.split_once('.').map_or(d, |(_, r)| r)
            )
        }
        None => rest,
    };
    format!("vision {rest}")
}

/// The designs a pack needs.
pub fn plan_pack(pack: &Pack) -> Result<Plan, PackError> {
    Ok(plan_shapes(&pack_linears(pack)?))
}

/// Groups linears by (kind, design K, design N), keeping the roles in first-seen order.
pub fn plan_shapes(linears: &[LinearShape]) -> Plan {
    let mut shapes: BTreeMap<(DesignKind, usize, usize), PlannedShape> = BTreeMap::new();
    let mut host: Vec<HostLinear> = Vec::new();
    for linear in linears {
        let Some(kind) = linear.kind else {
            match host
                .iter_mut()
                .find(|h| h.role == linear.role && h.k == linear.k && h.n == linear.n)
            {
                Some(h) => h.count += 1,
                None => host.push(HostLinear {
                    role: linear.role.clone(),
                    count: 1,
                    k: linear.k,
                    n: linear.n,
                }),
            }
            continue;
        };
        let n = design_n(linear.n);
        let shape = shapes
            .entry((kind, linear.k, n))
            .or_insert_with(|| PlannedShape {
                kind,
                k: linear.k,
                n,
                roles: Vec::new(),
                n_chunks: n_chunks(linear.n, n),
                m_tiles: M_TILES.to_vec(),
            });
        shape.n_chunks = shape.n_chunks.max(n_chunks(linear.n, n));
        match shape
            .roles
            .iter_mut()
            .find(|(role, _)| *role == linear.role)
        {
            Some((_, count)) => *count += 1,
            None => shape.roles.push((linear.role.clone(), 1)),
        }
    }
    Plan {
        shapes: shapes.into_values().collect(),
        host_only: host,
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<5} {:>7} {:>7} {:>9} {:>8}  roles",
            "kind", "K", "N", "M tiles", "N chunks"
        )?;
        for shape in &self.shapes {
            let tiles = shape
                .m_tiles
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let roles = shape
                .roles
                .iter()
                .map(|(role, count)| format!("{role} x{count}"))
                .collect::<Vec<_>>()
                .join(", ");
            writeln!(
                f,
                "{:<5} {:>7} {:>7} {:>9} {:>8}  {roles}",
                shape.kind.as_str(),
                shape.k,
                shape.n,
                tiles,
                shape.n_chunks
            )?;
        }
        for host in &self.host_only {
            writeln!(
                f,
                "host  {:>7} {:>7}  {} x{} (stored unquantized: no design)",
                host.k, host.n, host.role, host.count
            )?;
        }
        let count = self.geometries().len();
        write!(f, "{count} designs to build (one per row and M tile)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(role: &str, kind: Option<DesignKind>, k: usize, n: usize) -> LinearShape {
        LinearShape {
            role: role.into(),
            kind,
            k,
            n,
        }
    }

    #[test]
    fn groups_roles_and_splits_the_head() {
        let q4 = Some(DesignKind::Q4);
        let linears = vec![
            shape("q_proj", q4, 2048, 2048),
            shape("o_proj", q4, 2048, 2048),
            shape("q_proj", q4, 2048, 2048),
            shape("gate_proj", q4, 2048, 6144),
            shape("lm_head", q4, 2048, 151_936),
            shape("embed_as_head", None, 2048, 151_936),
        ];
        let plan = plan_shapes(&linears);
        assert_eq!(plan.shapes.len(), 3);
        let square = &plan.shapes[0];
        assert_eq!((square.k, square.n), (2048, 2048));
        assert_eq!(
            square.roles,
            vec![("q_proj".to_string(), 2), ("o_proj".to_string(), 1)]
        );
        let head = plan
            .shapes
            .iter()
            .find(|s| s.roles[0].0 == "lm_head")
            .unwrap();
        assert_eq!(head.n, MAX_DESIGN_N);
        assert_eq!(head.n_chunks, 19);
        assert_eq!(plan.host_only.len(), 1);
        assert_eq!(plan.geometries().len(), 6);
        assert!(plan.to_string().contains("lm_head x1"));
    }

    #[test]
    fn roles_are_checkpoint_names() {
        let names: Vec<String> = names::Proj::ALL
            .into_iter()
            .map(|p| names::proj(3, p))
            .collect();
        let roles: Vec<&str> = names.iter().map(|n| decoder_role(n)).collect();
        assert_eq!(
            roles,
            [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj"
            ]
        );
    }

    #[test]
    fn m_tile_choice() {
        assert_eq!(m_tile_for(1, &M_TILES), Some(16));
        assert_eq!(m_tile_for(16, &M_TILES), Some(16));
        assert_eq!(m_tile_for(17, &M_TILES), Some(128));
        assert_eq!(m_tile_for(500, &M_TILES), Some(128));
        assert_eq!(m_tile_for(3, &[]), None);
    }
}
