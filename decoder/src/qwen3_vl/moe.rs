//! The sparse MLP of a Qwen3-VL-MoE layer, in transformers' order (`Qwen3VLMoeTextTopKRouter`,
//! `Qwen3VLMoeTextExperts`):
//!
//! 1. router logits `xn · Wrᵀ` (f32), a softmax over the experts in f32;
//! 2. the top-k experts as `torch.topk` picks them on the CPU, ties included ([`torch_topk`]);
//! 3. with `norm_topk_prob`, the k weights divided by their sum;
//! 4. each expert that any row chose runs once on all its rows (gate and up, SiLU, down), and
//!    its output times the row's weight is added to the row, experts in ascending order from zero
//!    (transformers' `index_add_` loop).
//!
//! Rows are routed one by one, so a row's experts and its result do not depend on its neighbours.

use compute::ops::rows::grow;

use crate::DecoderError;

/// One sparse layer's routing rule.
#[derive(Clone, Copy, Debug)]
pub struct Routing {
    pub num_experts: usize,
    pub top_k: usize,
    /// Divide the k weights by their sum.
    pub renormalize: bool,
    /// A control (`Ablation::moe_ties_lower_index`): break ties by the lower expert index instead
    /// of torch.topk's order.
    pub ties_lower_index: bool,
}

/// The experts each row was routed to and their weights (`rows x top_k`, in top-k order).
#[derive(Clone, Debug, Default)]
pub struct Routes {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Reusable buffers of the sparse MLP.
#[derive(Default)]
pub struct MoeScratch {
    pub routes: Routes,
    /// What the sparse layers did since the last take.
    pub stats: MoeStats,
    probs: Vec<f32>,
    order: Vec<(f32, usize)>,
    by_expert: ByExpert,
    gathered: Vec<f32>,
    expert_out: Vec<f32>,
}

/// The routes grouped by expert: expert e's (row, weight) pairs are
/// `routed[start[e]..start[e + 1]]`, rows ascending and, within a row, in top-k order.
#[derive(Default)]
struct ByExpert {
    start: Vec<usize>,
    routed: Vec<(usize, f32)>,
}

/// Groups the routes of `rows` rows (`top_k` each) by expert in one pass (a counting sort, so
/// stable): each expert's rows in the order a scan of the rows finds them. A scan of every row per
/// expert took 1.6% of the samples of `perf record` over `bench --shape qwen3.5-35b-a3b-reduced
/// --prefill-rows 512` (256 experts; its prefills and decode steps).
fn bucket_routes(
    routes: &Routes,
    (rows, top_k): (usize, usize),
    experts: usize,
    by: &mut ByExpert,
) {
    let n = rows * top_k;
    by.start.clear();
    by.start.resize(experts + 1, 0);
    for &e in &routes.experts[..n] {
        by.start[e + 1] += 1;
    }
    for e in 0..experts {
        by.start[e + 1] += by.start[e];
    }
    by.routed.clear();
    by.routed.resize(n, (0, 0.0));
    let mut next = by.start[..experts].to_vec();
    for (i, (&e, &w)) in routes.experts[..n].iter().zip(&routes.weights).enumerate() {
        by.routed[next[e]] = (i / top_k, w);
        next[e] += 1;
    }
}

/// Counts since the last take: how many (expert, batch) runs and routed rows the sparse layers did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeStats {
    /// Expert FFNs run (each reads its three linears once).
    pub expert_runs: u64,
    /// Rows times top-k routed.
    pub routed_rows: u64,
}

