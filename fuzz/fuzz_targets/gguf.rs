#![no_main]
//! Fuzz target `gguf`: the invariants are in domino_models::fuzzing::gguf (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::gguf(data));
