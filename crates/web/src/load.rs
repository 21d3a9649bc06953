//! Loading a model folder (base URL or File objects) into GPU buffers: small files are read whole,
//! weights stream tensor by tensor through `BlobCheckpoint`.

use crate::error::WebError;
use crate::js;
use crate::source::BlobCheckpoint;
use domino_engine::{Gpu, WeightFormat};
use domino_models::config::parse_token_ids;
use domino_models::drafter::DrafterConfig;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::tokenizer::TextTokenizer;
use domino_models::{ModelError, Qwen3Config, Qwen3Model};
use js_sys::{Function, Reflect};
use std::path::Path;
use std::sync::Arc;
use wasm_bindgen::JsValue;

pub struct Loaded {
    pub model: Qwen3Model,
    pub tokenizer: Option<TextTokenizer>,
    /// eos ids from config.json, generation_config.json and tokenizer_config.json (as the CLI).
    pub stop_ids: Vec<u32>,
    pub drafter: Option<DrafterModel>,
    /// The drafter's own block size (generate's `blockSize` overrides it per call).
    pub drafter_block_size: usize,
    pub model_name: String,
    pub drafter_name: Option<String>,
    pub format: WeightFormat,
}

/// Calls onProgress(loaded, total, fileName, phase) where phase is "download" or "upload".
#[derive(Clone)]
pub struct Progress(Option<Function>);

impl Progress {
    pub fn new(f: Option<Function>) -> Self {
        Self(f)
    }

    fn call(&self, loaded: u64, total: u64, file: &str, phase: &str) {
        if let Some(f) = &self.0 {
            let args = js_sys::Array::of4(&(loaded as f64).into(), &(total as f64).into(), &file.into(), &phase.into());
            // A throwing progress callback must not abort the load.
            let _ = f.apply(&JsValue::NULL, &args);
        }
    }

    /// The JS callback handed to openFolder for the download phase.
    fn download_callback(&self) -> JsValue {
        let me = self.clone();
        let cb = wasm_bindgen::closure::Closure::<dyn Fn(f64, f64, String)>::new(move |l: f64, t: f64, name: String| {
            me.call(l as u64, t as u64, &name, "download");
        });
        cb.into_js_value()
    }
}

/// A folder opened on the JS side (its files as Blobs).
struct Folder {
    js: JsValue,
    name: String,
}

impl Folder {
    async fn open(source: &JsValue, progress: &Progress) -> Result<Self, WebError> {
        let js = js::wait(js::open_folder(source, &progress.download_callback())).await.map_err(WebError::Files)?;
        let name = Reflect::get(&js, &"name".into()).ok().and_then(|v| v.as_string()).unwrap_or_else(|| "model".into());
        Ok(Self { js, name })
    }

    async fn bytes(&self, file: &str) -> Result<Option<Vec<u8>>, WebError> {
        let v = js::wait(js::file_bytes(&self.js, file)).await.map_err(WebError::Files)?;
        Ok(if v.is_undefined() { None } else { Some(js_sys::Uint8Array::new(&v).to_vec()) })
    }

    async fn required(&self, file: &str) -> Result<Vec<u8>, WebError> {
        self.bytes(file).await?.ok_or_else(|| ModelError::Missing { path: Path::new(&self.name).join(file) }.into())
    }

    /// The weight files as (name, Blob, size) for the streaming reader.
    async fn weights(&self) -> Result<Vec<(String, JsValue, u64)>, WebError> {
        let names = js::wait(js::weight_files(&self.js)).await.map_err(WebError::Files)?;
        let mut out = Vec::new();
        for n in js_sys::Array::from(&names).iter() {
            let name = n.as_string().unwrap_or_default();
            let blob = js::file_blob(&self.js, &name);
            if blob.is_undefined() {
                return Err(ModelError::Missing { path: Path::new(&self.name).join(&name) }.into());
            }
            let size = Reflect::get(&blob, &"size".into()).ok().and_then(|s| s.as_f64()).unwrap_or(0.0) as u64;
            out.push((name, blob, size));
        }
        Ok(out)
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        Path::new(&self.name).join(file)
    }
}

fn checkpoint(files: Vec<(String, JsValue, u64)>, progress: &Progress) -> Result<BlobCheckpoint, WebError> {
    let p = progress.clone();
    Ok(BlobCheckpoint::open(files, Box::new(move |done, total, file| p.call(done, total, file, "upload")))?)
}

pub async fn load(gpu: Arc<Gpu>, model: &JsValue, draft: Option<&JsValue>, format: WeightFormat, progress: &Progress) -> Result<Loaded, WebError> {
    let folder = Folder::open(model, progress).await?;
    let config = Qwen3Config::from_json(&folder.required("config.json").await?, &folder.path("config.json"))?;
    let tokenizer = match folder.bytes("tokenizer.json").await? {
        Some(json) => Some(TextTokenizer::from_parts(&json, folder.bytes("tokenizer_config.json").await?.as_deref())?),
        None => None,
    };
    let mut stop_ids = config.eos_token_ids.clone();
    if let Some(bytes) = folder.bytes("generation_config.json").await? {
        let path = folder.path("generation_config.json");
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| ModelError::Json { path, message: e.to_string() })?;
        stop_ids.extend(parse_token_ids(v.get("eos_token_id")));
    }
    if let Some(t) = &tokenizer {
        stop_ids.extend(t.eos_token_ids());
    }
    stop_ids.sort();
    stop_ids.dedup();
    let ckpt = checkpoint(folder.weights().await?, progress)?;
    let model = Qwen3Model::load(gpu, config, &ckpt, format, &mut |_, _, _| {})?;
    drop(ckpt);

    let (drafter, drafter_name, drafter_block_size) = match draft {
        None => (None, None, 0),
        Some(source) => {
            let dfolder = Folder::open(source, progress).await?;
            let dconfig = DrafterConfig::from_json(&dfolder.required("config.json").await?, &dfolder.path("config.json"))?;
            let block = dconfig.block_size;
            let dckpt = checkpoint(dfolder.weights().await?, progress)?;
            let d = DrafterModel::load(dconfig, &dckpt, &model, format)?;
            (Some(d), Some(dfolder.name.clone()), block)
        }
    };
    Ok(Loaded { model, tokenizer, stop_ids, drafter, drafter_block_size, model_name: folder.name, drafter_name, format })
}
