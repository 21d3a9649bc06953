//! The browser build of Domino: wasm-bindgen bindings over domino-runtime, so the page runs the same
//! scheduler as the native `domino` binary.
//!
//! ```text
//! import init, { Domino } from './pkg/domino_web.js';
//! await init();
//! const d = await Domino.create();
//! d.adapterInfo();
//! await d.load({ model, draft, onProgress });
//! const r = await d.generate({ prompt, promptIds, chat, maxTokens, temperature, topP, topK, seed,
//!                              ignoreEos, blockSize, noHead, draftLen, lookup, onToken });
//! ```
//! `generate` resolves to the object `domino generate --json` prints; `bench` to a domino-bench/1
//! report with `runner: "browser"`. Weights are read tensor by tensor (FileReaderSync), so `load`
//! runs in a Web Worker.

// The RefCell borrow held across awaits IS the "one call at a time" guard (see `exclusive`).
#![allow(clippy::await_holding_refcell_ref)]

mod adapter;
mod bench;
mod error;
mod generate;
mod js;
mod load;
mod source;

pub use error::WebError;

use domino_engine::{DTypeChoice, Gpu};
use js::Options;
use load::{Loaded, Progress};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

/// Runs once at `init()`: a panic (a bug; errors are values) reaches the console with its message
/// instead of a bare "unreachable" trap.
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| console_error(&format!("domino-web panicked: {info}"))));
}

/// Logs WebGPU errors no error scope caught (in the browser, scopes resolve after a JS task, so the
/// engine cannot wait for them): the console names them, and the next call reports the first one.
fn watch_gpu_errors(gpu: &Gpu, sink: Arc<Mutex<Option<String>>>) {
    gpu.device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        let msg = e.to_string();
        console_error(&format!("WebGPU error: {msg}"));
        if let Ok(mut slot) = sink.lock() {
            slot.get_or_insert(msg);
        }
    }));
}

struct State {
    gpu: Arc<Gpu>,
    loaded: Option<Loaded>,
    /// The first WebGPU error no scope caught since the last call reported one.
    errors: Arc<Mutex<Option<String>>>,
}

impl State {
    /// Turn a WebGPU error raised during a call into that call's error.
    fn check_gpu(&self) -> Result<(), WebError> {
        match self.errors.lock().ok().and_then(|mut e| e.take()) {
            Some(msg) => Err(WebError::Usage(format!("WebGPU error: {msg}"))),
            None => Ok(()),
        }
    }
}

/// One WebGPU device with (after `load`) a model and an optional drafter.
#[wasm_bindgen]
pub struct Domino {
    state: Rc<RefCell<State>>,
}

/// Runs `f` with exclusive access to the state; a second call while one runs is a clear error.
fn exclusive<F, Fut>(state: &Rc<RefCell<State>>, f: F) -> js_sys::Promise
where
    F: FnOnce(Rc<RefCell<State>>) -> Fut + 'static,
    Fut: std::future::Future<Output = Result<JsValue, WebError>> + 'static,
{
    let state = state.clone();
    wasm_bindgen_futures::future_to_promise(async move { f(state).await.map_err(JsValue::from) })
}

#[wasm_bindgen]
impl Domino {
    /// Open the browser's WebGPU adapter. Rejects with a clear message when WebGPU is missing or a
    /// limit the kernels need is too small.
    pub async fn create() -> Result<Domino, JsValue> {
        let gpu = adapter::open().await?;
        let errors = Arc::new(Mutex::new(None));
        watch_gpu_errors(&gpu, errors.clone());
        Ok(Domino { state: Rc::new(RefCell::new(State { gpu, loaded: None, errors })) })
    }

    /// The adapter: name, backend, device type, driver, features (shader-f16 / subgroups /
    /// timestamp-query as granted to wgpu) and limits, as `domino devices --json` lists them.
    #[wasm_bindgen(js_name = adapterInfo)]
    pub fn adapter_info(&self) -> Result<JsValue, JsValue> {
        let s = self.state.try_borrow().map_err(|_| WebError::Busy)?;
        let mut v = serde_json::to_value(&s.gpu.info).map_err(|e| WebError::Usage(e.to_string()))?;
        if let Some(o) = v.as_object_mut() {
            // What the kernels actually use: the browser path runs on the fallback variants.
            o.insert("kernels_f16".into(), s.gpu.caps.f16.into());
            o.insert("kernels_subgroups".into(), s.gpu.caps.subgroup.into());
        }
        Ok(generate::to_js(&v)?)
    }

