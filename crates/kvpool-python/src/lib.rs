//! The `kvpool` Python package's native half, `kvpool._native`.
//!
//! The crate has a Python-free core — setting resolution ([`settings`]),
//! caller-memory checks ([`memory`]), host memory by address
//! ([`hostmem`]) and the per-process runtime ([`runtime`]) — that builds and tests with plain `cargo`, and the PyO3
//! binding behind the `python` cargo feature, which maturin turns on. The
//! pure-Python package beside it (`python/kvpool`) holds the Pythonic
//! `kvpool.Client`, the Mooncake-compatible `kvpool.mooncake` and the SGLang
//! backend `kvpool.sglang`; see docs/python.md.

pub mod hostmem;
pub mod memory;
pub mod runtime;
pub mod settings;

#[cfg(feature = "python")]
mod py;
