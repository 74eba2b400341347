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
