//! Short programs that use the Domino crates the way a user would; see `examples/README.md`.
//!
//! The library has no code of its own. It carries the README and the library guide as its
//! documentation so that `cargo test` compiles docs/library.md's example as a doctest and keeps it
//! true to the API.
#![doc = include_str!("../README.md")]
#![doc = include_str!("../docs/library.md")]
