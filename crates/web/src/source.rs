//! Streaming weight sources over Blobs: safetensors (`BlobCheckpoint`) and GGUF (`BlobSource`, read
//! by the native GGUF parser). For safetensors only the headers are read up front; each tensor's
//! bytes are read (synchronously, in the worker) when the loader asks for that tensor, converted and
//! uploaded by the loader, and dropped before the next one. So wasm memory holds at most one tensor,
//! never a second copy of the checkpoint.

use crate::js;
use domino_engine::HostDType;
use domino_models::checkpoint::{RawTensor, WeightSource};
use domino_models::ModelError;
use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use wasm_bindgen::JsValue;

struct Entry {
    /// Err holds an unsupported dtype's name, reported when the tensor is used.
    dtype: Result<HostDType, String>,
    shape: Vec<usize>,
    start: u64,
    end: u64,
}

struct BlobFile {
    path: PathBuf,
    blob: JsValue,
    data_start: u64,
    tensors: HashMap<String, Entry>,
}

/// Progress while tensors are read: (bytes read so far, bytes of all weight files, file name).
pub type ReadProgress = Box<dyn Fn(u64, u64, &str)>;

pub struct BlobCheckpoint {
    files: Vec<BlobFile>,
    index: HashMap<String, usize>,
    description: String,
    total: u64,
    read: Cell<u64>,
    progress: ReadProgress,
}

fn corrupt(path: &PathBuf, message: impl Into<String>) -> ModelError {
    ModelError::Safetensors { path: path.clone(), message: message.into() }
}

fn read(blob: &JsValue, path: &PathBuf, start: u64, end: u64) -> Result<Vec<u8>, ModelError> {
    js::read_sync(blob, start as f64, end as f64)
        .map(|a| a.to_vec())
        .map_err(|e| ModelError::Io { path: path.clone(), source: std::io::Error::other(js::message(&e)) })
}

impl BlobFile {
    /// Read and validate the header: 8-byte length, JSON, offsets inside the file.
    fn open(name: &str, blob: JsValue, size: u64) -> Result<Self, ModelError> {
        let path = PathBuf::from(name);
        if size < 8 {
            return Err(corrupt(&path, format!("{size} bytes: too short for a safetensors header")));
        }
        let len_bytes = read(&blob, &path, 0, 8)?;
        let header_len = u64::from_le_bytes(len_bytes.as_slice().try_into().map_err(|_| corrupt(&path, "short read"))?);
        if header_len > 100 << 20 || 8 + header_len > size {
            return Err(corrupt(&path, format!("header length {header_len} does not fit in {size} bytes")));
        }
        let header = read(&blob, &path, 8, 8 + header_len)?;
        let meta: HashMap<String, serde_json::Value> =
            serde_json::from_slice(&header).map_err(|e| corrupt(&path, format!("malformed header JSON: {e}")))?;
        let data_start = 8 + header_len;
        let data_len = size - data_start;
        let mut tensors = HashMap::new();
        for (name, info) in meta {
            if name == "__metadata__" {
                continue;
            }
            let bad = |what: &str| corrupt(&path, format!("tensor {name}: {what}"));
            let dtype_name = info.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad("missing dtype"))?;
            let shape: Vec<usize> = info
                .get("shape")
                .and_then(|s| s.as_array())
                .ok_or_else(|| bad("missing shape"))?
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("shape must be non-negative integers"))?;
            let offsets = info.get("data_offsets").and_then(|o| o.as_array()).ok_or_else(|| bad("missing data_offsets"))?;
            let (start, end) = match offsets.as_slice() {
                [a, b] => (a.as_u64().ok_or_else(|| bad("bad data_offsets"))?, b.as_u64().ok_or_else(|| bad("bad data_offsets"))?),
                _ => return Err(bad("data_offsets must be [start, end]")),
            };
            if start > end || end > data_len {
                return Err(bad(&format!("data_offsets [{start}, {end}] outside the {data_len} data bytes (truncated file?)")));
            }
            let dtype = match dtype_name {
                "F32" => Ok(HostDType::F32),
                "F16" => Ok(HostDType::F16),
                "BF16" => Ok(HostDType::BF16),
                other => Err(other.to_string()),
            };
            if let Ok(d) = dtype {
                let want = d.bytes_for(shape.iter().product::<usize>()) as u64;
                if want != end - start {
                    return Err(bad(&format!("{} bytes for shape {shape:?} {dtype_name}, expected {want}", end - start)));
                }
            }
            tensors.insert(name, Entry { dtype, shape, start, end });
        }
        Ok(Self { path, blob, data_start, tensors })
    }
}

