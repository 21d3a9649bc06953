//! Speculative decoding on the GPU: lossless against target-only greedy decoding, drafts identical to
//! the CPU reference drafter round by round, constructed always-accept pairs, and mismatch errors.

use domino_engine::testing::test_gpus;
use domino_engine::{Gpu, WeightFormat};
use domino_models::drafter::{DrafterConfig, DrafterKind};
use domino_models::drafter_gpu::DrafterModel;
use domino_models::drafter_reference::{speculative_greedy, ReferenceDrafter};
use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_drafter, write_tiny_model, TinyDrafterSpec, TinySpec};
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use domino_runtime::lookup::LookupScheduler;
use domino_runtime::{DraftLen, GenerateOptions, RoundCosts, Session, SpeculativeOptions, SpeculativeSession};
use pollster::block_on;
use std::sync::Arc;

struct Pair {
    _dir: tempfile::TempDir,
    target_cfg: Qwen3Config,
    target_ckpt: Checkpoint,
    drafter_cfg: DrafterConfig,
    drafter_ckpt: Checkpoint,
}

fn pair(target: &TinySpec, drafter: &TinyDrafterSpec) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let (t, d) = (dir.path().join("target"), dir.path().join("drafter"));
    write_tiny_model(&t, target).unwrap();
    write_tiny_drafter(&d, target, drafter).unwrap();
    Pair {
        target_cfg: Qwen3Config::from_file(&t.join("config.json")).unwrap(),
        target_ckpt: Checkpoint::open(&t).unwrap(),
        drafter_cfg: DrafterConfig::from_file(&d.join("config.json")).unwrap(),
        drafter_ckpt: Checkpoint::open(&d).unwrap(),
        _dir: dir,
    }
}

fn target_spec() -> TinySpec {
    TinySpec { embed_scale: 4.0, ..TinySpec::default() }
}

fn load(gpu: &Arc<Gpu>, p: &Pair) -> (Qwen3Model, DrafterModel) {
    let target = Qwen3Model::load(gpu.clone(), p.target_cfg.clone(), &p.target_ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
    let drafter = DrafterModel::load(p.drafter_cfg.clone(), &p.drafter_ckpt, &target, WeightFormat::F32).unwrap();
    (target, drafter)
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, ..Default::default() }
}

