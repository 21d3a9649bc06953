//! Our GGML block code against an independent implementation: the `gguf` Python package's numpy
//! dequantizers and quantizers (scripts/gguf-reference.py; scripts/setup.sh --test installs it).
//! Dequantization must agree bit for bit on every type, for blocks of random bytes as well as for
//! blocks our quantizer wrote; quantization must write the same bytes wherever gguf implements it
//! (the K-quants' quantizers exist only in llama.cpp's C, which ours ports line by line).

use domino_engine::quant::{self, QuantType};
use domino_engine::testing::Rng;
use half::f16;
use std::path::PathBuf;
use std::process::Command;

/// Runs scripts/gguf-reference.py MODE TYPE on `input` and returns what it wrote.
fn reference(mode: &str, t: QuantType, input: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&src, input).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gguf-reference.py");
    let out = Command::new("python3").arg(&script).args([mode, &t.name().to_uppercase()]).arg(&src).arg(&dst).output().expect("python3 runs");
    assert!(
        out.status.success(),
        "{} {mode} {t:?} failed (is the gguf package installed? bash scripts/setup.sh --test): {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&dst).unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Blocks of random bytes whose f16 fields hold finite scales of either sign.
fn random_blocks(t: QuantType, rng: &mut Rng, n: usize) -> Vec<u8> {
    let bb = t.block_bytes();
    let mut out: Vec<u8> = (0..n * bb).map(|_| rng.next_u64() as u8).collect();
    let halves: &[usize] = match t {
        QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => &[0],
        QuantType::Q6_K => &[208],
        _ => &[0, 2],
    };
    for b in out.chunks_exact_mut(bb) {
        for &at in halves {
            let v = (rng.uniform() - 0.5) * 0.02;
            b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    out
}

fn assert_bits_equal(t: QuantType, what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{t:?} {what}: lengths");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(a.to_bits() == b.to_bits(), "{t:?} {what}: value {i} is {a} here, {b} in gguf");
    }
}

#[test]
fn dequantization_matches_the_gguf_package_bit_for_bit() {
    let mut rng = Rng::new(5);
    for t in QuantType::ALL {
        let random = random_blocks(t, &mut rng, 64);
        assert_bits_equal(t, "random blocks", &quant::dequantize(t, &random), &f32s(&reference("dequantize", t, &random)));
        let written = quant::quantize(t, &rng.vec(8 * 256, 2.0));
        assert_bits_equal(t, "quantized blocks", &quant::dequantize(t, &written), &f32s(&reference("dequantize", t, &written)));
    }
}

#[test]
fn quantization_writes_the_bytes_gguf_writes() {
    let mut rng = Rng::new(6);
    for t in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1] {
        let values = rng.vec(64 * 32, 3.0);
        let ours = quant::quantize(t, &values);
        let theirs = reference("quantize", t, &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
        assert_eq!(ours.len(), theirs.len(), "{t:?}");
        let differing = ours.chunks(t.block_bytes()).zip(theirs.chunks(t.block_bytes())).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "{t:?}: {differing} of 64 blocks differ from gguf's quantizer");
    }
}

#[test]
fn k_quant_quantizers_round_trip_within_their_step() {
    // The K-quant quantizers have no Python twin: check what they promise instead. Every value comes
    // back within about one step of its sub-block's grid, and an all-zero block stays zero.
    let mut rng = Rng::new(7);
    for (t, step) in [(QuantType::Q4_K, 1.0 / 15.0), (QuantType::Q5_K, 1.0 / 31.0), (QuantType::Q6_K, 1.0 / 31.0)] {
        let values = rng.vec(16 * 256, 2.0);
        let back = quant::dequantize(t, &quant::quantize(t, &values));
        for (sub, (v, b)) in values.chunks(32).zip(back.chunks(32)).enumerate() {
            let range = v.iter().fold(0f32, |m, x| m.max(x.abs())) * 2.0;
            let err = v.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(err <= range * step * 1.5 + 1e-6, "{t:?} sub-block {sub}: error {err} over a range of {range}");
        }
        assert!(quant::dequantize(t, &quant::quantize(t, &[0.0; 256])).iter().all(|v| *v == 0.0), "{t:?}");
    }
}
