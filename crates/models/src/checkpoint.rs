//! Safetensors checkpoints, single-file or sharded (model.safetensors.index.json), memory-mapped.
//! Headers are validated when opened, so a truncated or corrupt file is refused up front.

use crate::config::read_file;
use crate::error::{ModelError, Result};
use domino_engine::HostDType;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A tensor's bytes as stored, with its dtype and shape. `data` is borrowed from a mapped file, or
/// owned when a streaming source (the browser build) reads just this tensor on request.
#[derive(Debug, Clone)]
pub struct RawTensor<'a> {
    pub dtype: HostDType,
    pub shape: &'a [usize],
    pub data: std::borrow::Cow<'a, [u8]>,
    pub file: &'a Path,
}

/// Where tensors come from (memory-mapped files natively; fetched bytes in the browser).
pub trait WeightSource {
    /// The tensor called `name`, or None if the checkpoint lacks it.
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>>;
    /// Names of all tensors (for error messages and prefix checks).
    fn names(&self) -> Vec<String>;
    /// A short description for errors ("model.safetensors", "3 shards").
    fn describe(&self) -> String;
    /// Shape and byte length of `name` without its data: streaming sources answer from the header,
    /// so checking a whole tensor plan reads no weights.
    fn tensor_shape(&self, name: &str) -> Result<Option<(Vec<usize>, u64)>> {
        Ok(self.tensor(name)?.map(|t| (t.shape.to_vec(), t.data.len() as u64)))
    }
}

struct TensorEntry {
    /// Err holds the unsupported dtype's name, reported when the tensor is used.
    dtype: std::result::Result<HostDType, String>,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

struct MappedFile {
    path: PathBuf,
    bytes: Box<dyn AsRef<[u8]> + Send + Sync>,
    data_start: usize,
    tensors: HashMap<String, TensorEntry>,
}

/// Safetensors bytes that were already loaded or mapped.
impl MappedFile {
    fn open(path: &Path, bytes: Box<dyn AsRef<[u8]> + Send + Sync>) -> Result<Self> {
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(bytes.as_ref().as_ref())
            .map_err(|e| ModelError::Safetensors { path: path.into(), message: format!("{e:?}") })?;
        let mut tensors = HashMap::new();
        for (name, info) in meta.tensors() {
            let dtype = match info.dtype {
                safetensors::Dtype::F32 => Ok(HostDType::F32),
                safetensors::Dtype::F16 => Ok(HostDType::F16),
                safetensors::Dtype::BF16 => Ok(HostDType::BF16),
                other => Err(format!("{other:?}")),
            };
            tensors.insert(name, TensorEntry { dtype, shape: info.shape.clone(), start: info.data_offsets.0, end: info.data_offsets.1 });
        }
        Ok(Self { path: path.into(), bytes, data_start: 8 + header_len, tensors })
    }
}

pub struct Checkpoint {
    files: Vec<MappedFile>,
    index: HashMap<String, usize>,
    description: String,
}

impl Checkpoint {
    /// Open `dir`: model.safetensors.index.json if present, else every *.safetensors file.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let file_names: Vec<String> = if index_path.exists() {
            shard_names(&read_file(&index_path)?, &index_path)?
        } else {
            let mut names = Vec::new();
            let rd = std::fs::read_dir(dir).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ModelError::Missing { path: dir.into() },
                _ => ModelError::Io { path: dir.into(), source: e },
            })?;
            for entry in rd.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                // A drafter folder's lookup table is not a weight shard.
                if name.ends_with(".safetensors") && name != crate::ngram_table::FILE_NAME {
                    names.push(name);
                }
            }
            names.sort();
            if names.is_empty() {
                return Err(ModelError::Missing { path: dir.join("model.safetensors") });
            }
            names
        };
        let mut files = Vec::new();
        for name in &file_names {
            let path = dir.join(name);
            let file = std::fs::File::open(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ModelError::Missing { path: path.clone() },
                _ => ModelError::Io { path: path.clone(), source: e },
            })?;
            files.push(MappedFile::open(&path, map_file(&file, &path)?)?);
        }
        Self::from_files(files, if file_names.len() == 1 { file_names[0].clone() } else { format!("{} shards", file_names.len()) })
    }

    /// A checkpoint from in-memory safetensors files (name, bytes).
    pub fn from_bytes(files: Vec<(String, Vec<u8>)>) -> Result<Self> {
        let n = files.len();
        let mut mapped = Vec::new();
        for (name, bytes) in files {
            mapped.push(MappedFile::open(Path::new(&name), Box::new(bytes))?);
        }
        Self::from_files(mapped, format!("{n} file(s)"))
    }

    fn from_files(files: Vec<MappedFile>, description: String) -> Result<Self> {
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for name in f.tensors.keys() {
                index.insert(name.clone(), i);
            }
        }
        Ok(Self { files, index, description })
    }
}

