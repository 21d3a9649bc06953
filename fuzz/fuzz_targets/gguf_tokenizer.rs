#![no_main]
//! Fuzz target `gguf_tokenizer`: the invariants are in domino_models::fuzzing::gguf_tokenizer (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::gguf_tokenizer(data));
