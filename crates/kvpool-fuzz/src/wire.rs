//! The wire: frames (`kvpool_proto::frame`) and the typed messages in their
//! meta section (`kvpool_proto::msg`), decoded the way the master, the stores
//! and the clients decode what a peer sends.

use std::fmt::Debug;

use kvpool_proto::compat;
use kvpool_proto::frame::{parse_frame, FrameHeader, FrameKind, Limits, HEADER_LEN};
use kvpool_proto::msg::{self, RequestTrailer, Rpc};
use kvpool_proto::{Code, KvError, Opcode};
use serde::{de::DeserializeOwned, Serialize};

/// Limits small enough that short inputs reach both length checks.
const SMALL: Limits = Limits {
    max_meta: 4096,
    max_payload: 1 << 16,
};

/// A byte stream of frames, parsed frame by frame as a connection's read
/// loop does, each message decoded as its opcode and kind say. The first
/// byte picks the limits (even: the defaults, odd: small ones).
pub fn frame(data: &[u8]) {
    let Some((&sel, mut rest)) = data.split_first() else {
        return;
    };
    let limits = if sel & 1 == 0 {
        Limits::default()
    } else {
        SMALL
    };
    loop {
        match parse_frame(rest, &limits) {
            Ok(Some(f)) => {
                let h = f.header;
                assert_eq!(h.encode()[..], rest[..HEADER_LEN], "header re-encodes");
                assert_eq!(f.meta.len(), h.meta_len as usize);
                assert_eq!(f.payload.len() as u64, h.payload_len);
                assert_eq!(f.consumed, HEADER_LEN + f.meta.len() + f.payload.len());
                match (h.kind, h.status) {
                    (FrameKind::Request, _) => meta(h.opcode, false, f.meta),
                    (FrameKind::Response, 0) => meta(h.opcode, true, f.meta),
                    // An error answer: a code and a UTF-8 message, as conn.rs reads it.
                    (FrameKind::Response, s) => {
                        let m = String::from_utf8_lossy(f.meta).into_owned();
                        let _ = KvError::new(Code::from_i32(s), m).to_string();
                    }
                }
                rest = &rest[f.consumed..];
            }
            Ok(None) => {
                if let Some(head) = rest.first_chunk::<HEADER_LEN>() {
                    let h = FrameHeader::decode(head, &limits).expect("incomplete, not corrupt");
                    let total = HEADER_LEN as u64 + u64::from(h.meta_len) + h.payload_len;
                    assert!((rest.len() as u64) < total, "a whole frame read as partial");
                }
                return;
            }
            Err(e) => {
                let head = rest.first_chunk::<HEADER_LEN>().expect("whole header");
                assert_eq!(FrameHeader::decode(head, &limits), Err(e.clone()));
                let _ = KvError::from(e).to_string();
                return;
            }
        }
    }
}

/// One message: the first byte picks the type (see [`message_selector`]),
/// the rest is its encoded form.
pub fn message(data: &[u8]) {
    let Some((&sel, meta_bytes)) = data.split_first() else {
        return;
    };
    if let Some(&op) = Opcode::ALL.get(usize::from(sel / 2)) {
        meta(op, sel % 2 == 1, meta_bytes);
    }
}

/// The first byte of a [`message`] input that decodes the request of `op`
/// (or, with `response`, its response). Stable as long as opcodes are only
/// appended to `Opcode::ALL`.
pub fn message_selector(op: Opcode, response: bool) -> u8 {
    let i = Opcode::ALL.iter().position(|o| *o == op).unwrap_or(0);
    u8::try_from(i * 2 + usize::from(response)).unwrap_or(u8::MAX)
}

