//! GGUF files (v2 and v3): header, metadata, tensor index and tensor data, memory-mapped natively.
//!
//! The parser reads through a `GgufSource`: a memory map or bytes in memory natively (`InMemory`),
//! a Blob read range by range in the browser (crates/web). The header is read in chunks of
//! `HEADER_CHUNK` bytes, and each tensor's bytes only when the tensor is asked for, so a source need
//! never hold the whole file.
//!
//! Everything read from the file is bounds-checked, so a truncated or corrupt file is refused with
//! an error naming the file and what was wrong, never a panic or a huge allocation. Tensor types:
//! F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K; any other type (Q2_K, Q3_K, the
//! IQ types, ...) is reported by name when its tensor is used.

use crate::error::{ModelError, Result};
use domino_engine::{HostDType, QuantType};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Items in one metadata array: far above real vocabularies (Qwen3: 151k tokens, 151k merges), low
/// enough that a hostile count cannot make the parser hold more than a few GB.
const MAX_ARRAY_ITEMS: usize = 1 << 24;
/// How much of the header the parser asks its source for at a time.
pub const HEADER_CHUNK: usize = 1 << 20;

/// Where a GGUF file's bytes come from. `read_at` is only called for ranges inside `len()`.
pub trait GgufSource {
    /// The file's length in bytes.
    fn len(&self) -> u64;
    /// The bytes `[offset, offset + len)`, borrowed (a map) or read (a Blob).
    fn read_at(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>>;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A file memory-mapped or already in memory.
pub struct InMemory(pub Box<dyn AsRef<[u8]> + Send + Sync>);

impl GgufSource for InMemory {
    fn len(&self) -> u64 {
        (*self.0).as_ref().len() as u64
    }
    fn read_at(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>> {
        let start = offset as usize;
        Ok(Cow::Borrowed(&(*self.0).as_ref()[start..start + len]))
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// Any integer type that fits in u64 (GGUF writers differ in which width they use).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v as u64),
            Self::U16(v) => Some(v as u64),
            Self::U32(v) => Some(v as u64),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v as f64),
            Self::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
    fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }
}

/// One entry of the tensor index. `dims` are in GGML order: dims[0] is the innermost (contiguous)
/// dimension, so a `[rows, cols]` matrix has dims `[cols, rows]`.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    /// The GGML type id (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, 30 BF16, ...).
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The element count (every parsed tensor's fits in u64: `GgufFile` refuses dims that overflow).
    pub fn elements(&self) -> u64 {
        self.checked_elements().unwrap_or(u64::MAX)
    }
    fn checked_elements(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
    /// Shape in row-major (PyTorch) order.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
    /// The host dtype, or the unsupported GGML type's name.
    pub fn dtype(&self) -> std::result::Result<HostDType, String> {
        match self.ggml_type {
            0 => Ok(HostDType::F32),
            1 => Ok(HostDType::F16),
            2 => Ok(HostDType::Quant(QuantType::Q4_0)),
            3 => Ok(HostDType::Quant(QuantType::Q4_1)),
            6 => Ok(HostDType::Quant(QuantType::Q5_0)),
            7 => Ok(HostDType::Quant(QuantType::Q5_1)),
            8 => Ok(HostDType::Quant(QuantType::Q8_0)),
            12 => Ok(HostDType::Quant(QuantType::Q4_K)),
            13 => Ok(HostDType::Quant(QuantType::Q5_K)),
            14 => Ok(HostDType::Quant(QuantType::Q6_K)),
            30 => Ok(HostDType::BF16),
            other => Err(ggml_type_name(other)),
        }
    }
}

/// GGML's names for the types this reader does not support (for error messages).
fn ggml_type_name(t: u32) -> String {
    const NAMES: [&str; 40] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
        "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
        "IQ1_M", "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
    ];
    NAMES.get(t as usize).map(|n| n.to_string()).unwrap_or_else(|| format!("unknown type {t}"))
}

/// A parsed GGUF file: metadata and tensor index, with its source (mapped, in memory or a Blob) kept
/// for the tensor data.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    pub tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_start: u64,
    source: Box<dyn GgufSource>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile").field("path", &self.path).field("version", &self.version).field("tensors", &self.tensors.len()).finish()
    }
}

