//! Plain CPU implementations of every kernel: the independent reference the GPU is tested against.
//! Row-major f32 everywhere; weights in PyTorch Linear layout `[out, in]`.

/// y[r][n] = sum_k x[r][k] * w[n][k]
pub fn matmul(x: &[f32], w: &[f32], rows: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0f32; rows * n];
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            let mut acc = 0f64;
            for i in 0..k {
                acc += xr[i] as f64 * wr[i] as f64;
            }
            y[r * n + j] = acc as f32;
        }
    }
    y
}

pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// silu(x·Wgᵀ) * (x·Wuᵀ)
pub fn glu(x: &[f32], gate: &[f32], up: &[f32], rows: usize, k: usize, n: usize) -> Vec<f32> {
    let g = matmul(x, gate, rows, k, n);
    let u = matmul(x, up, rows, k, n);
    g.iter().zip(&u).map(|(a, b)| silu(*a) * b).collect()
}

pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let n = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let ms = row.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(row.iter().zip(w).map(|(v, w)| (*v as f64 * inv) as f32 * w));
    }
    out
}

/// Per-head RMSNorm (optional) then NeoX RoPE, for `rows` rows of `heads` heads at positions pos0 + r.
pub fn norm_rope(x: &[f32], norm: Option<&[f32]>, rows: usize, heads: usize, d: usize, pos0: usize, theta: f64, eps: f32) -> Vec<f32> {
    let table = crate::kernels::rope_table_values(pos0 + rows, d, theta);
    let half = d / 2;
    let mut out = vec![0f32; rows * heads * d];
    for r in 0..rows {
        for h in 0..heads {
            let b = (r * heads + h) * d;
            let v: Vec<f32> = match norm {
                Some(w) => rmsnorm(&x[b..b + d], w, eps),
                None => x[b..b + d].to_vec(),
            };
            for i in 0..half {
                let [c, s] = table[(pos0 + r) * half + i];
                out[b + i] = v[i] * c - v[i + half] * s;
                out[b + i + half] = v[i + half] * c + v[i] * s;
            }
        }
    }
    out
}

/// Attention for `rows` query rows `[rows][hq][d]` over keys/values `[keys][hkv][d]`.
/// causal: row r sees keys [0, past + r]; otherwise all `keys`.
#[allow(clippy::too_many_arguments)]
pub fn attention(q: &[f32], k: &[f32], v: &[f32], rows: usize, hq: usize, hkv: usize, d: usize, keys: usize, past: usize, causal: bool) -> Vec<f32> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f32; rows * hq * d];
    for r in 0..rows {
        let visible = if causal { past + r + 1 } else { keys };
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let qb = (r * hq + h) * d;
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let kb = (j * hkv + kvh) * d;
                    (0..d).map(|i| q[qb + i] as f64 * k[kb + i] as f64).sum::<f64>() * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for i in 0..d {
                let o: f64 = (0..visible).map(|j| e[j] * v[(j * hkv + kvh) * d + i] as f64).sum();
                out[qb + i] = (o / l) as f32;
            }
        }
    }
    out
}

/// Rows of `table` ([vocab][hidden]) for each id.
pub fn embedding(table: &[f32], hidden: usize, ids: &[u32]) -> Vec<f32> {
    ids.iter().flat_map(|&t| table[t as usize * hidden..(t as usize + 1) * hidden].iter().copied()).collect()
}

/// First index of the maximum (NaN never wins).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = f32::NEG_INFINITY;
    let mut bi = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > best {
            best = v;
            bi = i;
        }
    }
    bi as u32
}

/// The distribution sampling.wgsl draws from: softmax(logits / t) restricted to top-k then top-p.
pub fn sampling_distribution(logits: &[f32], temperature: f32, top_k: usize, top_p: f32) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let z: Vec<f64> = logits.iter().map(|&l| ((l - m) / temperature) as f64).collect();
    let mut order: Vec<usize> = (0..z.len()).collect();
    order.sort_by(|a, b| z[*b].partial_cmp(&z[*a]).unwrap_or(std::cmp::Ordering::Equal));
    let k = if top_k == 0 { z.len() } else { top_k.min(z.len()) };
    let kept = &order[..k];
    let total: f64 = kept.iter().map(|&i| z[i].exp()).sum();
    let mut p = vec![0f64; z.len()];
    let mut acc = 0.0;
    for &i in kept {
        p[i] = z[i].exp();
        acc += p[i];
        if top_p < 1.0 && acc >= top_p as f64 * total {
            break;
        }
    }
    let s: f64 = p.iter().sum();
    p.iter().map(|v| v / s).collect()
}
