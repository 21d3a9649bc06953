#![no_main]
//! Fuzz target `drafter_config`: the invariants are in domino_models::fuzzing::drafter_config (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::drafter_config(data));
