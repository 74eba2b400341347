//! The one request table: for every opcode, its wire number, the plane
//! that serves it, the least role that may ask it, the message it carries
//! and the response it gets back, and for a batch where its item count sits
//! in the encoded bytes. Everything that maps an opcode to a type is
//! generated from this table ([`Opcode`], the [`Rpc`] impls, [`Request`],
//! [`Opcode::visit`]), so a server cannot decode a request as the wrong
//! type, and nothing is open by default: a request must name its plane and
//! role to compile, and [`Opcode::admit`] refuses everything else.

use std::fmt::Debug;

use serde::{de::DeserializeOwned, Serialize};

use crate::code::{Code, KvError, KvResult};
use crate::compat;
use crate::limits::check_batch;
use crate::msg::*;
use crate::policy::{Plane, Role};

/// A request type and the response it gets back; implemented by the
/// request table only.
pub trait Rpc: Serialize + DeserializeOwned + Debug + PartialEq + Send + 'static {
    /// Opcode that carries this request.
    const OPCODE: Opcode;
    /// The response message.
    type Response: Serialize + DeserializeOwned + Debug + PartialEq + Send + 'static;

    /// For a batch request, how many items its encoded form `meta` carries,
    /// read from the front of the bytes without decoding the rest: a
    /// receiver refuses a batch over [`crate::limits::MAX_BATCH_KEYS`]
    /// before allocating for it. `None` for a request that is no batch (or
    /// bytes too short to tell; decoding then fails anyway).
    fn batch_len(_meta: &[u8]) -> Option<u64> {
        None
    }

    /// For a batch request, how many items it carries: what
    /// [`Rpc::batch_len`] reads from its encoded bytes.
    fn items(&self) -> Option<usize> {
        None
    }
}

/// Something done with the message type of an opcode chosen at run time
/// (see [`Opcode::visit`]).
pub trait Visit {
    /// What the visit gives back.
    type Out;
    /// Called with the request type the table gives the opcode.
    fn visit<R: Rpc>(self) -> Self::Out;
}

/// The length of the sequence that follows the fields `P` at the front of
/// an encoded message (postcard writes a sequence's length as a varint,
/// the encoding of a `u64`).
fn seq_len_after<P: DeserializeOwned>(meta: &[u8]) -> Option<u64> {
    postcard::take_from_bytes::<(P, u64)>(meta)
        .ok()
        .map(|((_, n), _)| n)
}

/// The version a row's `since` names, or the oldest still spoken.
fn added(since: &[u32]) -> u32 {
    since
        .first()
        .copied()
        .unwrap_or(crate::compat::MIN_PROTOCOL_VERSION)
}

