//! Loading a model (a folder by base URL or File objects, or one GGUF file by URL or File) into GPU
//! buffers: small files are read whole, weights stream tensor by tensor (`BlobCheckpoint` for
//! safetensors, `BlobSource` under the native GGUF reader for GGUF).

use crate::error::WebError;
use crate::js;
use crate::source::{BlobCheckpoint, BlobSource};
use domino_engine::{DTypeChoice, Gpu, WeightFormat};
use domino_models::config::parse_token_ids;
use domino_models::drafter::DrafterConfig;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::gguf::GgufFile;
use domino_models::ngram_table::{self, NgramTable};
use domino_models::tokenizer::TextTokenizer;
use domino_models::{gguf_model_files, ModelError, Qwen3Config, Qwen3Model};
use js_sys::{Function, Reflect};
use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
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
    /// The `dtype` option as given ("auto" by default), as `--dtype` in the bench report.
    pub dtype: String,
    /// "gguf" or "safetensors".
    pub model_format: &'static str,
    /// The largest single read from a GGUF Blob (a header chunk or one tensor); 0 for safetensors.
    pub max_read_bytes: u64,
}

/// The drafter's weights are float checkpoints: f32 when asked for, f16 otherwise (as the CLI).
fn drafter_format(dtype: DTypeChoice) -> WeightFormat {
    if dtype == DTypeChoice::Format(WeightFormat::F32) {
        WeightFormat::F32
    } else {
        WeightFormat::F16
    }
}

/// Calls onProgress(loaded, total, fileName, phase) where phase is "download" or "upload".
#[derive(Clone)]
pub struct Progress(Option<Function>);

impl Progress {
    pub fn new(f: Option<Function>) -> Self {
        Self(f)
    }

    pub fn call(&self, loaded: u64, total: u64, file: &str, phase: &str) {
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
    /// The GGUF file's name when the source was one `.gguf` (URL or File) rather than a folder.
    gguf: Option<String>,
}

impl Folder {
    /// `drafter`: also fetch a drafter folder's optional lookup table (`ngram_table::FILE_NAME`).
    async fn open(source: &JsValue, progress: &Progress, drafter: bool) -> Result<Self, WebError> {
        let js = js::wait(js::open_folder(source, &progress.download_callback(), drafter)).await.map_err(WebError::Files)?;
        let name = Reflect::get(&js, &"name".into()).ok().and_then(|v| v.as_string()).unwrap_or_else(|| "model".into());
        let gguf = Reflect::get(&js, &"gguf".into()).ok().and_then(|v| v.as_string());
        Ok(Self { js, name, gguf })
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

pub async fn load(gpu: Arc<Gpu>, model: &JsValue, draft: Option<&JsValue>, dtype: DTypeChoice, dtype_name: String, progress: &Progress) -> Result<Loaded, WebError> {
    let folder = Folder::open(model, progress, false).await?;
    let (model, tokenizer, stop_ids, model_format, max_read_bytes) = match &folder.gguf {
        Some(file) => {
            let (model, tokenizer, stop_ids, max_read) = load_gguf(gpu, &folder, file, dtype, progress)?;
            (model, tokenizer, stop_ids, "gguf", max_read)
        }
        None => {
            let (model, tokenizer, stop_ids) = load_folder(gpu, &folder, dtype, progress).await?;
            (model, tokenizer, stop_ids, "safetensors", 0)
        }
    };

    let (drafter, drafter_name, drafter_block_size) = match draft {
        None => (None, None, 0),
        Some(source) => {
            let dfolder = Folder::open(source, progress, true).await?;
            if dfolder.gguf.is_some() {
                return Err(WebError::Usage(format!("{}: a drafter is a DFlash / Domino folder (config.json + model.safetensors), not a GGUF file", dfolder.name)));
            }
            let dconfig = DrafterConfig::from_json(&dfolder.required("config.json").await?, &dfolder.path("config.json"))?;
            let block = dconfig.block_size;
            let dckpt = checkpoint(dfolder.weights().await?, progress)?;
            let mut d = DrafterModel::load(dconfig, &dckpt, &model, drafter_format(dtype))?;
            // The CLI's default `--draft-vocab auto`: a frequency shortlist of a large vocabulary.
            let ranked = tokenizer.as_ref().and_then(|t| t.ranked_vocab());
            d.set_draft_vocab(&model, domino_models::drafter_gpu::DraftVocab::Auto.tokens(model.config.vocab_size, ranked))?;
            // The static n-gram table prompt lookup consults, where the folder ships one (as the CLI).
            if let Some(bytes) = dfolder.bytes(ngram_table::FILE_NAME).await? {
                let path = dfolder.path(ngram_table::FILE_NAME);
                d.lookup_table = Some(Arc::new(NgramTable::from_bytes(&bytes, &path)?.for_target(&path, model.config.vocab_size)?));
            }
            (Some(d), Some(dfolder.name.clone()), block)
        }
    };
    Ok(Loaded { model, tokenizer, stop_ids, drafter, drafter_block_size, model_name: folder.name, drafter_name, dtype: dtype_name, model_format, max_read_bytes })
}

/// A GGUF file through the native reader (`GgufFile::from_source` over the Blob, then
/// `gguf_model_files`: config, tokenizer and chat template from the metadata), its tensors uploaded
/// one at a time as stored (`dtype` auto keeps quantized blocks quantized).
fn load_gguf(gpu: Arc<Gpu>, folder: &Folder, file: &str, dtype: DTypeChoice, progress: &Progress) -> Result<(Qwen3Model, Option<TextTokenizer>, Vec<u32>, u64), WebError> {
    let blob = js::file_blob(&folder.js, file);
    if blob.is_undefined() {
        return Err(ModelError::Missing { path: file.into() }.into());
    }
    let size = Reflect::get(&blob, &"size".into()).ok().and_then(|s| s.as_f64()).unwrap_or(0.0) as u64;
    let max_read = Rc::new(Cell::new(0));
    let g = GgufFile::from_source(Path::new(file), Box::new(BlobSource::new(file, blob, size, max_read.clone())))?;
    let files = gguf_model_files(g)?;
    let p = progress.clone();
    let model = Qwen3Model::load_with(gpu, files.config, files.weights.as_ref(), dtype, &mut |done, total, _| p.call(done, total, file, "upload"))?;
    Ok((model, files.tokenizer, files.stop_ids, max_read.get()))
}

/// A Hugging Face folder: config.json, the tokenizer files, safetensors streamed by `BlobCheckpoint`.
async fn load_folder(gpu: Arc<Gpu>, folder: &Folder, dtype: DTypeChoice, progress: &Progress) -> Result<(Qwen3Model, Option<TextTokenizer>, Vec<u32>), WebError> {
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
    let model = Qwen3Model::load_with(gpu, config, &ckpt, dtype, &mut |_, _, _| {})?;
    Ok((model, tokenizer, stop_ids))
}
