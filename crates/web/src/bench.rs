//! The page's Bench button: the measurement `domino bench` makes on one adapter (the shared
//! `domino_runtime::bench::measure`), run in the browser on the loaded model, written as the same
//! domino-bench/1 report with `runner: "browser"` so `domino report` merges browser and native runs.
//! The per-mode figures are the runtime's `ModeReport`; the other field names and meanings follow
//! crates/cli/src/report.rs; keep the two in step.

use crate::error::WebError;
use crate::js::Options;
use crate::load::Loaded;
use domino_engine::Gpu;
use domino_runtime::bench::{self, BenchPlan, BenchProgress, DEFAULT_PROMPTS};
use domino_runtime::{DraftLen, RoundCosts};
use serde_json::{json, Value};
use wasm_bindgen::JsValue;

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

    if let Some(d) = loaded.drafter.as_mut() {
        d.config.block_size = loaded.drafter_block_size;
    }
    let model = &loaded.model;
    let max_prompt = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let plan = BenchPlan {
        capacity: (max_prompt + max_tokens).min(model.config.max_position_embeddings),
        spec_capacity: max_prompt + max_tokens,
        prompts,
        max_tokens,
        runs,
        split_prompts: None,
        draft_len: DraftLen::Auto,
        lookup: false,
        copy_bytes,
    };
    let steps_total = plan.progress_steps(loaded.drafter.as_ref().map_or(0, |d| bench::speculative_modes(d, plan.lookup).len()));
    let mut steps = 0usize;
    let mut progress = |p: BenchProgress| {
        if let BenchProgress::Done(what) = p {
            steps += 1;
            if let Some(f) = &on_progress {
                let _ = f.call3(&JsValue::NULL, &(steps as f64).into(), &(steps_total as f64).into(), &what.into());
            }
        }
    };
    // Adaptive draft length with the session's own cost estimates (no calibration cache in the page).
    let mut round_costs = |_: &mut domino_runtime::SpeculativeSession<'_>, _: bool| -> Result<Option<RoundCosts>, WebError> { Ok(None) };
    let result = bench::measure(gpu, model, loaded.drafter.as_ref(), &plan, &mut round_costs, &mut progress).await?;
    let prompts = plan.prompts;
    let weight_bytes = result.decode_weight_bytes_per_token;
    let copy = result.copy_bandwidth;
    let modes = serde_json::to_value(&result.modes).map_err(|e| WebError::Usage(format!("bench: {e}")))?;
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