    /// `load({ model, draft, onProgress, dtype })`: `model` is a GGUF file (a URL ending in `.gguf`,
    /// or a File), a base URL of a model folder, or an array of File objects; the optional `draft` is
    /// a drafter folder (URL or File[]). `dtype`: auto (default: GGUF blocks stay quantized), f16,
    /// f32 or a block type (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k). `onProgress(loadedBytes, totalBytes, fileName, phase)` with phase
    /// "download" (fetching into the cache) or "upload" (tensors to the GPU).
    pub fn load(&self, opts: JsValue) -> js_sys::Promise {
        exclusive(&self.state, move |state| async move {
            let o = Options::new(&opts, "load").map_err(WebError::Usage)?;
            let model = o.raw("model").ok_or_else(|| WebError::Usage("load: option 'model' (URL or File[]) is required".into()))?;
            let draft = o.raw("draft");
            let dtype_name = o.string("dtype").map_err(WebError::Usage)?.unwrap_or_else(|| "auto".into());
            let dtype = DTypeChoice::parse(&dtype_name)
                .ok_or_else(|| WebError::Usage(format!("load: dtype '{dtype_name}': expected auto, f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k")))?;
            let progress = Progress::new(o.function("onProgress").map_err(WebError::Usage)?);
            let mut s = state.try_borrow_mut().map_err(|_| WebError::Busy)?;
            // Free the previous model's buffers before uploading the next one.
            s.loaded = None;
            s.gpu.clear_bind_groups();
            if s.gpu.lost().is_some() {
                // The device was lost (driver reset, tab in the background too long): open a new
                // one, so the page continues without a reload.
                s.gpu = adapter::open().await?;
                if let Ok(mut e) = s.errors.lock() {
                    *e = None;
                }
                watch_gpu_errors(&s.gpu, s.errors.clone());
            }
            let loaded = load::load(s.gpu.clone(), &model, draft.as_ref(), dtype, dtype_name, &progress).await?;
            s.check_gpu()?;
            let summary = serde_json::json!({
                "model": loaded.model_name,
                "format": loaded.model_format,
                "dtype": loaded.dtype,
                "max_read_bytes": loaded.max_read_bytes,
                "drafter": loaded.drafter_name,
                "drafter_kind": loaded.drafter.as_ref().map(|d| if d.head.is_some() { "domino" } else { "dflash" }),
                "block_size": loaded.drafter.as_ref().map(|_| loaded.drafter_block_size),
                "lookup_table_contexts": loaded.drafter.as_ref().and_then(|d| d.lookup_table.as_ref()).map(|t| t.len()),
                "has_tokenizer": loaded.tokenizer.is_some(),
                "has_chat_template": loaded.tokenizer.as_ref().map(|t| t.has_chat_template()).unwrap_or(false),
                "vocab_size": loaded.model.config.vocab_size,
                "weight_bytes_per_token": loaded.model.decode_weight_bytes(),
            });
            s.loaded = Some(loaded);
            generate::to_js(&summary)
        })
    }

    /// `generate({ prompt, promptIds, chat, maxTokens, temperature, topP, topK, seed, ignoreEos,
    /// blockSize, noHead, draftLen, lookup, draft, context, onToken })` resolves to the `domino generate
    /// --json` object; `context` sets the KV cache capacity (default: prompt + maxTokens). A lost
    /// device rejects the promise; the next `load` opens a new device.
    /// `onToken(text, id)` streams; returning `false` from it stops (stop_reason "cancelled").
    /// With a drafter loaded, decoding is speculative unless `draft: false`.
    pub fn generate(&self, opts: JsValue) -> js_sys::Promise {
        exclusive(&self.state, move |state| async move {
            let mut s = state.try_borrow_mut().map_err(|_| WebError::Busy)?;
            let loaded = s.loaded.as_mut().ok_or(WebError::NotLoaded)?;
            let req = generate::Request::parse(loaded, &opts)?;
            let out = generate::generate(loaded, req).await?;
            s.check_gpu()?;
            generate::to_js(&out)
        })
    }

    /// `bench({ maxTokens, runs, prompts, promptLen, hostname, copyBytes, onProgress })` resolves to a
    /// domino-bench/1 report (`runner: "browser"`), the JSON `domino bench --json` writes, so
    /// `domino report` merges browser and native runs.
    pub fn bench(&self, opts: JsValue) -> js_sys::Promise {
        exclusive(&self.state, move |state| async move {
            let mut s = state.try_borrow_mut().map_err(|_| WebError::Busy)?;
            let gpu = s.gpu.clone();
            let loaded = s.loaded.as_mut().ok_or(WebError::NotLoaded)?;
            let report = bench::run(&gpu, loaded, &opts).await?;
            s.check_gpu()?;
            generate::to_js(&report)
        })
    }
}
