//! Structured JSON mutation: a random node of the document gets another type, an edge value, a
//! nudged number, a removed or duplicated key, or a reshaped array; raw text mutation (truncation,
//! flipped bytes) covers what the JSON parser itself must refuse.

use serde_json::{json, Map, Number, Value};

use crate::bytes;
use crate::rng::Rng;

/// Paths to every node (object keys and array indexes), at most `cap` of them.
fn paths(v: &Value, cap: usize) -> Vec<Vec<PathStep>> {
    let mut out = vec![Vec::new()];
    let mut stack = vec![(Vec::new(), v)];
    while let Some((path, v)) = stack.pop() {
        if out.len() >= cap {
            break;
        }
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    let mut p = path.clone();
                    p.push(PathStep::Key(k.clone()));
                    out.push(p.clone());
                    stack.push((p, c));
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    let mut p = path.clone();
                    p.push(PathStep::Index(i));
                    out.push(p.clone());
                    stack.push((p, c));
                }
            }
            _ => {}
        }
    }
    out
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn node_mut<'a>(v: &'a mut Value, path: &[PathStep]) -> Option<&'a mut Value> {
    let mut cur = v;
    for step in path {
        cur = match (step, cur) {
            (PathStep::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (PathStep::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// A value of a random type, drawn from edges.
pub fn edge_value(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(1, 2)),
        2 | 3 => json!(rng.interesting()),
        4 => json!(-(rng.interesting() as i64).saturating_abs()),
        5 => Number::from_f64(*rng.pick(&[
            0.5,
            -0.0,
            1e-300,
            1e308,
            -1e308,
            f64::MAX,
            f64::MIN_POSITIVE,
            3.0000001,
            1e19,
        ]))
        .map(Value::Number)
        .unwrap_or(Value::Null),
        6 => json!(*rng.pick(&[
            "",
            "x",
            "default",
            "F32",
            "BF16",
            "qwen3_vl",
            "qwen3",
            "NaN",
            "1e400",
            "\u{0}",
            "ünïcødé",
            "../x",
            "model.safetensors"
        ])),
        7 => json!("A".repeat(rng.range(100, 5000))),
        8 => json!([]),
        9 => json!([rng.interesting(), rng.interesting(), rng.interesting()]),
        10 => json!({}),
        _ => json!({ "a": rng.interesting() }),
    }
}

/// Applies one structural mutation at a random node of `v`.
pub fn mutate_value(rng: &mut Rng, v: &mut Value) {
    let ps = paths(v, 4096);
    let path = rng.pick(&ps).clone();
    let Some(node) = node_mut(v, &path) else {
        return;
    };
    if let (Some(u), true) = (node.as_u64(), rng.chance(1, 3)) {
        // Scale a count: large enough to cost memory or time, often still under a validation
        // bound (2^20 and 2^24 in the semantics).
        *node = json!(u.max(1).saturating_mul(1 << rng.range(4, 30)));
        return;
    }
    match rng.below(10) {
        0..=2 => *node = edge_value(rng),
        3 => {
            // Nudge a number; swap a value's type keeping its content.
            *node = match node.take() {
                Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                    (Some(u), _, _) => match rng.below(5) {
                        0 => json!(u.wrapping_add(1)),
                        1 => json!(u.saturating_sub(1)),
                        2 => json!(u.saturating_mul(2)),
                        3 => json!(u / 2),
                        _ => json!(u.to_string()),
                    },
                    (_, Some(i), _) => json!(i.wrapping_neg()),
                    (_, _, Some(f)) => json!(f.to_string()),
                    _ => Value::Null,
                },
                Value::String(s) => match s.parse::<f64>() {
                    Ok(f) => json!(f),
                    Err(_) => json!([s]),
                },
                Value::Bool(b) => json!(if b { 1 } else { 0 }),
                Value::Array(a) => Value::Object(
                    a.into_iter()
                        .enumerate()
                        .map(|(i, x)| (i.to_string(), x))
                        .collect(),
                ),
                Value::Object(m) => Value::Array(m.into_iter().map(|(_, x)| x).collect()),
                Value::Null => json!("null"),
            }
        }
        4 => match node {
            Value::Object(m) if !m.is_empty() => {
                let k = m
                    .keys()
                    .nth(rng.below(m.len()))
                    .cloned()
                    .unwrap_or_default();
                m.remove(&k);
            }
            Value::Array(a) if !a.is_empty() => {
                a.remove(rng.below(a.len()));
            }
            other => *other = Value::Null,
        },
        5 => match node {
            Value::Array(a) if !a.is_empty() => {
                let x = a[rng.below(a.len())].clone();
                let at = rng.below(a.len() + 1);
                a.insert(at, x);
            }
            Value::Array(a) => a.push(edge_value(rng)),
            Value::Object(m) => {
                let key = match rng.below(3) {
                    0 => format!("k{}", rng.below(100)),
                    _ => {
                        m.keys()
                            .nth(rng.below(m.len().max(1)))
                            .cloned()
                            .unwrap_or_default()
                            + "_"
                    }
                };
                m.insert(key, edge_value(rng));
            }
            other => *other = json!([other.take()]),
        },
        6 => match node {
            Value::Array(a) if a.len() >= 2 => {
                let (i, j) = (rng.below(a.len()), rng.below(a.len()));
                a.swap(i, j);
            }
            Value::Object(m) if m.len() >= 2 => {
                // Swap two keys' values (a field gets its neighbour's type and size).
                let keys: Vec<String> = m.keys().cloned().collect();
                let (a, b) = (rng.pick(&keys).clone(), rng.pick(&keys).clone());
                let va = m.get(&a).cloned().unwrap_or(Value::Null);
                let vb = m.insert(b, va).unwrap_or(Value::Null);
                m.insert(a, vb);
            }
            other => *other = edge_value(rng),
        },
        7 => {
            // Deep nesting: parsers must refuse rather than recurse without bound.
            let mut x = Value::Null;
            for _ in 0..rng.range(10, 300) {
                x = json!([x]);
            }
            *node = x;
        }
        _ => {
            // Copy a node from elsewhere in the document.
            let other = rng.pick(&ps).clone();
            let copy = node_mut(&mut v.clone(), &other)
                .cloned()
                .unwrap_or(Value::Null);
            if let Some(node) = node_mut(v, &path) {
                *node = copy;
            }
        }
    }
}

/// A mutated JSON text: mostly 1-3 structural mutations, sometimes raw text damage.
pub fn mutate_text(rng: &mut Rng, text: &[u8]) -> Vec<u8> {
    match serde_json::from_slice::<Value>(text) {
        Ok(mut v) if !rng.chance(1, 6) => {
            for _ in 0..rng.range(1, 3) {
                mutate_value(rng, &mut v);
            }
            serde_json::to_vec(&v).expect("a Value serializes")
        }
        _ => bytes::mutate(rng, text, 0..text.len()),
    }
}

/// Mutates the string value `v[key]`, itself a JSON document (the pack's `semantics`).
pub fn mutate_embedded(rng: &mut Rng, m: &mut Map<String, Value>, key: &str) {
    if let Some(Value::String(s)) = m.get(key) {
        let text = mutate_text(rng, s.as_bytes());
        m.insert(key.into(), json!(String::from_utf8_lossy(&text)));
    }
}
