//! Load a Qwen3 model folder, open a GPU, and generate 16 tokens greedily, printing each token id as
//! it arrives and then the decoded text and statistics.
//!
//!   cargo run --release -p domino-examples --example generate                    # tiny random model
//!   cargo run --release -p domino-examples --example generate -- MODEL_DIR "Hello"
//!
//! MODEL_DIR is a Hugging Face-format folder (config.json, *.safetensors, tokenizer.json). Without it
//! the example writes the built-in tiny random Qwen3 into a temporary folder first.

use domino_engine::{Gpu, GpuOptions, SamplingConfig, WeightFormat};
use domino_models::config::generation_eos;
use domino_models::tokenizer::TextTokenizer;
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use domino_runtime::{GenerateOptions, Session};
use std::io::Write;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Keep the temporary folder alive until the end of main (the checkpoint is memory-mapped).
    let mut _tmp = None;
    let dir: PathBuf = match args.first() {
        Some(d) => PathBuf::from(d),
        None => {
            let t = tempfile::tempdir()?;
            domino_models::testing::write_tiny_model(t.path(), &domino_models::testing::TinySpec::default())?;
            let p = t.path().to_path_buf();
            _tmp = Some(t);
            p
        }
    };
    let prompt = args.get(1).map(String::as_str).unwrap_or("Hello");

    // 1. A device: the first adapter (real GPUs before software ones), variants picked from its features.
    let gpu = pollster::block_on(Gpu::new(&GpuOptions::default()))?;
    println!("adapter: {} ({})", gpu.info.name, gpu.info.backend);

    // 2. The model: strict config.json, memory-mapped safetensors, weights uploaded as f16.
    let config = Qwen3Config::from_file(&dir.join("config.json"))?;
    let checkpoint = Checkpoint::open(&dir)?;
    let model = Qwen3Model::load(gpu.clone(), config, &checkpoint, WeightFormat::F16, &mut |_done, _total, _name| {})?;
    let tokenizer = TextTokenizer::from_dir(&dir)?;

    // 3. Stop tokens from config.json, generation_config.json and tokenizer_config.json.
    let mut stop_ids = model.config.eos_token_ids.clone();
    stop_ids.extend(generation_eos(&dir)?);
    stop_ids.extend(tokenizer.eos_token_ids());

    // 4. A session (its KV cache holds prompt + new tokens) and a greedy generation of 16 tokens.
    let prompt_ids = tokenizer.encode(prompt)?;
    let max_tokens = 16;
    let mut session = Session::new(&model, prompt_ids.len() + max_tokens)?;
    let opts = GenerateOptions { max_tokens, sampling: SamplingConfig::greedy(), ignore_eos: false, stop_ids };
    print!("prompt {prompt:?} = {prompt_ids:?}\ntokens:");
    let generation = pollster::block_on(session.generate(&prompt_ids, &opts, &mut |id| {
        print!(" {id}");
        let _ = std::io::stdout().flush();
        true // return false to stop early
    }))?;
    println!();
    println!("text: {:?}", tokenizer.decode(&generation.output_ids)?);
    let s = &generation.stats;
    println!(
        "stop: {:?}; {} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s",
        generation.stop_reason, s.prompt_tokens, s.prefill_tokens_per_s, s.generated_tokens, s.decode_tokens_per_s
    );
    Ok(())
}
