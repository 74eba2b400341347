//! Transports: how object bytes move between this process and a segment's
//! memory. [`tcp`] goes through the store's data plane on pooled
//! connections; [`shm`] maps the segment file of a store on this host and
//! copies with `memcpy`.
//!
//! Each is a [`Transport`]: it takes a batch of region writes or reads
//! (already routed to it) and returns the jobs that run them, batched,
//! pipelined and spread over connections or cores as that transport does
//! best. The client decides the route of every transfer in one place,
//! [`route`] (by protocol, tier and what each transport reaches), then
//! hands each transport its share and runs the jobs together. A new
//! transport (RDMA, a transfer engine's peer transfers) is a new file here,
//! a [`Kind`], and its entry in [`Transports`]; [`conformance`] is the
//! suite every transport passes.

#[cfg(test)]
mod conformance;
pub mod shm;
pub mod tcp;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use kvpool_proto::msg::{SegmentId, Tier};
use kvpool_proto::{Code, KvError, KvResult};
pub use kvpool_transfer::data::{ReadOp, WriteOp};

use crate::{Client, ClientConfig, Protocol};
pub use shm::ShmTransport;
pub use tcp::TcpTransport;

/// One share of a batch's transfers, run as one future: (item index,
/// result) pairs for the items it carried.
pub type Job<'a, T> = Pin<Box<dyn Future<Output = Vec<(usize, KvResult<T>)>> + Send + 'a>>;

/// One region write of a batch: its item index (reported with its result),
/// the address of the store serving the segment, and the write.
pub struct Write<'a> {
    /// The caller's index for this write; results carry it back.
    pub item: usize,
    /// Data-plane address of the store that serves `op`'s segment.
    pub peer: String,
    /// Where to write, under which grant, and the bytes.
    pub op: WriteOp<'a>,
}

/// One region read of a batch, as [`Write`] is for writes.
pub struct Read<'a> {
    /// The caller's index for this read; results carry it back.
    pub item: usize,
    /// Data-plane address of the store that serves `op`'s segment.
    pub peer: String,
    /// What to read, and the buffers it lands in (in order).
    pub op: ReadOp<'a>,
}

/// Checks a read as it lands (`item`, its buffers filled, and the checksum
/// of the value bytes, which the transport computes as they land, while
/// they are in the cache), returning the length to report: run inside the
/// transport's jobs, so a big batch verifies on as many cores as it copies on.
pub type Verify<'a> = &'a (dyn Fn(usize, &[&mut [u8]], u64) -> KvResult<usize> + Sync);

/// How far a batch may spread.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    /// Limit for each job's exchanges with one peer.
    pub timeout: Duration,
    /// Most connections (or other lanes) a batch uses per peer.
    pub lanes_per_peer: usize,
}

/// A transport's jobs for the reads of one peer (or, with `peer: None`,
/// reads that need no peer): they answer together and may be dropped
/// together, which is how a hedged read leaves a slow store behind.
pub struct Share<'a> {
    /// The store these reads wait on, if any.
    pub peer: Option<String>,
    /// The jobs; each verifies its reads as they land.
    pub jobs: Vec<Job<'a, usize>>,
}

/// A way to move object bytes to and from segment regions.
pub trait Transport: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> Kind;

    /// Whether this transport reaches `segment` for `dir` now. Only asked
    /// about memory-tier segments for which [`Client::prepare`] ran.
    fn reaches(&self, segment: SegmentId, dir: Dir) -> bool;

    /// The jobs that write `ops`. Every op's item is answered exactly once
    /// by the jobs together, whatever fails.
    fn write<'a>(&'a self, ops: Vec<Write<'a>>, spread: Spread) -> Vec<Job<'a, ()>>;

    /// The jobs that read `ops` into their buffers, each read checked by
    /// `verify` as it lands; every op's item is answered exactly once by
    /// the shares' jobs together, unless a share is dropped.
    fn read<'a>(&'a self, ops: Vec<Read<'a>>, verify: Verify<'a>, spread: Spread)
        -> Vec<Share<'a>>;

    /// Whether `peer` is known to be unreachable now, so a read that has
    /// only such peers left fails at once.
    fn is_down(&self, _peer: &str) -> bool {
        false
    }

    /// `peer` lost a hedged read's race: its share was dropped for another
    /// replica's answers.
    fn outrun(&self, _peer: &str) {}
}

/// The transports a client has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// [`ShmTransport`].
    Shm,
    /// [`TcpTransport`].
    Tcp,
}

/// Which way bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Into a segment.
    Write,
    /// Out of a segment.
    Read,
}

