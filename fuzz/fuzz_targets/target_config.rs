#![no_main]
//! Fuzz target `target_config`: the invariants are in domino_models::fuzzing::target_config (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::target_config(data));
