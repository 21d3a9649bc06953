//! The adaptive draft length's round costs, calibrated once per (model, drafter, adapter, kernel
//! variant) and cached on disk as `<cache dir>/calibration/<hash>.json`, so later runs start with them
//! (and a seed reproduces its sampled output across runs). The same file keeps the drafter's
//! acceptance counts over earlier greedy runs (the drafter's, and prompt lookup's copies per match
//! length), the prior a run's schedule starts from.

use crate::model_dir::cache_dir;
use crate::CliError;
use domino_engine::Gpu;
use domino_models::drafter_gpu::DrafterModel;
use domino_runtime::{AcceptanceCounts, RoundCosts, SpeculativeSession};
use serde::{Deserialize, Serialize};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// What the costs depend on; stored beside them so a file can be checked by eye.
#[derive(Debug, Clone, PartialEq, Hash, Serialize, Deserialize)]
pub struct CalibrationKey {
    pub model: String,
    pub drafter: String,
    /// Sizes and modification times of the model's and the drafter's files: a drafter retrained
    /// into the same folder (or a model replaced at the same path) must not inherit the old
    /// one's acceptance history or costs.
    #[serde(default)]
    pub files: String,
    pub block_size: usize,
    /// Token ids a draft may be (`--draft-vocab`): the draft's lm_head cost follows it.
    #[serde(default)]
    pub draft_vocab: usize,
    pub use_head: bool,
    pub dtype: String,
    pub adapter: String,
    pub backend: String,
    pub driver: String,
    /// The kernel variant in use (`Caps` printed), which the costs depend on as much as the adapter.
    pub caps: String,
    pub domino_version: String,
}

impl CalibrationKey {
    pub fn new(gpu: &Gpu, model: &Path, drafter_dir: &Path, drafter: &DrafterModel, use_head: bool, dtype: &str) -> Self {
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string();
        Self {
            model: canonical(model),
            drafter: canonical(drafter_dir),
            files: format!("{}; {}", fingerprint(model), fingerprint(drafter_dir)),
            block_size: drafter.config.block_size,
            draft_vocab: drafter.draft_vocab(),
            use_head,
            dtype: dtype.to_string(),
            adapter: gpu.info.name.clone(),
            backend: gpu.info.backend.clone(),
            driver: format!("{} {}", gpu.info.driver, gpu.info.driver_info),
            caps: caps_key(&gpu.caps),
            domino_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    pub fn path(&self) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        cache_dir().join("calibration").join(format!("{:016x}.json", h.finish()))
    }
}

/// `name:bytes:mtime` of a file, or of each file directly inside a folder (sorted by name). Cheap
/// (no file is read) and changed by any rewrite of the weights.
fn fingerprint(path: &Path) -> String {
    let stamp = |p: &Path, m: &std::fs::Metadata| {
        let mtime = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
        format!("{}:{}:{mtime}", p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()), m.len())
    };
    let Ok(meta) = std::fs::metadata(path) else { return String::new() };
    if !meta.is_dir() {
        return stamp(path, &meta);
    }
    let mut files: Vec<String> = std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok().filter(|m| m.is_file()).map(|m| stamp(&e.path(), &m)))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.join(",")
}

/// The kernel variant as the key records it: the caps without the memory budget, which follows the
/// machine's free memory from run to run (keying on it recalibrated every run).
fn caps_key(caps: &domino_engine::Caps) -> String {
    format!("{:?}", domino_engine::Caps { memory_budget: None, ..*caps })
}

#[derive(Serialize, Deserialize)]
struct CalibrationFile {
    key: CalibrationKey,
    costs: RoundCosts,
    /// Acceptance counts of earlier greedy runs (absent until a run saves them).
    #[serde(default)]
    acceptance: Option<AcceptanceCounts>,
    /// Acceptance counts of earlier greedy copy rounds (`--lookup`), per match length.
    #[serde(default)]
    lookup_acceptance: Option<Vec<AcceptanceCounts>>,
}

