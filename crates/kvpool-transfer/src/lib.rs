//! kvpool's transfer engine: memory that backs segments ([`mapped`]),
//! framed connections with handshake and pooling ([`conn`]), the server loops
//! that speak the frame protocol ([`server`]), and the TCP data plane that
//! moves object bytes between sockets and segment or caller memory without an
//! intermediate copy ([`data`]).

pub mod conn;
pub mod data;
pub mod etcd;
pub mod mapped;
pub mod master;
pub mod server;

pub use conn::{ConnPool, FramedConn};
pub use mapped::MappedRegion;
pub use master::{CallPolicy, MasterLink};