/// Decodes `bytes` as the request of `op`, or its response. The match is
/// exhaustive so that a new opcode cannot go unfuzzed.
fn meta(op: Opcode, response: bool, bytes: &[u8]) {
    use kvpool_proto::msg::*;
    let r = response;
    match op {
        Opcode::Hello => rpc::<Hello>(r, bytes, |_| None),
        Opcode::Auth => rpc::<Auth>(r, bytes, |_| None),
        Opcode::Write => rpc::<WriteReq>(r, bytes, |_| None),
        Opcode::Read => rpc::<ReadReq>(r, bytes, |_| None),
        Opcode::Invalidate => rpc::<InvalidateReq>(r, bytes, |m| Some(m.regions.len())),
        Opcode::TierMove => rpc::<TierMoveReq>(r, bytes, |m| Some(m.moves.len())),
        Opcode::RegisterClient => rpc::<RegisterClient>(r, bytes, |_| None),
        Opcode::Heartbeat => rpc::<Heartbeat>(r, bytes, |_| None),
        Opcode::MountSegment => rpc::<MountSegment>(r, bytes, |_| None),
        Opcode::UnmountSegment => rpc::<UnmountSegment>(r, bytes, |_| None),
        Opcode::ReportObjects => rpc::<ReportObjects>(r, bytes, |m| Some(m.objects.len())),
        Opcode::DrainSegment => rpc::<DrainSegment>(r, bytes, |_| None),
        Opcode::PutStart => rpc::<PutStart>(r, bytes, |m| Some(m.items.len())),
        Opcode::PutEnd => rpc::<PutEnd>(r, bytes, |m| Some(m.items.len())),
        Opcode::PutRevoke => rpc::<PutRevoke>(r, bytes, |m| Some(m.keys.len())),
        Opcode::GetReplicaList => rpc::<GetReplicaList>(r, bytes, |m| Some(m.keys.len())),
        Opcode::Exist => rpc::<Exist>(r, bytes, |m| Some(m.keys.len())),
        Opcode::Remove => rpc::<Remove>(r, bytes, |m| Some(m.keys.len())),
        Opcode::Touch => rpc::<Touch>(r, bytes, |m| Some(m.items.len())),
        Opcode::RemoveByRegex => rpc::<RemoveByRegex>(r, bytes, |_| None),
        Opcode::RemoveAll => rpc::<RemoveAll>(r, bytes, |_| None),
        Opcode::Status => rpc::<Status>(r, bytes, |_| None),
        Opcode::StoreAbout => rpc::<StoreAbout>(r, bytes, |_| None),
        Opcode::ReplicaAdd => rpc::<ReplicaAdd>(r, bytes, |_| None),
        Opcode::ReplicaCommit => rpc::<ReplicaCommit>(r, bytes, |_| None),
        Opcode::ReplicaClear => rpc::<ReplicaClear>(r, bytes, |m| Some(m.keys.len())),
        Opcode::TaskCreate => rpc::<TaskCreate>(r, bytes, |_| None),
        Opcode::TaskUpdate => rpc::<TaskUpdate>(r, bytes, |_| None),
        Opcode::TaskQuery => rpc::<TaskQuery>(r, bytes, |_| None),
        Opcode::EngineWrite => rpc::<EngineWriteReq>(r, bytes, |_| None),
        Opcode::EngineRead => rpc::<EngineReadReq>(r, bytes, |_| None),
    }
}

/// Decodes a request of type `T` (or its response). For a request,
/// `T::batch_len` must read the same item count as `items` of the decoded
/// message (`None`: not a batch), as receivers refuse batches by it.
fn rpc<T>(response: bool, bytes: &[u8], items: fn(&T) -> Option<usize>)
where
    T: Rpc + PartialEq + Debug,
    T::Response: PartialEq + Debug,
{
    if response {
        round_trip::<T::Response>(bytes);
        return;
    }
    let counted = T::batch_len(bytes);
    let plain = round_trip::<T>(bytes);
    if let Some(m) = &plain {
        let n = items(m).map(|n| n as u64);
        assert_eq!(counted, n, "{}: batch_len", T::OPCODE.name());
    }
    // Servers read the request id after the message (protocol 6); whatever
    // they accept, a v5 server reads as the same message.
    if let Ok((m, _)) = compat::decode_with::<T, RequestTrailer>(bytes) {
        assert_eq!(plain.as_ref(), Some(&m), "{}: trailer", T::OPCODE.name());
    }
}

/// Decodes `bytes` as `T`; a value that decodes must encode to bytes that
/// decode to the same value.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8]) -> Option<T> {
    let v = msg::decode::<T>(bytes).ok()?;
    let again = msg::decode::<T>(&msg::encode(&v)).expect("re-encoded message decodes");
    assert_eq!(again, v, "message round trip");
    Some(v)
}
