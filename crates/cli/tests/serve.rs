//! `domino serve` end to end over HTTP: the OpenAI shapes (non-streamed and SSE), exact greedy
//! output equal to `domino generate --chat`, the same output alone and among 7 concurrent requests,
//! errors in OpenAI's shape (400, 401, 404, 429), a client that disconnects mid-stream freeing its
//! sequence, SIGTERM finishing a running stream and exiting 0, and the official `openai` Python
//! client (scripts/openai-client-test.py); with a drafter, speculative requests alone (and with `--lookup`,
//! copies of repeated text) whose output is unchanged.

use domino_models::testing::{write_tiny_model, TinySpec};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn backends() -> Vec<String> {
    match std::env::var("DOMINO_TEST_BACKENDS") {
        Ok(v) => v.split(',').map(str::to_string).filter(|s| !s.is_empty()).collect(),
        Err(_) => vec!["vulkan".into(), "gl".into()],
    }
}

struct Server {
    child: Child,
    url: String,
    stderr: std::sync::Mutex<std::sync::mpsc::Receiver<String>>,
}

impl Server {
    fn start(model: &Path, backend: &str, extra: &[&str]) -> Self {
        Self::start_with_env(model, backend, extra, &[])
    }

    fn start_with_env(model: &Path, backend: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut args = vec!["serve", "--model", model.to_str().unwrap(), "--port", "0", "--backend", backend, "--dtype", "f32"];
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_domino"))
            .args(&args)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start domino serve");
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).unwrap_or_else(|_| panic!("domino serve did not start ({args:?})"));
            if let Some(rest) = line.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().unwrap().to_string();
                return Self { child, url, stderr: std::sync::Mutex::new(rx) };
            }
            assert!(!line.starts_with("error"), "domino serve failed: {line}");
        }
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_with(path, body, None)
    }

    fn post_with(&self, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
        let mut req = ureq::post(&format!("{}{path}", self.url)).set("content-type", "application/json");
        if let Some(k) = key {
            req = req.set("authorization", &format!("Bearer {k}"));
        }
        match req.send_string(&body.to_string()) {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
            Err(e) => panic!("POST {path}: {e}"),
        }
    }

    fn get_text(&self, path: &str) -> (u16, String) {
        match ureq::get(&format!("{}{path}", self.url)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    /// The data lines of a streamed request, parsed (`[DONE]` as the string "[DONE]").
    fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let r = ureq::post(&format!("{}{path}", self.url)).set("content-type", "application/json").send_string(&body.to_string()).expect("stream");
        assert!(r.header("content-type").unwrap_or("").starts_with("text/event-stream"));
        sse_events(r.into_reader())
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get_text("/metrics");
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or_else(|| panic!("no metric {name} in {text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sse_events(reader: impl Read) -> Vec<Value> {
    let mut out = Vec::new();
    for line in BufReader::new(reader).lines().map_while(Result::ok) {
        if let Some(data) = line.strip_prefix("data: ") {
            out.push(if data == "[DONE]" { json!("[DONE]") } else { serde_json::from_str(data).unwrap() });
        }
    }
    out
}

/// A greedy chat request that runs to max_tokens (the tiny random models often sample an
/// end-of-sequence token early).
fn chat_body(text: &str, max_tokens: u32) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &TinySpec { embed_scale: 4.0, max_position: 256, ..TinySpec::default() }).unwrap();
    dir
}

/// `generate --chat`'s greedy answer as the API's text: without end-of-sequence tokens, and ending at
/// the first one when `stop_at_eos` (as `domino chat` and requests without `ignore_eos` do).
fn generate_chat_text(model: &Path, backend: &str, prompt: &str, max_tokens: u32, stop_at_eos: bool) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_domino"))
        .args(["generate", "--model", model.to_str().unwrap(), "--chat", "--prompt", prompt, "--max-tokens", &max_tokens.to_string(), "--json", "--dtype", "f32", "--ignore-eos", "--backend", backend])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The API's text leaves out end-of-sequence tokens; decode the ids without them.
    let files = domino_models::open_model(model).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["output_ids"].clone()).unwrap();
    let ids: Vec<u32> = match ids.iter().position(|id| files.stop_ids.contains(id)) {
        Some(end) if stop_at_eos => ids[..end].to_vec(),
        _ => ids.into_iter().filter(|id| !files.stop_ids.contains(id)).collect(),
    };
    files.tokenizer.unwrap().decode(&ids).unwrap()
}

