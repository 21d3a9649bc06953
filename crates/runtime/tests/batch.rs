//! Continuous batching: every request's tokens, greedy or seeded, equal what `Session::generate`
//! gives for it alone, whatever runs beside it (requests joining mid-flight, slots reused, prompts
//! longer than one step's rows, a quantized model with separate q/k/v dtypes), on every adapter
//! configuration; cancellation frees a slot at once; bad requests are refused before they take one.

use domino_engine::testing::test_gpus;
use domino_engine::{DTypeChoice, HostDType, SamplingConfig, WeightFormat};
use domino_models::testing::{write_tiny_model, TinySpec};
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use domino_runtime::{BatchEvent, Batcher, GenerateOptions, RuntimeError, SequenceId, Session, StopReason};
use pollster::block_on;
use std::collections::HashMap;

fn load(spec: &TinySpec) -> (tempfile::TempDir, Qwen3Config, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    let config = Qwen3Config::from_file(&dir.path().join("config.json")).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    (dir, config, ckpt)
}

/// Eight requests: short and long prompts (one longer than a step's 64 rows), greedy and sampled.
fn requests(vocab: u32) -> Vec<(Vec<u32>, GenerateOptions)> {
    (0..8u32)
        .map(|i| {
            let len = [3, 9, 1, 17, 100, 5, 33, 2][i as usize];
            let prompt = (0..len).map(|j| (j * 37 + i * 11 + 1) % vocab).collect();
            let sampling = if i % 3 == 1 {
                SamplingConfig { temperature: 0.9, top_k: 0, top_p: 0.95, seed: 1000 + i as u64 }
            } else {
                SamplingConfig::greedy()
            };
            (prompt, GenerateOptions { max_tokens: 12 + i as usize, sampling, ignore_eos: true, stop_ids: vec![] })
        })
        .collect()
}

/// Runs `reqs` through a batcher of `slots` slots, admitting request i after step `join[i]` (or as
/// soon as a slot is free after that); returns each request's tokens and checks the stream.
fn run_batched(model: &Qwen3Model, slots: usize, reqs: &[(Vec<u32>, GenerateOptions)], join: &[usize]) -> Vec<Vec<u32>> {
    let mut batcher = Batcher::new(model, slots, 160, 64).unwrap();
    let mut ids: Vec<Option<SequenceId>> = vec![None; reqs.len()];
    let mut streamed: HashMap<SequenceId, Vec<u32>> = HashMap::new();
    let mut done: HashMap<SequenceId, Vec<u32>> = HashMap::new();
    let mut steps = 0;
    while done.len() < reqs.len() {
        for (i, (prompt, opts)) in reqs.iter().enumerate() {
            if ids[i].is_none() && join[i] <= steps && batcher.has_free_slot() {
                ids[i] = Some(batcher.admit(prompt.clone(), opts.clone()).unwrap());
            }
        }
        for e in block_on(batcher.step()).unwrap() {
            match e {
                BatchEvent::Token { id, token } => streamed.entry(id).or_default().push(token),
                BatchEvent::Finished { id, generation } => {
                    assert_eq!(generation.stop_reason, StopReason::MaxTokens);
                    assert_eq!(streamed.get(&id).cloned().unwrap_or_default(), generation.output_ids, "streamed tokens = final tokens");
                    done.insert(id, generation.output_ids);
                }
            }
        }
        steps += 1;
        assert!(steps < 500, "batcher made no progress");
    }
    assert!(batcher.is_idle());
    ids.iter().map(|id| done[&id.unwrap()].clone()).collect()
}

fn alone(model: &Qwen3Model, reqs: &[(Vec<u32>, GenerateOptions)]) -> Vec<Vec<u32>> {
    let mut session = Session::new(model, 160).unwrap();
    reqs.iter().map(|(p, o)| block_on(session.generate(p, o, &mut |_| true)).unwrap().output_ids).collect()
}

