//! A plain CPU Qwen3 forward (f64 accumulations, no KV cache, no batching tricks): the independent
//! reference the GPU forward is tested against. Recomputes everything from position 0 each call.

use crate::checkpoint::{expect_tensor, WeightSource};
use crate::config::Qwen3Config;
use crate::error::Result;
use domino_engine::reference as k;
use domino_engine::HostTensor;

struct RefLayer {
    input_norm: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

pub struct ReferenceModel {
    pub config: Qwen3Config,
    embed: Vec<f32>,
    lm_head: Option<Vec<f32>>,
    layers: Vec<RefLayer>,
    norm: Vec<f32>,
}

/// Logits of every position `[n][vocab]` and the residual stream after every layer `[layer][n][hidden]`.
pub struct RefOutput {
    pub logits: Vec<f32>,
    pub hidden: Vec<Vec<f32>>,
}

impl ReferenceModel {
    /// Load weights as f32. `round_f16` rounds matrices through f16 first, matching `--dtype f16`
    /// storage, so a comparison measures the kernels rather than the storage format.
    pub fn load(config: Qwen3Config, src: &dyn WeightSource, round_f16: bool) -> Result<Self> {
        let c = &config;
        let get = |name: &str, shape: &[usize], round: bool| -> Result<Vec<f32>> {
            let t = expect_tensor(src, name, shape)?;
            let n: usize = shape.iter().product();
            let v = HostTensor::new(name, t.dtype, 1, n, &t.data)?.to_f32();
            Ok(if round { v.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect() } else { v })
        };
        let (h, qw, kvw, i, vocab) = (c.hidden_size, c.q_width(), c.kv_width(), c.intermediate_size, c.vocab_size);
        let mut layers = Vec::new();
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}.");
            let m = |n: &str, s: &[usize]| get(&(p.clone() + n), s, round_f16);
            let vv = |n: &str, s: &[usize]| get(&(p.clone() + n), s, false);
            layers.push(RefLayer {
                input_norm: vv("input_layernorm.weight", &[h])?,
                q: m("self_attn.q_proj.weight", &[qw, h])?,
                k: m("self_attn.k_proj.weight", &[kvw, h])?,
                v: m("self_attn.v_proj.weight", &[kvw, h])?,
                o: m("self_attn.o_proj.weight", &[h, qw])?,
                q_norm: if c.qk_norm { Some(vv("self_attn.q_norm.weight", &[c.head_dim])?) } else { None },
                k_norm: if c.qk_norm { Some(vv("self_attn.k_norm.weight", &[c.head_dim])?) } else { None },
                post_norm: vv("post_attention_layernorm.weight", &[h])?,
                gate: m("mlp.gate_proj.weight", &[i, h])?,
                up: m("mlp.up_proj.weight", &[i, h])?,
                down: m("mlp.down_proj.weight", &[h, i])?,
            });
        }
        Ok(Self {
            embed: get("model.embed_tokens.weight", &[vocab, h], round_f16)?,
            lm_head: if c.tie_word_embeddings { None } else { Some(get("lm_head.weight", &[vocab, h], round_f16)?) },
            norm: get("model.norm.weight", &[h], false)?,
            layers,
            config,
        })
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.config
    }

    /// The token embedding `[vocab][hidden]` as loaded (drafters embed their blocks with it).
    pub fn embed(&self) -> &[f32] {
        &self.embed
    }

    /// The output projection `[vocab][hidden]`: the embedding when the weights are tied.
    pub fn lm_head(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }

    pub fn forward(&self, ids: &[u32]) -> RefOutput {
        let c = &self.config;
        let n = ids.len();
        let (h, d) = (c.hidden_size, c.head_dim);
        let mut x = k::embedding(&self.embed, h, ids);
        let mut hidden = Vec::new();
        for l in &self.layers {
            let a = k::rmsnorm(&x, &l.input_norm, c.rms_norm_eps);
            let q = k::matmul(&a, &l.q, n, h, c.q_width());
            let kk = k::matmul(&a, &l.k, n, h, c.kv_width());
            let v = k::matmul(&a, &l.v, n, h, c.kv_width());
            let q = k::norm_rope(&q, l.q_norm.as_deref(), n, c.num_heads, d, 0, c.rope_theta, c.rms_norm_eps);
            let kk = k::norm_rope(&kk, l.k_norm.as_deref(), n, c.num_kv_heads, d, 0, c.rope_theta, c.rms_norm_eps);
            let att = k::attention(&q, &kk, &v, n, c.num_heads, c.num_kv_heads, d, n, 0, true);
            let o = k::matmul(&att, &l.o, n, c.q_width(), h);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let b = k::rmsnorm(&x, &l.post_norm, c.rms_norm_eps);
            let m = k::glu(&b, &l.gate, &l.up, n, h, c.intermediate_size);
            let dn = k::matmul(&m, &l.down, n, c.intermediate_size, h);
            x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
            hidden.push(x.clone());
        }
        let y = k::rmsnorm(&x, &self.norm, c.rms_norm_eps);
        let logits = k::matmul(&y, self.lm_head(), n, h, c.vocab_size);
        RefOutput { logits, hidden }
    }

    /// Greedy continuation of `prompt` by `steps` tokens.
    pub fn greedy(&self, prompt: &[u32], steps: usize) -> Vec<u32> {
        let mut ids = prompt.to_vec();
        let v = self.config.vocab_size;
        for _ in 0..steps {
            let out = self.forward(&ids);
            let last = &out.logits[(ids.len() - 1) * v..ids.len() * v];
            ids.push(k::argmax(last));
        }
        ids[prompt.len()..].to_vec()
    }
}
