//! The self-describing header at the start of every object region, written by
//! the client together with the value and checked by every reader (and by a
//! store's scan after a restart). It is a persisted format, so it is
//! versioned.
//!
//! ```text
//! offset size field
//!      0    4 magic            b"KVOB"
//!      4    2 format version   u16 LE (1)
//!      6    2 key length       u16 LE
//!      8    8 value length     u64 LE
//!     16    8 generation       u64 LE, assigned by the master per put
//!     24    8 value checksum   xxh3-64 of the value bytes
//!     32    8 header checksum  xxh3-64 of bytes 0..32 followed by the key
//!     40    k key bytes (UTF-8)
//!   40+k    v value bytes
//! ```

use kvpool_proto::{Code, KvError, KvResult};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// Magic at the start of every object region.
pub const OBJECT_MAGIC: [u8; 4] = *b"KVOB";
/// Object header format written by this build.
pub const OBJECT_FORMAT: u16 = 1;
/// Fixed part of the header, before the key.
pub const FIXED_LEN: usize = 40;

/// Header length for a key of `key_len` bytes.
pub fn header_len(key_len: usize) -> usize {
    FIXED_LEN + key_len
}

/// Checksum of a value given as parts (their concatenation).
pub fn value_checksum(parts: &[&[u8]]) -> u64 {
    if let [one] = parts {
        return xxh3_64(one);
    }
    let mut h = Xxh3::new();
    for p in parts {
        h.update(p);
    }
    h.digest()
}

/// The decoded fields of an object header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectHeader {
    /// The object's key.
    pub key: String,
    /// Length of the value after the header.
    pub value_len: u64,
    /// Put generation from the master.
    pub generation: u64,
    /// xxh3-64 of the value.
    pub checksum: u64,
}

impl ObjectHeader {
    /// Encodes the header (with its own checksum) for writing before the value.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(header_len(self.key.len()));
        b.extend_from_slice(&OBJECT_MAGIC);
        b.extend_from_slice(&OBJECT_FORMAT.to_le_bytes());
        b.extend_from_slice(&(self.key.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.value_len.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.checksum.to_le_bytes());
        let hc = header_checksum(&b[..32], self.key.as_bytes());
        b.extend_from_slice(&hc.to_le_bytes());
        b.extend_from_slice(self.key.as_bytes());
        b
    }

    /// Decodes and checks a header; never panics on any input.
    pub fn decode(b: &[u8]) -> KvResult<ObjectHeader> {
        let bad = |why: &str| KvError::new(Code::ChecksumMismatch, format!("object header: {why}"));
        if b.len() < FIXED_LEN {
            return Err(bad("truncated"));
        }
        if b[0..4] != OBJECT_MAGIC {
            return Err(bad("bad magic"));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let version = u16_at(4);
        if version != OBJECT_FORMAT {
            return Err(bad(&format!("unknown format version {version}")));
        }
        let key_len = u16_at(6) as usize;
        let key = b
            .get(FIXED_LEN..FIXED_LEN + key_len)
            .ok_or_else(|| bad("truncated key"))?;
        if header_checksum(&b[..32], key) != u64_at(32) {
            return Err(bad("header checksum mismatch"));
        }
        let key = std::str::from_utf8(key).map_err(|_| bad("key is not UTF-8"))?;
        Ok(ObjectHeader {
            key: key.to_string(),
            value_len: u64_at(8),
            generation: u64_at(16),
            checksum: u64_at(24),
        })
    }

    /// Checks that a decoded header is the object the master pointed to.
    pub fn expect(&self, key: &str, value_len: u64, generation: u64) -> KvResult<()> {
        if self.key != key || self.value_len != value_len || self.generation != generation {
            return Err(KvError::new(
                Code::ChecksumMismatch,
                format!(
                    "region holds {:?} len {} gen {}, expected {key:?} len {value_len} gen {generation}",
                    self.key, self.value_len, self.generation
                ),
            ));
        }
        Ok(())
    }
}

fn header_checksum(fixed: &[u8], key: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(fixed);
    h.update(key);
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(key in "[a-z0-9_]{1,200}", value_len in any::<u64>(), generation in any::<u64>(), checksum in any::<u64>()) {
            let h = ObjectHeader { key, value_len, generation, checksum };
            let b = h.encode();
            prop_assert_eq!(b.len(), header_len(h.key.len()));
            prop_assert_eq!(ObjectHeader::decode(&b).unwrap(), h);
        }

        #[test]
        fn any_flipped_bit_is_caught(key in "[a-z]{1,40}", bit in 0usize..(8 * 80)) {
            let h = ObjectHeader { key, value_len: 5, generation: 1, checksum: 9 };
            let mut b = h.encode();
            let bit = bit % (b.len() * 8);
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(ObjectHeader::decode(&b).is_err());
        }

        #[test]
        fn garbage_never_panics(b in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = ObjectHeader::decode(&b);
        }
    }

    #[test]
    fn multi_part_checksum_equals_whole() {
        let v: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        assert_eq!(
            value_checksum(&[&v]),
            value_checksum(&[&v[..3], &v[3..5000], &v[5000..]])
        );
    }
}
