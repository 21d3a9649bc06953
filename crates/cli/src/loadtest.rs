//! `domino loadtest`: N concurrent clients send R chat requests in all to a running `domino serve`
//! (or any OpenAI-compatible server) and report throughput, time to first token and latency
//! percentiles, errors (an error status) and lost requests (no complete answer: a dropped
//! connection, a stream without `[DONE]`).

use crate::CliError;
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct LoadtestArgs {
    /// The server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Requests in all (spread over the clients).
    #[arg(long, default_value_t = 32)]
    pub requests: usize,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Stream the answers (Server-Sent Events); time to first token is then the first content.
    #[arg(long)]
    pub stream: bool,
    /// The user message; request i appends " (i)" so answers differ.
    #[arg(long, default_value = "Write a short story about a lighthouse keeper.")]
    pub prompt: String,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long)]
    pub api_key: Option<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone)]
enum Outcome {
    /// `prompt` tokens, `cached` of them from the server's prefix cache (as its usage reports).
    Ok { latency: f64, ttft: f64, tokens: usize, prompt: usize, cached: usize },
    Error(String),
    Lost(String),
}

pub fn run(a: LoadtestArgs) -> Result<(), CliError> {
    if a.clients == 0 || a.requests == 0 {
        return Err(CliError::Usage("--clients and --requests must be at least 1".into()));
    }
    let url = format!("{}/v1/chat/completions", a.url.trim_end_matches('/'));
    let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).timeout_read(Duration::from_secs(600)).build();
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..a.clients {
            let (next, outcomes, agent, url, a) = (next.clone(), outcomes.clone(), agent.clone(), url.clone(), &a);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= a.requests {
                    break;
                }
                let outcome = one_request(&agent, &url, a, i);
                if let Ok(mut o) = outcomes.lock() {
                    o.push(outcome);
                }
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    let outcomes = outcomes.lock().map(|o| o.clone()).unwrap_or_default();
    let report = summarize(&a, &outcomes, wall);
    if a.json {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

fn one_request(agent: &ureq::Agent, url: &str, a: &LoadtestArgs, i: usize) -> Outcome {
    let body = json!({
        "model": "domino",
        "messages": [{"role": "user", "content": format!("{} ({i})", a.prompt)}],
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "stream": a.stream,
        "stream_options": if a.stream { json!({"include_usage": true}) } else { Value::Null },
    });
    let mut req = agent.post(url).set("content-type", "application/json");
    if let Some(k) = &a.api_key {
        req = req.set("authorization", &format!("Bearer {k}"));
    }
    let t0 = Instant::now();
    let resp = match req.send_string(&body.to_string()) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => return Outcome::Error(format!("HTTP {code}: {}", r.into_string().unwrap_or_default())),
        Err(e) => return Outcome::Lost(e.to_string()),
    };
    if !a.stream {
        return match resp.into_json::<Value>() {
            Ok(v) => {
                let latency = t0.elapsed().as_secs_f64();
                let tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize;
                let (prompt, cached) = prompt_usage(&v["usage"]);
                Outcome::Ok { latency, ttft: latency, tokens, prompt, cached }
            }
            Err(e) => Outcome::Lost(format!("unreadable answer: {e}")),
        };
    }
    let mut ttft = None;
    let mut tokens = 0;
    let (mut prompt, mut cached) = (0, 0);
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => return Outcome::Lost(format!("stream broke: {e}")),
        };
        let Some(data) = line.strip_prefix("data: ").or_else(|| line.strip_prefix("data:")) else { continue };
        if data.trim() == "[DONE]" {
            let latency = t0.elapsed().as_secs_f64();
            return Outcome::Ok { latency, ttft: ttft.unwrap_or(latency), tokens, prompt, cached };
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else { return Outcome::Lost(format!("bad event: {data}")) };
        if v.get("error").is_some() {
            return Outcome::Error(v["error"]["message"].as_str().unwrap_or("error event").to_string());
        }
        if ttft.is_none() && v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            ttft = Some(t0.elapsed().as_secs_f64());
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = n as usize;
            (prompt, cached) = prompt_usage(&v["usage"]);
        }
    }
    Outcome::Lost("the stream ended without [DONE]".into())
}

/// Prompt tokens and the cached ones (`prompt_tokens_details.cached_tokens`, 0 when absent).
fn prompt_usage(usage: &Value) -> (usize, usize) {
    let n = |v: &Value| v.as_u64().unwrap_or(0) as usize;
    (n(&usage["prompt_tokens"]), n(&usage["prompt_tokens_details"]["cached_tokens"]))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summarize(a: &LoadtestArgs, outcomes: &[Outcome], wall: f64) -> Value {
    let mut lat = Vec::new();
    let mut ttft = Vec::new();
    let mut tokens = 0;
    let (mut prompt_tokens, mut cached_tokens) = (0, 0);
    let mut errors = Vec::new();
    let mut lost = Vec::new();
    for o in outcomes {
        match o {
            Outcome::Ok { latency, ttft: t, tokens: n, prompt, cached } => {
                lat.push(*latency);
                ttft.push(*t);
                tokens += n;
                prompt_tokens += prompt;
                cached_tokens += cached;
            }
            Outcome::Error(e) => errors.push(e.clone()),
            Outcome::Lost(e) => lost.push(e.clone()),
        }
    }
    lat.sort_by(f64::total_cmp);
    ttft.sort_by(f64::total_cmp);
    let pct = |v: &[f64]| json!({"p50": percentile(v, 50.0), "p90": percentile(v, 90.0), "p99": percentile(v, 99.0)});
    json!({
        "clients": a.clients,
        "requests": a.requests,
        "stream": a.stream,
        "max_tokens": a.max_tokens,
        "completed": lat.len(),
        "errors": errors.len(),
        "lost": lost.len() + a.requests.saturating_sub(outcomes.len()),
        "wall_seconds": wall,
        "requests_per_s": lat.len() as f64 / wall.max(1e-9),
        "output_tokens": tokens,
        "output_tokens_per_s": tokens as f64 / wall.max(1e-9),
        "prompt_tokens": prompt_tokens,
        "cached_prompt_tokens": cached_tokens,
        "time_to_first_token_s": pct(&ttft),
        "latency_s": pct(&lat),
        "first_errors": errors.iter().chain(lost.iter()).take(3).collect::<Vec<_>>(),
    })
}

fn print_table(r: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    println!("clients {}  requests {}  stream {}  max_tokens {}", r["clients"], r["requests"], r["stream"], r["max_tokens"]);
    println!("completed {}  errors {}  lost {}  in {:.1} s", r["completed"], r["errors"], r["lost"], f(&r["wall_seconds"]));
    println!("requests/s {:.2}  output tok/s {:.1}  ({} tokens)", f(&r["requests_per_s"]), f(&r["output_tokens_per_s"]), r["output_tokens"]);
    println!("prompt tokens {}  ({} from the server's prefix cache)", r["prompt_tokens"], r["cached_prompt_tokens"]);
    for (name, key) in [("time to first token", "time_to_first_token_s"), ("latency", "latency_s")] {
        let p = &r[key];
        println!("{name:>20}: p50 {:.3} s  p90 {:.3} s  p99 {:.3} s", f(&p["p50"]), f(&p["p90"]), f(&p["p99"]));
    }
    if let Some(e) = r["first_errors"].as_array().filter(|e| !e.is_empty()) {
        for e in e {
            println!("failed request: {}", e.as_str().unwrap_or_default());
        }
    }
}
