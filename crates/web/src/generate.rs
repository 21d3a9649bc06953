//! `generate`: the same request and the same result object as `domino generate --json`, on the same
//! runtime sessions (plain or speculative).

use crate::error::WebError;
use crate::js::{self, Options};
use crate::load::Loaded;
use domino_engine::SamplingConfig;
use domino_models::tokenizer::{ChatMessage, StreamDecoder};
use domino_runtime::{DraftLen, GenerateOptions, Session, SpeculativeOptions, SpeculativeSession};
use js_sys::Function;
use wasm_bindgen::JsValue;

/// The parsed `generate({...})` options.
pub struct Request {
    pub prompt_ids: Vec<u32>,
    pub opts: GenerateOptions,
    /// Some(use_head) for speculative decoding, None for plain decoding.
    pub speculative: Option<bool>,
    pub block_size: Option<usize>,
    /// `draftLen`: "auto" (default) or a fixed number of drafts per round.
    pub draft_len: DraftLen,
    /// `lookup`: also draft by prompt lookup (as `--lookup`, with any `draftLen`).
    pub lookup: bool,
    /// `context`: the KV cache capacity in positions (default: prompt + maxTokens).
    pub context: Option<usize>,
    pub on_token: Option<Function>,
}

impl Request {
    pub fn parse(loaded: &Loaded, obj: &JsValue) -> Result<Self, WebError> {
        let o = Options::new(obj, "generate").map_err(WebError::Usage)?;
        let u = |e| WebError::Usage(e);
        let max_tokens = o.uint("maxTokens", 1e9).map_err(u)?.unwrap_or(128) as usize;
        let temperature = o.number("temperature").map_err(u)?.unwrap_or(0.0) as f32;
        let top_p = o.number("topP").map_err(u)?.unwrap_or(1.0) as f32;
        if temperature < 0.0 || !(top_p > 0.0 && top_p <= 1.0) {
            return Err(WebError::Usage("generate: temperature must be >= 0 and topP in (0, 1]".into()));
        }
        let top_k = o.uint("topK", u32::MAX as f64).map_err(u)?.unwrap_or(0) as u32;
        let seed = o.uint("seed", 9007199254740991.0).map_err(u)?.unwrap_or(0);
        let chat = o.bool("chat").map_err(u)?.unwrap_or(false);
        let prompt_ids = match (o.string("prompt").map_err(u)?, o.ids("promptIds").map_err(u)?) {
            (Some(_), Some(_)) => return Err(WebError::Usage("generate: give prompt or promptIds, not both".into())),
            (None, Some(ids)) => ids,
            (Some(text), None) => {
                let tok = loaded
                    .tokenizer
                    .as_ref()
                    .ok_or_else(|| WebError::Usage(format!("{}: no tokenizer.json, use promptIds", loaded.model_name)))?;
                let text = if chat { tok.apply_chat_template(&[ChatMessage::new("user", text.as_str())], true, false)? } else { text };
                tok.encode(&text)?
            }
            (None, None) => return Err(WebError::Usage("generate: give prompt (text) or promptIds (token ids)".into())),
        };
        // `draft: false` decodes without the loaded drafter (the page's "plain" switch).
        let use_draft = o.bool("draft").map_err(u)?.unwrap_or(true);
        let no_head = o.bool("noHead").map_err(u)?.unwrap_or(false);
        let block_size = o.uint("blockSize", 1e6).map_err(u)?.map(|b| b as usize);
        let draft_len = match o.raw("draftLen") {
            None => DraftLen::Auto,
            Some(v) if v.as_string().as_deref() == Some("auto") => DraftLen::Auto,
            Some(_) => DraftLen::Fixed(o.uint("draftLen", 1e6).map_err(|_| WebError::Usage("generate: draftLen must be \"auto\" or a number of drafts".into()))?.unwrap_or(0) as usize),
        };
        let lookup = o.bool("lookup").map_err(u)?.unwrap_or(false);
        let speculative = match (&loaded.drafter, use_draft) {
            (Some(_), true) => Some(!no_head),
            (None, _) if block_size.is_some() || no_head || lookup => {
                return Err(WebError::Usage("generate: blockSize, noHead and lookup need a drafter (load({ model, draft }))".into()))
            }
            _ => None,
        };
        Ok(Self {
            prompt_ids,
            opts: GenerateOptions {
                max_tokens,
                sampling: SamplingConfig { temperature, top_k, top_p, seed },
                ignore_eos: o.bool("ignoreEos").map_err(u)?.unwrap_or(false),
                stop_ids: loaded.stop_ids.clone(),
            },
            speculative,
            block_size,
            draft_len,
            lookup,
            context: o.uint("context", 1e9).map_err(u)?.map(|c| (c as usize).max(1)),
            on_token: o.function("onToken").map_err(u)?,
        })
    }
}