/// Routes every row: `logits` is `rows x num_experts` router logits; fills `routes`.
pub fn route(logits: &[f32], rows: usize, rule: Routing, scratch: &mut MoeScratch) {
    let (e, k) = (rule.num_experts, rule.top_k);
    assert_eq!(
        logits.len(),
        rows * e,
        "route: logits are not rows x experts"
    );
    let routes = &mut scratch.routes;
    routes.experts.clear();
    routes.experts.resize(rows * k, 0);
    routes.weights.clear();
    routes.weights.resize(rows * k, 0.0);
    for r in 0..rows {
        let probs = &mut scratch.probs;
        probs.clear();
        probs.extend_from_slice(&logits[r * e..(r + 1) * e]);
        crate::attention::softmax(probs);
        let chosen = &mut routes.experts[r * k..(r + 1) * k];
        if rule.ties_lower_index {
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            chosen.copy_from_slice(&order[..k]);
        } else {
            torch_topk(probs, k, &mut scratch.order, chosen);
        }
        let w = &mut routes.weights[r * k..(r + 1) * k];
        for (w, &x) in w.iter_mut().zip(chosen.iter()) {
            *w = probs[x];
        }
        if rule.renormalize {
            let sum: f32 = w.iter().sum();
            for w in w.iter_mut() {
                *w /= sum;
            }
        }
    }
}

/// The sparse MLP of `rows` normalized rows `xn` (`rows x hidden`) into `out` (`rows x hidden`),
/// once [`route`] has filled `scratch.routes`. `run_expert(e, x, m, y)` computes expert `e`'s FFN
/// of `m` rows `x` into `y` (`m x hidden`); it is called once per chosen expert, ascending.
pub fn sparse_mlp<F>(
    xn: &[f32],
    rows: usize,
    hidden: usize,
    rule: Routing,
    scratch: &mut MoeScratch,
    out: &mut [f32],
    mut run_expert: F,
) -> Result<(), DecoderError>
where
    F: FnMut(usize, &[f32], usize, &mut [f32]) -> Result<(), DecoderError>,
{
    let k = rule.top_k;
    let out = &mut out[..rows * hidden];
    out.fill(0.0);
    scratch.stats.routed_rows += (rows * k) as u64;
    bucket_routes(
        &scratch.routes,
        (rows, k),
        rule.num_experts,
        &mut scratch.by_expert,
    );
    for expert in 0..rule.num_experts {
        let (from, to) = (
            scratch.by_expert.start[expert],
            scratch.by_expert.start[expert + 1],
        );
        if from == to {
            continue;
        }
        let rows_of = &scratch.by_expert.routed[from..to];
        let m = rows_of.len();
        grow(&mut scratch.gathered, m * hidden);
        for (i, &(r, _)) in rows_of.iter().enumerate() {
            scratch.gathered[i * hidden..(i + 1) * hidden]
                .copy_from_slice(&xn[r * hidden..(r + 1) * hidden]);
        }
        grow(&mut scratch.expert_out, m * hidden);
        run_expert(
            expert,
            &scratch.gathered[..m * hidden],
            m,
            &mut scratch.expert_out[..m * hidden],
        )?;
        scratch.stats.expert_runs += 1;
        for (i, &(r, w)) in rows_of.iter().enumerate() {
            let y = &scratch.expert_out[i * hidden..(i + 1) * hidden];
            for (o, &v) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(y) {
                *o += v * w;
            }
        }
    }
    Ok(())
}

/// The indices of the `k` largest `values`, as `torch.topk(values, k)` (largest, sorted) returns
/// them on the CPU — ties included. PyTorch (`aten/src/ATen/native/TopKImpl.h`) fills (value,
/// index) pairs and, when `k * 64 <= n`, `std::partial_sort`s the first k; otherwise it
/// `std::nth_element`s the k-th into place and `std::sort`s the first k - 1, with the comparator
/// "NaN first, then greater". Neither is stable, so which of equal values comes first is what
/// libstdc++'s introselect / heap / insertion sorts do; this follows them step by step (checked
/// against torch on tie-heavy rows: `tests/fixtures/moe-topk`).
pub fn torch_topk(values: &[f32], k: usize, q: &mut Vec<(f32, usize)>, out: &mut [usize]) {
    let n = values.len();
    assert!(
        k >= 1 && k <= n && out.len() == k,
        "torch_topk: k {k} of {n}"
    );
    q.clear();
    q.extend(values.iter().copied().zip(0..));
    if k * 64 <= n {
        heap_select(q, 0, k, n);
        sort_heap(q, 0, k);
    } else {
        introselect(q, 0, k - 1, n, 2 * lg(n));
        std_sort(q, 0, k - 1);
    }
    for (o, &(_, i)) in out.iter_mut().zip(q.iter()) {
        *o = i;
    }
}

