//! The frame codec shared by every kvpool connection (control and data plane).
//!
//! A frame is a fixed 32-byte header, then `meta_len` bytes of message (the
//! typed request or response of [`crate::msg`] that the request table
//! ([`crate::requests`]) gives its opcode, encoded with postcard), then
//! `payload_len` raw bytes. Payload bytes are never serialized: the data plane
//! moves them between the socket and segment or caller memory directly.
//!
//! ```text
//! offset size field
//!      0    4 magic        b"KVPL"
//!      4    2 opcode       u16 LE, see [`Opcode`]
//!      6    1 kind         0 = request, 1 = response
//!      7    1 flags        reserved, must be 0
//!      8    8 request id   u64 LE, chosen by the requester, echoed in the response
//!     16    4 status       i32 LE; responses: 0 or an error [`Code`]; requests: 0
//!     20    4 meta_len     u32 LE, length of the message that follows
//!     24    8 payload_len  u64 LE, length of the raw payload after the message
//! ```
//!
//! A response with a non-zero status carries a UTF-8 error message as its
//! meta and no payload. Many requests may be in flight on one connection; the
//! server answers each connection's requests in order, and the requester
//! checks the echoed id. The first frame on every connection is a
//! [`Opcode::Hello`] carrying the range of versions the caller speaks
//! ([`MIN_PROTOCOL_VERSION`]..=[`PROTOCOL_VERSION`]); the server answers the
//! highest version both speak, which both sides then use for the rest of the
//! connection, or [`Code::InvalidVersion`] when the ranges do not overlap,
//! and closes. The handshake itself is always in the oldest shape. What may
//! change between versions is in [`crate::compat`].
//!
//! Decoding checks the magic, kind, flags and both lengths against [`Limits`]
//! before anything is allocated, so a hostile or corrupt header costs nothing.

use crate::code::{Code, KvError};
pub use crate::compat::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
pub use crate::requests::Opcode;

/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 32;
/// Magic at the start of every frame.
pub const MAGIC: [u8; 4] = *b"KVPL";
/// Whether a frame asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Sent by the side that opened the connection.
    Request = 0,
    /// Sent back with the request's id.
    Response = 1,
}

/// Size limits a receiver enforces on incoming frames. The default takes
/// messages of up to [`crate::limits::MAX_MESSAGE`] (16 MiB), which every
/// legitimate request stays under (senders split batches), and payloads of
/// up to 16 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest message (meta) accepted.
    pub max_meta: u32,
    /// Largest raw payload accepted.
    pub max_payload: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_meta: crate::limits::MAX_MESSAGE,
            max_payload: 16 << 30,
        }
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame asks for (echoed in responses).
    pub opcode: Opcode,
    /// Request or response.
    pub kind: FrameKind,
    /// Matches a response to its request.
    pub request_id: u64,
    /// 0 or an error code (responses only).
    pub status: i32,
    /// Bytes of message after the header.
    pub meta_len: u32,
    /// Raw bytes after the message.
    pub payload_len: u64,
}

/// Why a frame header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first four bytes are not [`MAGIC`].
    #[error("bad frame magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// The opcode is not known to this build.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    /// Kind byte is neither request nor response.
    #[error("bad frame kind {0}")]
    BadKind(u8),
    /// Reserved flags are set.
    #[error("reserved flags set: {0:#x}")]
    BadFlags(u8),
    /// Message larger than [`Limits::max_meta`].
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MetaTooLarge {
        /// Announced length.
        len: u32,
        /// Limit in force.
        max: u32,
    },
    /// Payload larger than [`Limits::max_payload`].
    #[error("payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLarge {
        /// Announced length.
        len: u64,
        /// Limit in force.
        max: u64,
    },
}

impl From<FrameError> for KvError {
    fn from(e: FrameError) -> Self {
        let code = match e {
            FrameError::MetaTooLarge { .. } | FrameError::PayloadTooLarge { .. } => {
                Code::BufferOverflow
            }
            FrameError::UnknownOpcode(_) => Code::NotSupported,
            _ => Code::InvalidParams,
        };
        KvError::new(code, e.to_string())
    }
}

impl FrameHeader {
    /// A request header.
    pub fn request(opcode: Opcode, request_id: u64, meta_len: u32, payload_len: u64) -> Self {
        FrameHeader {
            opcode,
            kind: FrameKind::Request,
            request_id,
            status: 0,
            meta_len,
            payload_len,
        }
    }

    /// A response header for `req`.
    pub fn response(req: &FrameHeader, status: i32, meta_len: u32, payload_len: u64) -> Self {
        FrameHeader {
            opcode: req.opcode,
            kind: FrameKind::Response,
            request_id: req.request_id,
            status,
            meta_len,
            payload_len,
        }
    }

    /// Encodes into the fixed 32-byte layout.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&(self.opcode as u16).to_le_bytes());
        b[6] = self.kind as u8;
        b[7] = 0;
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.status.to_le_bytes());
        b[20..24].copy_from_slice(&self.meta_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Decodes and validates a header against `limits`.
    pub fn decode(b: &[u8; HEADER_LEN], limits: &Limits) -> Result<Self, FrameError> {
        let magic: [u8; 4] = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let op = u16::from_le_bytes([b[4], b[5]]);
        let opcode = Opcode::from_u16(op).ok_or(FrameError::UnknownOpcode(op))?;
        let kind = match b[6] {
            0 => FrameKind::Request,
            1 => FrameKind::Response,
            k => return Err(FrameError::BadKind(k)),
        };
        if b[7] != 0 {
            return Err(FrameError::BadFlags(b[7]));
        }
        let le8 = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[r]);
            u64::from_le_bytes(a)
        };
        let le4 = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[r]);
            a
        };
        let meta_len = u32::from_le_bytes(le4(20..24));
        let payload_len = le8(24..32);
        if meta_len > limits.max_meta {
            return Err(FrameError::MetaTooLarge {
                len: meta_len,
                max: limits.max_meta,
            });
        }
        if payload_len > limits.max_payload {
            return Err(FrameError::PayloadTooLarge {
                len: payload_len,
                max: limits.max_payload,
            });
        }
        Ok(FrameHeader {
            opcode,
            kind,
            request_id: le8(8..16),
            status: i32::from_le_bytes(le4(16..20)),
            meta_len,
            payload_len,
        })
    }
}