#[test]
fn serve_speaks_openai_and_batches_exactly() {
    let model = tiny_model();
    for backend in backends() {
        let server = Server::start(model.path(), &backend, &["--max-batch", "8", "--context", "128"]);
        assert_eq!(server.get_text("/health"), (200, json!({"status": "ok"}).to_string()));
        let (code, models) = server.get_text("/v1/models");
        assert_eq!(code, 200);
        let models: Value = serde_json::from_str(&models).unwrap();
        assert_eq!(models["object"], "list");
        assert_eq!(models["data"][0]["object"], "model");

        // Non-streamed: the chat.completion object, with exactly `generate --chat`'s greedy text.
        let (code, v) = server.post("/v1/chat/completions", &chat_body("hello there", 20));
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        assert_eq!(text, generate_chat_text(model.path(), &backend, "hello there", 20, false), "{backend}: serve vs generate");
        assert_eq!(v["usage"]["completion_tokens"], 20);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        assert_eq!(v["usage"]["total_tokens"], v["usage"]["prompt_tokens"].as_u64().unwrap() + 20);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "a cold prompt");

        // Streamed: role, content deltas, finish reason, usage, [DONE]; the same text.
        let mut body = chat_body("hello there", 20);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let events = server.stream("/v1/chat/completions", &body);
        assert_eq!(events.last().unwrap(), "[DONE]");
        assert_eq!(events[0]["object"], "chat.completion.chunk");
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        let streamed: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(streamed, text);
        let finish = &events[events.len() - 3];
        assert_eq!(finish["choices"][0]["finish_reason"], "length");
        let usage = &events[events.len() - 2];
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 20);
        // The same prompt again: all of it but the last token comes from the prefix cache.
        let prompt_tokens = usage["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);
        assert_eq!(server.metric("domino_prompt_tokens_cached_total"), (prompt_tokens - 1) as f64);

        // A second turn resends the first: the shared head is cached (the tiny model's reply need not
        // encode back to its own tokens, so not necessarily all of it).
        let turn2 = json!({"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": text}, {"role": "user", "content": "and again"}], "max_tokens": 8, "temperature": 0});
        let (code, v2) = server.post("/v1/chat/completions", &turn2);
        assert_eq!(code, 200, "{v2}");
        let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(cached > 0 && cached < v2["usage"]["prompt_tokens"].as_u64().unwrap(), "{v2}");

        // The same request alone and among 7 others (different prompts, lengths, sampling).
        let prompts: Vec<String> = (0..8).map(|i| format!("request number {i} {}", "abc ".repeat(i * 3))).collect();
        let alone: Vec<Value> = prompts.iter().map(|p| server.post("/v1/chat/completions", &chat_body(p, 24)).1).collect();
        let together: Vec<Value> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts.iter().map(|p| s.spawn(|| server.post("/v1/chat/completions", &chat_body(p, 24)).1)).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (a, t) in alone.iter().zip(&together) {
            assert_eq!(a["choices"][0]["message"]["content"], t["choices"][0]["message"]["content"], "{backend}: batched output differs from alone");
        }
        assert!(server.metric("domino_steps_total") > 0.0);

        // /v1/completions with a stop sequence: the text ends before it, finish_reason stop.
        let (code, plain) = server.post("/v1/completions", &json!({"prompt": "once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": true}));
        assert_eq!(code, 200, "{plain}");
        assert_eq!(plain["object"], "text_completion");
        let full = plain["choices"][0]["text"].as_str().unwrap().to_string();
        let stop: String = full.chars().skip(3).take(2).collect();
        if !stop.trim().is_empty() {
            let (_, cut) = server.post("/v1/completions", &json!({"prompt": "once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": true, "stop": [stop.clone()]}));
            let want = &full[..full.find(&stop).unwrap()];
            assert_eq!(cut["choices"][0]["text"], want, "stop {stop:?}");
            assert_eq!(cut["choices"][0]["finish_reason"], "stop");
        }

        // Seeded sampling reproduces.
        let sampled = |seed: u64| server.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "temperature": 1.0, "seed": seed})).1["choices"][0]["message"]["content"].clone();
        assert_eq!(sampled(7), sampled(7));
    }
}

