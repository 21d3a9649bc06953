//! Text tokenizer and chat template for HF-format models.
//!
//! Wraps the `tokenizers` crate (the same Rust code HF's Python tokenizers run, so ids match the
//! reference exactly) and renders `tokenizer_config.json`'s Jinja chat template with minijinja,
//! configured like HF's `apply_chat_template` (trim_blocks, lstrip_blocks, Python string methods,
//! `raise_exception`).

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// One chat turn, as fed to the chat template (`role` is "system", "user", "assistant", ...).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A model's tokenizer plus the bits of `tokenizer_config.json` that generation needs.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Models like Llama expect BOS on every encode; Qwen sets this false (its template has no BOS).
    add_bos_token: bool,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("has_chat_template", &self.has_chat_template())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("add_bos_token", &self.add_bos_token)
            .finish()
    }
}

/// Fields of `tokenizer_config.json` that Domino uses; everything else is ignored.
#[derive(Default)]
struct TokenizerConfig {
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos_token: bool,
}

impl TextTokenizer {
    /// Loads `dir/tokenizer.json` (required) and `dir/tokenizer_config.json` (optional: chat_template,
    /// eos_token, bos_token, add_bos_token). Newer HF repos keep the template in
    /// `dir/chat_template.jinja` instead; it is used when the config has none.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        let tok_bytes = read_file(&tok_path)?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg_bytes = read_optional(&cfg_path)?;
        let mut tok = Self::build(&tok_bytes, &tok_path, cfg_bytes.as_deref().map(|b| (b, cfg_path.as_path())))?;
        if tok.chat_template.is_none() {
            let jinja_path = dir.join("chat_template.jinja");
            if let Some(bytes) = read_optional(&jinja_path)? {
                let src = String::from_utf8(bytes)
                    .map_err(|e| ModelError::Config { path: jinja_path, message: format!("not UTF-8: {e}") })?;
                tok.chat_template = Some(src);
            }
        }
        Ok(tok)
    }

    /// Builds from file contents already in memory (the wasm build fetches them over HTTP).
    pub fn from_parts(tokenizer_json: &[u8], tokenizer_config_json: Option<&[u8]>) -> Result<Self> {
        let cfg_path = Path::new("tokenizer_config.json");
        Self::build(tokenizer_json, Path::new("tokenizer.json"), tokenizer_config_json.map(|b| (b, cfg_path)))
    }

    /// Shared by both constructors; the paths only label error messages.
    fn build(tokenizer_json: &[u8], tok_path: &Path, config: Option<(&[u8], &Path)>) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| ModelError::Json { path: tok_path.to_path_buf(), message: e.to_string() })?;
        let cfg = match config {
            Some((bytes, path)) => parse_config(bytes, path)?,
            None => TokenizerConfig::default(),
        };
        Ok(Self {
            inner,
            chat_template: cfg.chat_template,
            bos_token: cfg.bos_token,
            eos_token: cfg.eos_token,
            add_bos_token: cfg.add_bos_token,
        })
    }

    /// Text to token ids. Special-token text such as `<|im_start|>` still maps to its single id; the
    /// post-processor's BOS/EOS are added only when the config's `add_bos_token` asks for them.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, self.add_bos_token)
            .map_err(|e| ModelError::Tokenizer(format!("encode failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids to text, keeping special tokens so the caller sees exactly what the model produced.
    /// Ids the tokenizer does not know (the padding rows of a vocabulary larger than the tokenizer,
    /// as in Qwen3's 151936 vs 151669) decode to nothing, as in Hugging Face tokenizers; callers
    /// that need to reject them check `token_to_id`/`vocab_size` themselves.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let known: Vec<u32> = ids.iter().copied().filter(|&id| self.inner.id_to_token(id).is_some()).collect();
        self.inner.decode(&known, false).map_err(|e| ModelError::Tokenizer(format!("decode failed: {e}")))
    }

    /// Number of tokens including added/special tokens (can be below the model's padded embedding rows).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The vocabulary size when ids follow BPE merge ranks (a BPE vocabulary: frequent tokens
    /// first), else None.
    pub fn ranked_vocab(&self) -> Option<usize> {
        matches!(self.inner.get_model(), tokenizers::ModelWrapper::BPE(_)).then(|| self.vocab_size())
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders the chat template as HF's `apply_chat_template(..., tokenize=False)` would: variables
    /// `messages`, `add_generation_prompt`, `enable_thinking`, `bos_token`, `eos_token`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::ChatTemplate("this model's tokenizer_config.json has no chat_template".into()))?;
        render_chat_template(
            source,
            messages,
            add_generation_prompt,
            enable_thinking,
            self.bos_token.as_deref().unwrap_or(""),
            self.eos_token.as_deref().unwrap_or(""),
        )
    }

    /// Id of the config's `eos_token` (the chat end marker, e.g. `<|im_end|>` for Qwen3), if any.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_to_id(t)).into_iter().collect()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Most bytes a rendered chat prompt may have (far beyond any context: 16 MiB of text is millions
/// of tokens). A template that writes more is refused instead of filling memory.
pub const MAX_CHAT_PROMPT_BYTES: usize = 16 << 20;

/// Template instructions one render may run, plus [`TEMPLATE_FUEL_PER_MESSAGE`] per message: real
/// templates (Qwen3's, with tools and thinking) use a few hundred per message; a looping template
/// runs out and is refused instead of hanging.
pub const TEMPLATE_FUEL: u64 = 200_000;
pub const TEMPLATE_FUEL_PER_MESSAGE: u64 = 20_000;

/// Renders a chat template (Jinja source, as in `tokenizer_config.json` or GGUF
/// `tokenizer.chat_template`) with HF's variables. Hostile templates get errors, not hangs or huge
/// allocations: rendering stops after [`TEMPLATE_FUEL`] instructions, at [`MAX_CHAT_PROMPT_BYTES`] of
/// output, or 64 levels of recursion.
pub fn render_chat_template(
    source: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    enable_thinking: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = template_env();
    // Real templates nest a few levels; a self-recursive macro stops here, well before the stack of
    // a 2 MiB thread (minijinja's own default is 500 levels).
    env.set_recursion_limit(64);
    env.set_fuel(Some(TEMPLATE_FUEL.saturating_add(TEMPLATE_FUEL_PER_MESSAGE.saturating_mul(messages.len() as u64))));
    let template = env.template_from_str(source).map_err(|e| ModelError::ChatTemplate(format!("cannot parse: {e}")))?;
    let ctx = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        enable_thinking => enable_thinking,
        bos_token => bos_token,
        eos_token => eos_token,
    };
    let mut out = CappedWriter { bytes: Vec::new(), limit: MAX_CHAT_PROMPT_BYTES };
    match template.render_captured_to(ctx, &mut out) {
        Ok(_) => {}
        Err(_) if out.bytes.len() > out.limit => {
            return Err(ModelError::ChatTemplate(format!("the rendered prompt exceeds {} MiB", MAX_CHAT_PROMPT_BYTES >> 20)))
        }
        Err(e) => return Err(ModelError::ChatTemplate(format!("cannot render: {}", one_line(&e)))),
    }
    String::from_utf8(out.bytes).map_err(|_| ModelError::ChatTemplate("the rendered prompt is not UTF-8".into()))
}

/// minijinja's error with its cause chain on one line (its Display has no newlines, but a template's
/// own `raise_exception` message may).
fn one_line(e: &minijinja::Error) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An `io::Write` into memory that fails once more than `limit` bytes arrive.
struct CappedWriter {
    bytes: Vec<u8>,
    limit: usize,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.bytes.resize(self.limit + 1, 0);
            return Err(std::io::Error::other("rendered prompt too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A minijinja environment that behaves like the Jinja2 setup in HF transformers.
fn template_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // Templates call this to reject unsupported inputs (e.g. bad role order); surface it as an error.
    env.add_function("raise_exception", |msg: String| -> std::result::Result<minijinja::Value, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env
}

/// Reads the fields we use, accepting both shapes HF has used for each of them.
fn parse_config(bytes: &[u8], path: &Path) -> Result<TokenizerConfig> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ModelError::Json { path: path.to_path_buf(), message: e.to_string() })?;
    let bad = |message: String| ModelError::Config { path: path.to_path_buf(), message };
    let obj = value.as_object().ok_or_else(|| bad("expected a JSON object".into()))?;

    // "eos_token": "<|im_end|>"  or  "eos_token": {"content": "<|im_end|>", ...}  or null.
    let special = |key: &str| -> Result<Option<String>> {
        match obj.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => match v.get("content").and_then(|c| c.as_str()) {
                Some(s) => Ok(Some(s.to_owned())),
                None => Err(bad(format!("{key}: expected a string or an object with \"content\""))),
            },
        }
    };

    // "chat_template": "..."  or a list of {"name", "template"} where "default" is the chat one.
    let chat_template = match obj.get("chat_template") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(list)) => {
            let named = |name: &str| {
                list.iter().find(|t| t.get("name").and_then(|n| n.as_str()) == Some(name))
            };
            let entry = named("default").or_else(|| list.first());
            match entry.and_then(|t| t.get("template")).and_then(|t| t.as_str()) {
                Some(s) => Some(s.to_owned()),
                None => return Err(bad("chat_template: list entries need a \"template\" string".into())),
            }
        }
        Some(_) => return Err(bad("chat_template: expected a string or a list of templates".into())),
    };

    let add_bos_token = match obj.get("add_bos_token") {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(_) => return Err(bad("add_bos_token: expected true or false".into())),
    };

    Ok(TokenizerConfig {
        chat_template,
        bos_token: special("bos_token")?,
        eos_token: special("eos_token")?,
        add_bos_token,
    })
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    read_optional(path)?.ok_or_else(|| ModelError::Missing { path: path.to_path_buf() })
}

