//! Limits every receiver enforces on well-formed requests, checked before a
//! request costs memory or work, and the helpers senders use to stay inside
//! them. Frame sizes are in [`crate::frame::Limits`]; the numbers here are
//! about what a message carries.
//!
//! | limit | value | refused with |
//! |---|---|---|
//! | message after the handshake | [`MAX_MESSAGE`] (16 MiB) | `BUFFER_OVERFLOW`, connection closed |
//! | keys per batch request, inventory part or invalidation | [`MAX_BATCH_KEYS`] (16,384) | `INVALID_PARAMS`, whole request |
//! | key length | [`MAX_KEY_LEN`] (65,535 B) | `INVALID_KEY`, per key |
//! | metadata-service key length | [`MAX_METADATA_KEY_LEN`] (4,096 B) | HTTP 414 |
//! | hostnames, segment names, endpoints | [`MAX_NAME_LEN`] (255 B) | `INVALID_PARAMS` |
//! | segment file path | [`MAX_PATH_LEN`] (4,096 B) | `INVALID_PARAMS` |
//! | `preferred_segments` of one put | [`MAX_PREFERRED_SEGMENTS`] names | `INVALID_PARAMS` |
//! | remove-by-regex pattern | [`MAX_PATTERN_LEN`] (4 KiB) | `INVALID_PARAMS` |
//! | keys per `ListKeys` page | [`MAX_LIST_KEYS`] (10,000), [`LIST_PAGE_BYTES`] of keys | capped, not refused |

use std::ops::Range;

use crate::code::{Code, KvError, KvResult};

/// Longest key accepted anywhere (bytes of UTF-8): what the object
/// header's 16-bit key length holds. Engines' keys carry model names,
/// ranks and hashes, and Mooncake takes keys of 16 KiB and more. Longer
/// keys get [`Code::InvalidKey`].
pub const MAX_KEY_LEN: usize = u16::MAX as usize;

/// Longest key of the HTTP metadata service (it travels in the URL).
pub const MAX_METADATA_KEY_LEN: usize = 4096;

/// Most keys (or items, or regions) one batch request may carry: `PutStart`,
/// `PutEnd`, `PutRevoke`, `GetReplicaList`, `Exist`, `Remove`, `Touch`, an
/// inventory part (`ReportObjects`) and an `Invalidate`. Clients and stores
/// split bigger batches ([`batch_chunks`]); a receiver refuses a bigger one
/// whole, before decoding it.
pub const MAX_BATCH_KEYS: usize = 16_384;

/// Largest message (a frame's meta section) accepted once the handshake is
/// done: [`crate::frame::Limits::default`].
pub const MAX_MESSAGE: u32 = 16 << 20;

/// Bytes of items a sender puts in one batch request: half of
/// [`MAX_MESSAGE`], which leaves the rest of the message (ids, the
/// replicate config) far inside the limit whatever the key lengths.
pub const BATCH_BYTES: usize = MAX_MESSAGE as usize / 2;

/// Encoded bytes of one batch item beyond its key, at most: the key's length
/// prefix and up to four varint integers (generation, lengths, offsets).
pub const ITEM_OVERHEAD: usize = 64;

/// Longest hostname, segment name or endpoint (bytes), as for a DNS name.
pub const MAX_NAME_LEN: usize = 255;

/// Longest segment file path a store may announce (Linux's `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;

/// Most segment names one put may prefer: placement compares each with every
/// mounted segment, for every key of the batch.
pub const MAX_PREFERRED_SEGMENTS: usize = 64;

/// Longest remove-by-regex pattern (bytes).
pub const MAX_PATTERN_LEN: usize = 4 << 10;

/// Most keys one `ListKeys` page answers; a bigger `limit` is capped.
pub const MAX_LIST_KEYS: usize = 10_000;

/// Key bytes one `ListKeys` page carries at most (a page ends early past
/// it): [`BATCH_BYTES`], so a page of the longest keys fits a message.
pub const LIST_PAGE_BYTES: usize = BATCH_BYTES;

/// Checks a key against the limits every component enforces.
pub fn validate_key(key: &str) -> KvResult<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(KvError::new(
            Code::InvalidKey,
            format!("key length {} not in 1..={MAX_KEY_LEN}", key.len()),
        ));
    }
    Ok(())
}

/// Checks the item count of a batch request (`what` names it in the error).
pub fn check_batch(what: &str, n: u64) -> KvResult<()> {
    if n > MAX_BATCH_KEYS as u64 {
        return Err(KvError::new(
            Code::InvalidParams,
            format!(
                "{what} of {n} items exceeds the limit of {MAX_BATCH_KEYS} per request; split it"
            ),
        ));
    }
    Ok(())
}

