//! The transfer engine's peer copies to and from registered memory.

use serde::{Deserialize, Serialize};

/// Transfer engine: write the frame's payload (exactly `len` bytes) at
/// the absolute address `addr` of the peer process. The peer refuses it,
/// touching nothing, unless `[addr, addr + len)` lies inside one memory
/// region it registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineWriteReq {
    /// Absolute address in the peer process.
    pub addr: u64,
    /// Bytes to write; must equal the frame's payload length.
    pub len: u64,
}

/// Transfer engine: read `len` bytes at the absolute address `addr` of the
/// peer process into the response payload, under the same check as
/// [`EngineWriteReq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineReadReq {
    /// Absolute address in the peer process.
    pub addr: u64,
    /// Bytes to read.
    pub len: u64,
}

/// Transfer engine (protocol 10): a notification for the peer, sent after
/// a batch landed (Mooncake's `TransferNotify`); the peer queues it for
/// its `get_notifies`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineNotifyReq {
    /// Who sends it (Mooncake's `notify.name`).
    pub name: String,
    /// What it says (Mooncake's `notify.msg`).
    pub msg: String,
}

/// Transfer engine (protocol 10): what the peer's engine holds; answered
/// with an [`EngineAboutReply`]. Also a probe of the peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineAbout {}

/// What a peer's engine holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineAboutReply {
    /// Start of the earliest registered buffer still in place.
    pub first_buffer: Option<u64>,
}

/// Transfer engine (protocol 10, a same-host peer on the engine's Unix
/// socket): the peer copies `len` bytes from `caller_addr` in the caller's
/// own process into `[addr, addr + len)` of its registered memory. The
/// kernel names the caller by the socket's credentials, so a caller can
/// only point the peer at its own memory. Refused with `NOT_SUPPORTED`
/// when the peer may not read the caller's memory; the caller then sends
/// the bytes over the socket ([`EngineWriteReq`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineWriteFromReq {
    /// Absolute address in the peer process (inside its registered memory).
    pub addr: u64,
    /// Bytes to copy.
    pub len: u64,
    /// Absolute address in the caller's process.
    pub caller_addr: u64,
}

/// Transfer engine (protocol 10): [`EngineWriteFromReq`] the other way,
/// the peer copies from its registered memory to `caller_addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineReadIntoReq {
    /// Absolute address in the peer process (inside its registered memory).
    pub addr: u64,
    /// Bytes to copy.
    pub len: u64,
    /// Absolute address in the caller's process.
    pub caller_addr: u64,
}