#[test]
fn speculative_greedy_is_lossless_and_matches_the_cpu_reference() {
    let gpus = test_gpus();
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[100, 7, 250, 31, 31, 9, 44], &[300]];
    for kind in [DrafterKind::DFlash, DrafterKind::Domino] {
        for block in [2usize, 4, 8, 16] {
            if kind == DrafterKind::DFlash && block < 2 {
                continue;
            }
            let dspec = TinyDrafterSpec { kind, block_size: block, seed: 200 + block as u64, ..TinyDrafterSpec::default() };
            let p = pair(&target_spec(), &dspec);
            let ref_target = ReferenceModel::load(p.target_cfg.clone(), &p.target_ckpt, false).unwrap();
            for use_head in [true, false] {
                if kind == DrafterKind::DFlash && !use_head {
                    continue;
                }
                let mut ref_drafter = ReferenceDrafter::load(p.drafter_cfg.clone(), &p.drafter_ckpt, &ref_target, false).unwrap();
                for (name, gpu) in &gpus {
                    let (target, drafter) = load(gpu, &p);
                    let mut plain = Session::new(&target, 64).unwrap();
                    let mut spec = SpeculativeSession::new(&target, &drafter, 64).unwrap();
                    // The GPU kernel family is 20x slower than the others on CPU rasterizers (it is
                    // shaped for real GPUs): the longest prompt and two lengths there.
                    let (prompts, lengths): (&[&[u32]], &[usize]) = if gpu.caps.gpu_kernels { (&prompts[1..2], &[7, 20]) } else { (&prompts, &[1, 7, 20]) };
                    for &prompt in prompts {
                        // Lengths that end mid-round as well as on round boundaries.
                        for &max_tokens in lengths {
                            let want = block_on(plain.generate(prompt, &greedy(max_tokens), &mut |_| true)).unwrap().output_ids;
                            let opts = SpeculativeOptions { use_head, timing: false, draft_len: DraftLen::Fixed(usize::MAX), costs: None, refine_costs: true, lookup: false };
                            let (got, stats) = block_on(spec.generate(prompt, &greedy(max_tokens), &opts, &mut |_| true)).unwrap();
                            let ctx = format!("{name} {kind:?} B={block} head={use_head} prompt={prompt:?} max={max_tokens}");
                            assert_eq!(got.output_ids, want, "{ctx}: speculative output differs from target-only greedy");
                            let max_len = drafter.drafts_per_block() + 1;
                            assert!(stats.acceptance_lengths.iter().all(|&l| (1..=max_len).contains(&l)), "{ctx}: {:?}", stats.acceptance_lengths);
                            // Drafts identical to the CPU reference round by round => identical accepted counts.
                            let (ref_out, ref_lengths) = speculative_greedy(&ref_target, &mut ref_drafter, prompt, max_tokens, use_head);
                            assert_eq!(ref_out, want, "{ctx}: CPU reference");
                            let full_rounds = stats.acceptance_lengths.len().min(ref_lengths.len()).saturating_sub(1);
                            assert_eq!(stats.acceptance_lengths[..full_rounds], ref_lengths[..full_rounds], "{ctx}: per-round acceptance vs CPU reference");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_drafter_matches_the_cpu_reference_drafter() {
    use domino_engine::step::{read_buffer, read_f32};
    use domino_engine::Step;
    use domino_models::qwen3::{Capture, Forward};
    let gpus = test_gpus();
    for kind in [DrafterKind::DFlash, DrafterKind::Domino] {
        for block in [4usize, 8] {
            let dspec = TinyDrafterSpec { kind, block_size: block, layers: 2, seed: 900 + block as u64, ..TinyDrafterSpec::default() };
            let p = pair(&target_spec(), &dspec);
            let ref_target = ReferenceModel::load(p.target_cfg.clone(), &p.target_ckpt, false).unwrap();
            for use_head in [true, false] {
                for (name, gpu) in &gpus {
                    let (target, drafter) = load(gpu, &p);
                    let prompt: Vec<u32> = vec![11, 22, 33, 44, 55, 66];
                    let n = prompt.len() as u32;
                    let state = target.new_state(64, 64, 33).unwrap();
                    let draft = drafter.new_state(&target, 64, 64).unwrap();
                    let width = drafter.config.num_features() * target.config.hidden_size;
                    let feats = gpu.buffer("features", (64 * width * 4) as u64).unwrap();
                    gpu.write(&state.ids, 0, &prompt);
                    let layers = drafter.config.target_layer_ids.clone();
                    let mut step = Step::new(gpu);
                    let capture = Capture { layers: &layers, dst: &feats, dst_row: 0 };
                    target.record_forward(&mut step, &state, &Forward { pos0: 0, n_rows: n, logits_from: n - 1, capture: Some(capture) }).unwrap();
                    let frows = domino_engine::Rows::new(&feats, 0, width as u32);
                    drafter.record_context(&mut step, &draft, &frows, 0, n).unwrap();
                    target.record_sample(&mut step, &state, 1, &domino_engine::SamplingConfig::greedy(), n, &state.ids, n).unwrap();
                    drafter.reset_head_state(&draft);
                    drafter.record_block(&mut step, &draft, &target, &state.ids, n, use_head).unwrap();
                    step.submit().unwrap();
                    let k = drafter.drafts_per_block();
                    let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&block_on(read_buffer(gpu, &state.ids, n as u64 * 4, (k as u64 + 1) * 4)).unwrap());
                    let logits = block_on(read_f32(gpu, &draft.logits, 0, block * target.config.vocab_size)).unwrap();

                    let mut ref_drafter = ReferenceDrafter::load(p.drafter_cfg.clone(), &p.drafter_ckpt, &ref_target, false).unwrap();
                    let out = ref_target.forward(&prompt);
                    let f = domino_models::drafter_reference::target_features(&out, &layers, target.config.hidden_size, 0..prompt.len());
                    let v = target.config.vocab_size;
                    let anchor = domino_engine::reference::argmax(&out.logits[(prompt.len() - 1) * v..]);
                    let want = ref_drafter.draft_block(&f, anchor, prompt.len(), use_head);
                    let ctx = format!("{name} {kind:?} B={block} head={use_head}");
                    assert_eq!(ids[0], anchor, "{ctx}: anchor");
                    assert_eq!(&ids[1..], &want[..], "{ctx}: drafts differ from the CPU reference drafter");
                    let ref_logits = ref_drafter.last_final_logits();
                    let range = ref_logits.iter().cloned().fold(f32::MIN, f32::max) - ref_logits.iter().cloned().fold(f32::MAX, f32::min);
                    let err = logits.iter().zip(ref_logits).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                    assert!(err < 1e-4 * range, "{ctx}: drafter logits error {err} (range {range})");
                }
            }
        }
    }
}

#[test]
fn always_accepting_pairs_commit_whole_blocks() {
    let (name, gpu) = &test_gpus()[0];
    for kind in [DrafterKind::DFlash, DrafterKind::Domino] {
        for block in [2usize, 4, 8, 16] {
            let dir = tempfile::tempdir().unwrap();
            let (t, d) = (dir.path().join("t"), dir.path().join("d"));
            let dspec = TinyDrafterSpec { kind, block_size: block, ..TinyDrafterSpec::default() };
            domino_models::testing::write_always_accept_pair(&t, &d, &target_spec(), &dspec, 77).unwrap();
            let target = Qwen3Model::load(gpu.clone(), Qwen3Config::from_file(&t.join("config.json")).unwrap(), &Checkpoint::open(&t).unwrap(), WeightFormat::F16, &mut |_, _, _| {}).unwrap();
            let drafter = DrafterModel::load(DrafterConfig::from_file(&d.join("config.json")).unwrap(), &Checkpoint::open(&d).unwrap(), &target, WeightFormat::F16).unwrap();
            let mut spec = SpeculativeSession::new(&target, &drafter, 128).unwrap();
            let full = drafter.drafts_per_block() + 1;
            for max_tokens in [1usize, 2 + full, 3 * full + 2] {
                let (g, stats) = block_on(spec.generate(&[5, 6, 7], &greedy(max_tokens), &SpeculativeOptions { draft_len: DraftLen::Fixed(usize::MAX), ..Default::default() }, &mut |_| true)).unwrap();
                assert!(g.output_ids.iter().all(|&x| x == 77), "{name}: {:?}", g.output_ids);
                assert_eq!(g.output_ids.len(), max_tokens);
                // Every round commits B+1 (Domino) or B (DFlash); the prefill's token comes first.
                let rounds = (max_tokens - 1).div_ceil(full);
                assert_eq!(stats.rounds, rounds, "{kind:?} B={block} max={max_tokens}: {:?}", stats.acceptance_lengths);
                assert!(stats.acceptance_lengths.iter().all(|&l| l == full), "{kind:?} B={block}: {:?}", stats.acceptance_lengths);
            }
        }
    }
}

#[test]
fn mismatched_drafters_give_clear_errors() {
    let (_, gpu) = &test_gpus()[0];
    let tspec = target_spec();
    let p = pair(&tspec, &TinyDrafterSpec::default());
    let target = Qwen3Model::load(gpu.clone(), p.target_cfg.clone(), &p.target_ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
    let err = |f: &dyn Fn(&mut DrafterConfig)| {
        let mut cfg = p.drafter_cfg.clone();
        f(&mut cfg);
        match DrafterModel::load(cfg, &p.drafter_ckpt, &target, WeightFormat::F32) {
            Ok(_) => panic!("mismatch accepted"),
            Err(e) => e.to_string(),
        }
    };
    assert!(err(&|c| c.target_layer_ids = vec![0, 5]).contains("5"));
    assert!(err(&|c| c.block_size = 0).contains("block_size"));
    assert!(err(&|c| c.mask_token_id = 10_000).contains("10000"));
    // A drafter whose hidden size differs from the target's (a drafter for another target).
    let other = pair(&TinySpec { hidden: 96, ..tspec.clone() }, &TinyDrafterSpec::default());
    let e = DrafterModel::load(other.drafter_cfg.clone(), &other.drafter_ckpt, &target, WeightFormat::F32).err().unwrap().to_string();
    assert!(e.contains("96") && e.contains("64"), "{e}");
    // A drafter for a larger vocabulary: the Domino head's W2 shape names the mismatch.
    let other = pair(&TinySpec { vocab: 500, ..tspec }, &TinyDrafterSpec { kind: DrafterKind::Domino, ..TinyDrafterSpec::default() });
    let e = DrafterModel::load(other.drafter_cfg.clone(), &other.drafter_ckpt, &target, WeightFormat::F32).err().unwrap().to_string();
    assert!(e.contains("500") || e.contains("mask"), "{e}");
}

/// The first two tokens of a speculative round under sampling follow the target's distribution:
/// token 1 ~ p_0 and, when token 1 is the first draft, token 2 ~ p_1 (chi-square, fixed seeds, 0.1%).
#[test]
fn speculative_sampling_matches_the_target_distribution() {
    use domino_engine::{kernels, reference, step::read_buffer, Rows, SamplingConfig, Step};
    let (name, gpu) = &test_gpus()[0];
    let vocab = 24usize;
    let k = 3u32;
    let mut rng = domino_engine::testing::Rng::new(99);
    let logits = rng.vec((k as usize + 1) * vocab, 1.5);
    let cfg = SamplingConfig { temperature: 0.9, top_k: 12, top_p: 0.95, seed: 5 };
    let p: Vec<Vec<f64>> = logits.chunks(vocab).map(|row| reference::sampling_distribution(row, cfg.temperature, 12, 0.95)).collect();
    // Drafts: the most likely token of row 0 (accepted often) and arbitrary later ones.
    let d1 = reference::argmax(&logits[..vocab]);
    let drafts = [d1, 3, 5];
    let runs = 3000u32;
    let slot = k + 2;
    let lb = gpu.buffer("logits", (logits.len() * 4) as u64).unwrap();
    gpu.write(&lb, 0, &logits);
    let ids = gpu.buffer("ids", (runs * slot * 4) as u64).unwrap();
    let mut all_ids = vec![0u32; (runs * slot) as usize];
    for r in 0..runs as usize {
        all_ids[r * slot as usize + 1..r * slot as usize + 4].copy_from_slice(&drafts);
    }
    gpu.write(&ids, 0, &all_ids);
    let result = gpu.buffer("result", (runs * slot * 4) as u64).unwrap();
    let mut step = Step::new(gpu);
    for r in 0..runs {
        let rows = Rows::new(&lb, 0, vocab as u32);
        kernels::accept_sampled(&mut step, &rows, vocab as u32, k, &ids, r * slot, &result, r * slot, &cfg, r * 1000).unwrap();
    }
    step.submit().unwrap();
    let res: Vec<u32> = bytemuck::pod_collect_to_vec(&block_on(read_buffer(gpu, &result, 0, (runs * slot * 4) as u64)).unwrap());
    let chi2 = |counts: &[usize], p: &[f64], n: usize| -> (f64, f64) {
        let (mut chi, mut dof) = (0.0, 0usize);
        for i in 0..p.len() {
            let e = p[i] * n as f64;
            if e >= 5.0 {
                chi += (counts[i] as f64 - e).powi(2) / e;
                dof += 1;
            }
            assert!(p[i] > 0.0 || counts[i] == 0, "{name}: token {i} outside the filtered set");
        }
        let dof = dof.saturating_sub(1).max(1) as f64;
        (chi, dof * (1.0 - 2.0 / (9.0 * dof) + 3.09 * (2.0 / (9.0 * dof)).sqrt()).powi(3))
    };
    let (mut first, mut second) = (vec![0usize; vocab], vec![0usize; vocab]);
    let mut n_second = 0;
    for r in 0..runs as usize {
        let w = &res[r * slot as usize..(r + 1) * slot as usize];
        let a = w[0] as usize;
        assert!(a <= k as usize);
        first[w[1] as usize] += 1;
        if w[1] == d1 {
            second[w[2] as usize] += 1;
            n_second += 1;
        }
    }
    let (c1, crit1) = chi2(&first, &p[0], runs as usize);
    assert!(c1 < crit1, "{name}: first token chi2 {c1:.1} >= {crit1:.1}");
    assert!(n_second > 300, "too few accepted first drafts for the second test: {n_second}");
    let (c2, crit2) = chi2(&second, &p[1], n_second);
    assert!(c2 < crit2, "{name}: second token chi2 {c2:.1} >= {crit2:.1}");
}

#[test]
fn speculative_sampling_end_to_end_is_reproducible() {
    let (_, gpu) = &test_gpus()[0];
    let p = pair(&target_spec(), &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, ..TinyDrafterSpec::default() });
    let (target, drafter) = load(gpu, &p);
    let mut spec = SpeculativeSession::new(&target, &drafter, 64).unwrap();
    let opts = GenerateOptions {
        max_tokens: 20,
        ignore_eos: true,
        sampling: domino_engine::SamplingConfig { temperature: 0.8, top_k: 40, top_p: 0.9, seed: 3 },
        ..Default::default()
    };
    let so = SpeculativeOptions { use_head: true, timing: false, ..Default::default() };
    let (a, _) = block_on(spec.generate(&[1, 2, 3], &opts, &so, &mut |_| true)).unwrap();
    let (b, _) = block_on(spec.generate(&[1, 2, 3], &opts, &so, &mut |_| true)).unwrap();
    assert_eq!(a.output_ids, b.output_ids);
    assert_eq!(a.output_ids.len(), 20);
}

/// `--draft-len`: every fixed k (0 = plain steps only) and the adaptive schedule give exactly the
/// plain greedy output, on every test adapter; rounds verify the k they were given.
#[test]
fn every_draft_length_schedule_gives_the_plain_greedy_output() {
    let p = pair(&target_spec(), &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, seed: 404, ..TinyDrafterSpec::default() });
    for (name, gpu) in test_gpus() {
        let (target, drafter) = load(&gpu, &p);
        let mut plain = Session::new(&target, 96).unwrap();
        let mut spec = SpeculativeSession::new(&target, &drafter, 96).unwrap();
        let max_k = spec.max_draft_len();
        let prompts = [&[1u32, 2, 3][..], &[100, 7, 250, 31, 31, 9, 44]];
        // The GPU family is slow on CPU rasterizers: one prompt there.
        for prompt in &prompts[..if gpu.caps.gpu_kernels { 1 } else { 2 }] {
            // 80 tokens: more plain steps than the queue of pending feature rows holds (64).
            let want = block_on(plain.generate(prompt, &greedy(80), &mut |_| true)).unwrap().output_ids;
            // Every k; on the GPU family plain steps, one draft, the whole block and past it.
            let ks: Vec<usize> = if gpu.caps.gpu_kernels { vec![0, 1, max_k, max_k + 1] } else { (0..=max_k + 1).collect() };
            for k in ks {
                let so = SpeculativeOptions { timing: false, draft_len: DraftLen::Fixed(k), ..Default::default() };
                let (got, st) = block_on(spec.generate(prompt, &greedy(80), &so, &mut |_| true)).unwrap();
                assert_eq!(got.output_ids, want, "{name} k={k}");
                assert!(st.draft_lengths.iter().all(|&d| d == k.min(max_k)), "{name} k={k}: {:?}", st.draft_lengths);
                assert!(st.acceptance_lengths.iter().all(|&a| a <= k.min(max_k) + 1), "{name} k={k}");
            }
            // Adaptive, with a cost table on which drafting pays only while acceptance is high, so the
            // schedule moves between k = 0 and drafting (probes included).
            let costs = RoundCosts::from_rounds((0..=max_k).map(|k| if k == 0 { 1.0 } else { 1.3 + 0.1 * k as f64 }).collect());
            let so = SpeculativeOptions { timing: false, draft_len: DraftLen::Auto, costs: Some(costs), ..Default::default() };
            let (got, st) = block_on(spec.generate(prompt, &greedy(80), &so, &mut |_| true)).unwrap();
            assert_eq!(got.output_ids, want, "{name} auto");
            assert_eq!(st.draft_lengths.len(), st.rounds);
            // Calibrated on this adapter (no table given).
            let so = SpeculativeOptions { timing: false, ..Default::default() };
            let (got, _) = block_on(spec.generate(prompt, &greedy(30), &so, &mut |_| true)).unwrap();
            assert_eq!(got.output_ids[..], want[..30], "{name} auto, calibrated");
        }
    }
}

/// The adaptive schedule on real rounds. With fixed CPU-adapter-like cost tables (not refined
/// online, so the schedule depends on the tokens alone): an always-accepting pair drafts from the
/// first round and reaches the whole block at once; where the prior does not pay, the opening probe
/// finds it and it keeps drafting; a random drafter is drafted little, with plain steps among
/// its rounds. With this adapter's calibrated costs (timings are noisy), every draft is still accepted.
#[test]
fn adaptive_draft_length_follows_the_drafter() {
    let (name, gpu) = &test_gpus()[0];
    let dir = tempfile::tempdir().unwrap();
    let (t, d) = (dir.path().join("t"), dir.path().join("d"));
    let dspec = TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 8, ..TinyDrafterSpec::default() };
    domino_models::testing::write_always_accept_pair(&t, &d, &target_spec(), &dspec, 77).unwrap();
    let target = Qwen3Model::load(gpu.clone(), Qwen3Config::from_file(&t.join("config.json")).unwrap(), &Checkpoint::open(&t).unwrap(), WeightFormat::F16, &mut |_, _, _| {}).unwrap();
    let drafter = DrafterModel::load(DrafterConfig::from_file(&d.join("config.json")).unwrap(), &Checkpoint::open(&d).unwrap(), &target, WeightFormat::F16).unwrap();
    let mut spec = SpeculativeSession::new(&target, &drafter, 256).unwrap();
    let max_k = spec.max_draft_len();
    let table = |draft_pass: f64| RoundCosts::from_rounds((0..=max_k).map(|k| if k == 0 { 1.0 } else { draft_pass + 0.25 * k as f64 }).collect());
    let fixed = |costs: RoundCosts| SpeculativeOptions { timing: false, draft_len: DraftLen::Auto, costs: Some(costs), refine_costs: false, ..Default::default() };
    let all_accepted = |st: &domino_runtime::SpeculativeStats| st.draft_lengths.iter().zip(&st.acceptance_lengths).all(|(k, a)| a == &(k + 1));

    // A draft pass of half a decode step: drafting pays on the prior.
    let (_, st) = block_on(spec.generate(&[5, 6, 7], &greedy(120), &fixed(table(1.5)), &mut |_| true)).unwrap();
    assert!(all_accepted(&st), "{name}: {:?} {:?}", st.draft_lengths, st.acceptance_lengths);
    assert!(st.draft_lengths[0] > 0 && st.draft_lengths[1..].iter().all(|&k| k == max_k), "{name}: {:?}", st.draft_lengths);

    // A draft pass of 2.6 decode steps: the prior does not pay, perfect acceptance does. A fresh
    // session's first round probes with one draft; from then on every round drafts the whole block.
    let mut fresh = SpeculativeSession::new(&target, &drafter, 256).unwrap();
    let (_, st) = block_on(fresh.generate(&[5, 6, 7], &greedy(120), &fixed(table(2.6)), &mut |_| true)).unwrap();
    assert!(all_accepted(&st), "{name}");
    assert!(st.draft_lengths[0] == 1 && st.draft_lengths[1..].iter().all(|&k| k == max_k), "{name}: {:?}", st.draft_lengths);
    // The first session's history (every draft accepted) starts its next generation: the whole
    // block from the first round, no probe.
    assert!(spec.acceptance_history(true).rounds() >= 10.0);
    let (_, st) = block_on(spec.generate(&[5, 6, 7], &greedy(120), &fixed(table(2.6)), &mut |_| true)).unwrap();
    assert!(all_accepted(&st), "{name}");
    assert!(st.draft_lengths.iter().all(|&k| k == max_k), "{name}: {:?}", st.draft_lengths);

    // This adapter's calibrated costs, refined online: the schedule follows noisy timings, but it
    // drafts (at the latest in the opening probe) and every draft is accepted.
    let so = SpeculativeOptions { timing: false, draft_len: DraftLen::Auto, ..Default::default() };
    let (_, st) = block_on(spec.generate(&[5, 6, 7], &greedy(120), &so, &mut |_| true)).unwrap();
    assert!(all_accepted(&st) && st.draft_lengths.iter().any(|&k| k > 0), "{name}: {:?}", st.draft_lengths);

    let p = pair(&target_spec(), &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 8, seed: 5, ..TinyDrafterSpec::default() });
    let (target, drafter) = load(gpu, &p);
    let mut spec = SpeculativeSession::new(&target, &drafter, 256).unwrap();
    let (_, st) = block_on(spec.generate(&[1, 2, 3], &greedy(200), &fixed(table(1.5)), &mut |_| true)).unwrap();
    assert!(st.draft_lengths.iter().zip(&st.acceptance_lengths).all(|(k, a)| *a <= k + 1), "{name}");
    // A random drafter (it still hits now and then on the tiny target's repetitive text) is drafted
    // less than the whole block, with plain steps among its rounds.
    let plain_rounds = st.draft_lengths.iter().filter(|&&k| k == 0).count();
    assert!(plain_rounds > 0 && st.mean_draft_length < max_k as f64 * 0.75, "{name}: {:?}", st.draft_lengths);
}

/// Sampled acceptance stays exact whatever k a round verifies: the round's first committed token
/// follows the target's distribution at the anchor for k = 0 (a plain sampled step), 1 and 3.
#[test]
fn sampled_rounds_follow_the_target_distribution_at_every_draft_length() {
    use domino_engine::{kernels, reference, step::read_buffer, Rows, SamplingConfig, Step};
    let (name, gpu) = &test_gpus()[0];
    let vocab = 24usize;
    let mut rng = domino_engine::testing::Rng::new(7);
    let logits = rng.vec(4 * vocab, 1.5);
    let cfg = SamplingConfig { temperature: 0.9, top_k: 0, top_p: 1.0, seed: 11 };
    let p0 = reference::sampling_distribution(&logits[..vocab], cfg.temperature, 0, 1.0);
    let d1 = reference::argmax(&logits[..vocab]);
    let lb = gpu.buffer("logits", (logits.len() * 4) as u64).unwrap();
    gpu.write(&lb, 0, &logits);
    let runs = 3000u32;
    for k in [0u32, 1, 3] {
        let slot = 5u32;
        let mut all_ids = vec![0u32; (runs * slot) as usize];
        for r in 0..runs as usize {
            all_ids[r * slot as usize + 1..r * slot as usize + 4].copy_from_slice(&[d1, 3, 5]);
        }
        let ids = gpu.buffer("ids", (runs * slot * 4) as u64).unwrap();
        gpu.write(&ids, 0, &all_ids);
        let result = gpu.buffer("result", (runs * slot * 4) as u64).unwrap();
        let mut step = Step::new(gpu);
        for r in 0..runs {
            kernels::accept_sampled(&mut step, &Rows::new(&lb, 0, vocab as u32), vocab as u32, k, &ids, r * slot, &result, r * slot, &cfg, r * 1000 + k).unwrap();
        }
        step.submit().unwrap();
        let res: Vec<u32> = bytemuck::pod_collect_to_vec(&block_on(read_buffer(gpu, &result, 0, (runs * slot * 4) as u64)).unwrap());
        let mut counts = vec![0usize; vocab];
        for r in 0..runs as usize {
            assert!(res[r * slot as usize] <= k, "{name} k={k}: accepted more than verified");
            counts[res[r * slot as usize + 1] as usize] += 1;
        }
        let (mut chi, mut dof) = (0.0, 0usize);
        for i in 0..vocab {
            let e = p0[i] * runs as f64;
            if e >= 5.0 {
                chi += (counts[i] as f64 - e).powi(2) / e;
                dof += 1;
            }
        }
        let dof = dof.saturating_sub(1).max(1) as f64;
        let crit = dof * (1.0 - 2.0 / (9.0 * dof) + 3.09 * (2.0 / (9.0 * dof)).sqrt()).powi(3);
        assert!(chi < crit, "{name} k={k}: first token chi2 {chi:.1} >= {crit:.1}");
    }
}

/// `set_draft_vocab`: drafts come from the first N token ids only (a shortlist of the lm_head and
/// the Domino correction), and the output stays exactly plain greedy. An always-accepting pair whose
/// token is in the shortlist still commits whole blocks; one whose token is not commits one token
/// per round (its drafts never reach it). Shortlists that are not whole weight groups, empty or
/// larger than the vocabulary are refused with a clear error.
#[test]
fn a_draft_vocabulary_shortlist_drafts_only_its_tokens_and_keeps_the_output() {
    for (name, gpu) in test_gpus() {
        for token in [77usize, 300] {
            let dir = tempfile::tempdir().unwrap();
            let (t, d) = (dir.path().join("t"), dir.path().join("d"));
            let dspec = TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 8, ..TinyDrafterSpec::default() };
            domino_models::testing::write_always_accept_pair(&t, &d, &target_spec(), &dspec, token).unwrap();
            let target = Qwen3Model::load(gpu.clone(), Qwen3Config::from_file(&t.join("config.json")).unwrap(), &Checkpoint::open(&t).unwrap(), WeightFormat::F16, &mut |_, _, _| {}).unwrap();
            let mut drafter = DrafterModel::load(DrafterConfig::from_file(&d.join("config.json")).unwrap(), &Checkpoint::open(&d).unwrap(), &target, WeightFormat::F16).unwrap();
            for bad in [100, 0, 512] {
                let e = drafter.set_draft_vocab(&target, Some(bad)).unwrap_err().to_string();
                assert!(e.contains(&format!("--draft-vocab {bad}")) && e.contains("multiple of 128") && e.contains("384"), "{e}");
            }
            let prompt = [5u32, 6, 7];
            let want = block_on(Session::new(&target, 256).unwrap().generate(&prompt, &greedy(24), &mut |_| true)).unwrap().output_ids;
            assert!(want.iter().all(|&t| t as usize == token));
            // 128 and 256 each hold token 77 and not 300; the GPU family (slow on CPU rasterizers) runs one.
            let keeps: &[usize] = if gpu.caps.gpu_kernels { &[128] } else { &[128, 256] };
            for &keep in keeps {
                drafter.set_draft_vocab(&target, Some(keep)).unwrap();
                assert_eq!(drafter.draft_vocab(), keep);
                let mut spec = SpeculativeSession::new(&target, &drafter, 256).unwrap();
                let max_k = spec.max_draft_len();
                for use_head in [true, false] {
                    let so = SpeculativeOptions { use_head, timing: false, draft_len: DraftLen::Fixed(max_k), ..Default::default() };
                    let (got, st) = block_on(spec.generate(&prompt, &greedy(24), &so, &mut |_| true)).unwrap();
                    assert_eq!(got.output_ids, want, "{name} token={token} keep={keep} head={use_head}");
                    let last = st.acceptance_lengths.len() - 1;
                    let expected = if token < keep { max_k + 1 } else { 1 };
                    assert!(st.acceptance_lengths[..last].iter().all(|&a| a == expected), "{name} token={token} keep={keep} head={use_head}: {:?}", st.acceptance_lengths);
                }
            }
            drafter.set_draft_vocab(&target, None).unwrap();
            assert_eq!(drafter.draft_vocab(), 384);
        }
    }
}

/// Lookup with a fixed CPU-adapter-like cost table (a draft pass of half a step, a verify row a
/// quarter) and no online refinement, so the schedule depends on the tokens alone.
fn lookup_options(max_k: usize) -> SpeculativeOptions {
    let costs = RoundCosts {
        seconds: (0..=max_k).map(|k| if k == 0 { 1.0 } else { 1.5 + 0.25 * k as f64 }).collect(),
        verify_seconds: (0..=max_k).map(|k| 1.0 + 0.25 * k as f64).collect(),
    };
    SpeculativeOptions { timing: false, costs: Some(costs), refine_costs: false, lookup: true, ..Default::default() }
}

/// `SpeculativeOptions::lookup`: on the tiny target, whose greedy text soon repeats itself, rounds
/// that verify tokens copied from earlier in the text commit more than one token, and the output
/// stays exactly plain greedy (greedy) or reproducible from its seed (sampling), on every test
/// adapter. 80 tokens: lookup rounds queue their feature rows like plain steps, past the 64-row
/// queue. The cost table is fixed (CPU-adapter-like: a draft pass of half a step, a verify row a
/// quarter), so the schedule depends on the tokens alone. With a fixed draft length n (and no cost
/// table: copies against drafts by expected tokens per round) rounds verify at most n tokens, copies
/// among them, with the plain output; n = 0 is plain decoding, with no copy.
#[test]
fn prompt_lookup_rounds_copy_repeated_text_and_keep_the_output() {
    let p = pair(&target_spec(), &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 8, seed: 31, ..TinyDrafterSpec::default() });
    for (name, gpu) in test_gpus() {
        let (target, drafter) = load(&gpu, &p);
        let mut plain = Session::new(&target, 128).unwrap();
        let mut spec = SpeculativeSession::new(&target, &drafter, 128).unwrap();
        let max_k = spec.max_draft_len();
        let so = lookup_options(max_k);
        for prompt in [&[1u32, 2, 3][..], &[100, 7, 250, 31, 31, 9, 44]] {
            let want = block_on(plain.generate(prompt, &greedy(80), &mut |_| true)).unwrap().output_ids;
            let (got, st) = block_on(spec.generate(prompt, &greedy(80), &so, &mut |_| true)).unwrap();
            assert_eq!(got.output_ids, want, "{name} {prompt:?}");
            assert!(st.lookup_rounds > 0, "{name} {prompt:?}: no lookup round in {:?}", st.draft_lengths);
            assert!(st.draft_lengths.iter().zip(&st.acceptance_lengths).all(|(k, a)| *a <= k + 1 && *k <= max_k), "{name}");
            assert!(st.acceptance_lengths.iter().any(|&a| a > 2), "{name} {prompt:?}: copies never accepted: {:?}", st.acceptance_lengths);
            // Every emitted token after the prefill's came from a round (the last may overshoot).
            assert!(st.acceptance_lengths.iter().sum::<usize>() >= want.len() - 1, "{name}");
        }
        // The greedy copy rounds are the next generation's prior; sampled ones leave it alone.
        let copies = spec.lookup_history().iter().map(|c| c.rounds()).sum::<f64>();
        assert!(copies >= 1.0, "{name}: no copy round in the history");
        let sampled = GenerateOptions { max_tokens: 40, ignore_eos: true, sampling: domino_engine::SamplingConfig { temperature: 0.3, top_k: 0, top_p: 1.0, seed: 9 }, ..Default::default() };
        let (a, st) = block_on(spec.generate(&[1, 2, 3], &sampled, &so, &mut |_| true)).unwrap();
        let (b, _) = block_on(spec.generate(&[1, 2, 3], &sampled, &so, &mut |_| true)).unwrap();
        assert_eq!(a.output_ids, b.output_ids, "{name}: sampled output with lookup must follow the seed");
        assert!(st.lookup_rounds > 0, "{name}: no sampled lookup round");
        assert_eq!(spec.lookup_history().iter().map(|c| c.rounds()).sum::<f64>(), copies, "{name}: sampled rounds entered the history");
        // Copies that failed before: plain rounds, queued behind the one being read where no match
        // would be copied (`timing` turns that queueing off), until the declined matches age back
        // to the prior. The same rounds either way, and the plain output.
        let mut failed = LookupScheduler::empty_history(max_k);
        failed.iter_mut().for_each(|c| (0..3).for_each(|_| c.record(1, 0)));
        let mut schedules = Vec::new();
        let prompt = [100u32, 7, 250, 31, 31, 9, 44];
        let want = block_on(plain.generate(&prompt, &greedy(80), &mut |_| true)).unwrap().output_ids;
        for timing in [false, true] {
            let mut spec = SpeculativeSession::new(&target, &drafter, 128).unwrap();
            spec.set_lookup_history(failed.clone());
            let (got, st) = block_on(spec.generate(&prompt, &greedy(80), &SpeculativeOptions { timing, ..so.clone() }, &mut |_| true)).unwrap();
            assert_eq!(got.output_ids, want, "{name} timing {timing}");
            schedules.push((st.draft_lengths, st.acceptance_lengths, st.lookup_rounds));
        }
        assert_eq!(schedules[0], schedules[1], "{name}: queued plain rounds changed the schedule");
        assert!(schedules[0].0.windows(3).any(|w| w == [0, 0, 0]), "{name}: no run of plain rounds: {:?}", schedules[0].0);
        // Every fixed length on the CPU-adapter families; the ends on the GPU family (slow there).
        let lengths: &[usize] = if gpu.caps.gpu_kernels { &[0, max_k] } else { &[0, 1, 3, max_k] };
        for &n in lengths {
            let mut spec = SpeculativeSession::new(&target, &drafter, 128).unwrap();
            let fixed = SpeculativeOptions { draft_len: DraftLen::Fixed(n), lookup: true, timing: false, ..Default::default() };
            let (got, st) = block_on(spec.generate(&prompt, &greedy(80), &fixed, &mut |_| true)).unwrap();
            assert_eq!(got.output_ids, want, "{name} fixed {n}");
            assert!(st.draft_lengths.iter().all(|&k| k <= n), "{name} fixed {n}: {:?}", st.draft_lengths);
            if n == 0 {
                assert_eq!(st.lookup_rounds, 0, "{name}: copies at --draft-len 0");
            } else {
                assert!(st.lookup_rounds > 0, "{name} fixed {n}: no copy in {:?}", st.draft_lengths);
                assert!(st.acceptance_lengths.iter().any(|&a| a > 1), "{name} fixed {n}: {:?}", st.acceptance_lengths);
            }
        }
    }
}