/// `Ok(None)` when the file does not exist; other IO failures are errors.
fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModelError::Io { path: PathBuf::from(path), source }),
    }
}

/// Turns generated ids into text pieces as they arrive.
///
/// One character can span several byte-level tokens (CJK, emoji), and SentencePiece-style decoders
/// change a token's text depending on what precedes it, so a token cannot be decoded alone. Like
/// HF's `TextStreamer`/TGI, this decodes a short window of recent ids both with and without the new
/// one and emits the difference, holding it back while it ends in an incomplete character (U+FFFD).
/// Each push costs O(window), not O(all ids so far).
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the context window: ids before it are fully emitted and no longer affect the output.
    prefix_offset: usize,
    /// Ids before this have been emitted as text.
    read_offset: usize,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one id; returns the text it completes (often empty for a partial character).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.pending(tok)?;
        match text {
            Some(t) if !t.ends_with('\u{FFFD}') => {
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                Ok(t)
            }
            _ => Ok(String::new()),
        }
    }

    /// Emits whatever is still held back (e.g. generation stopped mid-character), as `decode` would.
    pub fn finish(&mut self, tok: &TextTokenizer) -> Result<String> {
        let text = self.pending(tok)?.unwrap_or_default();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(text)
    }

    /// Text of the ids after `read_offset`, decoded in context; `None` if there is none yet.
    fn pending(&self, tok: &TextTokenizer) -> Result<Option<String>> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let before = tok.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let after = tok.decode(&self.ids[self.prefix_offset..])?;
        Ok(match after.strip_prefix(before.as_str()) {
            Some(new) if !new.is_empty() => Some(new.to_owned()),
            Some(_) => None,
            // The window's text changed in context (rare decoder cleanups): decode everything
            // unemitted with full context instead.
            None => {
                let all = tok.decode(&self.ids)?;
                let done = tok.decode(&self.ids[..self.read_offset])?;
                all.strip_prefix(done.as_str()).filter(|s| !s.is_empty()).map(str::to_owned)
            }
        })
    }
}
