//! The wire: frames (`kvpool_proto::frame`) and the typed messages in their
//! meta section (`kvpool_proto::msg`), decoded the way the master, the stores
//! and the clients decode what a peer sends.

use std::fmt::Debug;

use kvpool_proto::compat;
use kvpool_proto::frame::{parse_frame, FrameHeader, FrameKind, Limits, HEADER_LEN};
use kvpool_proto::msg::{self, RequestTrailer};
use kvpool_proto::requests::Visit;
use kvpool_proto::{Code, KvError, Opcode, Request, Rpc};
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

/// Decodes `bytes` as the request of `op`, or its response, by the type
/// the request table gives `op`.
fn meta(op: Opcode, response: bool, bytes: &[u8]) {
    op.visit(Decode { response, bytes });
}

/// Decodes a request of type `R` (or its response). For a request,
/// `R::batch_len` must read the item count of the decoded message (`None`:
/// not a batch), as receivers refuse batches by it.
struct Decode<'a> {
    response: bool,
    bytes: &'a [u8],
}

impl Visit for Decode<'_> {
    type Out = ();

    fn visit<R: Rpc>(self) {
        let bytes = self.bytes;
        if self.response {
            round_trip::<R::Response>(bytes);
            return;
        }
        let counted = R::batch_len(bytes);
        let plain = round_trip::<R>(bytes);
        if let Some(m) = &plain {
            let n = m.items().map(|n| n as u64);
            assert_eq!(counted, n, "{}: batch_len", R::OPCODE.name());
        }
        // The handshake reads a tenant after `Auth` (protocol 8).
        if R::OPCODE == Opcode::Auth {
            if let Ok((m, _)) = compat::decode_with::<msg::Auth, msg::AuthTenant>(bytes) {
                let plain = msg::decode::<msg::Auth>(bytes).ok();
                assert_eq!(plain, Some(m), "Auth: tenant trailer");
            }
        }
        // Servers read the request id after the message (protocol 6);
        // whatever they accept, a v5 server reads as the same message.
        if let Ok((m, _)) = compat::decode_with::<R, RequestTrailer>(bytes) {
            assert_eq!(plain.as_ref(), Some(&m), "{}: trailer", R::OPCODE.name());
            // The table decodes it too, unless it is a batch over the limit.
            match Request::decode(R::OPCODE, bytes) {
                Ok((req, _)) => assert_eq!(req.opcode(), R::OPCODE),
                Err(e) => assert!(counted > Some(kvpool_proto::MAX_BATCH_KEYS as u64), "{e}"),
            }
        }
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
