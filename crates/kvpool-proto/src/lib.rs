//! kvpool's wire protocol, with no I/O: the frame codec ([`frame`]), the typed
//! messages of the control and data planes ([`msg`]), the stable error codes
//! shared with Mooncake ([`code`]), and parsers for human sizes ([`units`]).
//!
//! Everything that crosses a socket is defined here so that the master, the
//! storage node and the clients cannot disagree about it.

pub mod code;
pub mod frame;
pub mod msg;
pub mod units;

pub use code::{Code, KvError, KvResult};
pub use frame::{FrameHeader, FrameKind, Opcode, HEADER_LEN, PROTOCOL_VERSION};

/// Longest key accepted anywhere (bytes of UTF-8). Longer keys get [`Code::InvalidKey`].
pub const MAX_KEY_LEN: usize = 4096;

/// Checks a key against the limits every component enforces.
pub fn validate_key(key: &str) -> KvResult<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(KvError::new(
            Code::InvalidKey,
            format!("key length {} not in 1..={MAX_KEY_LEN}", key.len()),
        ));
    }
    Ok(())
}
