//! `domino bench` reports and `domino report`: the domino-bench/1 schema round trip, merging, the
//! self-contained HTML page, clear errors for bad input, and a short bench on every software adapter.
//! Timing values are never asserted, only that they are present, finite and positive.

#[path = "../src/report.rs"]
#[allow(dead_code)]
mod report;

use report::{AdapterFacts, AdapterReport, BenchReport, MachineInfo, ModeReport, Workload};
use std::process::{Command, Output};

fn domino(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_domino")).args(args).env("XDG_RUNTIME_DIR", std::env::temp_dir()).output().expect("run domino")
}

fn expect_error(args: &[&str]) -> String {
    let out = domino(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{args:?} succeeded; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty() && !l.contains("XDG_RUNTIME_DIR")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

fn mode(name: &str, tps: f64, plain: f64) -> ModeReport {
    ModeReport {
        mode: name.into(),
        prefill_tokens_per_s: 1000.0,
        decode_tokens_per_s: tps,
        decode_tokens_per_s_min: tps * 0.9,
        decode_tokens_per_s_max: tps * 1.1,
        decode_tokens_per_s_all: vec![tps * 0.9, tps, tps * 1.1],
        time_to_first_token_s: 0.012,
        speedup_over_plain: tps / plain,
        speedup_over_plain_paired: Some(tps / plain),
        mean_acceptance: if name == "plain" { 1.0 } else { 3.5 },
        mean_draft_length: if name == "plain" { 0.0 } else { 3.0 },
        draft_seconds: 0.1,
        verify_seconds: 0.2,
        head_seconds: 0.03,
        head_share: 0.1,
        decode_weight_bandwidth_gb_s: 1.5,
        roofline_ratio: 0.4,
        read_roofline_ratio: 0.8,
        peak_gpu_memory_bytes: 123 << 20,
        peak_gpu_memory_estimated: true,
    }
}

fn sample(host: &str, adapter: &str, backend: &str) -> BenchReport {
    BenchReport {
        schema: report::SCHEMA.into(),
        runner: "native".into(),
        domino_version: "0.1.0".into(),
        created_unix_s: 1_790_000_000,
        machine: MachineInfo { os: "linux".into(), arch: "x86_64".into(), cpu: Some("Some CPU".into()), hostname: Some(host.into()) },
        workload: Workload {
            model: "tiny".into(),
            drafter: Some("tiny-domino".into()),
            dtype: "f16".into(),
            prompt_source: "builtin".into(),
            prompt_tokens: vec![10, 20],
            max_tokens: 6,
            runs: 1,
        },
        adapters: vec![AdapterReport {
            kernels: "cpu".into(),
            adapter: AdapterFacts {
                name: adapter.into(),
                vendor: 0x10de,
                vendor_name: "NVIDIA".into(),
                device: 0x2684,
                backend: backend.into(),
                device_type: "DiscreteGpu".into(),
                driver: "drv".into(),
                driver_info: "1.2.3".into(),
                features: vec!["shader-f16".into()],
                max_storage_buffer_binding_size: 1 << 30,
                max_buffer_size: 1 << 31,
                max_compute_workgroup_storage_size: 32768,
                max_compute_invocations_per_workgroup: 1024,
                max_storage_buffers_per_shader_stage: 16,
            },
            copy_bandwidth_gb_s: 800.0,
            decode_weight_bytes_per_token: 1 << 20,
            modes: vec![mode("plain", 100.0, 100.0), mode("backbone (--no-head)", 180.0, 100.0), mode("domino", 250.0, 100.0)],
        }],
    }
}

#[test]
fn schema_round_trip() {
    let r = sample("box-a", "GPU A", "vulkan");
    let text = serde_json::to_string_pretty(&r).unwrap();
    let back: BenchReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], "domino-bench/1");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.json");
    std::fs::write(&p, &text).unwrap();
    assert_eq!(report::load(&p).unwrap(), r);

    // A report from before the paired speedup (and the mean draft length) existed still loads.
    let mut old = v.clone();
    for m in old["adapters"][0]["modes"].as_array_mut().unwrap() {
        let m = m.as_object_mut().unwrap();
        assert!(m.remove("speedup_over_plain_paired").is_some() && m.remove("mean_draft_length").is_some());
    }
    std::fs::write(&p, old.to_string()).unwrap();
    let back = report::load(&p).unwrap();
    assert!(back.adapters[0].modes.iter().all(|m| m.speedup_over_plain_paired.is_none() && m.mean_draft_length == 0.0));
}