/// The transports a transfer of `tier` may take under `protocol`, in
/// order of preference. Disk regions have no mapping to share, so they go
/// over TCP whatever the protocol; `shm` insists on shared memory for the
/// memory tier.
fn allowed(protocol: Protocol, tier: Tier) -> &'static [Kind] {
    match (tier, protocol) {
        (Tier::Disk, _) | (_, Protocol::Tcp) => &[Kind::Tcp],
        (Tier::Memory, Protocol::Shm) => &[Kind::Shm],
        (Tier::Memory, Protocol::Auto) => &[Kind::Shm, Kind::Tcp],
    }
}

/// The route of one transfer: the first transport `protocol` allows for
/// `tier` that `reaches` it; `None` when none does (only possible when the
/// protocol insists on shared memory).
pub(crate) fn route(
    protocol: Protocol,
    tier: Tier,
    reaches: impl Fn(Kind) -> bool,
) -> Option<Kind> {
    allowed(protocol, tier)
        .iter()
        .copied()
        .find(|&k| reaches(k))
}

/// What this client keeps to reach segments, shared by its clones.
pub(crate) struct Transports {
    /// Pooled TCP connections per store.
    pub(crate) tcp: TcpTransport,
    /// Segments mapped (or known unmappable) for shared memory.
    pub(crate) shm: ShmTransport,
}

impl Transports {
    /// Nothing connected or mapped yet; both happen on first use.
    pub(crate) fn new(cfg: &ClientConfig) -> Self {
        Transports {
            // `protocol = tcp` means TCP: only `auto` (and `shm`, for what
            // it cannot map) takes a store's same-host socket.
            tcp: TcpTransport::new(
                cfg.connect_timeout.min(cfg.timeout),
                cfg.security.clone(),
                cfg.protocol != Protocol::Tcp,
            ),
            shm: ShmTransport::default(),
        }
    }

    /// The transport of `kind`.
    pub(crate) fn get(&self, kind: Kind) -> &dyn Transport {
        match kind {
            Kind::Shm => &self.shm,
            Kind::Tcp => &self.tcp,
        }
    }
}

/// The error for a transfer no allowed transport reaches (`protocol = shm`
/// and the segment is not mapped, or not writable, here).
pub(crate) fn unreachable(segment: SegmentId) -> KvError {
    KvError::new(
        Code::TransferFail,
        format!("segment {segment} cannot be mapped from this process (protocol shm)"),
    )
}

impl Client {
    /// The route of a transfer to `segment` (of `tier`) going `dir`, or
    /// why there is none. [`Client::prepare`] must have run for it.
    pub(crate) fn route(&self, segment: SegmentId, tier: Tier, dir: Dir) -> KvResult<Kind> {
        let t = &self.inner.transports;
        // Final for the call: no transport this client allows will reach
        // the segment on another try (a retry would only spend the budget).
        route(self.inner.cfg.protocol, tier, |k| {
            t.get(k).reaches(segment, dir)
        })
        .ok_or_else(|| unreachable(segment).settled())
    }

    /// Makes every transport ready to be asked about `segments`: maps the
    /// ones not seen before when the protocol allows shared memory (their
    /// paths come from one `Status` call, so a segment costs the master a
    /// round trip once per client).
    pub(crate) async fn prepare(&self, segments: &[SegmentId]) {
        let shm = &self.inner.transports.shm;
        if self.inner.cfg.protocol == Protocol::Tcp || !shm.unknown(segments) {
            return;
        }
        let infos: Vec<_> = self
            .status()
            .await
            .map(|s| s.segments.into_iter().map(|s| s.info).collect())
            .unwrap_or_default();
        shm.map_new(segments, &infos);
    }

    /// How far this client's batches may spread.
    pub(crate) fn spread(&self) -> Spread {
        Spread {
            timeout: kvpool_net::deadline::cap(self.inner.cfg.timeout),
            lanes_per_peer: self.inner.cfg.conns_per_store,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_choice() {
        let mem = Tier::Memory;
        let any = |_| true;
        let tcp_only = |k| k == Kind::Tcp;
        assert_eq!(route(Protocol::Auto, mem, any), Some(Kind::Shm));
        assert_eq!(route(Protocol::Auto, mem, tcp_only), Some(Kind::Tcp));
        assert_eq!(route(Protocol::Shm, mem, any), Some(Kind::Shm));
        assert_eq!(route(Protocol::Shm, mem, tcp_only), None);
        assert_eq!(route(Protocol::Tcp, mem, any), Some(Kind::Tcp));
        assert_eq!(route(Protocol::Tcp, mem, tcp_only), Some(Kind::Tcp));
        // Disk regions go over TCP whatever the protocol.
        for p in [Protocol::Auto, Protocol::Shm, Protocol::Tcp] {
            assert_eq!(route(p, Tier::Disk, any), Some(Kind::Tcp));
        }
    }
}