fn read_file(key: &CalibrationKey) -> Option<CalibrationFile> {
    let bytes = std::fs::read(key.path()).ok()?;
    serde_json::from_slice::<CalibrationFile>(&bytes).ok().filter(|f| &f.key == key)
}

/// Write then rename, so a concurrent run never reads half a file. A cache that cannot be written
/// only costs the next run a calibration (or its prior).
fn write_file(path: &Path, file: &CalibrationFile) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(json) = serde_json::to_vec_pretty(file) {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, json).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

/// Give `session` the acceptance counts cached for `key` (from earlier greedy runs), if any.
pub fn load_acceptance(session: &mut SpeculativeSession, key: &CalibrationKey) {
    let Some(file) = read_file(key) else { return };
    if let Some(counts) = file.acceptance {
        session.set_acceptance_history(key.use_head, counts);
    }
    if let Some(counts) = file.lookup_acceptance {
        session.set_lookup_history(counts);
    }
}

/// Cache the session's acceptance counts for `key` beside its costs (nothing without a calibration).
pub fn save_acceptance(session: &SpeculativeSession, key: &CalibrationKey) {
    if let Some(mut file) = read_file(key) {
        file.acceptance = Some(session.acceptance_history(key.use_head).clone());
        file.lookup_acceptance = Some(session.lookup_history().to_vec());
        write_file(&key.path(), &file);
    }
}

/// The cached costs for `key`, or a fresh calibration of `session` (written to the cache; a cache
/// that cannot be written only costs the next run a calibration).
pub fn round_costs(session: &mut SpeculativeSession, key: &CalibrationKey, quiet: bool) -> Result<RoundCosts, CliError> {
    let path = key.path();
    // A table from before lookup rounds were timed (no verify-only times) is calibrated again.
    if let Some(file) = read_file(key).filter(|f| f.costs.is_complete(session.max_draft_len())) {
        return Ok(file.costs);
    }
    if !quiet {
        eprintln!("calibrating draft lengths on {} (once per model, drafter and adapter; cached in {})", key.adapter, path.display());
    }
    let costs = pollster::block_on(session.calibrate(domino_runtime::speculative::CALIBRATION_REPS, key.use_head))?;
    write_file(&path, &CalibrationFile { key: key.clone(), costs: costs.clone(), acceptance: None, lookup_acceptance: None });
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_ignores_free_memory_but_not_the_kernel_variant() {
        let caps = domino_engine::Caps {
            gpu_kernels: false,
            cpu: true,
            f16: true,
            subgroup: true,
            prefer_packed_f16: true,
            weight_textures: true,
            max_texture_dim: 16384,
            max_storage_binding: 1 << 27,
            max_buffer: 1 << 31,
            uniform_align: 32,
            uniform_window: 65536,
            memory_budget: Some(23_971_332_096),
        };
        let less_free = domino_engine::Caps { memory_budget: Some(23_811_682_304), ..caps };
        assert_eq!(caps_key(&caps), caps_key(&less_free));
        assert_ne!(caps_key(&caps), caps_key(&domino_engine::Caps { gpu_kernels: true, ..caps }));
    }

    #[test]
    fn rewriting_a_drafter_in_place_changes_its_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        std::fs::write(dir.path().join("model.safetensors"), [0u8; 8]).unwrap();
        let before = fingerprint(dir.path());
        assert_eq!(before, fingerprint(dir.path()), "the same files give the same fingerprint");
        assert!(before.contains("config.json:2:") && before.contains("model.safetensors:8:"), "{before}");
        std::fs::write(dir.path().join("model.safetensors"), [0u8; 16]).unwrap();
        assert_ne!(before, fingerprint(dir.path()), "retrained weights must not reuse the old calibration");
        let file = dir.path().join("model.safetensors");
        assert!(fingerprint(&file).starts_with("model.safetensors:16:"));
        assert_eq!(fingerprint(&dir.path().join("missing")), "");
    }
}
