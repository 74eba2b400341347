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
//!                              (0: the object was destroyed)
//!     24    8 value checksum   xxh3-64 of the value bytes
//!     32    8 header checksum  xxh3-64 of bytes 0..32 followed by the key
//!     40    k key bytes (UTF-8)
//!   40+k    v value bytes
//! ```

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use crate::fused::{fused_applies, fused_copy_hash, Stores};
use crate::xxh3_64;
use kvpool_proto::{Code, KvError, KvResult};

/// Magic at the start of every object region.
pub const OBJECT_MAGIC: [u8; 4] = *b"KVOB";
/// Object header format written by this build.
pub const OBJECT_FORMAT: u16 = 1;
/// Fixed part of the header, before the key.
pub const FIXED_LEN: usize = 40;
/// Offset of the generation in a header: the word an invalidation clears
/// (see [`crate::scan::invalidate`]); 8-byte aligned in every region.
pub const GENERATION_AT: usize = 16;

/// The generation word of the header at the start of `region`, as an
/// atomic, when the region holds one at an 8-byte aligned address.
pub(crate) fn generation_word(region: &mut [u8]) -> Option<&AtomicU64> {
    let word = region.get_mut(GENERATION_AT..GENERATION_AT + 8)?;
    let p = word.as_mut_ptr();
    // SAFETY: aligned (checked), 8 bytes in bounds, and borrowed mutably
    // for as long as the atomic lives.
    (p.align_offset(8) == 0).then(|| unsafe { AtomicU64::from_ptr(p.cast()) })
}

/// Stores `generation` (the one in the header just copied to the start
/// of `region`) there once more, with one atomic store. A store destroying
/// the region's previous object compares and swaps that word (see
/// [`crate::scan::invalidate`]): whatever the order of its swap and this
/// writer's copy, the new header ends with its own generation, because the
/// swap succeeds only before this store and changes nothing after it.
pub fn publish_generation(region: &mut [u8], generation: u64) {
    if let Some(word) = generation_word(region) {
        word.store(generation.to_le(), SeqCst);
    }
}

/// Header length for a key of `key_len` bytes.
pub fn header_len(key_len: usize) -> usize {
    FIXED_LEN + key_len
}

/// Checksum of a value given as parts (their concatenation).
pub fn value_checksum(parts: &[&[u8]]) -> u64 {
    if let [one] = parts {
        return xxh3_64(one);
    }
    let mut h = ValueHasher::new();
    for p in parts {
        h.update(p);
    }
    h.digest()
}

/// The value checksum computed piece by piece (xxh3-64, as
/// [`value_checksum`]), for bytes that arrive in pieces. Its vector code
/// is picked at run time (AVX2 where the CPU has it: 2.5x the speed of the
/// baseline build's SSE2 on 512 KiB values), with the same results.
#[derive(Clone, Default)]
pub struct ValueHasher(twox_hash::XxHash3_64);

impl ValueHasher {
    /// Nothing hashed yet (seed 0).
    pub fn new() -> ValueHasher {
        ValueHasher::default()
    }

    /// Hashes `bytes` after what came before.
    pub fn update(&mut self, bytes: &[u8]) {
        std::hash::Hasher::write(&mut self.0, bytes);
    }

    /// The checksum of everything hashed so far.
    pub fn digest(&self) -> u64 {
        std::hash::Hasher::finish(&self.0)
    }
}

/// Bytes hashed at a time by [`copy_sealed`]: small enough that a chunk
/// is still in the L2 cache when it is hashed right after its copy (64 KiB
/// and 256 KiB measured alike on 4 MiB puts).
const SEAL_CHUNK: usize = 256 << 10;

/// Values from this size up are copied into a segment around the cache
/// ([`Stores::Streamed`]): the writer does not read them again. A Rust
/// loop on this VM, copies into a 1 GiB region: 1.6-1.9x as fast from
/// 64 KiB to 4 MiB; smaller values are a small part of their put.
const STREAM_WRITES_FROM: usize = 64 << 10;

/// Values from this size up are read into caller memory around the cache:
/// a batch of them does not fit it (a Rust loop on this VM, 1 GiB read
/// into 128 MiB of buffers: 1.2-1.3x from 512 KiB up), and one read into
/// the same buffer again and again lost under 3% from 1 MiB up (9% at
/// 64 KiB, where the buffer stays in the cache).
const STREAM_READS_FROM: usize = 1 << 20;

/// [`Stores::Streamed`] for a value of `len` bytes from `floor` up.
fn stores(len: usize, floor: usize) -> Stores {
    if len >= floor {
        Stores::Streamed
    } else {
        Stores::Cached
    }
}

