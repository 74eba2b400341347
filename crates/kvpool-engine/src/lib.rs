//! kvpool's transfer engine: moves bytes between the memory one process
//! registered and another process's, addressed by absolute addresses, as
//! Mooncake's Transfer Engine does for prefill/decode disaggregation (the
//! prefill process writes KV pages straight into the decode process's
//! buffers). The Python package wraps it as a drop-in
//! `mooncake.engine.TransferEngine`.
//!
//! - [`Regions`]: what this process registered, the only memory peers may
//!   touch and the only local buffers transfers may use;
//! - [`EngineServer`]: serves peers' `EngineWrite`/`EngineRead` requests
//!   against those regions, over kvpool's framed, authenticated TCP;
//! - [`Engine`]: the client side, batches pipelined on pooled connections
//!   to peers named by their session id `host:port`.
//!
//! Today every transfer goes over TCP (same host included); a shared-memory
//! path for same-host peers comes later.

mod client;
mod regions;
mod server;

pub use client::{timeout_secs, Direction, Engine, Transfer, WINDOW};
pub use regions::{Pin, Region, Regions};
pub use server::EngineServer;
