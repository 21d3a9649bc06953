//! The benchmark report (`"schema": "domino-bench/1"`), written by `domino bench --json` and merged by
//! `domino report` into a Markdown table and a self-contained HTML page with hand-written SVG charts.
//!
//! This module depends only on serde, serde_json, domino-engine's `AdapterSummary` and
//! domino-runtime's `ModeReport` (the shared measurement's per-mode figures), so the tests include it
//! directly (`#[path]`) and check the schema round trip on the real structs. A browser
//! build must produce the same JSON (with `"runner": "browser"`) for its reports to merge here.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The value of the `schema` field of every report this version writes and reads.
pub const SCHEMA: &str = "domino-bench/1";

/// One `domino bench` run: the machine, the workload, and per adapter every mode measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Always `domino-bench/1`.
    pub schema: String,
    /// `native` for the `domino` binary (a browser build would write `browser`).
    pub runner: String,
    /// The domino version that produced the report.
    pub domino_version: String,
    /// Seconds since the Unix epoch when the run finished.
    pub created_unix_s: u64,
    pub machine: MachineInfo,
    pub workload: Workload,
    pub adapters: Vec<AdapterReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// `std::env::consts::OS`, e.g. `linux`.
    pub os: String,
    /// `std::env::consts::ARCH`, e.g. `x86_64`.
    pub arch: String,
    /// CPU model name (from /proc/cpuinfo where readable).
    pub cpu: Option<String>,
    pub hostname: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// The model folder (or repo id) as given.
    pub model: String,
    pub drafter: Option<String>,
    pub dtype: String,
    /// `builtin` (tokenized default prompts), `synthetic` (ids, no tokenizer) or the --prompts file.
    pub prompt_source: String,
    /// Token count of every prompt.
    pub prompt_tokens: Vec<usize>,
    /// Tokens generated per run (--max-tokens; generation ignores EOS).
    pub max_tokens: usize,
    /// Timed runs per prompt (after one warm-up run per adapter and mode).
    pub runs: usize,
}

/// Facts about one adapter (a copy of domino-engine's `AdapterSummary` plus a vendor name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterFacts {
    pub name: String,
    /// PCI vendor id (0 where the backend does not say).
    pub vendor: u32,
    pub vendor_name: String,
    pub device: u32,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub features: Vec<String>,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_storage_buffers_per_shader_stage: u32,
}

impl From<&domino_engine::AdapterSummary> for AdapterFacts {
    fn from(a: &domino_engine::AdapterSummary) -> Self {
        Self {
            name: a.name.clone(),
            vendor: a.vendor,
            vendor_name: vendor_name(a.vendor).to_string(),
            device: a.device,
            backend: a.backend.clone(),
            device_type: a.device_type.clone(),
            driver: a.driver.clone(),
            driver_info: a.driver_info.clone(),
            features: a.features.clone(),
            max_storage_buffer_binding_size: a.max_storage_buffer_binding_size,
            max_buffer_size: a.max_buffer_size,
            max_compute_workgroup_storage_size: a.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: a.max_compute_invocations_per_workgroup,
            max_storage_buffers_per_shader_stage: a.max_storage_buffers_per_shader_stage,
        }
    }
}

pub fn vendor_name(id: u32) -> &'static str {
    match id {
        0x10de => "NVIDIA",
        0x1002 | 0x1022 => "AMD",
        0x8086 => "Intel",
        0x106b => "Apple",
        0x13b5 => "ARM",
        0x5143 => "Qualcomm",
        0x1010 => "Imagination",
        0x14e4 => "Broadcom",
        0x10005 => "Mesa",
        0x1414 => "Microsoft",
        _ => "unknown",
    }
}

/// Everything measured on one adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterReport {
    pub adapter: AdapterFacts,
    /// The kernel family that ran: "gpu" or "cpu" (`--kernels`; empty in reports from before it).
    #[serde(default)]
    pub kernels: String,
    /// (bytes read + bytes written) / s of the WGSL copy kernel on this adapter, in this run.
    pub copy_bandwidth_gb_s: f64,
    /// Bytes of target weights one decode step reads (layer matrices + lm_head).
    pub decode_weight_bytes_per_token: u64,
    /// `plain` first, then (with a drafter) `dflash`, or `backbone (--no-head)` and `domino`.
    pub modes: Vec<ModeReport>,
}