/// Rewrites the value checksum of the encoded header at the start of
/// `region` (and the header's own checksum) to `checksum`. The header must
/// be whole and intact; otherwise nothing is written and `false` returned,
/// so a damaged header stays damaged and every reader refuses it.
pub fn seal(region: &mut [u8], checksum: u64) -> bool {
    let Ok(key) = checked(region) else {
        return false;
    };
    let key_len = key.len();
    region[24..32].copy_from_slice(&checksum.to_le_bytes());
    let hc = header_checksum(&region[..32], &region[FIXED_LEN..FIXED_LEN + key_len]);
    region[32..40].copy_from_slice(&hc.to_le_bytes());
    true
}

/// Value bytes of the object whose encoded header starts `region`: the
/// header's length, from its key length (`None` when the fixed part is
/// not all there).
pub fn value_start(region: &[u8]) -> Option<usize> {
    let fixed = region.get(..FIXED_LEN)?;
    Some(header_len(u16::from_le_bytes([fixed[6], fixed[7]]) as usize))
}

/// Copies the concatenation of `parts` (an encoded header, then the value)
/// into `dst`, and seals the header with the checksum of the value bytes
/// as they are in `dst`, each chunk hashed right after its copy. The
/// checksum is of the bytes stored, whatever a caller does to its source
/// meanwhile, so an object written this way always reads back. Returns
/// whether the header was sealed (see [`seal`]).
pub fn copy_sealed(dst: &mut [u8], parts: &[&[u8]]) -> bool {
    let start = parts.first().and_then(|h| value_start(h));
    // A header, then the value in one piece: the value copied and hashed in
    // one pass, after the header as below.
    if let (&[head, value], Some(s)) = (parts, start.filter(|&s| s == parts[0].len())) {
        let end = s + value.len();
        if dst.len() >= end && fused_applies(value.len()) {
            dst[..s].copy_from_slice(head);
            publish_generation(dst, u64_at(head, GENERATION_AT));
            let sum = fused_copy_hash(
                &mut dst[s..end],
                value,
                stores(value.len(), STREAM_WRITES_FROM),
            );
            return sum.is_some_and(|sum| seal(&mut dst[..end], sum));
        }
    }
    // Some only for a whole fixed header (`value_start` checks its length).
    let mut generation = start.and(parts.first()).map(|h| u64_at(h, GENERATION_AT));
    let mut h = ValueHasher::new();
    let mut at = 0;
    for p in parts {
        for piece in p.chunks(SEAL_CHUNK) {
            let end = at + piece.len();
            dst[at..end].copy_from_slice(piece);
            if let Some(g) = generation.take() {
                publish_generation(dst, g);
            }
            if let Some(s) = start.filter(|&s| s < end) {
                h.update(&dst[at.max(s)..end]);
            }
            at = end;
        }
    }
    start.is_some() && seal(&mut dst[..at], h.digest())
}

/// Copies `src` into `dst`'s buffers in order (an object's header, then its
/// value) and returns the checksum of the value bytes as they landed: each
/// chunk is hashed right after its copy, while it is still in the cache,
/// instead of in a second pass over the whole value. What a reader then
/// checks against the header, as [`value_checksum`] of `dst[1..]` would.
/// `src` must be as long as `dst` together.
pub fn copy_summed(dst: &mut [&mut [u8]], src: &[u8]) -> u64 {
    // A header, then the value in one buffer: copied and hashed in one pass.
    if let [head, value] = dst {
        let (h, v) = src.split_at(head.len().min(src.len()));
        if let Some(sum) = fused_copy_hash(value, v, stores(v.len(), STREAM_READS_FROM)) {
            head.copy_from_slice(h);
            return sum;
        }
    }
    let mut h = ValueHasher::new();
    let mut at = 0;
    for (i, d) in dst.iter_mut().enumerate() {
        for piece in d.chunks_mut(SEAL_CHUNK) {
            piece.copy_from_slice(&src[at..at + piece.len()]);
            at += piece.len();
            if i > 0 {
                h.update(piece);
            }
        }
    }
    h.digest()
}

