//! How the wire grows without breaking the released build: the version two
//! peers agree on ([`negotiate`]) and fields appended to a message after
//! its first version ([`Trailer`]).
//!
//! Messages are postcard, which is not self-describing: a field is found by
//! its position alone. Two properties make appending safe:
//!
//! - an old decoder stops at the end of the fields it knows and ignores the
//!   bytes after them (`postcard::from_bytes` returns without checking that
//!   the input is used up; the tests below pin this);
//! - a new decoder of an old message meets the end of the input where its
//!   new fields would start, and takes that as "absent".
//!
//! So the rule: fields added in protocol version `v` form one [`Trailer`]
//! group with `SINCE = v`, appended after the message (and after the groups
//! of earlier versions). A sender on a connection negotiated below `v`
//! leaves the group out ([`append`]), giving the old shape byte for byte; a
//! receiver reads the groups in version order ([`take`]), each absent one
//! as its `Default`. Bytes that are there but do not decode are an error,
//! never a default and never a panic. Never reorder, retype or remove a
//! field: that needs [`MIN_PROTOCOL_VERSION`] raised past every peer that
//! knows the old shape (docs/architecture.md, "Compatibility rules").

use std::ops::RangeInclusive;

use serde::{de::DeserializeOwned, Serialize};

use crate::code::{Code, KvError, KvResult};

/// Newest version spoken by this build; bumped with every wire change
/// (6: a [`crate::msg::RequestTrailer`] after each request; 7: stores check
/// key-bound grants, [`crate::msg::Capability::KEY`]; 8: tenant keys,
/// [`crate::msg::AuthTenant`]; 9: [`STORES_SEAL`], `ExistLeased`, `ListKeys`;
/// 10: the transfer engine's notifies, `EngineAbout` and same-host copies;
/// 11: `TierMoveCancel`, `PutCancel`).
pub const PROTOCOL_VERSION: u32 = 11;
/// From this version a store seals the header of every object written to
/// it with the checksum of the value bytes it received, so a writer need
/// not compute one; an older store keeps the writer's.
pub const STORES_SEAL: u32 = 9;
/// Oldest peer version this build still talks to: the previous release's
/// (N-1), so builds can be upgraded one process at a time.
pub const MIN_PROTOCOL_VERSION: u32 = 5;

/// The versions this build speaks.
pub const SUPPORTED: RangeInclusive<u32> = MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION;

/// The version a connection speaks when its peer speaks `min..=max` (from
/// its `Hello`): the highest one both sides know, or `None` when the ranges
/// do not overlap (or the peer's is empty).
pub fn negotiate(min: u32, max: u32) -> Option<u32> {
    let high = max.min(PROTOCOL_VERSION);
    let low = min.max(MIN_PROTOCOL_VERSION);
    (low <= high).then_some(high)
}

/// A group of fields appended to a message in protocol version
/// [`Trailer::SINCE`]; its `Default` is what an older peer meant by
/// leaving it out.
pub trait Trailer: Serialize + DeserializeOwned + Default {
    /// The protocol version that added these fields.
    const SINCE: u32;
}

/// Appends `group` to the message encoded in `buf` when the connection
/// speaks `version` or newer; otherwise leaves the old shape alone.
pub fn append<T: Trailer>(buf: &mut Vec<u8>, version: u32, group: &T) {
    if version < T::SINCE {
        return;
    }
    extend(buf, group);
}

/// Appends `value`'s encoding to `buf`, reusing its allocation.
pub(crate) fn extend<T: Serialize>(buf: &mut Vec<u8>, value: &T) {
    let v = std::mem::take(buf);
    // Only a sequence of unknown length fails, which no message has.
    *buf = postcard::to_extend(value, v).expect("messages encode into a Vec");
}

/// Reads the next trailer group from `rest` (the bytes after the message and
/// the groups before it): its `Default` when the sender left it out (`rest`
/// is empty), an error when bytes are there but do not decode. Returns the
/// bytes after it, for the next group.
pub fn take<T: Trailer>(rest: &[u8]) -> KvResult<(T, &[u8])> {
    if rest.is_empty() {
        return Ok((T::default(), rest));
    }
    postcard::take_from_bytes(rest).map_err(|e| {
        KvError::new(
            Code::InvalidParams,
            format!("malformed fields of protocol {}: {e}", T::SINCE),
        )
    })
}

/// Decodes a message followed by one trailer group (see [`take`]). Bytes
/// after the group are ignored, as an old decoder ignores the group: a
/// newer sender never sends them on a connection negotiated this low.
pub fn decode_with<M: DeserializeOwned, T: Trailer>(meta: &[u8]) -> KvResult<(M, T)> {
    let (msg, rest) = postcard::take_from_bytes(meta)
        .map_err(|e| KvError::new(Code::InvalidParams, format!("malformed message: {e}")))?;
    let (group, _) = take(rest)?;
    Ok((msg, group))
}