/// One decoding mode on one adapter (measured by `domino_runtime::bench`, shared with the browser).
pub use domino_runtime::bench::ModeReport;

/// This machine's OS, architecture, CPU model and hostname (where readable).
pub fn machine_facts() -> MachineInfo {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name") || l.starts_with("Hardware") || l.starts_with("Processor"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .filter(|v| !v.is_empty())
    });
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|s| s.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .filter(|s| !s.is_empty());
    MachineInfo { os: std::env::consts::OS.to_string(), arch: std::env::consts::ARCH.to_string(), cpu, hostname }
}

/// Read a report, checking the schema: errors are one line naming the file.
pub fn load(path: &Path) -> Result<BenchReport, String> {
    let p = path.display();
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{p}: file not found"),
        _ => format!("{p}: {e}"),
    })?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("{p}: malformed JSON: {e}"))?;
    match value.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) => return Err(format!("{p}: unsupported schema '{other}' (expected '{SCHEMA}')")),
        None => return Err(format!("{p}: not a domino bench report (no \"schema\": \"{SCHEMA}\" field)")),
    }
    serde_json::from_value(value).map_err(|e| format!("{p}: does not match schema {SCHEMA}: {e}"))
}

/// One row of the comparison: a machine, an adapter, a mode.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub machine: String,
    pub adapter: String,
    pub mode: String,
    pub m: ModeReport,
    pub copy_bandwidth_gb_s: f64,
}

fn machine_label(r: &BenchReport) -> String {
    let host = r.machine.hostname.clone().unwrap_or_else(|| "unknown host".into());
    let runner = if r.runner == "native" { String::new() } else { format!(", {}", r.runner) };
    format!("{host} ({}/{}{runner})", r.machine.os, r.machine.arch)
}

/// Merge reports into rows: report order, adapter order, mode order.
pub fn merge(reports: &[BenchReport]) -> Vec<Row> {
    let mut rows = Vec::new();
    for r in reports {
        let machine = machine_label(r);
        for a in &r.adapters {
            let adapter = format!("{} ({})", a.adapter.name, a.adapter.backend);
            for m in &a.modes {
                rows.push(Row { machine: machine.clone(), adapter: adapter.clone(), mode: m.mode.clone(), m: m.clone(), copy_bandwidth_gb_s: a.copy_bandwidth_gb_s });
            }
        }
    }
    rows
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The comparison as a Markdown table, one row per machine / adapter / mode.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str("| machine | adapter | mode | decode tok/s (min-max) | prefill tok/s | TTFT ms | speedup | mean acceptance | draft / verify s | head share | roofline | read roofline | copy GB/s | est. GPU MiB |\n");
    s.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let m = &r.m;
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} ({:.2}-{:.2}) | {:.1} | {:.1} | {:.2}x | {:.2} | {:.3} / {:.3} | {:.1}% | {:.3} | {:.3} | {:.2} | {:.1} |\n",
            md_cell(&r.machine),
            md_cell(&r.adapter),
            md_cell(&r.mode),
            m.decode_tokens_per_s,
            m.decode_tokens_per_s_min,
            m.decode_tokens_per_s_max,
            m.prefill_tokens_per_s,
            m.time_to_first_token_s * 1e3,
            m.speedup_over_plain,
            m.mean_acceptance,
            m.draft_seconds,
            m.verify_seconds,
            100.0 * m.head_share,
            m.roofline_ratio,
            m.read_roofline_ratio,
            r.copy_bandwidth_gb_s,
            m.peak_gpu_memory_bytes as f64 / (1u64 << 20) as f64,
        ));
    }
    s
}

/// Escape text for HTML / SVG text and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// The charts of the HTML page: (id, title, axis label, value of a row).
pub const METRICS: [(&str, &str, &str); 4] = [
    ("decode", "Decode speed", "decode tokens/s (median)"),
    ("speedup", "Speedup over plain decoding", "x plain decoding, same adapter and run"),
    ("acceptance", "Mean acceptance length", "tokens committed per round"),
    ("roofline", "Roofline ratio", "decode weight bandwidth / copy bandwidth"),
];

fn metric_value(id: &str, m: &ModeReport) -> f64 {
    match id {
        "decode" => m.decode_tokens_per_s,
        "speedup" => m.speedup_over_plain,
        "acceptance" => m.mean_acceptance,
        _ => m.roofline_ratio,
    }
}

