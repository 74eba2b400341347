//! Client settings: the transport to use and the knobs for timeouts,
//! retries, parallelism, the embedded segment and the location cache.
//!
//! Defaults suit one client per inference process on a small pool; every
//! field is public so the binary fills it from flags, and `settings` fills
//! it from arguments, environment and config file.

use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_proto::{Code, KvError, KvResult};

/// How object bytes move between this client and the stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Always over the TCP data plane.
    Tcp,
    /// Always by mapping the store's segment file (same host only); a
    /// segment that cannot be mapped is an error.
    Shm,
    /// Shared memory for segments on this host that this process may map,
    /// TCP for the others.
    #[default]
    Auto,
}

impl Protocol {
    /// The name as users write it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Shm => "shm",
            Protocol::Auto => "auto",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Protocol {
    type Err = KvError;

    /// `rdma` (and other transports Mooncake has and kvpool lacks) is
    /// `NOT_SUPPORTED`, an unknown name `INVALID_PARAMS`.
    fn from_str(s: &str) -> KvResult<Protocol> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "shm" => Ok(Protocol::Shm),
            "auto" | "" => Ok(Protocol::Auto),
            p @ ("rdma" | "efa" | "nvlink" | "cxl" | "ascend" | "nvmeof") => Err(KvError::new(
                Code::NotSupported,
                format!("protocol {p:?} is not supported by kvpool yet; use \"tcp\", \"shm\" or \"auto\""),
            )),
            p => Err(KvError::new(
                Code::InvalidParams,
                format!("unknown protocol {p:?}; use \"tcp\", \"shm\" or \"auto\""),
            )),
        }
    }
}

/// Settings of a client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Master RPC address `host:port`.
    pub master: String,
    /// Name of this client (and of its embedded segment).
    pub hostname: String,
    /// Limit for each master call attempt and each transfer (less when the
    /// call's deadline, `retry_for`, comes sooner).
    pub timeout: Duration,
    /// Limit for opening a connection to a store, handshake included: sized
    /// to the network, not to the call, so a store that does not answer
    /// (dead host, partition, paused process) is known within it, and then
    /// skipped by every call of the process until a probe finds it back.
    pub connect_timeout: Duration,
    /// Most extra attempts after transient failures (master calls, and keys
    /// whose store was unreachable or busy).
    pub retries: u32,
    /// Each call's deadline (or one whole `timeout`, if longer): its
    /// attempts share it, and transient failures are retried only until
    /// it. Long enough to ride out a store restart or a master failover.
    pub retry_for: Duration,
    /// Connections one big batch uses in parallel per store.
    pub conns_per_store: usize,
    /// Bytes to lend to the pool from this process (0 = pure client).
    pub segment_size: u64,
    /// IP the embedded segment's data plane binds and advertises.
    pub segment_address: String,
    /// Port the embedded segment's data plane binds (0 picks a free one).
    pub segment_port: u16,
    /// Transport for object bytes.
    pub protocol: Protocol,
    /// Keys whose locations are remembered for one-round-trip repeat reads
    /// (0 turns the location cache off).
    pub location_cache: usize,
    /// Whether a read of a replicated object that is slower than most asks
    /// the next replica too (first verified answer wins; see `hedge`). Off
    /// by default: the race costs 5-10% of single-key get throughput from
    /// cached locations, and without it a stalled store costs a reader its
    /// silence (2 connect timeouts) once, after which it is skipped.
    pub hedge_reads: bool,
    /// The key proved to the master and stores (and asked of peers of the
    /// embedded segment); lending memory takes a store key.
    pub security: Security,
    /// After the master has not answered this client's heartbeats for this
    /// long, master calls fail at once (RPC_FAIL) instead of waiting out
    /// their retries, until it answers again; a call already waiting ends
    /// then too. Off by default: an engine
    /// thread that must not block (a scheduler's lookup) sets it above a
    /// failover's length (2.5 s at p99 here).
    pub fail_fast_after: Option<Duration>,
}

impl ClientConfig {
    /// Defaults for a client of the master at `master`.
    pub fn new(master: &str) -> Self {
        ClientConfig {
            master: master.to_string(),
            hostname: "127.0.0.1".into(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
            retries: 50,
            retry_for: Duration::from_secs(10),
            conns_per_store: 4,
            segment_size: 0,
            segment_address: "127.0.0.1".into(),
            segment_port: 0,
            protocol: Protocol::Auto,
            location_cache: 65_536,
            hedge_reads: false,
            security: Security::default(),
            fail_fast_after: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_a_pure_client_on_auto() {
        let c = ClientConfig::new("10.0.0.1:50051");
        assert_eq!(c.master, "10.0.0.1:50051");
        assert_eq!(c.hostname, "127.0.0.1");
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(c.connect_timeout, Duration::from_secs(1));
        assert_eq!((c.retries, c.retry_for), (50, Duration::from_secs(10)));
        assert_eq!(c.conns_per_store, 4);
        assert_eq!(c.segment_size, 0, "lends no memory unless asked");
        assert_eq!(c.segment_address, "127.0.0.1");
        assert_eq!(c.protocol, Protocol::Auto);
        assert_eq!(Protocol::default(), Protocol::Auto);
        assert_eq!(c.location_cache, 65_536);
        assert!(!c.hedge_reads, "hedging costs throughput: asked for");
    }

    #[test]
    fn protocols_parse() {
        for (s, p) in [
            ("tcp", Protocol::Tcp),
            (" SHM ", Protocol::Shm),
            ("auto", Protocol::Auto),
            ("", Protocol::Auto),
        ] {
            assert_eq!(s.parse::<Protocol>().unwrap(), p, "{s:?}");
            if !s.is_empty() {
                assert_eq!(p.to_string(), s.trim().to_ascii_lowercase());
            }
        }
        assert_eq!(
            "efa".parse::<Protocol>().unwrap_err().code,
            Code::NotSupported
        );
        assert_eq!(
            "rdma".parse::<Protocol>().unwrap_err().code,
            Code::NotSupported
        );
        assert_eq!(
            "udp".parse::<Protocol>().unwrap_err().code,
            Code::InvalidParams
        );
    }
}
