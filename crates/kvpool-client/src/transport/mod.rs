//! Transports: how object bytes reach a segment's memory. [`tcp`] goes
//! through the store's data plane on pooled connections; [`shm`] maps the
//! segment file of a store on this host and copies with `memcpy`.
//!
//! The put and get paths ask [`Client::routes`] once per batch and then
//! send each replica's transfer down its [`Route`]. A new tier (a local
//! disk, RDMA) is a new file here and a new `Route` variant chosen in
//! [`crate::placement::route`], not new branches through the client.

pub(crate) mod shm;
pub(crate) mod tcp;

use std::sync::Arc;

use kvpool_proto::msg::{Replica, SegmentId, Tier};
use kvpool_proto::{Code, KvError};

use crate::placement::{route, Route};
use crate::{Client, ClientConfig, Protocol};
use shm::{Mappings, ShmMap, ShmMaps};

/// What this client keeps to reach segments, shared by its clones.
pub(crate) struct Transports {
    /// Pooled TCP connections per store.
    pub(crate) tcp: tcp::Pools,
    /// Segments mapped (or known unmappable) for shared memory.
    pub(crate) shm: Mappings,
}

impl Transports {
    /// Nothing connected or mapped yet; both happen on first use.
    pub(crate) fn new(cfg: &ClientConfig) -> Self {
        Transports {
            tcp: tcp::Pools::new(cfg.connect_timeout.min(cfg.timeout), cfg.security.clone()),
            shm: Mappings::default(),
        }
    }
}

/// The routes to the segments of one batch.
pub(crate) struct Routes {
    maps: ShmMaps,
    protocol: Protocol,
}

impl Routes {
    /// The route to `segment` (which must be one the routes were made for,
    /// or it is reached by TCP).
    pub(crate) fn to(&self, segment: SegmentId) -> Route<Arc<ShmMap>> {
        route(
            self.maps.get(&segment).and_then(|m| m.as_ref()),
            self.protocol,
        )
    }
}

impl Routes {
    /// The route to `replica`: a disk replica is read over TCP whatever
    /// the protocol (there is no mapping to find).
    pub(crate) fn to_replica(&self, replica: &Replica) -> Route<Arc<ShmMap>> {
        match replica.tier {
            Tier::Disk => Route::Tcp,
            Tier::Memory => self.to(replica.segment),
        }
    }
}

/// The error for a segment `protocol = shm` cannot reach.
pub(crate) fn not_mappable(segment: SegmentId) -> KvError {
    KvError::new(
        Code::TransferFail,
        format!("segment {segment} cannot be mapped from this process (protocol shm)"),
    )
}

impl Client {
    /// The routes to `segments`, mapping the ones not seen before when the
    /// protocol allows shared memory (their paths come from one `Status`
    /// call, so a segment costs the master a round trip once per client).
    pub(crate) async fn routes(&self, segments: Vec<SegmentId>) -> Routes {
        let protocol = self.inner.cfg.protocol;
        if protocol == Protocol::Tcp {
            return Routes {
                maps: ShmMaps::new(),
                protocol,
            };
        }
        let shm = &self.inner.transports.shm;
        if shm.unknown(&segments) {
            let infos: Vec<_> = self
                .status()
                .await
                .map(|s| s.segments.into_iter().map(|s| s.info).collect())
                .unwrap_or_default();
            shm.map_new(&segments, &infos);
        }
        Routes {
            maps: shm.get(segments),
            protocol,
        }
    }
}
