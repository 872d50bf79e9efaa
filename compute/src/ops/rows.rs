//! Row helpers both models use on their activations (`rows x width`, row-major).

use rayon::prelude::*;

/// `v[..len]`, grown (zero-filled) when shorter: scratch buffers reach the largest batch seen and
/// are never reallocated per step after that.
pub fn grow<T: Default + Clone>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

/// `f(r, row)` for every row of `x` (rows of `width`): on the pool when there are several rows
/// (each row's arithmetic is the same either way), in place for one.
pub fn for_rows<F>(pool: &rayon::ThreadPool, x: &mut [f32], width: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    if x.len() <= width {
        x.chunks_exact_mut(width.max(1))
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    } else {
        pool.install(|| {
            x.par_chunks_mut(width)
                .enumerate()
                .for_each(|(r, row)| f(r, row))
        });
    }
}

/// The residual: `x += y` over the rows of `x`.
pub fn add_rows(pool: &rayon::ThreadPool, x: &mut [f32], y: &[f32], width: usize) {
    for_rows(pool, x, width, |r, row| {
        for (a, b) in row.iter_mut().zip(&y[r * width..]) {
            *a += b;
        }
    });
}

/// `y[r] += bias` for every row of `y` (rows of `bias.len()`).
pub fn add_bias(pool: &rayon::ThreadPool, y: &mut [f32], bias: &[f32]) {
    for_rows(pool, y, bias.len(), |_, row| {
        for (a, b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_rows_adds_each_row_once() {
        let pool = crate::new_pool(2).unwrap();
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        add_rows(&pool, &mut x, &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0], 2);
        assert_eq!(x, [11.0, 22.0, 33.0, 44.0, 55.0, 66.0]);
        // Control: one row only (the in-place branch) gives the same sum.
        let mut one = vec![1.0, 2.0];
        add_rows(&pool, &mut one, &[10.0, 20.0], 2);
        assert_eq!(one, [11.0, 22.0]);
        let mut y = vec![0.0; 4];
        add_bias(&pool, &mut y, &[1.0, 2.0]);
        assert_eq!(y, [1.0, 2.0, 1.0, 2.0]);
    }

    #[test]
    fn grow_keeps_contents_and_never_shrinks() {
        let mut v = vec![1.0f32, 2.0];
        assert_eq!(grow(&mut v, 3), [1.0, 2.0, 0.0]);
        assert_eq!(grow(&mut v, 1), [1.0]);
        assert_eq!(v.len(), 3);
    }
}