/// The header `parts` start with, sealed with the checksum of the bytes
/// after it: for a reader of `parts` that keeps the header it is sent.
/// `None` when `parts` do not start with a whole, intact header.
pub fn sealed_header(parts: &[&[u8]]) -> Option<Vec<u8>> {
    let first = parts.first()?;
    let start = value_start(first).filter(|&s| s <= first.len())?;
    let mut h = ValueHasher::new();
    h.update(&first[start..]);
    for p in &parts[1..] {
        h.update(p);
    }
    let mut head = first[..start].to_vec();
    seal(&mut head, h.digest()).then_some(head)
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
        let key = checked(b)?;
        Ok(ObjectHeader {
            key: key.to_string(),
            value_len: u64_at(b, 8),
            generation: u64_at(b, 16),
            checksum: u64_at(b, 24),
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

/// The key of the encoded header `b` starts with, once its magic, version,
/// length and own checksum are checked; copies nothing, so a store can
/// check every header it seals. Never panics on any input.
fn checked(b: &[u8]) -> KvResult<&str> {
    let bad = |why: &str| KvError::new(Code::ChecksumMismatch, format!("object header: {why}"));
    if b.len() < FIXED_LEN {
        return Err(bad("truncated"));
    }
    if b[0..4] != OBJECT_MAGIC {
        return Err(bad("bad magic"));
    }
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let version = u16_at(4);
    if version != OBJECT_FORMAT {
        return Err(bad(&format!("unknown format version {version}")));
    }
    let key_len = u16_at(6) as usize;
    let key = b
        .get(FIXED_LEN..FIXED_LEN + key_len)
        .ok_or_else(|| bad("truncated key"))?;
    if header_checksum(&b[..32], key) != u64_at(b, 32) {
        return Err(bad("header checksum mismatch"));
    }
    std::str::from_utf8(key).map_err(|_| bad("key is not UTF-8"))
}

/// The little-endian u64 at `i` of `b` (which holds it).
fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

fn header_checksum(fixed: &[u8], key: &[u8]) -> u64 {
    let mut h = ValueHasher::new();
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
    fn a_copy_is_sealed_with_the_checksum_of_the_bytes_it_stored() {
        let value: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let h = ObjectHeader {
            key: "k".into(),
            value_len: value.len() as u64,
            generation: 3,
            checksum: 0,
        };
        let head = h.encode();
        // The value in pieces, and whole (copied and hashed in one pass).
        for parts in [&[&head[..], &value[..5], &value[5..]][..], &[&head, &value]] {
            let mut dst = vec![0u8; head.len() + value.len()];
            assert!(copy_sealed(&mut dst, parts));
            let got = ObjectHeader::decode(&dst).unwrap();
            assert_eq!(got.checksum, value_checksum(&[&value]));
            assert_eq!(got.generation, 3);
            assert_eq!(&dst[head.len()..], &value[..]);
            // What a reader checks: the stored value against the stored header.
            assert_eq!(value_checksum(&[&dst[head.len()..]]), got.checksum);
        }
    }

    #[test]
    fn a_summed_copy_sums_what_a_reader_checks() {
        let src: Vec<u8> = (0..(SEAL_CHUNK * 2 + 777) as u32)
            .map(|i| (i * 13) as u8)
            .collect();
        let (mut head, mut a, mut b) = (vec![0u8; 50], vec![0u8; 5], vec![0u8; src.len() - 55]);
        let sum = copy_summed(&mut [&mut head, &mut a, &mut b], &src);
        assert_eq!([head, a.clone(), b.clone()].concat(), src);
        assert_eq!(sum, value_checksum(&[&a, &b]));
        // One value buffer: copied and hashed in one pass.
        let (mut head, mut v) = (vec![0u8; 50], vec![0u8; src.len() - 50]);
        let sum = copy_summed(&mut [&mut head, &mut v], &src);
        assert_eq!([head, v.clone()].concat(), src);
        assert_eq!(sum, value_checksum(&[&v]));
        assert_eq!(
            copy_summed(&mut [&mut [0u8; 3]], b"abc"),
            value_checksum(&[])
        );
    }

    #[test]
    fn a_header_sealed_apart_is_the_one_a_copy_seals() {
        let value = b"some value bytes".repeat(100);
        let h = ObjectHeader {
            key: "kk".into(),
            value_len: value.len() as u64,
            generation: 9,
            checksum: 0,
        };
        let mut whole = h.encode();
        whole.extend_from_slice(&value[..7]);
        let parts: &[&[u8]] = &[&whole, &value[7..]];
        let sealed = sealed_header(parts).unwrap();
        let mut dst = vec![0u8; whole.len() + value.len() - 7];
        assert!(copy_sealed(&mut dst, parts));
        assert_eq!(&dst[..sealed.len()], &sealed[..]);
        assert_eq!(sealed_header(&[b"short"]), None);
    }

    #[test]
    fn a_damaged_header_is_never_sealed() {
        let h = ObjectHeader {
            key: "key".into(),
            value_len: 4,
            generation: 1,
            checksum: 0,
        };
        let mut b = h.encode();
        b.extend_from_slice(b"abcd");
        b[41] ^= 1;
        let before = b.clone();
        assert!(!seal(&mut b, 9));
        assert_eq!(b, before);
        assert!(!seal(&mut b[..20], 9));
        assert!(!copy_sealed(&mut [0u8; 8], &[b"tiny"]));
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
