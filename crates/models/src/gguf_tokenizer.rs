//! The tokenizer stored in GGUF metadata (`tokenizer.ggml.*`), rebuilt as a `tokenizers::Tokenizer`.
//!
//! Supported: byte-level BPE (`tokenizer.ggml.model = gpt2`) with the pre-tokenizers llama.cpp names
//! in `tokenizer.ggml.pre`. Their split rules are llama.cpp's regexes, applied in sequence like
//! llama.cpp does (each regex splits the pieces of the previous one, unmatched text stays a piece).
//! Control tokens (type 3) and user-defined tokens (type 4) become added tokens, so special-token
//! text such as `<|im_start|>` encodes to its single id, as llama.cpp's tokenize(special=true) does.
//! The chat template (`tokenizer.chat_template`) renders with the same Jinja engine as for Qwen3.

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::TextTokenizer;
use serde_json::{json, Value};

const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regexes of a llama.cpp pre-tokenizer name, in order.
fn split_rules(pre: &str) -> Option<Vec<&'static str>> {
    Some(match pre {
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" => vec![GPT2_SPLIT],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => vec![r"\p{N}", GPT2_SPLIT],
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => vec![LLAMA3_SPLIT],
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" => vec![QWEN2_SPLIT],
        _ => return None,
    })
}

const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// Build the tokenizer (and its chat template, bos/eos, add_bos) from the file's metadata.
pub fn tokenizer_from_gguf(g: &GgufFile) -> Result<TextTokenizer> {
    let err = |message: String| ModelError::Gguf { path: g.path.clone(), message };
    let model = g.opt_str("tokenizer.ggml.model")?.ok_or_else(|| err("metadata key tokenizer.ggml.model is missing: the file has no tokenizer".into()))?;
    if model != "gpt2" {
        return Err(err(format!("tokenizer.ggml.model '{model}' is not supported (only gpt2-style byte-level BPE)")));
    }
    let pre = g.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let rules = split_rules(pre).ok_or_else(|| err(format!("tokenizer.ggml.pre '{pre}' is not supported (known: gpt2, smollm, llama-bpe, qwen2 and their aliases)")))?;
    let tokens = g.str_array("tokenizer.ggml.tokens")?;
    let merges = g.str_array("tokenizer.ggml.merges")?;
    let types = g.int_array("tokenizer.ggml.token_type")?;
    if let Some(t) = &types {
        if t.len() != tokens.len() {
            return Err(err(format!("tokenizer.ggml.token_type has {} entries for {} tokens", t.len(), tokens.len())));
        }
    }
    let token_id = |key: &str| -> Result<Option<u32>> {
        let id = g.opt_u64(key)?;
        if let Some(id) = id {
            if id as usize >= tokens.len() {
                return Err(err(format!("{key} {id} is outside the {} tokens", tokens.len())));
            }
        }
        Ok(id.map(|v| v as u32))
    };
    let bos = token_id("tokenizer.ggml.bos_token_id")?;
    let eos = token_id("tokenizer.ggml.eos_token_id")?;
    token_id("tokenizer.ggml.unknown_token_id")?;
    token_id("tokenizer.ggml.padding_token_id")?;
    let add_bos = g.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        vocab.insert(tok.to_string(), json!(id));
        let ty = types.as_ref().map(|t| t[id]).unwrap_or(1);
        if ty == TYPE_CONTROL || ty == TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == TYPE_CONTROL,
            }));
        }
    }
    let mut pretokenizers: Vec<Value> = rules
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
        .collect();
    pretokenizers.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}));
    let post_processor = match (add_bos, bos) {
        (true, Some(b)) => {
            let t = tokens[b as usize];
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {t: {"id": t, "ids": [b], "tokens": [t]}},
            })
        }
        _ => Value::Null,
    };
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretokenizers},
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    let name = |id: Option<u32>| id.map(|i| tokens[i as usize]);
    let config_json = json!({
        "chat_template": g.opt_str("tokenizer.chat_template")?,
        "bos_token": name(bos),
        "eos_token": name(eos),
        "add_bos_token": add_bos,
    });
    let bytes = |v: &Value| serde_json::to_vec(v).map_err(|e| err(format!("building the tokenizer: {e}")));
    TextTokenizer::from_parts(&bytes(&tokenizer_json)?, Some(&bytes(&config_json)?)).map_err(|e| err(format!("its tokenizer metadata does not build a tokenizer: {e}")))
}