/// Run `req` and build the `domino generate --json` object.
pub async fn generate(loaded: &mut Loaded, req: Request) -> Result<serde_json::Value, WebError> {
    let capacity = req.context.unwrap_or_else(|| (req.prompt_ids.len() + req.opts.max_tokens).min(loaded.model.config.max_position_embeddings).max(1));
    if let Some(d) = loaded.drafter.as_mut() {
        // blockSize overrides the drafter's own block size for this call (as `--block-size`).
        d.config.block_size = req.block_size.unwrap_or(loaded.drafter_block_size);
        d.config.validate_against(&loaded.model.config)?;
    }
    let Loaded { model, tokenizer, drafter, .. } = &*loaded;
    let mut stream = StreamDecoder::new();
    let mut stream_error = None;
    let mut on_token = |id: u32| -> bool {
        let Some(f) = &req.on_token else { return true };
        let text = match tokenizer {
            Some(tok) => match stream.push(tok, id) {
                Ok(t) => t,
                Err(e) => {
                    stream_error = Some(e);
                    return false;
                }
            },
            None => String::new(),
        };
        // onToken returning exactly `false` stops generation (stop_reason "cancelled").
        match f.call2(&JsValue::NULL, &JsValue::from_str(&text), &JsValue::from(id)) {
            Ok(v) => v.as_bool() != Some(false),
            Err(_) => false,
        }
    };
    let (generation, spec_stats) = match (req.speculative, drafter) {
        (Some(use_head), Some(d)) => {
            let mut session = SpeculativeSession::new(model, d, capacity)?;
            let spec = SpeculativeOptions { use_head, timing: true, draft_len: req.draft_len, costs: None, refine_costs: true, lookup: req.lookup };
            let (g, s) = session.generate(&req.prompt_ids, &req.opts, &spec, &mut on_token).await?;
            (g, Some(s))
        }
        _ => {
            let mut session = Session::new(model, capacity)?;
            session.validate(&req.prompt_ids, req.opts.max_tokens)?;
            (session.generate(&req.prompt_ids, &req.opts, &mut on_token).await?, None)
        }
    };
    if let Some(e) = stream_error {
        return Err(e.into());
    }
    // Flush the stream decoder's held-back bytes (an incomplete UTF-8 sequence at the end).
    if let (Some(f), Some(tok)) = (&req.on_token, tokenizer) {
        let rest = stream.finish(tok)?;
        if !rest.is_empty() {
            let _ = f.call2(&JsValue::NULL, &JsValue::from_str(&rest), &JsValue::UNDEFINED);
        }
    }
    let text = match tokenizer {
        Some(tok) => tok.decode(&generation.output_ids)?,
        None => String::new(),
    };
    let mut stats = serde_json::to_value(&generation.stats).unwrap_or_default();
    if let (Some(s), Some(obj)) = (&spec_stats, stats.as_object_mut()) {
        if let Ok(serde_json::Value::Object(extra)) = serde_json::to_value(s) {
            obj.extend(extra);
        }
    }
    Ok(serde_json::json!({
        "prompt_ids": generation.prompt_ids,
        "output_ids": generation.output_ids,
        "text": text,
        "stop_reason": generation.stop_reason,
        "stats": stats,
    }))
}

pub fn to_js(v: &serde_json::Value) -> Result<JsValue, WebError> {
    js::to_js(v).map_err(WebError::Usage)
}
