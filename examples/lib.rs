//! Short programs that use the Domino crates the way a user would; see `examples/README.md`.
//! This library is intentionally empty.
