//! The shared measurement (`domino_runtime::bench::measure`, behind `domino bench` and the browser's
//! Bench): the modes it runs, how many runs and progress events, and that its acceptance and draft
//! length figures are those of the speculative session run on its own (each round counted once, the
//! timing runs left out). Timing values are never asserted, only that they are present and positive.

use domino_engine::testing::test_gpus;
use domino_engine::WeightFormat;
use domino_models::drafter::{DrafterConfig, DrafterKind};
use domino_models::drafter_gpu::DrafterModel;
use domino_models::testing::{write_tiny_drafter, write_tiny_model, TinyDrafterSpec, TinySpec};
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use domino_runtime::bench::{self, BenchPlan, BenchProgress};
use domino_runtime::{DraftLen, GenerateOptions, RoundCosts, RuntimeError, SpeculativeOptions, SpeculativeSession};
use pollster::block_on;

#[test]
fn measure_runs_every_mode_and_counts_each_round_once() {
    let dir = tempfile::tempdir().unwrap();
    let (t, d) = (dir.path().join("target"), dir.path().join("drafter"));
    let spec = TinySpec { embed_scale: 4.0, ..TinySpec::default() };
    write_tiny_model(&t, &spec).unwrap();
    write_tiny_drafter(&d, &spec, &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, ..TinyDrafterSpec::default() }).unwrap();
    let (_, gpu) = test_gpus().into_iter().next().expect("a GPU test adapter");
    let target = Qwen3Model::load(gpu.clone(), Qwen3Config::from_file(&t.join("config.json")).unwrap(), &Checkpoint::open(&t).unwrap(), WeightFormat::F32, &mut |_, _, _| {}).unwrap();
    let drafter = DrafterModel::load(DrafterConfig::from_file(&d.join("config.json")).unwrap(), &Checkpoint::open(&d).unwrap(), &target, WeightFormat::F32).unwrap();

    let prompts = vec![vec![1, 2, 3], vec![100, 7, 250, 31], vec![300]];
    let plan = BenchPlan {
        prompts: prompts.clone(),
        max_tokens: 9,
        runs: 2,
        capacity: 64,
        spec_capacity: 64,
        split_prompts: Some(2),
        draft_len: DraftLen::Fixed(2),
        lookup: false,
        copy_bytes: 1 << 20,
    };
    let mut events = Vec::new();
    let mut calibrations = 0;
    let mut round_costs = |_: &mut SpeculativeSession<'_>, _: bool| -> Result<Option<RoundCosts>, RuntimeError> {
        calibrations += 1;
        Ok(None)
    };
    let mut progress = |p: BenchProgress| events.push(format!("{p:?}"));
    let r = block_on(bench::measure(&gpu, &target, Some(&drafter), &plan, &mut round_costs, &mut progress)).unwrap();
    assert_eq!(calibrations, 0, "a fixed draft length needs no round costs");
    let done = events.iter().filter(|e| e.starts_with("Done")).count();
    assert_eq!(done, plan.progress_steps(2), "{events:?}");
    // The modes take turns: warm-ups, then per prompt each run in every mode, then the split runs.
    let done: Vec<&str> = events.iter().filter_map(|e| e.strip_prefix("Done(\"")).map(|e| e.trim_end_matches("\")")).collect();
    let all = ["plain", "backbone (--no-head)", "domino"];
    let mut expected = all.to_vec();
    for i in 0..prompts.len() {
        for _ in 0..plan.runs {
            expected.extend(all);
        }
        if i < 2 {
            expected.extend(&all[1..]);
        }
    }
    expected.push("copy bandwidth");
    assert_eq!(done, expected);
    for w in events.windows(2).filter(|w| w[1].starts_with("Done")) {
        assert_eq!(w[0].replacen("Mode", "Done", 1), w[1], "every run is announced by its mode: {events:?}");
    }

    let names: Vec<&str> = r.modes.iter().map(|m| m.mode.as_str()).collect();
    assert_eq!(names, ["plain", "backbone (--no-head)", "domino"]);
    assert!(r.copy_bandwidth > 0.0 && r.decode_weight_bytes_per_token == target.decode_weight_bytes());
    let plain = r.modes[0].decode_tokens_per_s;
    for (m, use_head) in r.modes[1..].iter().zip([false, true]) {
        // The reference: the same session options run directly, every prompt once (greedy rounds are
        // deterministic, so each of the `runs` throughput runs repeats them).
        let mut session = SpeculativeSession::new(&target, &drafter, 64).unwrap();
        let (mut accepted, mut drafted) = (Vec::new(), Vec::new());
        for p in &prompts {
            let so = SpeculativeOptions { use_head, timing: false, draft_len: DraftLen::Fixed(2), costs: None, refine_costs: true, lookup: false };
            let opts = GenerateOptions { max_tokens: 9, ignore_eos: true, ..Default::default() };
            let (_, st) = block_on(session.generate(p, &opts, &so, &mut |_| true)).unwrap();
            for _ in 0..plan.runs {
                accepted.extend(&st.acceptance_lengths);
                drafted.extend(&st.draft_lengths);
            }
        }
        let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len() as f64;
        assert_eq!(m.mean_acceptance, mean(&accepted), "{}", m.mode);
        assert_eq!(m.mean_draft_length, mean(&drafted), "{}", m.mode);
        assert_eq!(m.mean_draft_length, 2.0, "{}", m.mode);
        assert_eq!(m.decode_tokens_per_s_all.len(), prompts.len() * plan.runs, "{}", m.mode);
        assert!(m.draft_seconds > 0.0 && m.verify_seconds > 0.0, "{}: split runs happened", m.mode);
        assert_eq!(m.head_seconds > 0.0, use_head, "{}", m.mode);
        assert_eq!(m.speedup_over_plain, m.decode_tokens_per_s / plain, "{}", m.mode);
        assert!(m.peak_gpu_memory_bytes > r.modes[0].peak_gpu_memory_bytes, "{}: the drafter's weights count", m.mode);
    }
    assert_eq!((r.modes[0].mean_acceptance, r.modes[0].mean_draft_length), (1.0, 0.0));

    // --draft-len auto asks the caller for round costs once per speculative mode.
    let plan = BenchPlan { draft_len: DraftLen::Auto, runs: 1, ..plan };
    let mut calibrations = 0;
    let mut round_costs = |_: &mut SpeculativeSession<'_>, _: bool| -> Result<Option<RoundCosts>, RuntimeError> {
        calibrations += 1;
        Ok(None)
    };
    block_on(bench::measure(&gpu, &target, Some(&drafter), &plan, &mut round_costs, &mut |_| {})).unwrap();
    assert_eq!(calibrations, 2);

    // --lookup: the Domino mode once more with prompt lookup drafts (its own round costs too); with
    // a fixed draft length as well, with no calibration and rounds of at most that many drafts.
    let plan = BenchPlan { lookup: true, ..plan };
    let mut calibrations = 0;
    let mut round_costs = |_: &mut SpeculativeSession<'_>, _: bool| -> Result<Option<RoundCosts>, RuntimeError> {
        calibrations += 1;
        Ok(None)
    };
    let mut events = Vec::new();
    let r = block_on(bench::measure(&gpu, &target, Some(&drafter), &plan, &mut round_costs, &mut |p| events.push(format!("{p:?}")))).unwrap();
    let names: Vec<&str> = r.modes.iter().map(|m| m.mode.as_str()).collect();
    assert_eq!(names, ["plain", "backbone (--no-head)", "domino", "domino + lookup"]);
    assert_eq!(calibrations, 3);
    assert_eq!(events.iter().filter(|e| e.starts_with("Done")).count(), plan.progress_steps(3), "{events:?}");
    let plan = BenchPlan { draft_len: DraftLen::Fixed(2), ..plan };
    let mut calibrations = 0;
    let mut round_costs = |_: &mut SpeculativeSession<'_>, _: bool| -> Result<Option<RoundCosts>, RuntimeError> {
        calibrations += 1;
        Ok(None)
    };
    let r = block_on(bench::measure(&gpu, &target, Some(&drafter), &plan, &mut round_costs, &mut |_| {})).unwrap();
    assert_eq!(calibrations, 0);
    let lookup = r.modes.iter().find(|m| m.mode == "domino + lookup").unwrap();
    assert!(lookup.mean_draft_length > 0.0 && lookup.mean_draft_length <= 2.0, "{lookup:?}");
    assert!(lookup.mean_acceptance >= 1.0 && lookup.mean_acceptance <= 3.0, "{lookup:?}");
}
