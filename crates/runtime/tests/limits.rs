//! Memory limits before work and device loss, on every test backend (Vulkan and GL software
//! adapters):
//! - `check_memory` sizes weights, KV cache, drafter and scratch from the headers and refuses a
//!   request over the adapter's binding limit or memory budget with one line naming both;
//! - with the adapter's binding limit forced small (the device enforces it), a context that fits
//!   the plan loads and runs, and one that does not is refused before anything is uploaded;
//! - a destroyed device fails the running generation with a clear error, and a new device runs the
//!   same generation again in the same process.

use domino_engine::testing::test_backends;
use domino_engine::{DTypeChoice, Gpu, GpuOptions, WeightFormat};
use domino_models::drafter::DrafterConfig;
use domino_models::testing::{write_tiny_drafter, write_tiny_model, TinyDrafterSpec, TinySpec};
use domino_models::{open_model, Qwen3Model};
use domino_runtime::{check_memory, GenerateOptions, MemoryLimits, MemoryRequest, RuntimeError, Session};
use pollster::block_on;

fn spec() -> TinySpec {
    TinySpec { max_position: 1 << 20, embed_scale: 4.0, ..TinySpec::default() }
}

fn unlimited() -> MemoryLimits {
    MemoryLimits { adapter: "test".into(), max_storage_binding: 1 << 40, max_buffer: 1 << 40, budget: None }
}

#[test]
fn the_plan_counts_weights_kv_cache_and_drafter_and_refuses_with_need_and_limit() {
    let s = spec();
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &s).unwrap();
    let files = open_model(dir.path()).unwrap();
    let c = &files.config;
    let req = |dtype, context| MemoryRequest { config: c, weights: files.weights.as_ref(), dtype, drafter: None, context, sequences: 1 };
    let f32_plan = check_memory(&req(DTypeChoice::Format(WeightFormat::F32), 1000), &unlimited()).unwrap();
    let f16_plan = check_memory(&req(DTypeChoice::Format(WeightFormat::F16), 1000), &unlimited()).unwrap();
    // Every matrix in f32 and f16, norms always f32.
    let (mut mats, mut vecs) = (0u64, 0u64);
    for (_, shape) in c.tensor_plan() {
        let n: u64 = shape.iter().map(|&d| d as u64).product();
        if shape.len() == 1 { vecs += n } else { mats += n }
    }
    assert_eq!(f32_plan.weights, 4 * mats + 4 * vecs);
    assert_eq!(f16_plan.weights, 2 * mats + 4 * vecs);
    let kv_layer = 1000 * (s.kv_heads * s.head_dim) as u64 * 4;
    assert_eq!(f32_plan.kv_cache, 2 * s.layers as u64 * kv_layer);
    assert_eq!(f32_plan.largest_binding, kv_layer);
    assert_eq!(f32_plan.total, f32_plan.weights + f32_plan.kv_cache + f32_plan.scratch);

    // A budget one byte short: refused, naming the need, the budget and what to change.
    let tight = MemoryLimits { budget: Some(f32_plan.total - 1), ..unlimited() };
    let e = check_memory(&req(DTypeChoice::Format(WeightFormat::F32), 1000), &tight).unwrap_err().to_string();
    assert!(matches!(check_memory(&req(DTypeChoice::Format(WeightFormat::F32), 1000), &tight), Err(RuntimeError::Memory(_))));
    assert!(e.contains("memory budget") && e.contains("--context") && e.contains("--dtype") && e.contains("KV cache for 1000 positions"), "{e}");
    assert!(!e.contains('\n'));
    // The same budget fits in f16 or with a shorter context.
    check_memory(&req(DTypeChoice::Format(WeightFormat::F16), 1000), &tight).unwrap();
    check_memory(&req(DTypeChoice::Format(WeightFormat::F32), 500), &tight).unwrap();

    // One KV buffer over the binding limit.
    let small = MemoryLimits { max_storage_binding: kv_layer - 1, ..unlimited() };
    let e = check_memory(&req(DTypeChoice::Format(WeightFormat::F16), 1000), &small).unwrap_err().to_string();
    assert!(e.contains("KV cache of one layer for 1000 positions") && e.contains("max_storage_buffer_binding_size") && e.contains("--context"), "{e}");

    // Beyond the model's positions.
    let e = check_memory(&req(DTypeChoice::Format(WeightFormat::F16), (1 << 20) + 1), &unlimited()).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings"), "{e}");

    // A drafter adds its weights and a KV cache over context + block + 1 slots.
    let ddir = tempfile::tempdir().unwrap();
    let d = TinyDrafterSpec::default();
    write_tiny_drafter(ddir.path(), &s, &d).unwrap();
    let dcfg = DrafterConfig::from_file(&ddir.path().join("config.json")).unwrap();
    let with = MemoryRequest { drafter: Some((&dcfg, WeightFormat::F16)), ..req(DTypeChoice::Format(WeightFormat::F16), 1000) };
    let p = check_memory(&with, &unlimited()).unwrap();
    let slots = 1000 + d.block_size as u64 + 1;
    assert_eq!(p.drafter_kv_cache, 2 * d.layers as u64 * slots * dcfg.kv_width() as u64 * 4);
    assert!(p.drafter_weights > 0 && p.kv_cache == 2 * s.layers as u64 * slots * (s.kv_heads * s.head_dim) as u64 * 4);
}