const COLORS: [&str; 4] = ["#4c78a8", "#f58518", "#54a24b", "#b279a2"];

/// One horizontal bar chart: a bar per row, labels on the left, values at the bar ends.
fn svg_chart(id: &str, title: &str, axis: &str, rows: &[Row], modes: &[String]) -> String {
    // Labels are right-aligned against the bars: size their column from the longest one (about 6.6 px
    // per character at 12 px) so none is clipped at the left edge.
    let longest = rows.iter().map(|r| format!("{} · {} · {}", r.machine, r.adapter, r.mode).chars().count()).max().unwrap_or(0);
    let (label_w, bar_w, row_h, top) = ((longest as f64 * 6.6 + 12.0).max(120.0), 360.0, 22.0, 34.0);
    let width = label_w + bar_w + 90.0;
    let height = top + row_h * rows.len() as f64 + 44.0;
    let values: Vec<f64> = rows.iter().map(|r| metric_value(id, &r.m)).map(|v| if v.is_finite() { v.max(0.0) } else { 0.0 }).collect();
    let max = values.iter().cloned().fold(0.0f64, f64::max);
    let scale = if max > 0.0 { bar_w / max } else { 0.0 };
    let mut s = format!(
        "<svg id=\"chart-{id}\" role=\"img\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">\n<title>{}</title>\n",
        escape(title)
    );
    s.push_str(&format!("<text x=\"0\" y=\"18\" class=\"title\">{}</text>\n", escape(title)));
    for (i, (r, v)) in rows.iter().zip(&values).enumerate() {
        let y = top + row_h * i as f64;
        let color = COLORS[modes.iter().position(|m| *m == r.mode).unwrap_or(0) % COLORS.len()];
        let label = format!("{} · {} · {}", r.machine, r.adapter, r.mode);
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" class=\"label\">{}</text>\n",
            label_w - 6.0,
            y + 15.0,
            escape(&label)
        ));
        s.push_str(&format!(
            "<rect x=\"{label_w:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\"><title>{}: {}</title></rect>\n",
            y + 3.0,
            v * scale,
            row_h - 6.0,
            escape(&label),
            fmt_value(*v)
        ));
        s.push_str(&format!("<text x=\"{:.1}\" y=\"{:.1}\" class=\"value\">{}</text>\n", label_w + v * scale + 4.0, y + 15.0, fmt_value(*v)));
    }
    let axis_y = top + row_h * rows.len() as f64 + 4.0;
    s.push_str(&format!("<line x1=\"{label_w:.1}\" y1=\"{top:.1}\" x2=\"{label_w:.1}\" y2=\"{axis_y:.1}\" stroke=\"#333\"/>\n"));
    s.push_str(&format!("<line x1=\"{label_w:.1}\" y1=\"{axis_y:.1}\" x2=\"{:.1}\" y2=\"{axis_y:.1}\" stroke=\"#333\"/>\n", label_w + bar_w));
    s.push_str(&format!("<text x=\"{label_w:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"tick\">0</text>\n", axis_y + 14.0));
    s.push_str(&format!("<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"tick\">{}</text>\n", label_w + bar_w, axis_y + 14.0, fmt_value(max)));
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"axis\">{}</text>\n",
        label_w + bar_w / 2.0,
        axis_y + 32.0,
        escape(axis)
    ));
    s.push_str("</svg>\n");
    s
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A self-contained page: inline CSS, one inline SVG chart per metric, the facts of every machine and
/// adapter, and the table. No scripts, nothing fetched.
pub fn html(reports: &[BenchReport]) -> String {
    let rows = merge(reports);
    let mut modes: Vec<String> = Vec::new();
    for r in &rows {
        if !modes.contains(&r.mode) {
            modes.push(r.mode.clone());
        }
    }
    let mut s = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>Domino benchmark report</title>\n<style>\n\
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }\n\
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }\n\
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }\n\
th:nth-child(-n+3), td:nth-child(-n+3) { text-align: left; }\n\
svg { display: block; margin: 1.5em 0; }\n\
svg .title { font-size: 15px; font-weight: bold; }\n\
svg .label, svg .value, svg .tick, svg .axis { font-size: 12px; }\n\
.legend span { display: inline-block; margin-right: 1.2em; }\n\
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }\n\
</style>\n</head>\n<body>\n<h1>Domino benchmark report</h1>\n",
    );
    s.push_str(&format!("<p>{} report(s), {} row(s). Schema {}.</p>\n", reports.len(), rows.len(), escape(SCHEMA)));
    s.push_str("<p class=\"legend\">");
    for (i, m) in modes.iter().enumerate() {
        s.push_str(&format!("<span><span class=\"swatch\" style=\"background: {}\"></span>{}</span>", COLORS[i % COLORS.len()], escape(m)));
    }
    s.push_str("</p>\n");
    for (id, title, axis) in METRICS {
        s.push_str(&svg_chart(id, title, axis, &rows, &modes));
    }
    s.push_str("<h2>Table</h2>\n<table>\n<tr>");
    for h in ["machine", "adapter", "mode", "decode tok/s", "min", "max", "prefill tok/s", "TTFT ms", "speedup", "mean acceptance", "draft s", "verify s", "head share", "roofline", "read roofline", "copy GB/s", "est. GPU MiB"] {
        s.push_str(&format!("<th>{}</th>", escape(h)));
    }
    s.push_str("</tr>\n");
    for r in &rows {
        let m = &r.m;
        let cells = [
            r.machine.clone(),
            r.adapter.clone(),
            r.mode.clone(),
            format!("{:.2}", m.decode_tokens_per_s),
            format!("{:.2}", m.decode_tokens_per_s_min),
            format!("{:.2}", m.decode_tokens_per_s_max),
            format!("{:.1}", m.prefill_tokens_per_s),
            format!("{:.1}", m.time_to_first_token_s * 1e3),
            format!("{:.2}x", m.speedup_over_plain),
            format!("{:.2}", m.mean_acceptance),
            format!("{:.3}", m.draft_seconds),
            format!("{:.3}", m.verify_seconds),
            format!("{:.1}%", 100.0 * m.head_share),
            format!("{:.3}", m.roofline_ratio),
            format!("{:.3}", m.read_roofline_ratio),
            format!("{:.2}", r.copy_bandwidth_gb_s),
            format!("{:.1}", m.peak_gpu_memory_bytes as f64 / (1u64 << 20) as f64),
        ];
        s.push_str("<tr>");
        for c in cells {
            s.push_str(&format!("<td>{}</td>", escape(&c)));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n<h2>Machines and adapters</h2>\n");
    for r in reports {
        let w = &r.workload;
        s.push_str(&format!(
            "<h3>{}</h3>\n<p>CPU: {}. Runner: {}, domino {}. Model {} ({}){}; prompts: {} ({} prompt(s), {:?} tokens), {} tokens per run, {} run(s).</p>\n<ul>\n",
            escape(&machine_label(r)),
            escape(r.machine.cpu.as_deref().unwrap_or("unknown")),
            escape(&r.runner),
            escape(&r.domino_version),
            escape(&w.model),
            escape(&w.dtype),
            w.drafter.as_deref().map(|d| format!(", drafter {}", escape(d))).unwrap_or_default(),
            escape(&w.prompt_source),
            w.prompt_tokens.len(),
            w.prompt_tokens,
            w.max_tokens,
            w.runs,
        ));
        for a in &r.adapters {
            let f = &a.adapter;
            s.push_str(&format!(
                "<li>{} ({}, {}, vendor {} 0x{:04x}, device 0x{:04x}), driver {} {}; features: {}; storage binding {} MiB, buffer {} MiB, workgroup storage {} KiB, {} invocations/workgroup, {} storage buffers/stage; copy bandwidth {:.2} GB/s.</li>\n",
                escape(&f.name),
                escape(&f.backend),
                escape(&f.device_type),
                escape(&f.vendor_name),
                f.vendor,
                f.device,
                escape(&f.driver),
                escape(&f.driver_info),
                escape(&if f.features.is_empty() { "none".to_string() } else { f.features.join(", ") }),
                f.max_storage_buffer_binding_size >> 20,
                f.max_buffer_size >> 20,
                f.max_compute_workgroup_storage_size >> 10,
                f.max_compute_invocations_per_workgroup,
                f.max_storage_buffers_per_shader_stage,
                a.copy_bandwidth_gb_s,
            ));
        }
        s.push_str("</ul>\n");
    }
    s.push_str("<p>GPU memory figures are estimates from buffer sizes (weights + KV cache, + drafter weights for speculative modes).</p>\n</body>\n</html>\n");
    s
}