/// The drafter's static n-gram table (`DrafterModel::lookup_table`): built from the tiny target's
/// greedy text on other prompts, it proposes where the text has no earlier occurrence to copy.
/// Table rounds happen, some of their tokens are accepted, and the output stays exactly plain
/// greedy (greedy) or reproducible from its seed (sampling), on every test adapter.
#[test]
fn lookup_table_proposals_keep_the_output() {
    use domino_models::ngram_table::NgramTable;
    use domino_runtime::lookup::MAX_NGRAM;
    let p = pair(&target_spec(), &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 8, seed: 31, ..TinyDrafterSpec::default() });
    for (name, gpu) in test_gpus() {
        let (target, mut drafter) = load(&gpu, &p);
        let mut plain = Session::new(&target, 128).unwrap();
        let corpus: Vec<Vec<u32>> = [[5u32, 6, 7], [40, 41, 2], [300, 12, 12], [77, 1, 90]]
            .iter()
            .map(|prompt| block_on(plain.generate(prompt, &greedy(60), &mut |_| true)).unwrap().output_ids)
            .collect();
        let table = NgramTable::build(corpus.iter().map(|t| t.as_slice()), target.config.vocab_size, 1);
        assert!(!table.is_empty(), "{name}");
        drafter.lookup_table = Some(Arc::new(table));
        let mut spec = SpeculativeSession::new(&target, &drafter, 128).unwrap();
        let max_k = spec.max_draft_len();
        let so = lookup_options(max_k);
        let mut table_rounds = 0;
        for prompt in [&[9u32, 8, 7][..], &[5, 6, 8], &[41, 2, 300, 12]] {
            let want = block_on(plain.generate(prompt, &greedy(60), &mut |_| true)).unwrap().output_ids;
            let (got, st) = block_on(spec.generate(prompt, &greedy(60), &so, &mut |_| true)).unwrap();
            assert_eq!(got.output_ids, want, "{name} {prompt:?}");
            assert!(st.table_rounds <= st.lookup_rounds, "{name}");
            table_rounds += st.table_rounds;
        }
        assert!(table_rounds > 0, "{name}: no table round");
        let accepted: f64 = spec.lookup_history()[MAX_NGRAM..].iter().map(|c| c.accepted.iter().sum::<f64>()).sum();
        assert!(accepted > 0.0, "{name}: no table token accepted");
        let sampled = GenerateOptions { max_tokens: 40, ignore_eos: true, sampling: domino_engine::SamplingConfig { temperature: 0.3, top_k: 0, top_p: 1.0, seed: 5 }, ..Default::default() };
        let (a, _) = block_on(spec.generate(&[9, 8, 7], &sampled, &so, &mut |_| true)).unwrap();
        let (b, _) = block_on(spec.generate(&[9, 8, 7], &sampled, &so, &mut |_| true)).unwrap();
        assert_eq!(a.output_ids, b.output_ids, "{name}: sampled output with a table must follow the seed");
    }
}