#[test]
fn a_forced_small_adapter_limit_is_enforced_and_checked_before_upload() {
    let s = spec();
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &s).unwrap();
    let kv_row = (s.kv_heads * s.head_dim * 4) as u64;
    for (name, backend) in test_backends() {
        let limit = 1u64 << 20;
        let gpu = block_on(Gpu::new(&GpuOptions { backend, max_binding: Some(limit), ..Default::default() })).unwrap();
        assert_eq!(gpu.caps.max_storage_binding, limit, "{name}");
        let files = open_model(dir.path()).unwrap();
        let limits = MemoryLimits::of(&gpu);
        let fits = (limit / kv_row) as usize;
        let req = |context| MemoryRequest { config: &files.config, weights: files.weights.as_ref(), dtype: DTypeChoice::Format(WeightFormat::F32), drafter: None, context, sequences: 1 };
        let e = check_memory(&req(fits + 1), &limits).unwrap_err().to_string();
        assert!(e.contains("max_storage_buffer_binding_size") && e.contains(&format!("adapter '{}'", gpu.info.name)), "{name}: {e}");
        // The largest context the plan accepts really loads and runs on the limited device.
        check_memory(&req(fits), &limits).unwrap();
        let model = Qwen3Model::load(gpu.clone(), files.config.clone(), files.weights.as_ref(), WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        let mut session = Session::new(&model, fits).unwrap();
        let g = block_on(session.generate(&[1, 2, 3], &GenerateOptions { max_tokens: 4, ignore_eos: true, ..Default::default() }, &mut |_| true)).unwrap();
        assert_eq!(g.output_ids.len(), 4, "{name}");
    }
}

#[test]
fn a_lost_device_fails_the_generation_and_a_new_device_continues() {
    let s = spec();
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &s).unwrap();
    let opts = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    let prompt = [5u32, 6, 7];
    for (name, backend) in test_backends() {
        let gpu_opts = GpuOptions { backend, ..Default::default() };
        let load = |gpu: &std::sync::Arc<Gpu>| {
            let files = open_model(dir.path()).unwrap();
            Qwen3Model::load(gpu.clone(), files.config.clone(), files.weights.as_ref(), WeightFormat::F32, &mut |_, _, _| {})
        };
        let gpu = block_on(Gpu::new(&gpu_opts)).unwrap();
        let model = load(&gpu).unwrap();
        let mut session = Session::new(&model, 64).unwrap();
        let want = block_on(session.generate(&prompt, &opts, &mut |_| true)).unwrap().output_ids;

        // Lost in the middle of a generation: the token callback destroys the device.
        let mut seen = 0;
        let e = block_on(session.generate(&prompt, &opts, &mut |_| {
            seen += 1;
            if seen == 2 {
                gpu.destroy();
            }
            true
        }))
        .unwrap_err()
        .to_string();
        assert!(e.contains("was lost") && e.contains(&gpu.info.name), "{name}: {e}");
        assert!(!e.contains('\n'));
        assert!(gpu.lost().is_some());
        // The lost device keeps failing clearly (no panic) for new sessions and loads.
        assert!(Session::new(&model, 64).err().expect("a session on a lost device").to_string().contains("was lost"), "{name}");
        assert!(load(&gpu).err().expect("a load on a lost device").to_string().contains("was lost"), "{name}");
        drop(session);
        drop(model);

        // Recovery without restarting the process: a new device, the model loaded again, same tokens.
        let gpu = block_on(Gpu::new(&gpu_opts)).unwrap();
        let model = load(&gpu).unwrap();
        let mut session = Session::new(&model, 64).unwrap();
        assert_eq!(block_on(session.generate(&prompt, &opts, &mut |_| true)).unwrap().output_ids, want, "{name}");
    }
}