#[cfg(test)]
mod tests {
    // Local message types: `msg` depends on this module, so its tests
    // (for `RequestTrailer`) live there.
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    /// A message as a v5 peer knows it.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Msg {
        segment: u128,
        offset: u64,
        name: String,
        grant: Option<[u8; 4]>,
    }

    /// Fields a v6 peer appends.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
    struct V6 {
        id: u64,
    }

    impl Trailer for V6 {
        const SINCE: u32 = 6;
    }

    /// Fields a v7 peer appends after those.
    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    struct V7 {
        ttl_ms: u64,
        tag: String,
    }

    impl Trailer for V7 {
        const SINCE: u32 = 7;
    }

    fn msg() -> Msg {
        Msg {
            segment: u128::MAX - 5,
            offset: 1 << 40,
            name: "seg".into(),
            grant: None,
        }
    }

    fn encode<T: Serialize>(v: &T) -> Vec<u8> {
        postcard::to_allocvec(v).unwrap()
    }

    #[test]
    fn negotiation_takes_the_highest_common_version() {
        assert_eq!(negotiate(5, 5), Some(5));
        assert_eq!(negotiate(5, PROTOCOL_VERSION), Some(PROTOCOL_VERSION));
        assert_eq!(negotiate(1, 99), Some(PROTOCOL_VERSION));
        assert_eq!(negotiate(PROTOCOL_VERSION, 99), Some(PROTOCOL_VERSION));
        assert_eq!(negotiate(1, MIN_PROTOCOL_VERSION - 1), None);
        assert_eq!(negotiate(PROTOCOL_VERSION + 1, 99), None);
        // A peer that sends an empty range (min above max) speaks nothing.
        assert_eq!(negotiate(6, 5), None);
    }

    /// The property the whole scheme rests on: the released decoder
    /// (`msg::decode` is postcard's `from_bytes`) ignores appended bytes.
    #[test]
    fn an_old_decoder_ignores_a_trailer() {
        let mut buf = encode(&msg());
        append(&mut buf, 6, &V6 { id: u64::MAX });
        assert!(buf.len() > encode(&msg()).len());
        assert_eq!(postcard::from_bytes::<Msg>(&buf).unwrap(), msg());
        assert_eq!(
            decode_with::<Msg, V6>(&buf).unwrap(),
            (msg(), V6 { id: u64::MAX })
        );
    }

    #[test]
    fn a_connection_below_the_version_gets_the_old_shape() {
        let mut buf = encode(&msg());
        append(&mut buf, 5, &V6 { id: 7 });
        assert_eq!(buf, encode(&msg()));
        // ... which a new decoder reads with the group at its default.
        assert_eq!(
            decode_with::<Msg, V6>(&buf).unwrap(),
            (msg(), V6::default())
        );
    }

    #[test]
    fn a_damaged_trailer_is_an_error_not_a_default() {
        let mut buf = encode(&msg());
        buf.push(0xff); // a varint that never ends
        let e = decode_with::<Msg, V6>(&buf).unwrap_err();
        assert_eq!(e.code, Code::InvalidParams);
        assert!(e.message.contains("protocol 6"), "{e}");
    }

    /// Groups of later versions chain: each is read after the one before,
    /// and a peer that stopped earlier leaves the rest at their defaults.
    #[test]
    fn groups_chain_in_version_order() {
        let t6 = V6 { id: 9 };
        let t7 = || V7 {
            ttl_ms: 5,
            tag: "x".into(),
        };
        for (version, want6, want7) in [
            (5, V6::default(), V7::default()),
            (6, t6, V7::default()),
            (7, t6, t7()),
        ] {
            let mut buf = encode(&msg());
            append(&mut buf, version, &t6);
            append(&mut buf, version, &t7());
            let (m, rest) = postcard::take_from_bytes::<Msg>(&buf).unwrap();
            let (g6, rest) = take::<V6>(rest).unwrap();
            let (g7, rest) = take::<V7>(rest).unwrap();
            assert_eq!((m, g6, g7), (msg(), want6, want7), "v{version}");
            assert!(rest.is_empty());
        }
    }

    proptest! {
        /// Whatever follows a valid message, decoding never panics, and an
        /// old decoder still sees the message.
        #[test]
        fn junk_after_a_message_never_panics(junk in prop::collection::vec(any::<u8>(), 0..32)) {
            let mut buf = encode(&msg());
            buf.extend_from_slice(&junk);
            let _ = decode_with::<Msg, V7>(&buf);
            prop_assert_eq!(postcard::from_bytes::<Msg>(&buf).unwrap(), msg());
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_with::<Msg, V7>(&bytes);
            let _ = take::<V7>(&bytes);
        }
    }
}
