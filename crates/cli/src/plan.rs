//! `domino plan`: record one decode step (or one R-row verify pass) with the engine's own recording
//! code, run it once, and print every dispatch: kernel and variant, workgroup size and count,
//! invocations, and the weight bytes it reads. This is how anyone sees, on any machine, how much
//! parallelism each kernel offers a GPU, without timing one.

use crate::load::{load_model, open_gpu, parse_dtype};
use crate::{model_dir, CliError};
use clap::Args;
use domino_engine::step::DispatchInfo;
use domino_engine::{SamplingConfig, Step};
use domino_models::qwen3::Forward;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model folder or GGUF file (default: the built-in tiny Qwen3).
    #[arg(long)]
    pub model: Option<String>,
    /// Kernel family: auto, cpu or gpu.
    #[arg(long, default_value = "auto")]
    pub kernels: String,
    /// Rows of the recorded pass: 1 = a decode step, R > 1 = an R-row verify pass.
    #[arg(long, default_value_t = 1)]
    pub rows: u32,
    /// Tokens the KV cache already holds when the recorded pass runs.
    #[arg(long, default_value_t = 16)]
    pub context: u32,
    /// auto, vulkan, metal, dx12 or gl.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Adapter index (as listed by `domino devices`).
    #[arg(long)]
    pub adapter: Option<usize>,
    /// Weight storage: auto, f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Plan {
    kernels: &'static str,
    adapter: String,
    rows: u32,
    context: u32,
    submissions: u32,
    total_dispatches: usize,
    total_invocations: u64,
    total_weight_bytes: u64,
    dispatches: Vec<DispatchInfo>,
}

pub fn run(args: PlanArgs) -> Result<(), CliError> {
    if args.rows == 0 {
        return Err(CliError::Usage("--rows must be at least 1".into()));
    }
    let dir = model_dir::resolve(args.model.as_deref())?;
    let gpu = open_gpu(&args.backend, args.adapter, "auto", &args.kernels)?;
    let loaded = load_model(gpu.clone(), &dir, parse_dtype(&args.dtype)?, true)?;
    let model = &loaded.model;
    let (rows, context) = (args.rows, args.context);
    let capacity = (context + rows) as usize;
    if capacity > model.config.max_position_embeddings {
        return Err(CliError::Usage(format!(
            "--context {context} + --rows {rows} exceeds the model's context of {} tokens",
            model.config.max_position_embeddings
        )));
    }
    let state = model.new_state(capacity, rows.min(64) as usize, rows as usize)?;
    // The pass reads token ids at positions context..context + rows (any valid id will do).
    gpu.write(&state.ids, context as u64, &vec![0u32; rows as usize]);
    let mut step = Step::new(&gpu);
    model.record_forward(&mut step, &state, &Forward { pos0: context, n_rows: rows, logits_from: 0, capture: None })?;
    model.record_sample(&mut step, &state, rows, &SamplingConfig::greedy(), 0, &state.out_ids, 0)?;
    let dispatches = step.plan();
    // Run it once: the plan is of a pass that really runs on this adapter.
    pollster::block_on(step.submit_and_read(&state.out_ids, 0, 4 * rows as u64))?;
    let plan = Plan {
        kernels: if gpu.caps.gpu_kernels { "gpu" } else { "cpu" },
        adapter: gpu.info.name.clone(),
        rows,
        context,
        submissions: 1,
        total_dispatches: dispatches.len(),
        total_invocations: dispatches.iter().map(|d| d.invocations).sum(),
        total_weight_bytes: dispatches.iter().map(|d| d.weight_bytes).sum(),
        dispatches,
    };
    if args.json {
        println!("{}", serde_json::to_string(&plan).map_err(|e| CliError::Usage(e.to_string()))?);
        return Ok(());
    }
    print_table(&plan);
    Ok(())
}

fn print_table(plan: &Plan) {
    let what = if plan.rows == 1 { "decode step".to_string() } else { format!("{}-row verify pass", plan.rows) };
    println!("{what} at context {} on {} ({} kernels)", plan.context, plan.adapter, plan.kernels);
    println!("{:<28} {:<12} {:<40} {:>12} {:>18} {:>12} {:>12}", "label", "kernel", "variant", "wg size", "workgroups", "invocations", "weight B");
    let dims = |v: [u32; 3]| format!("{}x{}x{}", v[0], v[1], v[2]);
    for d in &plan.dispatches {
        println!(
            "{:<28} {:<12} {:<40} {:>12} {:>18} {:>12} {:>12}",
            d.label,
            d.kernel,
            d.variant,
            dims(d.workgroup_size),
            dims(d.workgroups),
            d.invocations,
            d.weight_bytes
        );
    }
    println!(
        "total: {} dispatches in {} submission, {} invocations, {:.1} MB of weights",
        plan.total_dispatches,
        plan.submissions,
        plan.total_invocations,
        plan.total_weight_bytes as f64 / 1e6
    );
}
