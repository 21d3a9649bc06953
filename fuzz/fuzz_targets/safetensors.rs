#![no_main]
//! Fuzz target `safetensors`: the invariants are in domino_models::fuzzing::safetensors (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::safetensors(data));
