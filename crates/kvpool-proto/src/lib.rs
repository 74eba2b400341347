//! kvpool's wire protocol, with no I/O: the frame codec ([`frame`]), the
//! request table ([`requests`]: opcode, plane, role, message, response),
//! the typed messages of each plane ([`msg`]), the stable error codes
//! shared with Mooncake ([`code`]), how the wire grows between versions
//! ([`compat`]), the limits every receiver enforces on
//! well-formed requests ([`limits`]), who may ask what ([`policy`]), tenants' namespaces ([`tenant`]), and parsers for human sizes ([`units`]).
//!
//! Everything that crosses a socket is defined here so that the master, the
//! storage node and the clients cannot disagree about it.

pub mod code;
pub mod compat;
pub mod frame;
pub mod limits;
pub mod msg;
pub mod policy;
pub mod requests;
pub mod tenant;
pub mod units;

pub use code::{Code, KvError, KvResult};
pub use frame::{FrameHeader, FrameKind, Opcode, HEADER_LEN, PROTOCOL_VERSION};
pub use limits::{validate_key, MAX_BATCH_KEYS, MAX_KEY_LEN, MAX_METADATA_KEY_LEN};
pub use policy::{Plane, Role};
pub use requests::{Request, Rpc};