impl BlobCheckpoint {
    /// `files`: (file name, Blob, size in bytes) of every weight file of the folder.
    pub fn open(files: Vec<(String, JsValue, u64)>, progress: ReadProgress) -> Result<Self, ModelError> {
        let n = files.len();
        let description = if n == 1 { files[0].0.clone() } else { format!("{n} shards") };
        let mut opened = Vec::with_capacity(n);
        let mut index = HashMap::new();
        let mut total = 0;
        for (i, (name, blob, size)) in files.into_iter().enumerate() {
            let f = BlobFile::open(&name, blob, size)?;
            for (t, e) in &f.tensors {
                index.insert(t.clone(), i);
                total += e.end - e.start;
            }
            opened.push(f);
        }
        Ok(Self { files: opened, index, description, total, read: Cell::new(0), progress })
    }

    fn entry(&self, name: &str) -> Option<(&BlobFile, &Entry)> {
        let f = &self.files[*self.index.get(name)?];
        Some((f, f.tensors.get(name)?))
    }
}

impl WeightSource for BlobCheckpoint {
    fn tensor(&self, name: &str) -> domino_models::Result<Option<RawTensor<'_>>> {
        let Some((f, e)) = self.entry(name) else { return Ok(None) };
        let dtype = e.dtype.clone().map_err(|d| ModelError::DType { name: name.into(), dtype: d, path: f.path.clone() })?;
        let data = read(&f.blob, &f.path, f.data_start + e.start, f.data_start + e.end)?;
        let done = self.read.get() + data.len() as u64;
        self.read.set(done);
        (self.progress)(done.min(self.total), self.total, &f.path.to_string_lossy());
        Ok(Some(RawTensor { dtype, shape: &e.shape, data: Cow::Owned(data), file: &f.path }))
    }

    fn tensor_shape(&self, name: &str) -> domino_models::Result<Option<(Vec<usize>, u64)>> {
        let Some((f, e)) = self.entry(name) else { return Ok(None) };
        if let Err(d) = &e.dtype {
            return Err(ModelError::DType { name: name.into(), dtype: d.clone(), path: f.path.clone() });
        }
        Ok(Some((e.shape.clone(), e.end - e.start)))
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.index.keys().cloned().collect();
        v.sort();
        v
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

/// A GGUF file as a Blob for `GgufFile::from_source`: the header parser reads it in
/// `HEADER_CHUNK`-sized ranges, the loader one tensor's range at a time. Nothing keeps the bytes
/// after a read, so wasm memory never holds more than one tensor (or one header chunk).
pub struct BlobSource {
    path: PathBuf,
    blob: JsValue,
    size: u64,
    /// The largest single read so far (the browser test checks it stays one tensor's size).
    max_read: std::rc::Rc<Cell<u64>>,
}

impl BlobSource {
    pub fn new(name: &str, blob: JsValue, size: u64, max_read: std::rc::Rc<Cell<u64>>) -> Self {
        Self { path: PathBuf::from(name), blob, size, max_read }
    }
}

impl domino_models::gguf::GgufSource for BlobSource {
    fn len(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, len: usize) -> domino_models::Result<Cow<'_, [u8]>> {
        let data = read(&self.blob, &self.path, offset, offset + len as u64)?;
        if data.len() != len {
            return Err(ModelError::Gguf {
                path: self.path.clone(),
                message: format!("read {} of {len} bytes at offset {offset}: the file changed or is truncated", data.len()),
            });
        }
        self.max_read.set(self.max_read.get().max(len as u64));
        Ok(Cow::Owned(data))
    }
}
