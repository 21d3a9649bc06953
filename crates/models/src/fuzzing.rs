//! Invariant checks on hostile inputs, shared by the fuzz targets (`fuzz/`, cargo-fuzz) and the
//! regression tests (`tests/fuzz_regressions.rs`, which replay every committed seed and every input
//! that once crashed). Each function takes arbitrary bytes, runs one loader on them and panics only
//! when an invariant breaks; a clean error is a pass. The invariants go beyond "no panic":
//! - a GGUF / safetensors file that parses yields tensors whose byte ranges lie inside the file and
//!   whose shapes multiply (and scale to bytes) without overflow, with data of exactly that length;
//! - a config that parses has sizes whose weight shapes multiply without overflow, and so does a
//!   drafter accepted against a target;
//! - a shard index only names plain files in the checkpoint folder;
//! - a tokenizer that builds encodes to ids inside its vocabulary;
//! - a chat template renders within the fuel and output limits, or fails with an error;
//! - a lookup n-gram table that loads proposes only tokens inside its vocabulary, never more than
//!   asked for, and writes back to a file that loads as the same table.
//!
//! See docs/fuzzing.md.

use crate::checkpoint::{shard_names, Checkpoint, WeightSource};
use crate::config::Qwen3Config;
use crate::drafter::{drafter_tensor_plan, DrafterConfig};
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::gguf_model::{config_from_gguf, GgufWeights};
use crate::gguf_tokenizer::tokenizer_from_gguf;
use crate::ngram_table::{NgramTable, CONFIDENCE_CLASSES, MAX_CONTEXT, MIN_CONTEXT};
use crate::tokenizer::{render_chat_template, ChatMessage, MAX_CHAT_PROMPT_BYTES};
use std::path::Path;

/// The fuzz targets, by name (the `fuzz/fuzz_targets/*.rs` files, the seed and regression folders).
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("shard_index", shard_index),
    ("target_config", target_config),
    ("drafter_config", drafter_config),
    ("gguf_tokenizer", gguf_tokenizer),
    ("chat_template", chat_template),
    ("lookup_table", lookup_table),
];

fn product(shape: impl IntoIterator<Item = u64>) -> Option<u64> {
    shape.into_iter().try_fold(1u64, |a, d| a.checked_mul(d))
}

/// Every element count and byte size of a tensor plan fits in u64 (and usize).
fn assert_plan_fits(plan: &[(String, Vec<usize>)]) {
    for (name, shape) in plan {
        let n = product(shape.iter().map(|&d| d as u64));
        assert!(n.and_then(|n| n.checked_mul(4)).is_some_and(|b| usize::try_from(b).is_ok()), "tensor {name} {shape:?}: size overflows");
    }
}

/// Sizes of an accepted target config: its tensor plan multiplies without overflow.
fn assert_target_sizes(c: &Qwen3Config) {
    assert_plan_fits(&c.tensor_plan());
}

/// GGUF: header, metadata, tensor index; then the config, the weights under HF names and the
/// tokenizer, as `open_model` would build them.
pub fn gguf(bytes: &[u8]) {
    let Ok(g) = GgufFile::from_bytes(Path::new("fuzz.gguf"), bytes.to_vec()) else { return };
    let mut names = std::collections::HashSet::new();
    for t in &g.tensors {
        assert!(names.insert(t.name.as_str()), "duplicate tensor name {} accepted", t.name);
        let elements = product(t.dims.iter().copied()).unwrap_or_else(|| panic!("tensor {}: dims {:?} overflow", t.name, t.dims));
        let Ok(dtype) = t.dtype() else { continue };
        let (d, data) = g.tensor_data(&t.name).expect("a parsed tensor's data").expect("a listed tensor");
        assert_eq!(d, dtype);
        let expected = match dtype {
            domino_engine::HostDType::Quant(q) => Some(elements / q.block_values() as u64 * q.block_bytes() as u64),
            domino_engine::HostDType::F32 => elements.checked_mul(4),
            _ => elements.checked_mul(2),
        };
        let expected = expected.unwrap_or_else(|| panic!("tensor {}: byte size overflows", t.name));
        assert_eq!(data.len() as u64, expected, "tensor {}: data length", t.name);
        assert!(usize::try_from(elements).is_ok());
    }
    let Ok(config) = config_from_gguf(&g) else { return };
    assert_target_sizes(&config);
    let has_tokens = g.get("tokenizer.ggml.tokens").is_some();
    let weights = GgufWeights::new(g, &config);
    for name in weights.names() {
        let Ok(Some((shape, len))) = weights.tensor_shape(&name) else { continue };
        assert!(product(shape.iter().map(|&d| d as u64)).is_some());
        if let Ok(Some(t)) = weights.tensor(&name) {
            assert_eq!(t.data.len() as u64, len, "tensor {name}: data length");
            assert_eq!(t.shape, shape.as_slice());
        }
    }
    if has_tokens {
        if let Ok(tok) = tokenizer_from_gguf(&weights.file) {
            check_tokenizer(&tok);
        }
    }
}

