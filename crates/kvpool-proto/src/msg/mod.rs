//! Typed messages carried in a frame's meta section, one request type and one
//! response type per [`crate::Opcode`], one file per plane: the handshake,
//! the data plane, the members and segments of the pool, objects, replica
//! tasks, a store's self-description and the transfer engine. Which opcode
//! carries which message is declared in the request table
//! ([`crate::requests`]). Batch forms are the only forms: a single-key call
//! is a batch of one, and every batch answers **per key**, so partial
//! success is never hidden behind one code.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::code::{Code, KvError, KvResult};

mod about;
mod data;
mod engine;
mod handshake;
mod objects;
mod replicas;
mod segments;

pub use about::*;
pub use data::*;
pub use engine::*;
pub use handshake::*;
pub use objects::*;
pub use replicas::*;
pub use segments::*;

/// Encodes a message for a frame's meta section.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_to(msg, &mut buf);
    buf
}

/// Encodes a message into `buf` (cleared first), reusing its allocation.
pub fn encode_to<T: Serialize>(msg: &T, buf: &mut Vec<u8>) {
    buf.clear();
    crate::compat::extend(buf, msg);
}

/// Decodes a frame's meta section; malformed bytes are an error, never a panic.
pub fn decode<T: DeserializeOwned>(meta: &[u8]) -> KvResult<T> {
    postcard::from_bytes(meta)
        .map_err(|e| KvError::new(Code::InvalidParams, format!("malformed message: {e}")))
}

/// A per-key outcome on the wire: a value or an error code.
pub type WireResult<T> = Result<T, i32>;

/// Converts a per-key wire result into a typed one.
pub fn from_wire<T>(r: WireResult<T>) -> KvResult<T> {
    r.map_err(|c| KvError::from(Code::from_i32(c)))
}

/// Converts a typed per-key result into its wire form.
pub fn to_wire<T>(r: KvResult<T>) -> WireResult<T> {
    r.map_err(|e| e.code.as_i32())
}

/// Identifies a segment for its whole life, across store restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SegmentId(pub u128);

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl SegmentId {
    /// The top 32 bits of every id derived from a proof of possession
    /// (`"KVP1"`); an id drawn at random before them carries it with odds
    /// of 2^-32.
    const PROVEN: u128 = 0x4b56_5031 << 96;

    /// The id of a new segment whose proof of possession is `possession`:
    /// a marker and 96 bits of its SHA-256, so that any master, also one
    /// that never saw the segment (after a restart), can tell whether a
    /// mount proves it, and nobody who does not hold the proof can find
    /// one that does.
    pub fn derived_from(possession: &[u8; 16]) -> SegmentId {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"kvpool segment id\0")
            .chain_update(possession)
            .finalize();
        let mut low = [0u8; 16];
        low[4..].copy_from_slice(&digest[..12]);
        SegmentId(Self::PROVEN | u128::from_be_bytes(low))
    }

    /// Whether `possession` proves this id: `Some(true)` or `Some(false)`
    /// for an id derived with [`SegmentId::derived_from`], `None` for one drawn
    /// at random (by builds before it), which only the secret a master
    /// saw at its first mount proves.
    pub fn proved_by(self, possession: &[u8; 16]) -> Option<bool> {
        (self.0 & (u128::MAX << 96) == Self::PROVEN).then(|| Self::derived_from(possession) == self)
    }
}

/// Identifies a client (or store) process to the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClientId(pub u128);

impl std::fmt::Display for ClientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Follows one client call across processes: chosen by the client, sent
/// with each of its requests (see [`RequestTrailer`]) and logged by the
/// master and stores in their `request` spans. 0 means none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl RequestId {
    /// No id: a request from a v5 peer, or from a process that set none.
    pub const NONE: RequestId = RequestId(0);
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Fields every request carries after its message since protocol 6 (see
/// [`crate::compat`]); left out on connections that speak 5.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTrailer {
    /// The client call this request is part of.
    pub id: RequestId,
}

impl crate::compat::Trailer for RequestTrailer {
    const SINCE: u32 = 6;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request from a v6 peer (trailer) and one from a v5 peer (none)
    /// both decode, to the same message and the id or none; the released
    /// decoder reads the v6 one as the v5 message.
    #[test]
    fn request_ids_follow_the_message_from_protocol_6() {
        use crate::compat::{append, decode_with};
        let req = ReadReq {
            segment: SegmentId(u128::MAX - 5),
            offset: 1 << 40,
            len: 4096,
            grant: None,
        };
        for (version, id) in [(5, 0), (6, 1), (6, u64::MAX), (7, 42)] {
            let mut buf = encode(&req);
            append(&mut buf, version, &RequestTrailer { id: RequestId(id) });
            let (m, t) = decode_with::<ReadReq, RequestTrailer>(&buf).unwrap();
            assert_eq!((m, t.id), (req, RequestId(id)), "v{version}");
            assert_eq!(decode::<ReadReq>(&buf).unwrap(), req);
        }
        assert_eq!(RequestId(0xab).to_string(), "00000000000000ab");
    }

    #[test]
    fn a_proven_segment_id_takes_its_own_proof_and_no_other() {
        let p = [7u8; 16];
        let id = SegmentId::derived_from(&p);
        assert_eq!(id.proved_by(&p), Some(true));
        for other in [[8u8; 16], [0; 16], {
            let mut q = p;
            q[15] ^= 1;
            q
        }] {
            assert_eq!(id.proved_by(&other), Some(false));
        }
        assert_ne!(SegmentId::derived_from(&[8; 16]), id);
        assert_eq!(
            SegmentId(0x1234).proved_by(&p),
            None,
            "a random id of before"
        );
        assert_eq!(format!("{id}").get(..8), Some("4b565031"));
    }

    #[test]
    fn garbage_is_an_error() {
        let e = decode::<PutStart>(&[0xff; 7]).unwrap_err();
        assert_eq!(e.code, Code::InvalidParams);
    }
}