/// Checks a hostname or segment name: 1 to [`MAX_NAME_LEN`] bytes, no
/// control characters (it ends up in logs and status pages).
pub fn validate_name(what: &str, name: &str) -> KvResult<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("{what} of {} bytes not in 1..={MAX_NAME_LEN}", name.len()),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("{what} {name:?} contains control characters"),
        ));
    }
    Ok(())
}

/// Checks a data-plane endpoint: a name (see [`validate_name`]) of the form
/// `host:port` or `[v6]:port`, port 1..=65535, host without spaces.
pub fn validate_endpoint(endpoint: &str) -> KvResult<()> {
    validate_name("endpoint", endpoint)?;
    let bad = |why: &str| {
        Err(KvError::new(
            Code::InvalidParams,
            format!("endpoint {endpoint:?} is not host:port ({why})"),
        ))
    };
    let Some((host, port)) = endpoint.rsplit_once(':') else {
        return bad("no port");
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return bad("port not in 1..=65535"),
    }
    let host = match host.strip_prefix('[') {
        Some(v6) => match v6.strip_suffix(']') {
            Some(v6) if v6.parse::<std::net::Ipv6Addr>().is_ok() => return Ok(()),
            _ => return bad("bad IPv6 address"),
        },
        None => host,
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == ':' || c == '/') {
        return bad("bad host");
    }
    Ok(())
}

/// Splits a batch of `items` into runs that each fit one request: at most
/// [`MAX_BATCH_KEYS`] items and at most [`BATCH_BYTES`] of `bytes(item)`
/// (a bound on the item's encoded size, e.g. its key length plus
/// [`ITEM_OVERHEAD`]). An empty batch is one empty run. Runs are in order
/// and cover every item.
pub fn batch_chunks<T>(items: &[T], bytes: impl Fn(&T) -> usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let b = bytes(item);
        if i > start && (i - start == MAX_BATCH_KEYS || size + b > BATCH_BYTES) {
            out.push(start..i);
            (start, size) = (i, 0);
        }
        size += b;
    }
    out.push(start..items.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_names_are_bounded() {
        assert!(validate_key("k").is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        for bad in [String::new(), "k".repeat(MAX_KEY_LEN + 1)] {
            assert_eq!(validate_key(&bad).unwrap_err().code, Code::InvalidKey);
        }
        assert!(validate_name("hostname", &"h".repeat(MAX_NAME_LEN)).is_ok());
        for bad in [String::new(), "h".repeat(MAX_NAME_LEN + 1), "a\nb".into()] {
            let e = validate_name("hostname", &bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidParams);
            assert!(e.message.contains("hostname"), "{e}");
        }
    }

    #[test]
    fn endpoints_must_parse() {
        for ok in ["127.0.0.1:9000", "store-3.example.com:1", "[::1]:65535"] {
            assert!(validate_endpoint(ok).is_ok(), "{ok}");
        }
        let long = format!("{}:80", "h".repeat(MAX_NAME_LEN));
        for bad in [
            "nohost",
            ":80",
            "host:0",
            "host:65536",
            "host:port",
            "a b:80",
            "[::1:80",
            "[zz]:80",
            "a:b:80",
            long.as_str(),
        ] {
            let e = validate_endpoint(bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidParams, "{bad}");
        }
    }

    #[test]
    fn batch_counts_are_checked() {
        assert!(check_batch("Exist", MAX_BATCH_KEYS as u64).is_ok());
        let e = check_batch("Exist", MAX_BATCH_KEYS as u64 + 1).unwrap_err();
        assert_eq!(e.code, Code::InvalidParams);
        assert!(e.message.contains("16384"), "{e}");
    }

    #[test]
    fn chunks_respect_both_limits_and_cover_everything_in_order() {
        assert_eq!(batch_chunks::<u8>(&[], |_| 1), vec![0..0]);
        let small = vec![1usize; 40_000];
        let runs = batch_chunks(&small, |&b| b);
        assert_eq!(runs, vec![0..16_384, 16_384..32_768, 32_768..40_000]);
        // Big items: the byte budget splits first.
        let big = vec![MAX_KEY_LEN + ITEM_OVERHEAD; 5_000];
        let runs = batch_chunks(&big, |&b| b);
        let per = BATCH_BYTES / (MAX_KEY_LEN + ITEM_OVERHEAD);
        assert_eq!(runs[0], 0..per);
        assert_eq!(runs.last().unwrap().end, 5_000);
        for w in runs.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        for r in &runs {
            assert!(r.len() <= MAX_BATCH_KEYS);
            assert!(r.len() * (MAX_KEY_LEN + ITEM_OVERHEAD) <= BATCH_BYTES);
        }
        // One item over the budget still gets a run of its own.
        assert_eq!(
            batch_chunks(&[1, BATCH_BYTES * 2, 1], |&b| b),
            vec![0..1, 1..2, 2..3]
        );
    }
}