macro_rules! requests {
    ($(
        $(#[$doc:meta])*
        $name:ident = $v:literal $(since $since:literal)? => $plane:ident, $needs:ident,
        $req:ident -> $resp:ty $(, batch $front:ty => $items:ident)?;
    )*) => {
        /// What a frame asks for; stable numbers on the wire.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Opcode { $($(#[$doc])* $name = $v,)* }

        impl Opcode {
            /// Decodes a wire value; `None` for an unknown opcode.
            pub fn from_u16(v: u16) -> Option<Opcode> {
                match v { $($v => Some(Opcode::$name),)* _ => None }
            }
            /// Every opcode, for metrics labels and tests.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name,)*];
            /// Lower-case name, for metrics labels and logs.
            pub fn name(self) -> &'static str {
                match self { $(Opcode::$name => stringify!($name),)* }
            }
            /// The server that answers it.
            pub fn plane(self) -> Plane {
                match self { $(Opcode::$name => Plane::$plane,)* }
            }
            /// The least role a peer must have proved to ask it (see
            /// [`Opcode::admit`]).
            pub fn needs(self) -> Role {
                match self { $(Opcode::$name => Role::$needs,)* }
            }
            /// The protocol version that added it: a peer on a connection
            /// of an older version does not know it (and closes the
            /// connection on it), so it is not sent there.
            pub fn since(self) -> u32 {
                match self { $(Opcode::$name => added(&[$($since)?]),)* }
            }
            /// [`Rpc::batch_len`] of the request type this opcode carries.
            pub fn batch_len(self, meta: &[u8]) -> Option<u64> {
                match self { $(Opcode::$name => <$req as Rpc>::batch_len(meta),)* }
            }
            /// Runs `v` with the request type this opcode carries.
            pub fn visit<V: Visit>(self, v: V) -> V::Out {
                match self { $(Opcode::$name => v.visit::<$req>(),)* }
            }
        }

        $(
            impl Rpc for $req {
                const OPCODE: Opcode = Opcode::$name;
                type Response = $resp;
                $(
                    fn batch_len(meta: &[u8]) -> Option<u64> {
                        seq_len_after::<$front>(meta)
                    }
                    fn items(&self) -> Option<usize> {
                        Some(self.$items.len())
                    }
                )?
            }
        )*

        /// A request's message, decoded as the type its opcode carries.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Request { $($(#[$doc])* $name($req),)* }

        impl Request {
            /// Decodes the message of a request with opcode `op`, and the
            /// fields a newer peer sends after it (absent from a v5 peer).
            /// A batch over [`crate::limits::MAX_BATCH_KEYS`] items is
            /// refused from the count at the front of its bytes, before
            /// anything is decoded or allocated.
            pub fn decode(op: Opcode, meta: &[u8]) -> KvResult<(Request, RequestTrailer)> {
                if let Some(n) = op.batch_len(meta) {
                    check_batch(op.name(), n)?;
                }
                match op {
                    $(Opcode::$name => {
                        let (m, t) = compat::decode_with::<$req, RequestTrailer>(meta)?;
                        Ok((Request::$name(m), t))
                    })*
                }
            }
            /// The opcode that carries it.
            pub fn opcode(&self) -> Opcode {
                match self { $(Request::$name(_) => Opcode::$name,)* }
            }
        }
    };
}

