//! The `kvpool` Python package's native half, `kvpool._native`.
//!
//! The crate has a Python-free core — caller-memory checks ([`memory`]),
//! host memory by address ([`hostmem`]) and the per-process runtime
//! ([`runtime`]) — that builds and tests with plain `cargo`, and the PyO3
//! binding behind the `python` cargo feature, which maturin turns on. The
//! pure-Python package beside it (`python/kvpool`) holds the Pythonic
//! `kvpool.Client`, the Mooncake-compatible `kvpool.mooncake` and the SGLang
//! backend `kvpool.sglang`; see docs/python.md. Settings are resolved by
//! `kvpool_client::Settings`, the same rules a Rust client gets.

pub mod hostmem;
pub mod memory;
pub mod runtime;

#[cfg(feature = "python")]
mod py;
