//! kvpool's data plane: memory that backs segments ([`mapped`]) and the TCP
//! data plane that moves object bytes between sockets and segment or caller
//! memory without an intermediate copy ([`data`]). Connections, server loops
//! and the master link it builds on live in `kvpool-net`.

pub mod data;
pub mod mapped;

pub use mapped::MappedRegion;