// Each row: `Name = wire number [since protocol version] => plane, least
// role, request type -> response type` (no `since`: in every version still
// spoken), and for a batch `batch <fields before the items> =>
// <items field>`. Servers refuse a request of another plane, or from a
// lower role, before reading it (`Opcode::admit`); some ask more of
// particular messages, said where they are listed. New opcodes go at the
// end: fuzz corpora index messages by their position here.
requests! {
    /// Version handshake; first frame on every connection.
    Hello = 1 => Handshake, Client, Hello -> HelloReply;
    /// Handshake: proof of the role key, when the server asks for one.
    Auth = 2 => Handshake, Client, Auth -> AuthReply;
    /// Data plane: write the payload into a segment region. A client also
    /// needs the master's grant for the region.
    Write = 10 => Data, Client, WriteReq -> ();
    /// Data plane: read a segment region into the response payload. A
    /// client also needs the master's grant for the region.
    Read = 11 => Data, Client, ReadReq -> ();
    /// Data plane: destroy freed objects so a restart cannot find them
    /// (the master's, which proves the store role). Answers how many
    /// objects were destroyed.
    Invalidate = 12 => Data, Store, InvalidateReq -> u64,
        batch (SegmentId, u64) => regions;
    /// Control: a client or store announces itself to the master.
    RegisterClient = 20 => Control, Client, RegisterClient -> RegisterReply;
    /// Control: liveness ping from a registered client.
    Heartbeat = 21 => Control, Client, Heartbeat -> HeartbeatReply;
    /// Control: lend a segment to the pool.
    MountSegment = 22 => Control, Store, MountSegment -> ();
    /// Control: withdraw a segment.
    UnmountSegment = 23 => Control, Store, UnmountSegment -> ();
    /// Control: the objects a remounted segment holds (restart recovery).
    ReportObjects = 24 => Control, Store, ReportObjects -> InventoryVerdict,
        batch (ClientId, SegmentId) => objects;
    /// Control: an operator stops placing objects on segments, optionally
    /// unmounting them later. Answers the segments now draining.
    DrainSegment = 25 => Control, Admin, DrainSegment -> Vec<SegmentId>;
    /// Control: a store stops placing objects on a segment of its own,
    /// proved by the segment's secret (protocol 7).
    DrainOwn = 26 since 7 => Control, Store, DrainOwn -> ();
    /// Control: reserve regions for new objects.
    PutStart = 30 => Control, Client, PutStart -> Vec<WireResult<PutGrant>>,
        batch (ClientId, u64) => items;
    /// Control: commit written objects.
    PutEnd = 31 => Control, Client, PutEnd -> Vec<WireResult<()>>,
        batch ClientId => items;
    /// Control: abandon started puts.
    PutRevoke = 32 => Control, Client, PutRevoke -> Vec<WireResult<()>>,
        batch ClientId => keys;
    /// Control: locate objects and take read leases.
    GetReplicaList = 33 => Control, Client,
        GetReplicaList -> Vec<WireResult<ObjectLocation>>, batch () => keys;
    /// Control: existence and size, without extending anyone's life.
    /// Answers per key the value size, or `OBJECT_NOT_FOUND`.
    Exist = 34 => Control, Client, Exist -> Vec<WireResult<u64>>, batch () => keys;
    /// Control: remove objects.
    Remove = 35 => Control, Client, Remove -> Vec<WireResult<()>>, batch () => keys;
    /// Control: objects read through cached locations (recency only).
    /// Answers per item whether that version is still current (and now
    /// leased).
    Touch = 38 => Control, Client, Touch -> Vec<bool>, batch () => items;
    /// Control: remove objects whose key matches a regex; answers how many.
    RemoveByRegex = 36 => Control, Admin, RemoveByRegex -> u64;
    /// Control: remove every object; answers how many.
    RemoveAll = 37 => Control, Admin, RemoveAll -> u64;
    /// Control: cluster status for `kvpool status` and tools.
    Status = 40 => Control, Client, Status -> ClusterStatus;
    /// Data plane: what a data server serves, and its master (not secret:
    /// an engine on the host learns where to attach).
    StoreAbout = 13 => Data, Client, StoreAbout -> StoreAboutReply;
    /// Control: regions on more segments for an object's replicas (copy, move).
    ReplicaAdd = 50 => Control, Client, ReplicaAdd -> ReplicaPlan;
    /// Control: attach written replica copies, drop moved-away ones.
    ReplicaCommit = 51 => Control, Client, ReplicaCommit -> ();
    /// Control: drop objects' replicas on a segment (or whole objects).
    /// Answers per key whether something was dropped.
    ReplicaClear = 52 => Control, Client, ReplicaClear -> Vec<bool>, batch () => keys;
    /// Control: record a replica copy or move task; answers its id.
    TaskCreate = 53 => Control, Client, TaskCreate -> u128;
    /// Control: report a task's progress.
    TaskUpdate = 54 => Control, Client, TaskUpdate -> ();
    /// Control: a task's status.
    TaskQuery = 55 => Control, Client, TaskQuery -> TaskInfo;
    /// Data plane: copy objects between a store's segments (tiering; the
    /// master's). Answers per move 0, or the code it failed with.
    TierMove = 16 => Data, Store, TierMoveReq -> Vec<i32>, batch () => moves;
    /// Data plane: give up tier move requests (the master's, after it
    /// stopped waiting for their answers).
    TierMoveCancel = 17 since 11 => Data, Store, TierMoveCancel -> (), batch () => requests;
    /// Transfer engine: write the payload at an absolute address in the
    /// peer's registered memory (`kvpool-engine`; Mooncake's TE write).
    EngineWrite = 60 since 6 => Data, Client, EngineWriteReq -> ();
    /// Transfer engine: read bytes at an absolute address in the peer's
    /// registered memory into the response payload.
    EngineRead = 61 since 6 => Data, Client, EngineReadReq -> ();
    /// Control: existence and size, taking read leases on what is found
    /// (as `GetReplicaList`, without the replicas).
    ExistLeased = 39 since 9 => Control, Client, ExistLeased -> Vec<WireResult<u64>>,
        batch () => keys;
    /// Control: one bounded page of the keys in the caller's namespace
    /// under a prefix, with a cursor to resume from.
    ListKeys = 41 since 9 => Control, Client, ListKeys -> KeyPage;
    /// Control: give up put operations whose outcome their caller never
    /// learned; answers how many puts in flight were revoked.
    PutCancel = 42 since 11 => Control, Client, PutCancel -> u64, batch ClientId => ops;
    /// Transfer engine: queue a notification for the peer's `get_notifies`.
    EngineNotify = 62 since 10 => Data, Client, EngineNotifyReq -> ();
    /// Transfer engine: what the peer's engine holds (and a probe).
    EngineAbout = 63 since 10 => Data, Client, EngineAbout -> EngineAboutReply;
    /// Transfer engine, same host: the peer pulls the caller's bytes into
    /// its registered memory.
    EngineWriteFrom = 64 since 10 => Data, Client, EngineWriteFromReq -> ();
    /// Transfer engine, same host: the peer pushes bytes of its registered
    /// memory into the caller's.
    EngineReadInto = 65 since 10 => Data, Client, EngineReadIntoReq -> ();
}

