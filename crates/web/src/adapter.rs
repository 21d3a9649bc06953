//! Opening the browser's WebGPU adapter through wgpu, with clear errors when WebGPU is missing or a
//! limit the kernels need is too small.

use crate::error::WebError;
use crate::js;
use domino_engine::{list_adapters, AdapterSummary, BackendChoice, Gpu, GpuOptions};
use js_sys::Reflect;
use std::sync::Arc;
use wasm_bindgen::JsValue;

/// Limits every kernel needs (WebGPU's defaults; adapters below them cannot run Domino at all).
/// Model-dependent limits (storage binding size for the KV cache and weights) are checked at load.
const NEEDED: [(&str, u64); 3] = [
    ("maxStorageBuffersPerShaderStage", 5),
    ("maxComputeInvocationsPerWorkgroup", 256),
    ("maxComputeWorkgroupStorageSize", 4096),
];

fn get(obj: &JsValue, key: &str) -> JsValue {
    Reflect::get(obj, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

/// GPUAdapterInfo (vendor, architecture, description) from the browser: wgpu leaves the vendor and
/// driver fields empty on the WebGPU backend.
async fn browser_adapter_info() -> Result<JsValue, WebError> {
    let global = js_sys::global();
    let gpu = get(&get(&global, "navigator"), "gpu");
    if gpu.is_undefined() || gpu.is_null() {
        return Err(WebError::Usage(
            "WebGPU is not available here (navigator.gpu is missing): use a browser with WebGPU enabled \
             (Chrome/Edge 113+, or Chromium with --enable-unsafe-webgpu), on a secure origin (https or localhost)"
                .into(),
        ));
    }
    let request = get(&gpu, "requestAdapter")
        .dyn_into_function()
        .ok_or_else(|| WebError::Usage("WebGPU: navigator.gpu.requestAdapter is missing".into()))?;
    let promise = request.call0(&gpu).map_err(|e| WebError::Usage(format!("WebGPU: requestAdapter failed: {}", js::message(&e))))?;
    let adapter = js::wait(js_sys::Promise::resolve(&promise)).await.map_err(|e| WebError::Usage(format!("WebGPU: requestAdapter failed: {e}")))?;
    if adapter.is_null() || adapter.is_undefined() {
        return Err(WebError::Usage("WebGPU is enabled but the browser offers no adapter (GPU blocklisted or disabled?)".into()));
    }
    Ok(adapter)
}

trait DynFn {
    fn dyn_into_function(self) -> Option<js_sys::Function>;
}
impl DynFn for JsValue {
    fn dyn_into_function(self) -> Option<js_sys::Function> {
        use wasm_bindgen::JsCast;
        self.dyn_into::<js_sys::Function>().ok()
    }
}

pub async fn open() -> Result<Arc<Gpu>, WebError> {
    let js_adapter = browser_adapter_info().await?;
    let limits = get(&js_adapter, "limits");
    for (name, needed) in NEEDED {
        let have = get(&limits, name).as_f64().unwrap_or(0.0) as u64;
        if have < needed {
            return Err(WebError::Usage(format!("WebGPU limit too small: {name} is {have} on this adapter, Domino's kernels need {needed}")));
        }
    }
    let info = get(&js_adapter, "info");
    let s = |k: &str| get(&info, k).as_string().unwrap_or_default();
    let mut adapters = list_adapters(BackendChoice::Auto).await;
    if adapters.is_empty() {
        return Err(domino_engine::EngineError::NoAdapter { backend: "webgpu".into() }.into());
    }
    let (adapter, mut summary): (_, AdapterSummary) = adapters.swap_remove(0);
    if summary.name.is_empty() {
        summary.name = [s("vendor"), s("architecture"), s("device")].iter().filter(|x| !x.is_empty()).cloned().collect::<Vec<_>>().join(" ");
    }
    if summary.driver.is_empty() {
        summary.driver = s("vendor");
    }
    if summary.driver_info.is_empty() {
        summary.driver_info = s("description");
    }
    Ok(Gpu::from_adapter(adapter, summary, &GpuOptions::default()).await?)
}
