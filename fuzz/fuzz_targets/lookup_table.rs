#![no_main]
//! Fuzz target `lookup_table`: the invariants are in domino_models::fuzzing::lookup_table (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::lookup_table(data));
