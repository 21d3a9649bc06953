//! The page's Bench button: the measurement `domino bench` makes on one adapter (crates/cli/src/bench.rs),
//! run in the browser on the loaded model, written as the same domino-bench/1 report with
//! `runner: "browser"` so `domino report` merges browser and native runs. Field names and meanings
//! follow crates/cli/src/report.rs; keep the two in step.

use crate::error::WebError;
use crate::js::Options;
use crate::load::Loaded;
use domino_engine::Gpu;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::Qwen3Model;
use domino_runtime::clock::now;
use domino_runtime::{GenerateOptions, Session, SpeculativeOptions, SpeculativeSession};
use serde_json::{json, Value};
use wasm_bindgen::JsValue;

/// Same built-in prompts as `domino bench` (crates/cli/src/bench.rs DEFAULT_PROMPTS).
const DEFAULT_PROMPTS: [&str; 4] = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a GPU running out of memory.",
    "The capital of France is",
];

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn min_max(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    (v.iter().cloned().fold(f64::INFINITY, f64::min), v.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
}

fn layer_bytes(layers: &[domino_models::qwen3::LayerWeights]) -> u64 {
    layers.iter().map(domino_models::qwen3::LayerWeights::matrix_bytes).sum()
}

/// Target weights (embedding once) + KV cache, as `domino bench` estimates it.
fn target_memory(model: &Qwen3Model, capacity: usize) -> u64 {
    let c = &model.config;
    let embed = if c.tie_word_embeddings { 0 } else { model.embed.bytes() };
    model.decode_weight_bytes() + embed + 2 * (c.num_layers * capacity * c.kv_width() * 4) as u64
}

fn drafter_memory(d: &DrafterModel) -> u64 {
    let head = d.head.as_ref().map(|h| h.w_ih.bytes() + h.w_hh.bytes() + h.w1_y.bytes() + h.w1_s.bytes() + h.w2.bytes()).unwrap_or(0);
    d.fc.bytes() + layer_bytes(&d.layers) + head
}

#[derive(Default)]
struct Measured {
    prefill: Vec<f64>,
    decode: Vec<f64>,
    ttft: Vec<f64>,
    acceptance: Vec<usize>,
    draft: f64,
    verify: f64,
    head: f64,
    memory: u64,
}

fn mode_report(name: &str, m: &Measured, plain_tps: Option<f64>, weight_bytes: u64, copy: f64) -> Value {
    let tps = median(&m.decode);
    let (lo, hi) = min_max(&m.decode);
    let weight_bw = weight_bytes as f64 * tps;
    let mean_acceptance = if m.acceptance.is_empty() { 1.0 } else { m.acceptance.iter().sum::<usize>() as f64 / m.acceptance.len() as f64 };
    let round = m.draft + m.verify;
    json!({
        "mode": name,
        "prefill_tokens_per_s": median(&m.prefill),
        "decode_tokens_per_s": tps,
        "decode_tokens_per_s_min": lo,
        "decode_tokens_per_s_max": hi,
        "decode_tokens_per_s_all": m.decode,
        "time_to_first_token_s": median(&m.ttft),
        "speedup_over_plain": plain_tps.map(|p| tps / p.max(1e-12)).unwrap_or(1.0),
        "mean_acceptance": mean_acceptance,
        "draft_seconds": m.draft,
        "verify_seconds": m.verify,
        "head_seconds": m.head,
        "head_share": if round > 0.0 { m.head / round } else { 0.0 },
        "decode_weight_bandwidth_gb_s": weight_bw / 1e9,
        "roofline_ratio": weight_bw / copy.max(1e-12),
        "read_roofline_ratio": weight_bw / (copy / 2.0).max(1e-12),
        "peak_gpu_memory_bytes": m.memory,
        "peak_gpu_memory_estimated": true,
    })
}

fn vendor_name(gpu: &Gpu) -> String {
    // wgpu reports no PCI vendor id on the WebGPU backend; the browser's vendor string stands in.
    if gpu.info.driver.is_empty() { "unknown".into() } else { gpu.info.driver.clone() }
}

/// The user agent's OS, in `std::env::consts::OS` words where it is one of them.
fn browser_os() -> String {
    let ua = js_sys::Reflect::get(&js_sys::Reflect::get(&js_sys::global(), &"navigator".into()).unwrap_or(JsValue::UNDEFINED), &"userAgent".into())
        .ok()
        .and_then(|v| v.as_string())
        .unwrap_or_default();
    let os = [("Android", "android"), ("iPhone", "ios"), ("iPad", "ios"), ("Windows", "windows"), ("Mac OS", "macos"), ("CrOS", "chromeos"), ("Linux", "linux")]
        .iter()
        .find(|(k, _)| ua.contains(k))
        .map(|(_, v)| *v)
        .unwrap_or("unknown");
    os.to_string()
}

pub async fn run(gpu: &Gpu, loaded: &mut Loaded, opts: &JsValue) -> Result<Value, WebError> {
    let o = Options::new(opts, "bench").map_err(WebError::Usage)?;
    let u = WebError::Usage;
    let max_tokens = o.uint("maxTokens", 1e6).map_err(u)?.unwrap_or(64) as usize;
    let runs = o.uint("runs", 1e4).map_err(u)?.unwrap_or(3).max(1) as usize;
    let prompt_len = o.uint("promptLen", 1e6).map_err(u)?.map(|n| n as usize);
    let hostname = o.string("hostname").map_err(u)?;
    let copy_bytes = o.uint("copyBytes", 1e12).map_err(u)?.unwrap_or(256 << 20);
    let on_progress = o.function("onProgress").map_err(u)?;
    let texts: Option<Vec<String>> = match o.raw("prompts") {
        Some(v) => Some(
            js_sys::Array::from(&v)
                .iter()
                .map(|p| p.as_string().filter(|s| !s.is_empty()))
                .collect::<Option<Vec<_>>>()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| WebError::Usage("bench: option 'prompts' must be a non-empty array of non-empty strings".into()))?,
        ),
        None => None,
    };

    let vocab = loaded.model.config.vocab_size as u32;
    let (source, prompts): (String, Vec<Vec<u32>>) = match (&texts, &loaded.tokenizer, prompt_len) {
        (Some(_), None, _) => return Err(WebError::Usage(format!("bench: prompts given but {} has no tokenizer.json", loaded.model_name))),
        (Some(_), _, Some(_)) => return Err(WebError::Usage("bench: give prompts or promptLen, not both".into())),
        (Some(t), Some(tok), None) => ("page".into(), t.iter().map(|s| tok.encode(s)).collect::<Result<_, _>>()?),
        (None, Some(tok), None) => ("builtin".into(), DEFAULT_PROMPTS.iter().map(|s| tok.encode(s)).collect::<Result<_, _>>()?),
        (None, _, n) => ("synthetic".into(), vec![(0..n.unwrap_or(128) as u32).map(|i| (i * 7919 + 13) % vocab).collect()]),
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(WebError::Usage("bench: a prompt tokenizes to no tokens".into()));
    }

    let modes_count = 1 + if loaded.drafter.is_some() { 2 } else { 0 };
    let steps_total = modes_count * (1 + prompts.len() * (runs + 1)) + 1;
    let mut steps = 0usize;
    let mut tick = |what: &str| {
        steps += 1;
        if let Some(f) = &on_progress {
            let _ = f.call3(&JsValue::NULL, &(steps as f64).into(), &(steps_total as f64).into(), &what.into());
        }
    };

    if let Some(d) = loaded.drafter.as_mut() {
        d.config.block_size = loaded.drafter_block_size;
    }
    let model = &loaded.model;
    let max_prompt = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = (max_prompt + max_tokens).min(model.config.max_position_embeddings);
    let gen = GenerateOptions { max_tokens, ignore_eos: true, ..Default::default() };

    let mut session = Session::new(model, capacity)?;
    let mut plain = Measured { memory: target_memory(model, capacity), ..Default::default() };
    session.generate(&prompts[0], &gen, &mut |_| true).await?;
    tick("plain");
    for p in &prompts {
        for _ in 0..runs {
            let g = session.generate(p, &gen, &mut |_| true).await?;
            plain.prefill.push(g.stats.prefill_tokens_per_s);
            plain.decode.push(g.stats.decode_tokens_per_s);
            plain.ttft.push(g.stats.time_to_first_token_s);
            tick("plain");
        }
    }
    drop(session);
    let mut measured = vec![("plain".to_string(), plain)];

    if let Some(drafter) = &loaded.drafter {
        let mut modes = vec![("backbone (--no-head)", false)];
        if drafter.head.is_some() {
            modes.push(("domino", true));
        } else {
            modes[0].0 = "dflash";
        }
        let spec_capacity = max_prompt + max_tokens;
        let memory = target_memory(model, spec_capacity) + drafter_memory(drafter);
        let mut spec = SpeculativeSession::new(model, drafter, spec_capacity)?;
        for (name, use_head) in modes {
            let mut m = Measured { memory, ..Default::default() };
            spec.generate(&prompts[0], &gen, &SpeculativeOptions { use_head, timing: false, ..Default::default() }, &mut |_| true).await?;
            tick(name);
            for p in &prompts {
                for run in 1..=runs + 1 {
                    let timing = run == runs + 1;
                    let (g, st) = spec.generate(p, &gen, &SpeculativeOptions { use_head, timing, ..Default::default() }, &mut |_| true).await?;
                    m.acceptance.extend(&st.acceptance_lengths);
                    if timing {
                        m.draft += st.draft_seconds;
                        m.verify += st.verify_seconds;
                        m.head += st.head_seconds;
                    } else {
                        m.prefill.push(g.stats.prefill_tokens_per_s);
                        m.decode.push(g.stats.decode_tokens_per_s);
                        m.ttft.push(g.stats.time_to_first_token_s);
                    }
                    tick(name);
                }
            }
            measured.push((name.to_string(), m));
        }
    }

    let copy = domino_engine::bandwidth::copy_bandwidth(gpu, copy_bytes.min(gpu.caps.max_storage_binding), 5, &now).await?;
    tick("copy bandwidth");
    let weight_bytes = model.decode_weight_bytes();
    let plain_tps = median(&measured[0].1.decode);
    let modes: Vec<Value> = measured
        .iter()
        .enumerate()
        .map(|(i, (name, m))| mode_report(name, m, if i == 0 { None } else { Some(plain_tps) }, weight_bytes, copy))
        .collect();
    let a = &gpu.info;
    Ok(json!({
        "schema": "domino-bench/1",
        "runner": "browser",
        "domino_version": env!("CARGO_PKG_VERSION"),
        "created_unix_s": (js_sys::Date::now() / 1000.0) as u64,
        "machine": { "os": browser_os(), "arch": "wasm32", "cpu": Value::Null, "hostname": hostname },
        "workload": {
            "model": loaded.model_name,
            "drafter": loaded.drafter_name,
            "dtype": loaded.dtype,
            "prompt_source": source,
            "prompt_tokens": prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            "max_tokens": max_tokens,
            "runs": runs,
        },
        "adapters": [{
            "adapter": {
                "name": a.name,
                "vendor": a.vendor,
                "vendor_name": vendor_name(gpu),
                "device": a.device,
                "backend": a.backend,
                "device_type": a.device_type,
                "driver": a.driver,
                "driver_info": a.driver_info,
                "features": a.features,
                "max_storage_buffer_binding_size": a.max_storage_buffer_binding_size,
                "max_buffer_size": a.max_buffer_size,
                "max_compute_workgroup_storage_size": a.max_compute_workgroup_storage_size,
                "max_compute_invocations_per_workgroup": a.max_compute_invocations_per_workgroup,
                "max_storage_buffers_per_shader_stage": a.max_storage_buffers_per_shader_stage,
            },
            "copy_bandwidth_gb_s": copy / 1e9,
            "decode_weight_bytes_per_token": weight_bytes,
            "modes": modes,
        }],
    }))
}