/// A complete frame found in a byte buffer by [`parse_frame`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// The validated header.
    pub header: FrameHeader,
    /// The message bytes.
    pub meta: &'a [u8],
    /// The raw payload bytes.
    pub payload: &'a [u8],
    /// Total bytes consumed from the buffer.
    pub consumed: usize,
}

/// Parses one frame from the front of `buf`. `Ok(None)` means the buffer
/// holds only part of a frame (read more); an error means the stream is
/// corrupt and the connection must be answered and closed.
pub fn parse_frame<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<ParsedFrame<'a>>, FrameError> {
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(head);
    let header = FrameHeader::decode(&h, limits)?;
    let meta_end = HEADER_LEN + header.meta_len as usize;
    // payload_len is bounded by limits, but may exceed usize on 32-bit targets.
    let Some(end) = usize::try_from(header.payload_len)
        .ok()
        .and_then(|p| meta_end.checked_add(p))
    else {
        return Ok(None);
    };
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some(ParsedFrame {
        header,
        meta: &buf[HEADER_LEN..meta_end],
        payload: &buf[meta_end..end],
        consumed: end,
    }))
}

/// Appends a whole frame (header, message, payload) to `out`.
pub fn write_frame(out: &mut Vec<u8>, header: &FrameHeader, meta: &[u8], payload: &[u8]) {
    debug_assert_eq!(header.meta_len as usize, meta.len());
    debug_assert_eq!(header.payload_len as usize, payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(meta);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_header() -> impl Strategy<Value = FrameHeader> {
        (
            prop::sample::select(Opcode::ALL.to_vec()),
            any::<bool>(),
            any::<u64>(),
            any::<i32>(),
            0u32..1024,
            0u64..1024,
        )
            .prop_map(
                |(opcode, resp, request_id, status, meta_len, payload_len)| FrameHeader {
                    opcode,
                    kind: if resp {
                        FrameKind::Response
                    } else {
                        FrameKind::Request
                    },
                    request_id,
                    status,
                    meta_len,
                    payload_len,
                },
            )
    }

    proptest! {
        #[test]
        fn header_round_trips(h in any_header()) {
            let b = h.encode();
            prop_assert_eq!(FrameHeader::decode(&b, &Limits::default()).unwrap(), h);
        }

        #[test]
        fn frame_round_trips_and_truncation_is_incomplete(
            h in any_header(), seed in any::<u8>(), cut in 0usize..4096,
        ) {
            let meta: Vec<u8> = (0..h.meta_len).map(|i| (i as u8).wrapping_add(seed)).collect();
            let payload: Vec<u8> = (0..h.payload_len).map(|i| (i as u8) ^ seed).collect();
            let mut buf = Vec::new();
            write_frame(&mut buf, &h, &meta, &payload);
            buf.extend_from_slice(b"next");
            let f = parse_frame(&buf, &Limits::default()).unwrap().unwrap();
            prop_assert_eq!(f.header, h);
            prop_assert_eq!(f.meta, &meta[..]);
            prop_assert_eq!(f.payload, &payload[..]);
            prop_assert_eq!(f.consumed, buf.len() - 4);
            let cut = cut % f.consumed;
            prop_assert_eq!(parse_frame(&buf[..cut], &Limits::default()).unwrap(), None);
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
            let _ = parse_frame(&bytes, &Limits::default());
        }

        #[test]
        fn oversized_lengths_are_rejected(h in any_header(), extra in 1u64..u32::MAX as u64) {
            let limits = Limits { max_meta: 1024, max_payload: 1024 };
            let mut big = h;
            big.payload_len = 1024 + extra;
            let is_too_large = matches!(
                FrameHeader::decode(&big.encode(), &limits),
                Err(FrameError::PayloadTooLarge { .. })
            );
            prop_assert!(is_too_large);
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let h = FrameHeader::request(Opcode::Read, 7, 0, 0);
        let l = Limits::default();
        let mut b = h.encode();
        b[0] = b'X';
        assert!(matches!(
            FrameHeader::decode(&b, &l),
            Err(FrameError::BadMagic(_))
        ));
        let mut b = h.encode();
        b[4] = 0xff;
        assert!(matches!(
            FrameHeader::decode(&b, &l),
            Err(FrameError::UnknownOpcode(_))
        ));
        let mut b = h.encode();
        b[6] = 9;
        assert!(matches!(
            FrameHeader::decode(&b, &l),
            Err(FrameError::BadKind(9))
        ));
        let mut b = h.encode();
        b[7] = 1;
        assert!(matches!(
            FrameHeader::decode(&b, &l),
            Err(FrameError::BadFlags(1))
        ));
        let mut b = h.encode();
        b[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&b, &l),
            Err(FrameError::MetaTooLarge { .. })
        ));
    }
}
