//! `domino devices`: every adapter with its backend, type, features and key limits.

use crate::CliError;
use clap::Args;
use domino_engine::{list_adapters, BackendChoice};

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// all, vulkan, metal, dx12 or gl.
    #[arg(long, default_value = "all")]
    pub backend: String,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DevicesArgs) -> Result<(), CliError> {
    let backend = BackendChoice::parse(&args.backend)?;
    let adapters: Vec<_> = pollster::block_on(list_adapters(backend)).into_iter().map(|(_, s)| s).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&adapters).unwrap_or_default());
        return Ok(());
    }
    if adapters.is_empty() {
        return Err(domino_engine::EngineError::NoAdapter { backend: args.backend }.into());
    }
    for a in adapters {
        println!("[{}] {} ({}, {})", a.index, a.name, a.backend, a.device_type);
        println!("    driver: {} {}", a.driver, a.driver_info);
        println!("    features: {}", if a.features.is_empty() { "none of shader-f16/subgroups".into() } else { a.features.join(", ") });
        println!(
            "    limits: storage binding {} MiB, buffer {} MiB, workgroup storage {} KiB, {} invocations/workgroup, {} storage buffers/stage",
            a.max_storage_buffer_binding_size >> 20,
            a.max_buffer_size >> 20,
            a.max_compute_workgroup_storage_size >> 10,
            a.max_compute_invocations_per_workgroup,
            a.max_storage_buffers_per_shader_stage
        );
        if a.name.contains("llvmpipe") {
            let threads = std::env::var(domino_engine::cpu_threads::LLVMPIPE_THREADS_VAR).unwrap_or_else(|_| "one per core".into());
            println!("    threads: {threads} ({}; domino asks two per core unless it is set)", domino_engine::cpu_threads::LLVMPIPE_THREADS_VAR);
        }
    }
    Ok(())
}