impl WeightSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>> {
        let Some(&fi) = self.index.get(name) else { return Ok(None) };
        let f = &self.files[fi];
        let e = &f.tensors[name];
        let dtype = e.dtype.clone().map_err(|d| ModelError::DType { name: name.into(), dtype: d, path: f.path.clone() })?;
        let all = (*f.bytes).as_ref();
        let data = std::borrow::Cow::Borrowed(&all[f.data_start + e.start..f.data_start + e.end]);
        Ok(Some(RawTensor { dtype, shape: &e.shape, data, file: &f.path }))
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

/// The shard files a `model.safetensors.index.json` names (sorted, deduplicated). Each must be a
/// plain file name in the checkpoint's folder: a path (`../x`, `/etc/x`, `a/b`) is refused, so an
/// index cannot make the loader open files elsewhere.
pub fn shard_names(bytes: &[u8], index_path: &Path) -> Result<Vec<String>> {
    let err = |message: String| ModelError::Config { path: index_path.into(), message };
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ModelError::Json { path: index_path.into(), message: e.to_string() })?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| err("missing 'weight_map' object".into()))?;
    let mut names = Vec::with_capacity(map.len());
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| err(format!("weight_map entry '{tensor}': expected a file name, found {file}")))?;
        let plain = !file.is_empty()
            && file != "."
            && file != ".."
            && !file.contains(['/', '\\', '\0'])
            && !(file.len() >= 2 && file.as_bytes()[1] == b':');
        if !plain {
            return Err(err(format!("weight_map entry '{tensor}': '{file}' is not a plain file name in the checkpoint folder")));
        }
        names.push(file.to_string());
    }
    if names.is_empty() {
        return Err(err("'weight_map' is empty".into()));
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// Memory-map a checkpoint file (memmap2 does not build for wasm32, where files are read whole;
/// the browser build streams tensors through its own `WeightSource` instead).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn map_file(file: &std::fs::File, path: &Path) -> Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
    // SAFETY: the file is only read; a concurrent writer could change the mapped bytes, which
    // would corrupt weights but not memory safety of this process's own data structures.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| ModelError::Io { path: path.into(), source: e })?;
    Ok(Box::new(map))
}

#[cfg(target_arch = "wasm32")]
pub(crate) fn map_file(file: &std::fs::File, path: &Path) -> Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let mut file = file;
    file.read_to_end(&mut bytes).map_err(|e| ModelError::Io { path: path.into(), source: e })?;
    Ok(Box::new(bytes))
}

/// Check that `name` exists with `shape` and return its byte length, without reading its data.
pub fn expect_shape(src: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<u64> {
    let (found, len) = src.tensor_shape(name)?.ok_or_else(|| ModelError::MissingTensor { name: name.into(), where_: src.describe() })?;
    if found != shape {
        // The full lookup builds the error that names the file (reads the data only on this error path).
        expect_tensor(src, name, shape)?;
    }
    Ok(len)
}

/// Fetch `name` and check its shape.
pub fn expect_tensor<'a>(src: &'a dyn WeightSource, name: &str, shape: &[usize]) -> Result<RawTensor<'a>> {
    let t = src.tensor(name)?.ok_or_else(|| ModelError::MissingTensor { name: name.into(), where_: src.describe() })?;
    if t.shape != shape {
        return Err(ModelError::Shape { name: name.into(), expected: shape.to_vec(), found: t.shape.to_vec(), path: t.file.into() });
    }
    Ok(t)
}
