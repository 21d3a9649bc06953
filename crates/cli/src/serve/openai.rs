//! The OpenAI wire format: request parsing (strict about what changes the output, lenient about
//! fields real clients send and we can ignore), response objects and the error shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param }
    }

    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 404 => "invalid_request_error",
            401 => "authentication_error",
            429 => "rate_limit_error",
            503 => "service_unavailable",
            _ => "server_error",
        }
    }

    pub fn body(&self) -> Value {
        let code = match self.status.as_u16() {
            401 => json!("invalid_api_key"),
            404 => json!("not_found"),
            429 => json!("queue_full"),
            503 => json!("shutting_down"),
            _ => Value::Null,
        };
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Message content: a string or a list of parts, of which only text parts are understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// Fields both endpoints share. Unknown fields are ignored (clients send many defaults), but those
/// whose non-default values we cannot honour are refused below.
#[derive(Debug, Deserialize)]
pub struct Common {
    /// Accepted whatever it names: the server serves one model.
    #[serde(default)]
    #[allow(dead_code)]
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    /// Extension (as llama.cpp's server): keep generating past end-of-sequence tokens.
    #[serde(default)]
    pub ignore_eos: bool,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub tools: Option<Value>,
    #[serde(default)]
    pub functions: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    #[serde(flatten)]
    pub common: Common,
}

/// Parse a body as `T`; every failure (bad JSON, a field of the wrong type) is a 400 naming it.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() { "the body is not valid JSON" } else { "invalid request" };
        ApiError::bad_request(format!("{what}: {e}"), None)
    })
}

/// What generation a request asks for, checked.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: u64,
    pub ignore_eos: bool,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

impl Common {
    pub fn sampling(&self) -> Result<Sampling, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::bad_request(format!("n = {n}: only n = 1 is supported"), Some("n")));
            }
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_null()) || self.functions.as_ref().is_some_and(|t| !t.is_null()) {
            return Err(ApiError::bad_request("tools and functions are not supported", Some("tools")));
        }
        if self.logprobs.as_ref().is_some_and(|l| !(l.is_null() || *l == json!(false))) {
            return Err(ApiError::bad_request("logprobs are not supported", Some("logprobs")));
        }
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if max_tokens == Some(0) {
            return Err(ApiError::bad_request("max_tokens must be at least 1", Some("max_tokens")));
        }
        // OpenAI's defaults: temperature 1, top_p 1.
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::bad_request(format!("temperature {temperature} is outside [0, 2]"), Some("temperature")));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad_request(format!("top_p {top_p} is outside (0, 1]"), Some("top_p")));
        }
        let stops = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        if stops.len() > 4 {
            return Err(ApiError::bad_request("at most 4 stop sequences", Some("stop")));
        }
        // Without a seed every request gets its own draws.
        let seed = match self.seed {
            Some(s) => s as u64,
            None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
        };
        Ok(Sampling {
            max_tokens: max_tokens.map(|m| m as usize),
            temperature,
            top_p,
            top_k: self.top_k.unwrap_or(0),
            seed,
            ignore_eos: self.ignore_eos,
            stops,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }
}

impl Message {
    /// The text of the message (text parts joined); other part types are refused.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::bad_request(format!("content parts of type '{}' are not supported (text only)", p.kind), Some("messages")));
                    }
                    out.push_str(p.text.as_deref().unwrap_or(""));
                }
                Ok(out)
            }
        }
    }

    /// system / user / assistant (OpenAI's newer `developer` role is a system message).
    pub fn chat_role(&self) -> Result<&'static str, ApiError> {
        match self.role.as_str() {
            "system" | "developer" => Ok("system"),
            "user" => Ok("user"),
            "assistant" => Ok("assistant"),
            other => Err(ApiError::bad_request(format!("message role '{other}' is not supported (system, user, assistant)"), Some("messages"))),
        }
    }
}

/// `prompt` of /v1/completions: a string, or a list holding exactly one string.
pub fn completion_prompt(prompt: &Value) -> Result<String, ApiError> {
    match prompt {
        Value::String(s) => Ok(s.clone()),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => Ok(a[0].as_str().unwrap_or_default().to_string()),
        _ => Err(ApiError::bad_request("prompt must be a string (or a list of one string)", Some("prompt"))),
    }
}

/// OpenAI's usage object; `cached` prompt tokens came from the prefix cache (a request handed over
/// from speculative decoding counts its generated tokens as prompt there, hence the cap).
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached.min(prompt)}})
}