/// A bounds-checked little-endian reader over the header, pulling `HEADER_CHUNK`-sized windows from
/// the source as it goes.
struct Reader<'a> {
    src: &'a dyn GgufSource,
    len: u64,
    window: Cow<'a, [u8]>,
    window_start: u64,
    pos: u64,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn corrupt(&self, what: &str) -> ModelError {
        ModelError::Gguf { path: self.path.into(), message: format!("{what} at byte {} (file is {} bytes): truncated or corrupt", self.pos, self.len) }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        let end = self.pos.checked_add(n as u64).filter(|&e| e <= self.len).ok_or_else(|| self.corrupt(what))?;
        if end > self.window_start + self.window.len() as u64 || self.pos < self.window_start {
            let want = (n.max(HEADER_CHUNK) as u64).min(self.len - self.pos) as usize;
            self.window = self.src.read_at(self.pos, want)?;
            self.window_start = self.pos;
            if self.window.len() < n {
                return Err(self.corrupt(&format!("{what}: short read")));
            }
        }
        let off = (self.pos - self.window_start) as usize;
        self.pos = end;
        Ok(&self.window[off..off + n])
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A count that must be plausible for the bytes left (each item takes at least `min_item` bytes).
    fn count(&mut self, what: &str, min_item: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let left = self.len - self.pos;
        if n.saturating_mul(min_item as u64) > left {
            return Err(ModelError::Gguf { path: self.path.into(), message: format!("{what} {n} is larger than the file allows: truncated or corrupt") });
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let s = self.take(n, what)?.to_vec();
        String::from_utf8(s).map_err(|_| self.corrupt(&format!("{what}: invalid UTF-8")))
    }
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => GgufValue::Bool(self.array::<1>(key)?[0] != 0),
            8 => GgufValue::String(self.string(key)?),
            9 if depth == 0 => {
                let item = self.u32(key)?;
                let n = self.count(&format!("{key}: array length"), 1)?;
                if n > MAX_ARRAY_ITEMS {
                    return Err(self.corrupt(&format!("metadata {key}: an array of {n} items (at most {MAX_ARRAY_ITEMS})")));
                }
                let mut v = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    v.push(self.value(item, key, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.corrupt(&format!("metadata {key}: unknown value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Open and memory-map `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ModelError::Missing { path: path.into() },
            _ => ModelError::Io { path: path.into(), source: e },
        })?;
        let bytes = crate::checkpoint::map_file(&file, path)?;
        Self::from_source(path, Box::new(InMemory(bytes)))
    }

    /// Parse GGUF bytes already in memory; `path` only labels errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self> {
        Self::from_source(path, Box::new(InMemory(Box::new(bytes))))
    }

    /// Parse the header read through `source` (a few `HEADER_CHUNK` reads; no tensor data is read);
    /// the source is kept for `tensor_data`. `path` names the file in errors.
    pub fn from_source(path: &Path, source: Box<dyn GgufSource>) -> Result<Self> {
        let (version, metadata, meta_index, tensors, tensor_index, header_end) = Self::parse_header(path, source.as_ref())?;
        let len = source.len();
        let mut file = Self { path: path.into(), version, metadata, meta_index, tensors, tensor_index, data_start: 0, source };
        file.locate_data(header_end, len)?;
        Ok(file)
    }

    #[allow(clippy::type_complexity)]
    fn parse_header(
        path: &Path,
        src: &dyn GgufSource,
    ) -> Result<(u32, Vec<(String, GgufValue)>, HashMap<String, usize>, Vec<GgufTensorInfo>, HashMap<String, usize>, u64)> {
        let mut r = Reader { src, len: src.len(), window: Cow::Borrowed(&[]), window_start: 0, pos: 0, path };
        if r.take(4, "magic")? != MAGIC {
            return Err(ModelError::Gguf { path: path.into(), message: "not a GGUF file (the first 4 bytes are not 'GGUF')".into() });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::Gguf { path: path.into(), message: format!("GGUF version {version} is not supported (2 or 3)") });
        }
        let n_tensors = r.count("tensor count", 24)?;
        let n_kv = r.count("metadata count", 12)?;
        let mut metadata = Vec::with_capacity(n_kv);
        let mut meta_index = HashMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32(&key)?;
            let v = r.value(ty, &key, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(ModelError::Gguf { path: path.into(), message: format!("metadata key {key} appears twice") });
            }
            metadata.push((key, v));
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::new();
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32(&name)? as usize;
            if n_dims > 4 {
                return Err(ModelError::Gguf { path: path.into(), message: format!("tensor {name}: {n_dims} dimensions (at most 4)") });
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(r.u64(&name)?);
            }
            let ggml_type = r.u32(&name)?;
            let offset = r.u64(&name)?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(ModelError::Gguf { path: path.into(), message: format!("tensor {name} appears twice in the tensor index") });
            }
            tensors.push(GgufTensorInfo { name, dims, ggml_type, offset });
        }
        Ok((version, metadata, meta_index, tensors, tensor_index, r.pos))
    }

    /// The data section's start (after the header, aligned), and every tensor's bytes inside the file.
    fn locate_data(&mut self, header_end: u64, len: u64) -> Result<()> {
        let path_buf = self.path.clone();
        let path = path_buf.as_path();
        let file = &mut *self;
        let alignment = match file.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| ModelError::Gguf {
                path: path.into(),
                message: format!("general.alignment {v:?} is not a power of two"),
            })?,
        };
        let data_start = header_end.div_ceil(alignment) * alignment;
        file.data_start = data_start;
        // Every tensor must lie inside the file, aligned: a truncated download fails here, up front.
        for t in &file.tensors {
            let elements = t.checked_elements().ok_or_else(|| ModelError::Gguf {
                path: path.into(),
                message: format!("tensor {}: dims {:?} multiply beyond 64 bits: corrupt", t.name, t.dims),
            })?;
            let bytes_needed = match t.dtype() {
                Ok(d) => {
                    let inner = t.dims.first().copied().unwrap_or(1);
                    if let HostDType::Quant(q) = d {
                        let bv = q.block_values() as u64;
                        if inner % bv != 0 {
                            return Err(ModelError::Gguf { path: path.into(), message: format!("tensor {}: {} rows of {inner} values are not whole blocks of {bv}", t.name, d.name()) });
                        }
                    }
                    match d {
                        HostDType::Quant(q) => Some(elements / q.block_values() as u64 * q.block_bytes() as u64),
                        HostDType::F32 => elements.checked_mul(4),
                        HostDType::F16 | HostDType::BF16 => elements.checked_mul(2),
                    }
                }
                Err(_) => Some(0), // size unknown to us; reported by name if the tensor is used
            };
            let end = bytes_needed.and_then(|b| data_start.checked_add(t.offset)?.checked_add(b));
            if t.offset % alignment != 0 || end.is_none_or(|e| e > len) {
                return Err(ModelError::Gguf {
                    path: path.into(),
                    message: format!(
                        "tensor {}: data at offset {} ({} bytes) lies outside the file ({len} bytes) or is misaligned: truncated or corrupt",
                        t.name,
                        t.offset,
                        bytes_needed.map(|b| b.to_string()).unwrap_or_else(|| "more than 2^64".into())
                    ),
                });
            }
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn wrong_type(&self, key: &str, want: &str) -> ModelError {
        let found = self.get(key).map(|v| v.type_name()).unwrap_or("nothing");
        ModelError::Gguf { path: self.path.clone(), message: format!("metadata {key}: expected {want}, found {found}") }
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::Gguf { path: self.path.clone(), message: format!("metadata key {key} is missing") }
    }

    /// An integer that must be present.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get(key).ok_or_else(|| self.missing(key))?.as_u64().ok_or_else(|| self.wrong_type(key, "an integer"))
    }

    /// An optional integer (present with another type is an error).
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|v| v.as_u64().ok_or_else(|| self.wrong_type(key, "an integer"))).transpose()
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| self.wrong_type(key, "a number"))).transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|v| v.as_str().ok_or_else(|| self.wrong_type(key, "a string"))).transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.wrong_type(key, "a bool"))).transpose()
    }

    /// A string array (tokens, merges).
    pub fn str_array(&self, key: &str) -> Result<Vec<&str>> {
        let a = self.get(key).ok_or_else(|| self.missing(key))?.as_array().ok_or_else(|| self.wrong_type(key, "an array"))?;
        a.iter().map(|v| v.as_str().ok_or_else(|| self.wrong_type(key, "an array of strings"))).collect()
    }

    /// An integer array (token types).
    pub fn int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let a = v.as_array().ok_or_else(|| self.wrong_type(key, "an array"))?;
        a.iter()
            .map(|v| match *v {
                GgufValue::I32(x) => Ok(x as i64),
                GgufValue::I64(x) => Ok(x),
                _ => v.as_u64().map(|x| x as i64).ok_or_else(|| self.wrong_type(key, "an array of integers")),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's dtype and bytes (borrowed from a map, or read from the source just now); an
    /// unsupported type is an error naming it.
    pub fn tensor_data(&self, name: &str) -> Result<Option<(HostDType, Cow<'_, [u8]>)>> {
        let Some(t) = self.tensor_info(name) else { return Ok(None) };
        let dtype = t.dtype().map_err(|ty| ModelError::DType { name: name.into(), dtype: ty, path: self.path.clone() })?;
        let len = dtype.bytes_for(t.elements() as usize);
        Ok(Some((dtype, self.source.read_at(self.data_start + t.offset, len)?)))
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.source.len()
    }

    pub fn is_empty(&self) -> bool {
        self.source.is_empty()
    }
}
