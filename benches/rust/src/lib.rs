//! Empty: this package holds the criterion benchmarks in `benches/rnn.rs` and `benches/sklinear.rs` (how to run them and
//! the last results: `benches/results/rust_criterion.md` at the repository root).