#[test]
fn batched_requests_equal_each_request_alone() {
    let spec = TinySpec { embed_scale: 4.0, seed: 31, ..TinySpec::default() };
    let (_dir, config, ckpt) = load(&spec);
    let reqs = requests(config.vocab_size as u32);
    for (name, gpu) in &test_gpus() {
        for format in [WeightFormat::F32, WeightFormat::F16] {
            let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, format, &mut |_, _, _| {}).unwrap();
            let want = alone(&model, &reqs);
            // All eight at once; then staggered joins; then four slots reused by eight requests.
            assert_eq!(run_batched(&model, 8, &reqs, &[0; 8]), want, "{name} {format:?}: 8 at once");
            assert_eq!(run_batched(&model, 8, &reqs, &[0, 3, 3, 5, 0, 9, 1, 20]), want, "{name} {format:?}: staggered");
            assert_eq!(run_batched(&model, 4, &reqs, &[0; 8]), want, "{name} {format:?}: 4 slots");
        }
    }
}

/// Slots are split over several KV pools where one pool buffer would pass the adapter's binding
/// limit: here 4 slots of 160 positions per pool, 8 slots in 2 pools, so a step's segments span two
/// pools (one RoPE and one attention dispatch per pool). Tokens still equal each request alone.
#[test]
fn kv_pools_split_at_the_binding_limit_stay_exact() {
    let spec = TinySpec { embed_scale: 4.0, seed: 33, ..TinySpec::default() };
    let (_dir, config, ckpt) = load(&spec);
    let reqs = requests(config.vocab_size as u32);
    let slot_bytes = (160 * config.kv_width() * 4) as u64;
    for (name, backend) in domino_engine::testing::test_backends() {
        let opts = domino_engine::GpuOptions { backend, max_binding: Some(4 * slot_bytes + slot_bytes / 2), ..Default::default() };
        let gpu = block_on(domino_engine::Gpu::new(&opts)).unwrap_or_else(|e| panic!("GPU test adapter '{name}' is required: {e}"));
        let model = Qwen3Model::load(gpu, config.clone(), &ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        let state = model.new_batch_state(8, 160, 64).unwrap();
        let pools = state.slots.iter().filter(|s| s.kv_base == 0).count();
        assert_eq!(pools, 2, "{name}: 8 slots of {slot_bytes} bytes under a limit of 4.5 slots");
        drop(state);
        let want = alone(&model, &reqs);
        assert_eq!(run_batched(&model, 8, &reqs, &[0; 8]), want, "{name}: 8 at once over 2 pools");
        assert_eq!(run_batched(&model, 8, &reqs, &[0, 3, 3, 5, 0, 9, 1, 20]), want, "{name}: staggered over 2 pools");
    }
}

#[test]
fn batched_quantized_model_with_separate_qkv_equals_alone() {
    // Q8_0 at load quantizes q/k/v alike (fused); a GGUF with mixed types takes the separate path,
    // covered by writing one with the engine's own writer.
    let spec = TinySpec { embed_scale: 4.0, seed: 32, hidden: 64, ..TinySpec::default() };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.gguf");
    let q8 = HostDType::Quant(domino_engine::QuantType::Q8_0);
    domino_models::gguf_writer::write_tiny_gguf_with(&path, &spec, &|name| if name.contains("v_proj") { HostDType::F32 } else { q8 }).unwrap();
    let files = domino_models::open_model(&path).unwrap();
    let reqs = requests(files.config.vocab_size as u32);
    for (name, gpu) in &test_gpus() {
        let model = Qwen3Model::load_with(gpu.clone(), files.config.clone(), files.weights.as_ref(), DTypeChoice::AsStored, &mut |_, _, _| {}).unwrap();
        assert!(matches!(model.layers[0].qkv, domino_models::qwen3::QkvWeights::Separate { .. }), "the mixed file must load q/k/v separately");
        let want = alone(&model, &reqs);
        assert_eq!(run_batched(&model, 8, &reqs, &[0, 1, 2, 3, 4, 5, 6, 7]), want, "{name}: mixed-type q/k/v");
    }
}

#[test]
fn cancel_frees_the_slot_and_bad_requests_are_refused() {
    let (_dir, config, ckpt) = load(&TinySpec { embed_scale: 4.0, ..TinySpec::default() });
    let (_, gpu) = &test_gpus()[0];
    let model = Qwen3Model::load(gpu.clone(), config, &ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
    let mut batcher = Batcher::new(&model, 2, 32, 64).unwrap();
    let opts = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    // Over the context: refused before taking a slot.
    let err = batcher.admit(vec![1; 30], opts.clone()).unwrap_err();
    assert!(matches!(err, RuntimeError::ContextOverflow { .. }), "{err}");
    assert!(matches!(batcher.admit(vec![], opts.clone()).unwrap_err(), RuntimeError::EmptyPrompt));
    let a = batcher.admit(vec![1, 2, 3], opts.clone()).unwrap();
    let _b = batcher.admit(vec![4, 5], opts.clone()).unwrap();
    assert!(!batcher.has_free_slot());
    assert!(batcher.admit(vec![6], opts.clone()).is_err(), "no free slot");
    block_on(batcher.step()).unwrap();
    let g = batcher.cancel(a).unwrap();
    assert_eq!(g.stop_reason, StopReason::Cancelled);
    assert_eq!(g.output_ids.len(), 1);
    assert!(batcher.has_free_slot());
    // The freed slot serves a new request whose output equals the request alone.
    let c = batcher.admit(vec![7, 8, 9], opts.clone()).unwrap();
    let mut got = Vec::new();
    while !batcher.is_idle() {
        for e in block_on(batcher.step()).unwrap() {
            if let BatchEvent::Token { id, token } = e {
                if id == c {
                    got.push(token);
                }
            }
        }
    }
    let mut session = Session::new(&model, 32).unwrap();
    assert_eq!(got, block_on(session.generate(&[7, 8, 9], &opts, &mut |_| true)).unwrap().output_ids);
    // max_tokens 0 finishes without work.
    let z = batcher.admit(vec![1], GenerateOptions { max_tokens: 0, ..opts }).unwrap();
    let ev = block_on(batcher.step()).unwrap();
    assert!(matches!(&ev[..], [BatchEvent::Finished { id, generation }] if *id == z && generation.output_ids.is_empty()));
}

/// Runs one request through `batcher` to the end; returns its tokens and its cached prompt tokens.
fn run_one(batcher: &mut Batcher, prompt: &[u32], opts: &GenerateOptions) -> (Vec<u32>, usize) {
    let id = batcher.admit(prompt.to_vec(), opts.clone()).unwrap();
    let cached = batcher.cached_prompt_tokens(id).unwrap();
    loop {
        for e in block_on(batcher.step()).unwrap() {
            if let BatchEvent::Finished { id: done, generation } = e {
                if done == id {
                    assert_eq!(generation.stats.cached_prompt_tokens, cached);
                    return (generation.output_ids, cached);
                }
            }
        }
    }
}

#[test]
fn prefix_cache_reuses_common_prefixes_and_stays_exact() {
    let spec = TinySpec { embed_scale: 4.0, seed: 33, ..TinySpec::default() };
    let (_dir, config, ckpt) = load(&spec);
    let vocab = config.vocab_size as u32;
    let greedy = GenerateOptions { max_tokens: 10, ignore_eos: true, ..Default::default() };
    let sampled = GenerateOptions { sampling: SamplingConfig { temperature: 0.8, top_k: 0, top_p: 0.9, seed: 7 }, ..greedy.clone() };
    let first: Vec<u32> = (0..20).map(|j| (j * 13 + 5) % vocab).collect();
    for (name, gpu) in &test_gpus() {
        for format in [WeightFormat::F32, WeightFormat::F16] {
            let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, format, &mut |_, _, _| {}).unwrap();
            let mut session = Session::new(&model, 160).unwrap();
            let mut solo = |p: &[u32], o: &GenerateOptions| block_on(session.generate(p, o, &mut |_| true)).unwrap().output_ids;
            let mut batcher = Batcher::new(&model, 2, 160, 64).unwrap();
            batcher.set_prefix_cache(true);
            let ctx = format!("{name} {format:?}");

            let (out, cached) = run_one(&mut batcher, &first, &greedy);
            assert_eq!((out.clone(), cached), (solo(&first, &greedy), 0), "{ctx}: cold");
            // A second turn: the first prompt, its reply, and more. All but the reply's last token
            // (never fed back) are cached.
            let turn2: Vec<u32> = first.iter().chain(&out).copied().chain([3, 1, 4, 1, 5]).collect();
            let (out2, cached) = run_one(&mut batcher, &turn2, &sampled);
            assert_eq!(cached, first.len() + out.len() - 1, "{ctx}: second turn");
            assert_eq!(out2, solo(&turn2, &sampled), "{ctx}: second turn tokens");
            // The same prompt again: everything but its last token, whose logits are needed.
            let (again, cached) = run_one(&mut batcher, &first, &greedy);
            assert_eq!((again, cached), (out.clone(), first.len() - 1), "{ctx}: repeated prompt");
            // A shared head only (a system prompt), then a different tail.
            let branch: Vec<u32> = first[..12].iter().copied().chain([9, 9, 2, 6]).collect();
            let (out3, cached) = run_one(&mut batcher, &branch, &greedy);
            assert_eq!((out3, cached), (solo(&branch, &greedy), 12), "{ctx}: shared head");

            // Cancelled in the middle of its prefill (100 rows take two steps): the prefilled rows
            // are reusable, the rest is computed.
            let long: Vec<u32> = (0..100).map(|j| (j * 7 + 2) % vocab).collect();
            let id = batcher.admit(long.clone(), greedy.clone()).unwrap();
            block_on(batcher.step()).unwrap();
            batcher.cancel(id).unwrap();
            let (out4, cached) = run_one(&mut batcher, &long, &greedy);
            assert_eq!((out4, cached), (solo(&long, &greedy), 64), "{ctx}: after a cancelled prefill");

            // Off: nothing is reused.
            batcher.set_prefix_cache(false);
            let (again, cached) = run_one(&mut batcher, &first, &greedy);
            assert_eq!((again, cached), (out, 0), "{ctx}: cache off");
        }
    }
}

#[test]
fn warm_up_leaves_the_batcher_idle_with_nothing_cached() {
    let spec = TinySpec { embed_scale: 4.0, seed: 35, ..TinySpec::default() };
    let (_dir, config, ckpt) = load(&spec);
    let greedy = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
    // Starts like the warm-up's prompts (token 0s): a kept warm-up row would be reused.
    let prompt = vec![0, 0, 0, 7, 3];
    for (name, gpu) in &test_gpus() {
        let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        let expected = block_on(Session::new(&model, 64).unwrap().generate(&prompt, &greedy, &mut |_| true)).unwrap().output_ids;
        let mut batcher = Batcher::new(&model, 4, 64, 64).unwrap();
        batcher.set_prefix_cache(true);
        block_on(batcher.warm_up()).unwrap();
        assert!(batcher.is_idle(), "{name}: idle after the warm-up");
        assert_eq!(run_one(&mut batcher, &prompt, &greedy), (expected, 0), "{name}: same tokens, nothing cached from the warm-up");
        // The cache still works afterwards.
        assert_eq!(run_one(&mut batcher, &prompt, &greedy).1, prompt.len() - 1, "{name}: cache on after the warm-up");
        // Not while sequences run.
        batcher.admit(prompt.clone(), greedy.clone()).unwrap();
        assert!(block_on(batcher.warm_up()).is_err(), "{name}: warm-up of a busy batcher");
    }
}

#[test]
fn prefix_cache_keeps_concurrent_requests_exact() {
    // Eight requests, four of which repeat another's prompt, through 4 reused slots.
    let spec = TinySpec { embed_scale: 4.0, seed: 34, ..TinySpec::default() };
    let (_dir, config, ckpt) = load(&spec);
    let mut reqs = requests(config.vocab_size as u32);
    for i in 4..8 {
        reqs[i].0 = reqs[i - 4].0.iter().copied().chain([i as u32]).collect();
    }
    for (name, gpu) in &test_gpus() {
        let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        let want = alone(&model, &reqs);
        let mut batcher = Batcher::new(&model, 4, 160, 64).unwrap();
        batcher.set_prefix_cache(true);
        let mut ids = Vec::new();
        let mut done: HashMap<SequenceId, (Vec<u32>, usize)> = HashMap::new();
        let mut next = 0;
        while done.len() < reqs.len() {
            while next < reqs.len() && batcher.has_free_slot() {
                ids.push(batcher.admit(reqs[next].0.clone(), reqs[next].1.clone()).unwrap());
                next += 1;
            }
            for e in block_on(batcher.step()).unwrap() {
                if let BatchEvent::Finished { id, generation } = e {
                    done.insert(id, (generation.output_ids, generation.stats.cached_prompt_tokens));
                }
            }
        }
        let got: Vec<Vec<u32>> = ids.iter().map(|id| done[id].0.clone()).collect();
        assert_eq!(got, want, "{name}");
        let cached: usize = done.values().map(|d| d.1).sum();
        assert!(cached > 0, "{name}: the repeated prompts must hit the cache");
    }
}

#[test]
fn requests_sharing_a_head_compute_it_once_and_stay_exact() {
    // Eight requests arriving together with one 30-token head (a system prompt), then their own
    // tails; and one joining later whose prompt continues a running sequence's prompt and output.
    let spec = TinySpec { embed_scale: 4.0, seed: 35, ..TinySpec::default() };
    let (_dir, config, ckpt) = load(&spec);
    let vocab = config.vocab_size as u32;
    let head: Vec<u32> = (0..30).map(|j| (j * 11 + 3) % vocab).collect();
    let mut reqs: Vec<(Vec<u32>, GenerateOptions)> = (0..8u32)
        .map(|i| {
            let prompt = head.iter().copied().chain((0..=i % 4).map(|j| (i * 17 + j * 5 + 1) % vocab)).collect();
            let sampling = if i % 2 == 1 { SamplingConfig { temperature: 0.9, top_k: 0, top_p: 0.95, seed: 50 + i as u64 } } else { SamplingConfig::greedy() };
            (prompt, GenerateOptions { max_tokens: 10 + i as usize, sampling, ignore_eos: true, stop_ids: vec![] })
        })
        .collect();
    for (name, gpu) in &test_gpus() {
        for format in [WeightFormat::F32, WeightFormat::F16] {
            let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, format, &mut |_, _, _| {}).unwrap();
            let ctx = format!("{name} {format:?}");
            let mut batcher = Batcher::new(&model, 9, 160, 64).unwrap();
            batcher.set_prefix_cache(true);
            let mut ids: Vec<SequenceId> = reqs[..8].iter().map(|(p, o)| batcher.admit(p.clone(), o.clone()).unwrap()).collect();
            let mut streamed: HashMap<SequenceId, Vec<u32>> = HashMap::new();
            let mut done: HashMap<SequenceId, (Vec<u32>, usize)> = HashMap::new();
            let (mut prefill_rows, mut steps) = (0, 0);
            let mut late: Option<Vec<u32>> = None;
            while done.len() < ids.len() {
                for e in block_on(batcher.step()).unwrap() {
                    match e {
                        BatchEvent::Token { id, token } => streamed.entry(id).or_default().push(token),
                        BatchEvent::Finished { id, generation } => {
                            done.insert(id, (generation.output_ids, generation.stats.cached_prompt_tokens));
                        }
                    }
                }
                prefill_rows += batcher.last_step().prefill_rows;
                steps += 1;
                // Once request 0 has 4 tokens, a request continuing its prompt and 3 of them joins.
                if late.is_none() && streamed.get(&ids[0]).is_some_and(|t| t.len() >= 4) {
                    let prompt: Vec<u32> = reqs[0].0.iter().chain(&streamed[&ids[0]][..3]).copied().chain([7]).collect();
                    ids.push(batcher.admit(prompt.clone(), reqs[0].1.clone()).unwrap());
                    late = Some(prompt);
                }
                assert!(steps < 200, "{ctx}: no progress");
            }
            if reqs.len() == 8 {
                reqs.push((late.clone().unwrap(), reqs[0].1.clone()));
            }
            let want = alone(&model, &reqs);
            let got: Vec<Vec<u32>> = ids.iter().map(|id| done[id].0.clone()).collect();
            assert_eq!(got, want, "{ctx}: shared heads change no output");
            // The head is computed once; the others copy it (their last prompt token is always computed).
            for id in &ids[1..8] {
                assert_eq!(done[id].1, 30, "{ctx}: request {id} copies the 30-token head");
            }
            assert_eq!(done[&ids[8]].1, reqs[8].0.len() - 1, "{ctx}: the late request copies all but its last token");
            let prompt_rows: usize = reqs.iter().map(|r| r.0.len()).sum();
            let cached: usize = done.values().map(|d| d.1).sum();
            assert_eq!(prefill_rows, prompt_rows - cached, "{ctx}: only uncached rows are prefilled");
        }
    }
}