/// One safetensors file: every tensor's data has exactly its shape's byte length, inside the file.
pub fn safetensors(bytes: &[u8]) {
    let Ok(ckpt) = Checkpoint::from_bytes(vec![("fuzz.safetensors".into(), bytes.to_vec())]) else { return };
    for name in ckpt.names() {
        match ckpt.tensor(&name) {
            Ok(Some(t)) => {
                let n = product(t.shape.iter().map(|&d| d as u64)).unwrap_or_else(|| panic!("tensor {name}: shape {:?} overflows", t.shape));
                let per = match t.dtype {
                    domino_engine::HostDType::F32 => 4,
                    _ => 2,
                };
                assert_eq!(t.data.len() as u64, n * per, "tensor {name}: data length");
                let (shape, len) = ckpt.tensor_shape(&name).expect("shape").expect("listed");
                assert_eq!((shape.as_slice(), len), (t.shape, t.data.len() as u64));
            }
            Ok(None) => panic!("tensor {name} is listed but not found"),
            Err(ModelError::DType { .. }) => {}
            Err(e) => panic!("tensor {name}: unexpected error {e}"),
        }
    }
}

/// model.safetensors.index.json: only plain file names come back.
pub fn shard_index(bytes: &[u8]) {
    let Ok(names) = shard_names(bytes, Path::new("model.safetensors.index.json")) else { return };
    assert!(!names.is_empty());
    for n in &names {
        let p = Path::new(n);
        assert!(p.components().count() == 1 && p.file_name().is_some_and(|f| f == n.as_str()), "shard name {n:?} is a path");
    }
}

/// A target's config.json.
pub fn target_config(bytes: &[u8]) {
    if let Ok(c) = Qwen3Config::from_json(bytes, Path::new("config.json")) {
        assert_target_sizes(&c);
    }
}

/// Targets drafters are checked against: a tiny model and SmolLM2-135M's shape.
fn drafter_targets() -> [Qwen3Config; 2] {
    let tiny = Qwen3Config {
        hidden_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        intermediate_size: 128,
        vocab_size: 384,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        max_position_embeddings: 2048,
        tie_word_embeddings: false,
        eos_token_ids: vec![258],
        qk_norm: true,
    };
    let smollm2 = Qwen3Config {
        hidden_size: 576,
        num_layers: 30,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        intermediate_size: 1536,
        vocab_size: 49152,
        rms_norm_eps: 1e-5,
        rope_theta: 1e5,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        eos_token_ids: vec![2],
        qk_norm: false,
    };
    [tiny, smollm2]
}

/// A drafter's config.json, alone and against two targets; an accepted pairing has a tensor plan
/// whose shapes multiply without overflow.
pub fn drafter_config(bytes: &[u8]) {
    let Ok(cfg) = DrafterConfig::from_json(bytes, Path::new("config.json")) else { return };
    let _ = cfg.drafts_per_block();
    for target in drafter_targets() {
        if cfg.validate_against(&target).is_ok() {
            assert_plan_fits(&drafter_tensor_plan(&cfg, &target));
        }
    }
}

/// The tokenizer from GGUF metadata (the input is a GGUF file; tensors are not needed).
pub fn gguf_tokenizer(bytes: &[u8]) {
    let Ok(g) = GgufFile::from_bytes(Path::new("fuzz.gguf"), bytes.to_vec()) else { return };
    if let Ok(tok) = tokenizer_from_gguf(&g) {
        check_tokenizer(&tok);
    }
}

fn check_tokenizer(tok: &crate::tokenizer::TextTokenizer) {
    let vocab = tok.vocab_size();
    for text in ["Hello, world! 123", "<|im_start|>user\nhi<|im_end|>", "naïve 日本語 🙂\n\n  x"] {
        if let Ok(ids) = tok.encode(text) {
            assert!(ids.iter().all(|&id| (id as usize) < vocab || tok.decode(&[id]).is_ok()), "id outside the vocabulary");
            let _ = tok.decode(&ids);
        }
    }
    if tok.has_chat_template() {
        let _ = tok.apply_chat_template(&messages(), true, false);
    }
}

fn messages() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi <|im_end|> {{ 1 }}"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Again?"),
    ]
}

/// A chat template (the input is the Jinja source): it renders within the limits or errs.
pub fn chat_template(bytes: &[u8]) {
    let source = String::from_utf8_lossy(bytes);
    if let Ok(out) = render_chat_template(&source, &messages(), true, false, "<s>", "</s>") {
        assert!(out.len() <= MAX_CHAT_PROMPT_BYTES, "rendered {} bytes", out.len());
    }
}

/// A lookup n-gram table file (`ngram_table`): proposals after contexts made of its own tokens and
/// of the input's bytes stay inside the vocabulary and within the length asked for, and the table
/// round-trips through its file format.
pub fn lookup_table(bytes: &[u8]) {
    let path = Path::new("lookup-ngrams.safetensors");
    let Ok(table) = NgramTable::from_bytes(bytes, path) else { return };
    let vocab = table.vocab_size();
    let contexts: Vec<Vec<u32>> = bytes.chunks(4).take(64).map(|c| c.iter().map(|&b| b as u32 % vocab as u32).collect()).collect();
    for (i, context) in contexts.iter().enumerate() {
        let max_len = i % 9;
        if let Some(p) = table.propose(context, max_len) {
            assert!(!p.tokens.is_empty() && p.tokens.len() <= max_len, "{} tokens for max_len {max_len}", p.tokens.len());
            assert!(p.tokens.iter().all(|&t| (t as usize) < vocab), "a proposed token outside the vocabulary {vocab}");
            assert!((MIN_CONTEXT..=MAX_CONTEXT).contains(&p.context) && p.confidence < CONFIDENCE_CLASSES);
        }
    }
    let again = NgramTable::from_bytes(&table.to_bytes(), path).expect("a loaded table writes a loadable file");
    assert!(again == table, "the table changed through its file format");
}
