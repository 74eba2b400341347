//! Values the workload writes: each one names its key and version and
//! carries a checksum, so any reader (and the checker, long after) can tell
//! exactly which write a read returned, or that the bytes were never written
//! by anyone.
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `KVCH` |
//! | 4..12 | version (u64 LE), unique per write in a campaign |
//! | 12..20 | xxh3 of the key (u64 LE) |
//! | 20..24 | total length (u32 LE) |
//! | 24..len-8 | payload, a stream derived from (key hash, version) |
//! | len-8..len | xxh3 of bytes 0..len-8 (u64 LE) |

use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 4] = b"KVCH";
/// The shortest value: header and checksum, no payload.
pub const MIN_LEN: usize = 32;

/// What a read's bytes turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A value some write of this key produced, by its version.
    Version(u64),
    /// Bytes no write of this key produced; the reason says what is off.
    Corrupt(String),
}

/// The bytes of version `version` of `key`, `len` bytes long (at least
/// [`MIN_LEN`]).
pub fn encode(key: &str, version: u64, len: usize) -> Vec<u8> {
    let len = len.max(MIN_LEN);
    let kh = xxh3_64(key.as_bytes());
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&kh.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    fill_payload(&mut v, kh ^ version.rotate_left(17), len - 8);
    let sum = xxh3_64(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

/// Appends the payload stream of `seed` until `v` is `until` bytes long.
fn fill_payload(v: &mut Vec<u8>, seed: u64, until: usize) {
    let mut s = seed;
    while v.len() < until {
        // splitmix64: cheap, and any flipped or shifted byte shows.
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let take = (until - v.len()).min(8);
        v.extend_from_slice(&z.to_le_bytes()[..take]);
    }
}

/// Which version of `key` `bytes` are, or why they are none.
pub fn decode(key: &str, bytes: &[u8]) -> Decoded {
    let bad = |why: &str| Decoded::Corrupt(format!("{why} ({} bytes)", bytes.len()));
    if bytes.len() < MIN_LEN {
        return bad("shorter than any value");
    }
    if &bytes[..4] != MAGIC {
        return bad("no magic");
    }
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let version = u64_at(4);
    let kh = u64_at(12);
    let len = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes")) as usize;
    if len != bytes.len() {
        return bad(&format!("length field says {len}"));
    }
    let sum = u64_at(len - 8);
    if xxh3_64(&bytes[..len - 8]) != sum {
        return bad(&format!("checksum mismatch (version field {version:#x})"));
    }
    if kh != xxh3_64(key.as_bytes()) {
        return bad(&format!("value of another key (version {version:#x})"));
    }
    // The checksum covers the payload, but a writer bug could checksum
    // wrong bytes: the payload must be the one this version produces.
    if encode(key, version, len) != bytes {
        return bad(&format!("payload differs from version {version:#x}'s"));
    }
    Decoded::Version(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_at_every_length() {
        for len in [0, 31, 32, 33, 40, 41, 4096, 65_537] {
            let v = encode("k/1", 0xabc, len);
            assert_eq!(v.len(), len.max(MIN_LEN));
            assert_eq!(decode("k/1", &v), Decoded::Version(0xabc), "len {len}");
        }
    }

    #[test]
    fn anything_else_is_corrupt() {
        let v = encode("k/1", 7, 100);
        let corrupt = |b: &[u8]| matches!(decode("k/1", b), Decoded::Corrupt(_));
        assert!(corrupt(&v[..99]), "truncated");
        assert!(corrupt(&[]), "empty");
        let mut flipped = v.clone();
        flipped[50] ^= 1;
        assert!(corrupt(&flipped), "a flipped payload byte");
        assert!(
            matches!(decode("k/2", &v), Decoded::Corrupt(why) if why.contains("another key")),
            "another key's value"
        );
        let mut zeros = v.clone();
        zeros[..4].fill(0);
        assert!(corrupt(&zeros), "zeroed header (a destroyed object)");
        // A forged value with a valid checksum over a wrong payload.
        let mut forged = v.clone();
        forged[30] ^= 0xff;
        let n = forged.len();
        let sum = xxh3_64(&forged[..n - 8]);
        forged[n - 8..].copy_from_slice(&sum.to_le_bytes());
        assert!(
            matches!(decode("k/1", &forged), Decoded::Corrupt(why) if why.contains("payload")),
            "checksummed wrong payload"
        );
    }
}
