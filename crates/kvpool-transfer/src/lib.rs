//! kvpool's data plane: memory that backs segments ([`mapped`]), disk-tier
//! segment files read and written with O_DIRECT ([`disk`]), and the TCP
//! data plane that moves object bytes between sockets and segment or caller
//! memory without an intermediate copy ([`data`]: its segment registry, the
//! reads, invalidations and tier copies that depend on the medium, the
//! server, and the client side's pipelining), the write fences that keep
//! grants of an earlier mount out of a segment ([`fence`]), and what that
//! server counts ([`metrics`]). Connections, server loops
//! and the master link it builds on live in `kvpool-net`.

pub mod data;
pub mod disk;
pub mod fence;
pub mod mapped;
pub mod metrics;

pub use disk::DiskFile;
pub use mapped::MappedRegion;