/// A minimal checker: every start tag is closed in order (self-closing and void tags excepted).
fn assert_balanced(doc: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = doc;
    while let Some(i) = rest.find('<') {
        let j = rest[i..].find('>').unwrap_or_else(|| panic!("unterminated tag near {}", &rest[i..]));
        let tag = &rest[i + 1..i + j];
        rest = &rest[i + j + 1..];
        if tag.starts_with('!') || tag.starts_with('?') {
            continue;
        }
        let name: String = tag.trim_start_matches('/').chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        assert!(!name.is_empty(), "bad tag <{tag}>");
        if tag.starts_with('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.as_str()), "mismatched </{name}>");
        } else if !tag.ends_with('/') && !["meta", "br", "hr", "img", "link", "input"].contains(&name.as_str()) {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
}

fn check_html(html: &str) {
    assert_eq!(html.matches("<svg").count(), report::METRICS.len(), "one chart per metric");
    assert_eq!(html.matches("</svg>").count(), report::METRICS.len());
    for (id, ..) in report::METRICS {
        let start = html.find(&format!("<svg id=\"chart-{id}\"")).unwrap_or_else(|| panic!("no chart {id}"));
        let end = start + html[start..].find("</svg>").unwrap() + "</svg>".len();
        let svg = &html[start..end];
        assert_balanced(svg);
        assert!(svg.contains("<rect"), "{id}: no bars");
    }
    assert_balanced(html);
    assert!(!html.to_lowercase().contains("http"), "no URLs: the page must work offline");
    assert!(!html.to_lowercase().contains("<script"));
}

#[test]
fn merge_two_reports_into_markdown_and_html() {
    let a = sample("box-a", "GPU <A> & \"co\"", "vulkan");
    let b = sample("box-b", "GPU B", "metal");
    let rows = report::merge(&[a.clone(), b.clone()]);
    assert_eq!(rows.len(), 6);
    assert!(rows[0].machine.contains("box-a") && rows[5].machine.contains("box-b"));
    assert_eq!(rows[2].mode, "domino");

    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (dir.path().join("a.json"), dir.path().join("b.json"));
    std::fs::write(&pa, serde_json::to_string(&a).unwrap()).unwrap();
    std::fs::write(&pb, serde_json::to_string(&b).unwrap()).unwrap();
    let md = dir.path().join("out.md");
    let html = dir.path().join("out.html");
    let out = domino(&["report", pa.to_str().unwrap(), pb.to_str().unwrap(), "--markdown", md.to_str().unwrap(), "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(std::fs::read_to_string(&md).unwrap(), stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2 + 6, "{stdout}");
    assert!(lines[2].contains("box-a") && lines[2].contains("plain") && lines[2].contains("vulkan"));
    assert!(lines[7].contains("box-b") && lines[7].contains("domino") && lines[7].contains("metal"));
    assert!(lines[4].contains("2.50x"), "{}", lines[4]);

    let page = std::fs::read_to_string(&html).unwrap();
    check_html(&page);
    assert!(page.contains("GPU &lt;A&gt; &amp; &quot;co&quot;"), "adapter names are escaped");
    assert!(!page.contains("GPU <A>"));
    assert_eq!(page, report::html(&[a, b]));
}

#[test]
fn report_bad_input_gives_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    assert!(expect_error(&["report", &p("missing.json")]).contains("missing.json: file not found"));
    std::fs::write(p("bad.json"), "{\"schema\": ").unwrap();
    assert!(expect_error(&["report", &p("bad.json")]).contains("bad.json: malformed JSON"));
    std::fs::write(p("other.json"), "{\"schema\": \"something/2\"}").unwrap();
    assert!(expect_error(&["report", &p("other.json")]).contains("unsupported schema 'something/2'"));
    std::fs::write(p("none.json"), "[1, 2]").unwrap();
    assert!(expect_error(&["report", &p("none.json")]).contains("not a domino bench report"));
    std::fs::write(p("partial.json"), "{\"schema\": \"domino-bench/1\"}").unwrap();
    assert!(expect_error(&["report", &p("partial.json")]).contains("does not match schema domino-bench/1"));
}

/// Every number in the report is finite and >= 0.
fn assert_numbers_finite(v: &serde_json::Value, path: &str) {
    match v {
        serde_json::Value::Number(n) => {
            let x = n.as_f64().unwrap();
            assert!(x.is_finite() && x >= 0.0, "{path} = {x}");
        }
        serde_json::Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| assert_numbers_finite(x, &format!("{path}[{i}]"))),
        serde_json::Value::Object(o) => o.iter().for_each(|(k, x)| assert_numbers_finite(x, &format!("{path}.{k}"))),
        _ => {}
    }
}

#[test]
fn bench_on_every_software_adapter() {
    use domino_models::drafter::DrafterKind;
    use domino_models::testing::{write_tiny_drafter, write_tiny_model, TinyDrafterSpec, TinySpec};
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let spec = TinySpec::default();
    write_tiny_model(&model, &spec).unwrap();
    let draft = dir.path().join("domino");
    write_tiny_drafter(&draft, &spec, &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, ..TinyDrafterSpec::default() }).unwrap();
    let json = dir.path().join("bench.json");
    let html = dir.path().join("bench.html");
    let (m, d, j, h) = (model.to_str().unwrap(), draft.to_str().unwrap(), json.to_str().unwrap(), html.to_str().unwrap());
    // Whole blocks (4 drafts) every round, so every mode's phases run and are timed.
    let out = domino(&["bench", "--model", m, "--draft", d, "--draft-len", "4", "--backend", "all", "--runs", "1", "--max-tokens", "6", "--json", j, "--html", h]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let r = report::load(&json).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_numbers_finite(&v, "report");
    let again: BenchReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(again, r, "a real report round-trips");
    assert_eq!(r.schema, "domino-bench/1");
    assert!(!r.machine.os.is_empty() && !r.machine.arch.is_empty());
    assert_eq!(r.workload.prompt_source, "builtin");
    assert_eq!(r.workload.prompt_tokens.len(), 4);
    assert!(r.workload.prompt_tokens.iter().all(|&n| n > 0));
    let backends: Vec<&str> = r.adapters.iter().map(|a| a.adapter.backend.as_str()).collect();
    assert!(backends.contains(&"vulkan") && backends.contains(&"gl"), "{backends:?}");
    for a in &r.adapters {
        let name = &a.adapter.name;
        assert!(a.copy_bandwidth_gb_s > 0.0 && a.decode_weight_bytes_per_token > 0, "{name}");
        let modes: Vec<&str> = a.modes.iter().map(|m| m.mode.as_str()).collect();
        assert_eq!(modes, ["plain", "backbone (--no-head)", "domino"], "{name}");
        let plain = a.modes[0].decode_tokens_per_s;
        for m in &a.modes {
            let ctx = format!("{name} {}", m.mode);
            for (key, x) in [
                ("prefill", m.prefill_tokens_per_s),
                ("decode", m.decode_tokens_per_s),
                ("decode min", m.decode_tokens_per_s_min),
                ("decode max", m.decode_tokens_per_s_max),
                ("ttft", m.time_to_first_token_s),
                ("speedup", m.speedup_over_plain),
                ("weight bw", m.decode_weight_bandwidth_gb_s),
                ("roofline", m.roofline_ratio),
                ("read roofline", m.read_roofline_ratio),
            ] {
                assert!(x.is_finite() && x > 0.0, "{ctx}: {key} = {x}");
            }
            assert!(m.decode_tokens_per_s_min <= m.decode_tokens_per_s && m.decode_tokens_per_s <= m.decode_tokens_per_s_max, "{ctx}");
            assert_eq!(m.decode_tokens_per_s_all.len(), 4, "{ctx}: one value per prompt and run");
            assert!(m.mean_acceptance >= 1.0, "{ctx}");
            assert!(m.peak_gpu_memory_bytes > 0 && m.peak_gpu_memory_estimated, "{ctx}");
            // Speedups come from the same run: this adapter's plain decoding in this report.
            let want = m.decode_tokens_per_s / plain;
            assert!((m.speedup_over_plain - want).abs() <= 1e-9 * want.max(1.0), "{ctx}: {} vs {want}", m.speedup_over_plain);
            // The paired figure: the geometric mean of run-by-run ratios to plain's runs.
            let logs: f64 = m.decode_tokens_per_s_all.iter().zip(&a.modes[0].decode_tokens_per_s_all).map(|(r, p)| (r / p).ln()).sum();
            let want = (logs / 4.0).exp();
            let paired = m.speedup_over_plain_paired.unwrap_or_else(|| panic!("{ctx}: no paired speedup"));
            assert!((paired - want).abs() <= 1e-9 * want, "{ctx}: paired {paired} vs {want}");
            let ratio = m.decode_weight_bandwidth_gb_s / a.copy_bandwidth_gb_s;
            assert!((m.roofline_ratio - ratio).abs() <= 1e-6 * ratio, "{ctx}: roofline from this adapter's copy bandwidth");
            assert!((m.read_roofline_ratio - 2.0 * m.roofline_ratio).abs() <= 1e-6 * m.read_roofline_ratio, "{ctx}");
            if m.mode == "plain" {
                assert_eq!(m.mean_acceptance, 1.0);
                assert_eq!(m.head_share, 0.0);
                assert_eq!(m.mean_draft_length, 0.0);
            } else {
                assert!(m.draft_seconds > 0.0 && m.verify_seconds > 0.0, "{ctx}");
                assert_eq!(m.mean_draft_length, 4.0, "{ctx}");
            }
            if m.mode == "domino" {
                assert!(m.head_share > 0.0 && m.head_seconds > 0.0, "{ctx}");
            } else {
                assert_eq!(m.head_share, 0.0, "{ctx}");
            }
        }
        assert!(a.modes[1].peak_gpu_memory_bytes > a.modes[0].peak_gpu_memory_bytes, "the drafter's weights count");
    }
    check_html(&std::fs::read_to_string(&html).unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("vulkan") && stdout.contains("gl"), "{stdout}");
}

#[test]
fn bench_prompts_file() {
    use domino_models::testing::{write_tiny_model, TinySpec};
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_tiny_model(&model, &TinySpec::default()).unwrap();
    let m = model.to_str().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"def add(a, b):\"}\n\n{\"prompt\": \"Hello\", \"task_id\": \"x/1\"}\n").unwrap();
    let json = dir.path().join("r.json");
    let out = domino(&["bench", "--model", m, "--prompts", prompts.to_str().unwrap(), "--runs", "1", "--max-tokens", "3", "--json", json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = report::load(&json).unwrap();
    assert_eq!(r.workload.prompt_tokens, vec!["def add(a, b):".len(), "Hello".len()], "byte-level tokenizer");
    assert_eq!(r.adapters.len(), 1, "--backend auto: one adapter");
    assert_eq!(r.adapters[0].modes.len(), 1);

    let p = prompts.to_str().unwrap();
    std::fs::write(&prompts, "{\"prompt\": \"ok\"}\n{\"prompt\": \n").unwrap();
    let e = expect_error(&["bench", "--model", m, "--prompts", p]);
    assert!(e.contains("prompts.jsonl") && e.contains("line 2") && e.contains("malformed JSON"), "{e}");
    std::fs::write(&prompts, "{\"text\": \"no prompt field\"}\n").unwrap();
    let e = expect_error(&["bench", "--model", m, "--prompts", p]);
    assert!(e.contains("prompts.jsonl") && e.contains("line 1") && e.contains("\"prompt\""), "{e}");
    let e = expect_error(&["bench", "--model", m, "--prompts", dir.path().join("nope.jsonl").to_str().unwrap()]);
    assert!(e.contains("nope.jsonl: file not found"), "{e}");
}
