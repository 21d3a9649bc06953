#![no_main]
//! Fuzz target `shard_index`: the invariants are in domino_models::fuzzing::shard_index (shared with the regression tests).
libfuzzer_sys::fuzz_target!(|data: &[u8]| domino_models::fuzzing::shard_index(data));