impl Opcode {
    /// Admits this request on `plane` from a peer that proved `peer`: it
    /// must belong to that plane (`NOT_SUPPORTED` otherwise) and the peer
    /// must hold at least the role the table gives it (`UNAUTHORIZED`).
    /// Handshake requests are never admitted: they come first, once.
    pub fn admit(self, plane: Plane, peer: Role) -> KvResult<()> {
        if self.plane() != plane || plane == Plane::Handshake {
            return Err(KvError::new(
                Code::NotSupported,
                format!("{} is not served by the {}", self.name(), plane.name()),
            ));
        }
        let needs = self.needs();
        if peer >= needs {
            return Ok(());
        }
        Err(KvError::new(
            Code::Unauthorized,
            format!(
                "{} takes the {needs} key; this connection proved {peer}",
                self.name()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_has_a_plane_and_a_role_and_is_refused_elsewhere() {
        for &op in Opcode::ALL {
            let plane = op.plane();
            for other in [Plane::Handshake, Plane::Data, Plane::Control] {
                if other != plane || other == Plane::Handshake {
                    let e = op.admit(other, Role::Admin).unwrap_err();
                    assert_eq!(e.code, Code::NotSupported, "{op:?} on {other:?}");
                }
            }
            if plane == Plane::Handshake {
                continue;
            }
            for peer in Role::ALL {
                let r = op.admit(plane, peer);
                assert_eq!(r.is_ok(), peer >= op.needs(), "{op:?} from {peer}");
                if let Err(e) = r {
                    assert_eq!(e.code, Code::Unauthorized);
                    assert!(e.message.contains(op.needs().name()), "{e}");
                }
            }
        }
    }

    /// Every server decodes through `Request::decode`, so an oversized
    /// batch is refused there from its count alone (here: nothing but a
    /// count follows).
    #[test]
    fn decode_refuses_a_batch_over_the_limit_before_reading_it() {
        let over = encode(&(crate::limits::MAX_BATCH_KEYS as u64 + 1));
        for op in [Opcode::Exist, Opcode::TierMove] {
            let e = Request::decode(op, &over).unwrap_err();
            assert!(e.message.contains("exceeds the limit"), "{op:?}: {e}");
        }
    }

    /// The table binds each opcode to one type, both ways.
    #[test]
    fn every_opcode_carries_the_type_that_names_it() {
        struct OpcodeOf;
        impl Visit for OpcodeOf {
            type Out = Opcode;
            fn visit<R: Rpc>(self) -> Opcode {
                R::OPCODE
            }
        }
        for &op in Opcode::ALL {
            assert_eq!(op.visit(OpcodeOf), op);
            assert_eq!(Opcode::from_u16(op as u16), Some(op));
        }
    }

    #[test]
    fn what_only_stores_and_operators_may_ask_is_closed_to_clients() {
        for op in [
            Opcode::MountSegment,
            Opcode::ReportObjects,
            Opcode::UnmountSegment,
            Opcode::DrainOwn,
            Opcode::Invalidate,
            Opcode::TierMove,
            Opcode::TierMoveCancel,
        ] {
            assert_eq!(op.needs(), Role::Store, "{op:?}");
        }
        for op in [
            Opcode::RemoveAll,
            Opcode::RemoveByRegex,
            Opcode::DrainSegment,
        ] {
            assert_eq!(op.needs(), Role::Admin, "{op:?}");
        }
    }

    #[test]
    fn messages_round_trip() {
        let m = PutStart {
            client_id: ClientId(u128::MAX - 3),
            op: 1,
            items: vec![PutItem {
                key: "k".repeat(100),
                value_len: 4096,
                region_len: 4200,
            }],
            config: ReplicateConfig {
                replica_num: 2,
                preferred_segments: vec!["a".into()],
                ..Default::default()
            },
            upsert: true,
        };
        assert_eq!(decode::<PutStart>(&encode(&m)).unwrap(), m);
        let r: <PutStart as Rpc>::Response = vec![
            Ok(PutGrant::Write {
                generation: 9,
                replicas: vec![Replica {
                    segment: SegmentId(1 << 100),
                    endpoint: "127.0.0.1:1".into(),
                    offset: 4096,
                    len: 4224,
                    cap: Some(Capability {
                        expires_ms: 1_700_000_000_000,
                        access: Capability::READ | Capability::WRITE,
                        mac: [7; 16],
                    }),
                    tier: Tier::Memory,
                    fence: u64::MAX,
                }],
            }),
            Err(Code::NoAvailableHandle.as_i32()),
        ];
        assert_eq!(
            decode::<<PutStart as Rpc>::Response>(&encode(&r)).unwrap(),
            r
        );
    }

    /// The count read from the front of each batch message is its item
    /// count: a field added before the items must update `batch_len`.
    #[test]
    fn batch_lengths_are_read_without_decoding() {
        fn check<R: Rpc>(m: &R, n: u64) {
            let meta = encode(m);
            assert_eq!(R::batch_len(&meta), Some(n), "{}", R::OPCODE.name());
            assert_eq!(R::OPCODE.batch_len(&meta), Some(n));
            assert_eq!(m.items(), usize::try_from(n).ok());
            assert_eq!(R::batch_len(&[]), None);
            match Request::decode(R::OPCODE, &meta) {
                Ok((decoded, _)) => assert_eq!(decoded.opcode(), R::OPCODE),
                Err(e) => assert!(n > crate::limits::MAX_BATCH_KEYS as u64, "{e}"),
            }
        }
        let id = ClientId(u128::MAX - 1);
        let seg = SegmentId(u128::MAX / 3);
        let keys = |n: usize| (0..n).map(|i| format!("key-{i}")).collect::<Vec<_>>();
        for n in [0usize, 1, 127, 128, 300, 20_000] {
            let nn = n as u64;
            check(
                &InvalidateReq {
                    segment: seg,
                    fence: u64::MAX,
                    regions: vec![(u64::MAX, 7); n],
                },
                nn,
            );
            let item = InventoryItem {
                key: "k".into(),
                generation: u64::MAX,
                value_len: 1,
                offset: 2,
                region_len: 3,
            };
            let objects = vec![item; n];
            check(
                &ReportObjects {
                    client_id: id,
                    segment: seg,
                    objects,
                    last: true,
                },
                nn,
            );
            let items = keys(n)
                .into_iter()
                .map(|key| PutItem {
                    key,
                    value_len: 5,
                    region_len: 9,
                })
                .collect();
            let config = ReplicateConfig::default();
            check(
                &PutStart {
                    client_id: id,
                    op: 1,
                    items,
                    config,
                    upsert: true,
                },
                nn,
            );
            let items = keys(n)
                .into_iter()
                .map(|key| PutEndItem { key, generation: 3 })
                .collect();
            check(
                &PutEnd {
                    client_id: id,
                    items,
                },
                nn,
            );
            check(
                &PutRevoke {
                    client_id: id,
                    keys: keys(n),
                },
                nn,
            );
            check(&GetReplicaList { keys: keys(n) }, nn);
            check(
                &ReplicaClear {
                    keys: keys(n),
                    segment: Some("s".into()),
                },
                nn,
            );
            check(&Exist { keys: keys(n) }, nn);
            let items = keys(n)
                .into_iter()
                .map(|key| TouchItem {
                    key,
                    generation: 1,
                    age_us: 2,
                })
                .collect();
            check(&Touch { items }, nn);
            check(
                &Remove {
                    keys: keys(n),
                    force: true,
                },
                nn,
            );
        }
        assert_eq!(Status::batch_len(&encode(&Status {})), None);
    }
}
