//! kvpool's transfer engine: moves bytes between the memory one process
//! registered and another process's, addressed by absolute addresses, as
//! Mooncake's Transfer Engine does for prefill/decode disaggregation (the
//! prefill process writes KV pages straight into the decode process's
//! buffers). The Python package wraps it as a drop-in
//! `mooncake.engine.TransferEngine`.
//!
//! - [`Regions`]: what this process registered, the only memory peers may
//!   touch and the only local buffers transfers may use, in host or GPU
//!   memory ([`Memory`]);
//! - [`EngineServer`]: serves peers' `EngineWrite`/`EngineRead` requests
//!   against those regions, over kvpool's framed, authenticated TCP;
//! - [`Engine`]: the client side, batches pipelined on pooled connections
//!   to peers named by their session id `host:port`;
//! - [`Notifies`]: the notifications peers sent after their batches.
//!
//! Peers in other hosts (or namespaces) talk over TCP; peers on this host
//! find each other on a Unix socket and copy straight between their
//! memories (the `local` module says when and why that is safe; see
//! [`SameHost`]).

mod client;
mod cuda;
mod local;
mod notifies;
mod regions;
mod server;

pub use client::{timeout_secs, Direction, Engine, Transfer, WINDOW};
pub use cuda::{wait_for_stream, Device, Memory};
pub use local::SameHost;
pub use notifies::{Notifies, Notify, MAX_NOTIFY_BYTES, MAX_UNREAD};
pub use regions::{Pin, Region, Regions};
pub use server::EngineServer;
