//! kvpool's networking: framed connections with handshake and pooling
//! ([`conn`], with a [`breaker`] per peer that can be done without), one
//! [`deadline`] per call shared by its attempts, the
//! server loops that speak the frame protocol ([`server`]) and the
//! connection budgets they keep ([`admission`]), the id that
//! follows one call through every process ([`request_id`]),
//! data-plane capabilities ([`capability`]), TLS ([`tls`]), HTTP ports
//! served within limits ([`http`]), same-host Unix sockets beside TCP
//! servers ([`local`]),
//! the link every client and store keeps to the master ([`master`]), and the
//! etcd client behind `etcd://` master addresses and leader election
//! ([`etcd`]).
//!
//! It knows nothing of segments or object bytes, so the master can link it
//! without the data plane (that lives in `kvpool-transfer`, on top of this).

pub mod admission;
pub mod auth;
pub mod breaker;
pub mod capability;
pub mod conn;
pub mod deadline;
pub mod etcd;
pub mod http;
pub mod local;
pub mod master;
#[cfg(feature = "planted-bugs")]
pub mod planted;
pub mod request_id;
pub mod server;
pub mod tls;

pub use conn::{ConnPool, FramedConn};
pub use master::{CallPolicy, MasterLink};