#[test]
fn serve_errors_have_openai_shape() {
    let model = tiny_model();
    let backend = &backends()[0];
    let server = Server::start(model.path(), backend, &["--max-batch", "1", "--max-queue", "1", "--context", "128", "--api-key", "sekrit"]);
    let key = Some("sekrit");
    let check = |code: u16, v: &Value, want: u16| {
        assert_eq!(code, want, "{v}");
        for field in ["message", "type", "param", "code"] {
            assert!(v["error"].get(field).is_some(), "error object lacks {field}: {v}");
        }
    };
    let (code, v) = server.post_with("/v1/chat/completions", &chat_body("hi", 4), None);
    check(code, &v, 401);
    let (code, v) = server.post_with("/v1/chat/completions", &chat_body("hi", 4), Some("wrong"));
    check(code, &v, 401);
    let r = ureq::post(&format!("{}/v1/chat/completions", server.url)).set("authorization", "Bearer sekrit").send_string("{not json");
    match r {
        Err(ureq::Error::Status(400, r)) => check(400, &r.into_json().unwrap(), 400),
        other => panic!("bad JSON: {other:?}"),
    }
    let (code, v) = server.post_with("/v1/chat/completions", &json!({"messages": "hello"}), key);
    check(code, &v, 400);
    let mut body = chat_body("hi", 4);
    body["n"] = json!(2);
    let (code, v) = server.post_with("/v1/chat/completions", &body, key);
    check(code, &v, 400);
    assert_eq!(v["error"]["param"], "n");
    // Over the context: refused before any work.
    let (code, v) = server.post_with("/v1/chat/completions", &chat_body(&"word ".repeat(80), 4), key);
    check(code, &v, 400);
    let (code, v) = server.post_with("/v1/chat/completions", &chat_body("hi", 120), key);
    check(code, &v, 400);
    let (code, body) = server.get_text("/v2/nothing");
    check(code, &serde_json::from_str(&body).unwrap(), 404);
    // One slot and a queue of one: a burst of 16 gets some 429s, and every other request completes.
    let codes: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16).map(|_| s.spawn(|| server.post_with("/v1/chat/completions", &chat_body("hello", 40), key))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).map(|(c, v)| {
            if c == 429 {
                check(c, &v, 429);
            }
            c
        }).collect()
    });
    assert!(codes.iter().all(|&c| c == 200 || c == 429), "{codes:?}");
    assert!(codes.contains(&429), "a burst of 16 over 1 slot + 1 queue place must see 429: {codes:?}");
    assert!(codes.contains(&200), "{codes:?}");
}

