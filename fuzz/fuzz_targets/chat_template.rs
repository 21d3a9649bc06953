#![no_main]
//! Fuzz target `chat_template`: the invariants are in domino_models::fuzzing::chat_template (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::chat_template(data));
