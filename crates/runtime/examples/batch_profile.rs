//! Time one continuous-batching decode step at batch sizes 1, 2, 4, 8 and 16 (the server's step):
//!
//!     cargo run --release -p domino-runtime --example batch_profile -- MODEL.gguf|DIR [vulkan|gl] [steps] [auto|cpu|gpu] [uniform|storage] [stored|f32|f16] [prompt_len] [batches, e.g. 1,8]
//!
//! Prints the mean step time and the tokens per second it implies for each batch size, so the
//! scaling of `domino serve` can be read without HTTP in the way. The last argument picks how the
//! CPU family reads matmul inputs (`GpuOptions::uniform_inputs`), to compare both in one sitting.

use domino_engine::{BackendChoice, DTypeChoice, Gpu, GpuOptions, KernelChoice};
use domino_models::{open_model, Qwen3Model};
use domino_engine::testing::process_cpu_seconds;
use domino_runtime::clock::now;
use domino_runtime::{Batcher, GenerateOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As `domino` does (LP_NUM_THREADS set by the caller wins, so both counts can be compared).
    domino_engine::cpu_threads::oversubscribe_cpu_adapter();
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: batch_profile MODEL [backend] [steps] [auto|cpu|gpu] [uniform|storage]")?;
    let backend = BackendChoice::parse(args.get(2).map(String::as_str).unwrap_or("vulkan"))?;
    let steps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(24);
    let kernels = KernelChoice::parse(args.get(4).map(String::as_str).unwrap_or("auto")).map_err(|_| "kernels: auto, cpu or gpu")?;
    let uniform_inputs = match args.get(5).map(String::as_str) {
        None | Some("uniform") => None,
        Some("storage") => Some(false),
        Some(_) => return Err("inputs: uniform or storage".into()),
    };
    let dtype = match args.get(6).map(String::as_str) {
        None | Some("stored") => DTypeChoice::AsStored,
        Some("f32") => DTypeChoice::Format(domino_engine::WeightFormat::F32),
        Some("f16") => DTypeChoice::Format(domino_engine::WeightFormat::F16),
        Some(_) => return Err("dtype: stored, f32 or f16".into()),
    };
    // Context each sequence decodes after (attention reads this many keys and more).
    let prompt_len: u32 = args.get(7).and_then(|s| s.parse().ok()).unwrap_or(4);
    // Batch sizes to time, comma-separated (the first is the baseline of the speedups).
    let batches: Vec<usize> = match args.get(8) {
        Some(list) => list.split(',').map(|b| b.parse().map_err(|_| format!("batch sizes: {list}"))).collect::<Result<_, _>>()?,
        None => vec![1, 2, 4, 8, 16],
    };
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend, kernels, uniform_inputs, ..Default::default() }))?;
    let files = open_model(std::path::Path::new(path))?;
    let model = Qwen3Model::load_with(gpu, files.config, files.weights.as_ref(), dtype, &mut |_, _, _| {})?;
    let mut one = None::<f64>;
    for b in batches {
        let mut batcher = Batcher::new(&model, b, prompt_len as usize + steps + 64 + (b * prompt_len as usize).div_ceil(8), 64)?;
        // Enough tokens that no sequence ends while the others' prompts are still prefilling.
        let prefill_steps = (b * prompt_len as usize).div_ceil(8);
        let opts = GenerateOptions { max_tokens: steps + 8 + prefill_steps, ignore_eos: true, ..Default::default() };
        for i in 0..b {
            batcher.admit((0..prompt_len).map(|t| 1 + i as u32 + t).collect(), opts.clone())?;
        }
        // Prefill and warm up, then time decode steps with every slot generating.
        while batcher.last_step().prefill_rows > 0 || batcher.last_step().decode_rows < b {
            pollster::block_on(batcher.step())?;
        }
        let (t0, cpu0) = (now(), process_cpu_seconds());
        for _ in 0..steps {
            pollster::block_on(batcher.step())?;
        }
        let step = (now() - t0) / steps as f64;
        let cpu = process_cpu_seconds().zip(cpu0).map(|(b, a)| (b - a) / steps as f64);
        let tps = b as f64 / step;
        let speedup = one.map(|o| tps / o).unwrap_or(1.0);
        one.get_or_insert(tps);
        let cpu = cpu.map(|c| format!(", {:.1} ms CPU time per step", c * 1e3)).unwrap_or_default();
        println!("batch {b:>2}: {:.2} ms per step, {tps:.1} tok/s ({speedup:.2}x batch 1){cpu}", step * 1e3);
    }
    Ok(())
}