/// `comp(x, y)`: x goes before y (NaN first, then the greater value).
#[inline]
fn before(x: (f32, usize), y: (f32, usize)) -> bool {
    (x.0.is_nan() && !y.0.is_nan()) || x.0 > y.0
}

fn lg(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

fn insertion_sort(q: &mut [(f32, usize)], first: usize, last: usize) {
    if first == last {
        return;
    }
    for i in first + 1..last {
        let v = q[i];
        if before(v, q[first]) {
            q.copy_within(first..i, first + 1);
            q[first] = v;
        } else {
            unguarded_linear_insert(q, i);
        }
    }
}

fn unguarded_linear_insert(q: &mut [(f32, usize)], mut last: usize) {
    let v = q[last];
    let mut next = last - 1;
    while before(v, q[next]) {
        q[last] = q[next];
        last = next;
        next -= 1;
    }
    q[last] = v;
}

fn move_median_to_first(q: &mut [(f32, usize)], result: usize, a: usize, b: usize, c: usize) {
    let pick = if before(q[a], q[b]) {
        if before(q[b], q[c]) {
            b
        } else if before(q[a], q[c]) {
            c
        } else {
            a
        }
    } else if before(q[a], q[c]) {
        a
    } else if before(q[b], q[c]) {
        c
    } else {
        b
    };
    q.swap(result, pick);
}

fn unguarded_partition(
    q: &mut [(f32, usize)],
    mut first: usize,
    mut last: usize,
    pivot: usize,
) -> usize {
    loop {
        while before(q[first], q[pivot]) {
            first += 1;
        }
        last -= 1;
        while before(q[pivot], q[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        q.swap(first, last);
        first += 1;
    }
}

fn partition_pivot(q: &mut [(f32, usize)], first: usize, last: usize) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(q, first, first + 1, mid, last - 1);
    unguarded_partition(q, first + 1, last, first)
}

fn push_heap(q: &mut [(f32, usize)], first: usize, mut hole: usize, top: usize, v: (f32, usize)) {
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && before(q[first + parent], v) {
        q[first + hole] = q[first + parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    q[first + hole] = v;
}

fn adjust_heap(q: &mut [(f32, usize)], first: usize, mut hole: usize, len: usize, v: (f32, usize)) {
    let top = hole;
    let mut second = hole;
    while len >= 1 && second < (len - 1) / 2 {
        second = 2 * (second + 1);
        if before(q[first + second], q[first + second - 1]) {
            second -= 1;
        }
        q[first + hole] = q[first + second];
        hole = second;
    }
    if len & 1 == 0 && len >= 2 && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        q[first + hole] = q[first + second - 1];
        hole = second - 1;
    }
    push_heap(q, first, hole, top, v);
}

fn make_heap(q: &mut [(f32, usize)], first: usize, last: usize) {
    let len = last - first;
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let v = q[first + parent];
        adjust_heap(q, first, parent, len, v);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

fn pop_heap(q: &mut [(f32, usize)], first: usize, last: usize, result: usize) {
    let v = q[result];
    q[result] = q[first];
    adjust_heap(q, first, 0, last - first, v);
}

fn heap_select(q: &mut [(f32, usize)], first: usize, middle: usize, last: usize) {
    make_heap(q, first, middle);
    for i in middle..last {
        if before(q[i], q[first]) {
            pop_heap(q, first, middle, i);
        }
    }
}

fn sort_heap(q: &mut [(f32, usize)], first: usize, mut last: usize) {
    while last - first > 1 {
        last -= 1;
        pop_heap(q, first, last, last);
    }
}

fn introselect(
    q: &mut [(f32, usize)],
    mut first: usize,
    nth: usize,
    mut last: usize,
    mut depth: usize,
) {
    while last - first > 3 {
        if depth == 0 {
            heap_select(q, first, nth + 1, last);
            q.swap(first, nth);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(q, first, last);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(q, first, last);
}

fn introsort_loop(q: &mut [(f32, usize)], first: usize, mut last: usize, mut depth: usize) {
    while last - first > 16 {
        if depth == 0 {
            heap_select(q, first, last, last);
            sort_heap(q, first, last);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(q, first, last);
        introsort_loop(q, cut, last, depth);
        last = cut;
    }
}

fn std_sort(q: &mut [(f32, usize)], first: usize, last: usize) {
    if first == last {
        return;
    }
    introsort_loop(q, first, last, 2 * lg(last - first));
    if last - first > 16 {
        insertion_sort(q, first, first + 16);
        for i in first + 16..last {
            unguarded_linear_insert(q, i);
        }
    } else {
        insertion_sort(q, first, last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topk(values: &[f32], k: usize) -> Vec<usize> {
        let mut out = vec![0; k];
        torch_topk(values, k, &mut Vec::new(), &mut out);
        out
    }

    #[test]
    fn distinct_values_come_out_largest_first() {
        let v = [0.1, 0.7, 0.3, 0.9, 0.2, 0.5];
        assert_eq!(topk(&v, 3), [3, 1, 5]);
        assert_eq!(topk(&v, 6), [3, 1, 5, 2, 4, 0]);
        let many: Vec<f32> = (0..300).map(|i| ((i * 37) % 300) as f32).collect();
        // 300 >= 64 * 4: the partial-sort path.
        assert_eq!(topk(&many, 4), [227, 154, 81, 8]);
    }

    #[test]
    fn ties_follow_libstdcxx_not_the_lower_index() {
        // torch.topk(tensor([a, a, b, a]), 2) with a > b gives [1, 3] (measured with torch 2.15; the fixture
        // moe-topk holds thousands of such rows).
        let a = 0.314_634_6;
        assert_eq!(topk(&[a, a, 0.056, a], 2), [1, 3]);
    }

    /// The routes grouped in one pass are, expert by expert, what a scan of every row per expert
    /// finds, in its order (rows ascending, top-k order within a row); experts nobody chose hold
    /// none. Control: the scan of another expert differs.
    #[test]
    fn routes_grouped_by_expert_are_each_experts_scan() {
        let (rows, k, experts) = (37, 3, 11);
        let mut seed = 5u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 33) as usize
        };
        let routes = Routes {
            // Experts 0..9 only: 9 and 10 are never chosen.
            experts: (0..rows * k).map(|_| next() % 9).collect(),
            weights: (0..rows * k).map(|i| i as f32 * 0.5).collect(),
        };
        let scan = |e: usize| -> Vec<(usize, f32)> {
            (0..rows)
                .flat_map(|r| (0..k).map(move |j| (r, j)))
                .filter(|&(r, j)| routes.experts[r * k + j] == e)
                .map(|(r, j)| (r, routes.weights[r * k + j]))
                .collect()
        };
        let mut by = ByExpert::default();
        bucket_routes(&routes, (rows, k), experts, &mut by);
        for e in 0..experts {
            let got = &by.routed[by.start[e]..by.start[e + 1]];
            assert_eq!(got, &scan(e)[..], "expert {e}");
        }
        assert!(scan(9).is_empty() && scan(10).is_empty());
        assert_ne!(
            &by.routed[by.start[1]..by.start[2]],
            &scan(2)[..],
            "control"
        );
    }

    #[test]
    fn renormalized_weights_sum_to_one() {
        let rule = Routing {
            num_experts: 4,
            top_k: 2,
            renormalize: true,
            ties_lower_index: false,
        };
        let mut s = MoeScratch::default();
        route(&[0.5, -1.0, 2.0, 0.0], 1, rule, &mut s);
        assert_eq!(s.routes.experts, [2, 0]);
        let sum: f32 = s.routes.weights.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6);
        // Control: without renormalization the weights are the softmax's (sum < 1).
        route(
            &[0.5, -1.0, 2.0, 0.0],
            1,
            Routing {
                renormalize: false,
                ..rule
            },
            &mut s,
        );
        let sum: f32 = s.routes.weights.iter().sum();
        assert!(sum < 0.95, "{sum}");
    }
}