#[test]
fn disconnect_frees_the_sequence_and_sigterm_exits_cleanly() {
    let model = tiny_model();
    let backend = &backends()[0];
    let mut server = Server::start(model.path(), backend, &["--max-batch", "2", "--context", "256"]);
    // A streaming client that reads two events and hangs up.
    let mut body = chat_body("tell me everything", 200);
    body["stream"] = json!(true);
    {
        let r = ureq::post(&format!("{}/v1/chat/completions", server.url)).send_string(&body.to_string()).unwrap();
        let mut lines = BufReader::new(r.into_reader()).lines();
        let mut seen = 0;
        while seen < 2 {
            if lines.next().unwrap().unwrap().starts_with("data: ") {
                seen += 1;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("domino_active_sequences") > 0.0 || server.metric("domino_requests_total{status=\"cancelled\"}") < 1.0 {
        assert!(Instant::now() < deadline, "the disconnected stream's sequence was not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.metric("domino_generated_tokens_total") < 200.0, "the abandoned request ran to its end");

    // SIGTERM during a stream: the stream still ends with [DONE], then the process exits 0.
    let url = server.url.clone();
    let mut body = chat_body("a long answer please", 120);
    body["stream"] = json!(true);
    let reader = std::thread::spawn(move || {
        let r = ureq::post(&format!("{url}/v1/chat/completions")).send_string(&body.to_string()).unwrap();
        sse_events(r.into_reader())
    });
    std::thread::sleep(Duration::from_millis(300));
    let pid = server.child.id().to_string();
    // The shell's builtin kill: no procps needed.
    assert!(Command::new("sh").args(["-c", &format!("kill -TERM {pid}")]).status().unwrap().success());
    let events = reader.join().unwrap();
    assert_eq!(events.last().unwrap(), "[DONE]", "{events:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "serve did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status:?}");
    let stderr: Vec<String> = server.stderr.lock().unwrap().try_iter().collect();
    assert!(!stderr.iter().any(|l| l.starts_with("error") || l.contains("panicked")), "{stderr:?}");
}

#[test]
fn the_official_openai_python_client_works() {
    let python_has_openai = Command::new("python3").args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    assert!(python_has_openai, "the openai Python package is missing: `bash scripts/setup.sh --test` (or pip install openai) installs it");
    let model = tiny_model();
    let server = Server::start(model.path(), &backends()[0], &["--max-batch", "4", "--context", "128"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/openai-client-test.py");
    let out = Command::new("python3").arg(script).arg(&server.url).output().unwrap();
    assert!(out.status.success(), "openai client test failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn serve_with_a_drafter_is_speculative_alone_and_exact_when_handing_over() {
    use domino_models::drafter::DrafterKind;
    use domino_models::testing::{write_always_accept_pair, TinyDrafterSpec};
    let model = tempfile::tempdir().unwrap();
    let drafter = tempfile::tempdir().unwrap();
    let spec = TinySpec { embed_scale: 4.0, max_position: 256, ..TinySpec::default() };
    let dspec = TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, ..TinyDrafterSpec::default() };
    write_always_accept_pair(model.path(), drafter.path(), &spec, &dspec, spec.vocab / 2).unwrap();
    let backend = &backends()[0];
    let server = Server::start(model.path(), backend, &["--max-batch", "4", "--context", "128", "--draft", drafter.path().to_str().unwrap(), "--draft-len", "3"]);
    // Alone: speculative, whole blocks accepted.
    let (code, alone) = server.post("/v1/chat/completions", &chat_body("hello", 24));
    assert_eq!(code, 200, "{alone}");
    let ext = &alone["domino"];
    assert_eq!(ext["speculative"], true, "{alone}");
    assert!(ext["acceptance_lengths"].as_array().unwrap().iter().any(|a| a.as_u64().unwrap() == 4), "{ext}");
    assert!(ext["draft_lengths"].as_array().unwrap().iter().all(|k| k.as_u64().unwrap() <= 3), "{ext}");
    // Several at once: some hand over to the batch mid-way; every text equals its request alone.
    let prompts: Vec<String> = (0..4).map(|i| format!("prompt {i}")).collect();
    let want: Vec<Value> = prompts.iter().map(|p| server.post("/v1/chat/completions", &chat_body(p, 40)).1["choices"][0]["message"]["content"].clone()).collect();
    let got: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts.iter().map(|p| s.spawn(|| server.post("/v1/chat/completions", &chat_body(p, 40)).1["choices"][0]["message"]["content"].clone())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    assert!(server.metric("domino_mean_acceptance") > 1.0);
}

#[test]
fn serve_with_lookup_copies_repeated_text_and_keeps_the_output() {
    use domino_models::drafter::DrafterKind;
    use domino_models::testing::{write_tiny_drafter, TinyDrafterSpec};
    let model = tiny_model();
    let drafter = tempfile::tempdir().unwrap();
    // An untrained drafter: the rounds that pay are the copies of the reply's own repeats.
    let dspec = TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 8, seed: 31, ..TinyDrafterSpec::default() };
    write_tiny_drafter(drafter.path(), &TinySpec { embed_scale: 4.0, max_position: 256, ..TinySpec::default() }, &dspec).unwrap();
    let draft = drafter.path().to_str().unwrap();
    let backend = &backends()[0];
    let server = Server::start(model.path(), backend, &["--max-batch", "2", "--context", "128", "--draft", draft, "--lookup"]);
    let (code, v) = server.post("/v1/chat/completions", &chat_body("hello", 64));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), generate_chat_text(model.path(), backend, "hello", 64, false));
    let ext = &v["domino"];
    assert_eq!(ext["speculative"], true, "{v}");
    assert!(ext["lookup_rounds"].as_u64().unwrap() > 0, "no copy round: {ext}");
    let (ks, accepted) = (ext["draft_lengths"].as_array().unwrap(), ext["acceptance_lengths"].as_array().unwrap());
    assert!(ks.iter().zip(accepted).all(|(k, a)| a.as_u64().unwrap() <= k.as_u64().unwrap() + 1), "{ext}");
    assert!(accepted.iter().any(|a| a.as_u64().unwrap() > 1), "copies never accepted: {ext}");
    drop(server);
    // With a fixed draft length: rounds of at most 3 tokens, copies among them, the same reply.
    let server = Server::start(model.path(), backend, &["--max-batch", "2", "--context", "128", "--draft", draft, "--lookup", "--draft-len", "3"]);
    let (code, v) = server.post("/v1/chat/completions", &chat_body("hello", 64));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), generate_chat_text(model.path(), backend, "hello", 64, false));
    let ext = &v["domino"];
    assert!(ext["lookup_rounds"].as_u64().unwrap() > 0, "no copy round: {ext}");
    assert!(ext["draft_lengths"].as_array().unwrap().iter().all(|k| k.as_u64().unwrap() <= 3), "{ext}");
}

#[test]
fn chat_streams_replies_with_the_whole_conversation_and_refuses_overflow() {
    use std::io::Write;
    let model = tiny_model();
    let backend = &backends()[0];
    let mut child = Command::new(env!("CARGO_BIN_EXE_domino"))
        .args(["chat", "--model", model.path().to_str().unwrap(), "--max-tokens", "12", "--context", "96", "--dtype", "f32", "--backend", backend])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let long = "many words ".repeat(40);
    let input = format!("hello\n/reset\nhello\n{long}\nhi\n/exit\n");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let first = generate_chat_text(model.path(), backend, "hello", 12, true);
    // Replies follow the "> " prompts; after /reset the same question gets the same answer.
    let replies: Vec<&str> = stdout.split("> ").map(str::trim_end).filter(|s| !s.is_empty()).collect();
    assert_eq!(replies.len(), 3, "{stdout}");
    assert_eq!(replies[0], first.trim_end());
    assert_eq!(replies[1], first.trim_end());
    assert!(stderr.contains("(conversation reset)"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "only the overflowing turn is refused: {stderr}");
    assert!(errors[0].contains("context"), "{stderr}");
    assert_eq!(stderr.lines().filter(|l| l.starts_with('[') && l.contains("tok/s")).count(), 3, "a stats line per reply: {stderr}");
    // The repeated question and the later turn reuse the cached conversation prefix.
    assert_eq!(stderr.lines().filter(|l| l.starts_with('[') && l.contains(" cached)")).count(), 2, "{stderr}");
}

#[test]
fn a_lost_device_fails_its_requests_with_500_and_the_server_recovers() {
    let model = tiny_model();
    for backend in backends() {
        // The engine destroys its device after 3 steps (a test hook), in the middle of this request.
        let server = Server::start_with_env(model.path(), &backend, &["--max-batch", "2", "--context", "128"], &[("DOMINO_SERVE_LOSE_DEVICE_AT_STEP", "3")]);
        let (code, v) = server.post("/v1/chat/completions", &chat_body("hello there", 12));
        assert_eq!(code, 500, "{backend}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("lost"), "{v}");
        // The next request runs on a new device and gives the right answer.
        let (code, v) = server.post("/v1/chat/completions", &chat_body("hello there", 12));
        assert_eq!(code, 200, "{backend}: {v}");
        assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), generate_chat_text(model.path(), &backend, "hello there", 12, false));
        assert_eq!(server.metric("domino_gpu_errors_total"), 1.0);
    }
}

#[test]
fn serve_refuses_a_batch_that_does_not_fit_before_uploading() {
    let model = tiny_model();
    let out = Command::new(env!("CARGO_BIN_EXE_domino"))
        .args(["serve", "--model", model.path().to_str().unwrap(), "--port", "0", "--max-batch", "16", "--context", "256", "--backend", &backends()[0]])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env("DOMINO_MEMORY_BUDGET", "2M")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains("16 sequences of 256 positions") && lines[0].contains("--max-batch"), "{stderr}");
}

#[test]
fn loadtest_counts_requests_tokens_and_failures() {
    let model = tiny_model();
    let server = Server::start(model.path(), &backends()[0], &["--max-batch", "4", "--context", "128"]);
    let loadtest = |url: &str, extra: &[&str]| -> Value {
        let mut args = vec!["loadtest", "--url", url, "--clients", "3", "--requests", "6", "--max-tokens", "8", "--json"];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_domino")).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    for stream in [true, false] {
        // ignore_eos is not sent, so a reply may stop early; the tiny model rarely does in 8 tokens.
        let r = loadtest(&server.url, if stream { &["--stream"] } else { &[] });
        assert_eq!((r["completed"].as_u64(), r["errors"].as_u64(), r["lost"].as_u64()), (Some(6), Some(0), Some(0)), "{r}");
        let tokens = r["output_tokens"].as_u64().unwrap();
        assert!((6..=48).contains(&tokens), "{r}");
        assert!(r["output_tokens_per_s"].as_f64().unwrap() > 0.0);
        let p = &r["latency_s"];
        assert!(p["p50"].as_f64().unwrap() > 0.0 && p["p50"].as_f64() <= p["p99"].as_f64(), "{r}");
        assert!(r["time_to_first_token_s"]["p50"].as_f64() <= p["p50"].as_f64(), "{r}");
        // The requests differ only in their last words: after the first, their heads are cached.
        let (prompt, cached) = (r["prompt_tokens"].as_u64().unwrap(), r["cached_prompt_tokens"].as_u64().unwrap());
        assert!(prompt > 0 && cached > 0 && cached < prompt, "{r}");
    }
    // Nobody listening: every request is lost, none is an error, and the run still reports.
    let dead = format!("http://127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let r = loadtest(&dead, &[]);
    assert_eq!((r["completed"].as_u64(), r["errors"].as_u64(), r["lost"].as_u64()), (Some(0), Some(0), Some(6)), "{r}");
    // A wrong key: every request is an error (HTTP 401), none is lost.
    let keyed = Server::start(model.path(), &backends()[0], &["--max-batch", "2", "--context", "128", "--api-key", "k"]);
    let r = loadtest(&keyed.url, &["--api-key", "wrong"]);
    assert_eq!((r["completed"].as_u64(), r["errors"].as_u64(), r["lost"].as_u64()), (Some(0), Some(6), Some(0)), "{r}");
}
