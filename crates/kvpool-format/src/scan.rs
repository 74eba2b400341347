//! Finding the objects an object area holds (a store does it after a restart
//! or when a new master asks for them), and invalidating freed regions so
//! they never come back.
//!
//! The scan walks the object area in 64-byte steps (the allocator's
//! alignment). Where a header decodes and its value's checksum verifies, the
//! whole object is taken and the walk jumps past it, so header-like bytes
//! inside a value are never mistaken for an object; anything else (torn
//! writes, stale or invalidated regions, zeroes) is stepped over.
//!
//! Both work on plain bytes: the caller hands in the segment's memory.

use std::sync::atomic::Ordering::SeqCst;

use crate::header::{
    header_len, value_checksum, ObjectHeader, FIXED_LEN, GENERATION_AT, OBJECT_MAGIC,
};

/// Alignment of regions in the object area (the master allocator's).
pub const REGION_ALIGN: u64 = 64;

/// An intact object found in a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The object's key.
    pub key: String,
    /// Generation from its header.
    pub generation: u64,
    /// Value bytes.
    pub value_len: u64,
    /// Region start.
    pub offset: u64,
    /// Region length as the allocator reserved it (rounded up).
    pub region_len: u64,
}

/// What a scan saw, for logs and the restart-time report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanStats {
    /// Objects kept.
    pub objects: u64,
    /// Bytes they occupy.
    pub bytes: u64,
    /// Headers that decoded but whose value failed its checksum (torn writes).
    pub torn: u64,
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(REGION_ALIGN) * REGION_ALIGN
}

/// `len` bytes of `segment` at `offset`, if they lie inside it.
fn bytes_at(segment: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    segment.get(start..end)
}

/// Reads the object at `offset` if one is intact there.
fn object_at(segment: &[u8], offset: u64) -> Result<Option<Found>, ()> {
    let Some(fixed) = bytes_at(segment, offset, FIXED_LEN as u64) else {
        return Ok(None);
    };
    if fixed[..4] != OBJECT_MAGIC {
        return Ok(None);
    }
    let key_len = u16::from_le_bytes([fixed[6], fixed[7]]) as u64;
    let hl = header_len(key_len as usize) as u64;
    let Some(header) = bytes_at(segment, offset, hl) else {
        return Ok(None);
    };
    let Ok(h) = ObjectHeader::decode(header) else {
        return Ok(None);
    };
    if h.generation == DESTROYED {
        return Ok(None);
    }
    let Some(total) = hl.checked_add(h.value_len) else {
        return Err(());
    };
    let Some(value) = bytes_at(segment, offset + hl, h.value_len) else {
        return Err(());
    };
    if value_checksum(&[value]) != h.checksum {
        return Err(());
    }
    Ok(Some(Found {
        key: h.key,
        generation: h.generation,
        value_len: h.value_len,
        offset,
        region_len: round_up(total),
    }))
}

/// Every intact object in `segment` from `base` on, in offset order; offsets
/// are from the start of `segment`.
pub fn scan(segment: &[u8], base: u64) -> (Vec<Found>, ScanStats) {
    let mut found = Vec::new();
    let mut stats = ScanStats::default();
    let mut off = round_up(base);
    while off < segment.len() as u64 {
        match object_at(segment, off) {
            Ok(Some(f)) => {
                stats.objects += 1;
                stats.bytes += f.region_len;
                off += f.region_len;
                found.push(f);
            }
            Ok(None) => off += REGION_ALIGN,
            Err(()) => {
                stats.torn += 1;
                off += REGION_ALIGN;
            }
        }
    }
    (found, stats)
}

/// Whether `bytes` hold exactly an intact object of `generation`: its
/// header decodes, names that generation, and its value (which must end
/// within `bytes`) matches its checksum. A copy is checked so before it is
/// made durable elsewhere (a demotion to disk).
pub fn intact(bytes: &[u8], generation: u64) -> bool {
    matches!(object_at(bytes, 0), Ok(Some(f)) if f.generation == generation)
}

/// The header at the start of `block` and the object's total length
/// (header and value), if one decodes there; the value is not read. A
/// disk-tier scan uses it: disk copies are verified before they are
/// written, header last, so a header found there vouches for its value.
pub fn header_at(block: &[u8]) -> Option<(ObjectHeader, u64)> {
    let fixed = block.get(..FIXED_LEN)?;
    if fixed[..4] != OBJECT_MAGIC {
        return None;
    }
    let key_len = u16::from_le_bytes([fixed[6], fixed[7]]) as usize;
    let h = ObjectHeader::decode(block.get(..header_len(key_len))?).ok()?;
    if h.generation == DESTROYED {
        return None;
    }
    let total = (header_len(key_len) as u64).checked_add(h.value_len)?;
    Some((h, total))
}

/// The generation in the fixed part of a header at the start of `fixed`,
/// if its magic is there (the header's checksum, which covers the key that
/// follows, is not checked).
pub fn fixed_generation(fixed: &[u8]) -> Option<u64> {
    let fixed = fixed.get(..FIXED_LEN)?;
    (fixed[..4] == OBJECT_MAGIC)
        .then(|| u64::from_le_bytes(fixed[GENERATION_AT..][..8].try_into().unwrap_or([0; 8])))
        .filter(|&g| g != DESTROYED)
}

/// The key bytes of the header at the start of `block`, if its magic is
/// there and the key lies within `block` (nothing else is checked: a store
/// compares them with a grant's signature, which a torn header fails).
pub fn key_at(block: &[u8]) -> Option<&[u8]> {
    let fixed = block.get(..FIXED_LEN)?;
    if fixed[..4] != OBJECT_MAGIC {
        return None;
    }
    let key_len = u16::from_le_bytes([fixed[6], fixed[7]]) as usize;
    block.get(FIXED_LEN..FIXED_LEN + key_len)
}

/// The generation a destroyed header carries; the master never issues it.
pub const DESTROYED: u64 = 0;

/// Destroys the object whose header starts at `object[0]` if that header
/// still carries `generation`, so a freed region can never be found again by
/// a scan nor read through an old location: its generation becomes
/// [`DESTROYED`], which also breaks the header's checksum. A region already
/// reused by a newer object (another generation), or fewer than
/// [`FIXED_LEN`] bytes, is left alone.
///
/// The master hands a freed memory region out again before its old object
/// is destroyed, so a writer may be copying a new object here meanwhile,
/// from another process. The generation is therefore changed with one
/// compare-and-swap, and a writer stores its own generation once more,
/// atomically, after copying its header
/// ([`crate::header::publish_generation`]): either the swap comes first and
/// the writer's store overwrites it, or the swap finds the new generation
/// and does nothing. Where the old header lies inside the new object's
/// value, the swap either comes before the value's bytes there or finds
/// them (which hold the old magic and generation only if the writer put
/// them there). (Zeroing the magic after checking the generation, as
/// this did before, could land after a writer's header: the new object
/// was lost, or a value covering the old header got four zero bytes.)
pub fn invalidate(object: &mut [u8], generation: u64) -> bool {
    if generation == DESTROYED || object.len() < FIXED_LEN || object[..4] != OBJECT_MAGIC {
        return false;
    }
    match crate::header::generation_word(object) {
        Some(word) => word
            .compare_exchange(generation.to_le(), DESTROYED, SeqCst, SeqCst)
            .is_ok(),
        // Unaligned: a private copy (a disk block read into a buffer),
        // which nobody else writes.
        None => {
            let Some(word) = object.get_mut(GENERATION_AT..GENERATION_AT + 8) else {
                return false;
            };
            if word != generation.to_le_bytes() {
                return false;
            }
            word.copy_from_slice(&DESTROYED.to_le_bytes());
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(segment: &mut [u8], offset: u64, key: &str, generation: u64, value: &[u8]) -> u64 {
        let h = ObjectHeader {
            key: key.into(),
            value_len: value.len() as u64,
            generation,
            checksum: value_checksum(&[value]),
        }
        .encode();
        let dst = &mut segment[offset as usize..][..h.len() + value.len()];
        dst[..h.len()].copy_from_slice(&h);
        dst[h.len()..].copy_from_slice(value);
        round_up((h.len() + value.len()) as u64)
    }

    /// Test helper: invalidate at an offset of the whole segment.
    fn invalidate_at(segment: &mut [u8], offset: u64, generation: u64) -> bool {
        invalidate(&mut segment[offset as usize..], generation)
    }

    #[test]
    fn finds_intact_objects_and_skips_torn_and_invalidated_ones() {
        let mut r = vec![0u8; 1 << 20];
        let base = 4096;
        let a = write(&mut r, base, "a", 1, &[1; 1000]);
        let b_off = base + a;
        let b = write(&mut r, b_off, "b", 2, &[2; 5000]);
        let c_off = b_off + b + 640; // a gap of stale zeroes
        let c = write(&mut r, c_off, "c", 3, &[3; 70]);
        let d_off = c_off + c;
        write(&mut r, d_off, "torn", 4, &[4; 3000]);
        r[(d_off + 2000) as usize] ^= 0xff;
        // A value that itself contains a valid object: must not be found inside.
        let mut inner = vec![0u8; 4096];
        let mut inner_obj = vec![0u8; 8192];
        let n = write(&mut inner_obj, 0, "fake", 9, b"x") as usize;
        inner[64..64 + n].copy_from_slice(&inner_obj[..n]);
        let e_off = d_off + 8192;
        write(&mut r, e_off, "e", 5, &inner);

        let (found, stats) = scan(&r, base);
        let keys: Vec<&str> = found.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "e"]);
        assert_eq!(stats.torn, 1);
        assert_eq!(found[1].offset, b_off);
        assert_eq!(found[1].region_len, b);
        assert_eq!(found[3].generation, 5);

        assert!(
            !invalidate_at(&mut r, b_off, 99),
            "wrong generation must not invalidate"
        );
        assert!(invalidate_at(&mut r, b_off, 2));
        let (found, _) = scan(&r, base);
        let keys: Vec<&str> = found.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["a", "c", "e"]);
    }

    #[test]
    fn garbage_segment_never_panics() {
        let mut bytes = vec![0u8; 64 << 10];
        let mut x: u32 = 12345;
        for (i, b) in bytes.iter_mut().enumerate() {
            x = x.wrapping_mul(1103515245).wrapping_add(12345);
            *b = if i % 64 < 4 {
                OBJECT_MAGIC[i % 64]
            } else {
                (x >> 16) as u8
            };
        }
        let (found, _) = scan(&bytes, 0);
        assert!(found.is_empty());
    }

    #[test]
    fn intact_copies_and_headers_alone() {
        let mut r = vec![0u8; 8192];
        let len = write(&mut r, 0, "k", 7, &[5; 3000]);
        let total = header_len(1) + 3000;
        assert!(intact(&r[..total], 7));
        assert!(!intact(&r[..total], 8), "another generation");
        assert!(!intact(&r[..total - 1], 7), "cut short");
        let (h, t) = header_at(&r).unwrap();
        assert_eq!((h.key.as_str(), t), ("k", total as u64));
        assert!(len >= t);
        r[100] ^= 1;
        assert!(!intact(&r[..total], 7), "a damaged value");
        assert!(header_at(&r).is_some(), "the header alone still decodes");
        assert!(header_at(&r[..FIXED_LEN]).is_none(), "the key is cut off");
        assert!(header_at(&[0; 64]).is_none());
    }

    #[test]
    fn short_object_bytes_are_left_alone() {
        let mut r = vec![0u8; 4096];
        write(&mut r, 0, "k", 7, b"v");
        assert!(!invalidate(&mut r[..FIXED_LEN - 1], 7));
        assert!(invalidate(&mut r[..FIXED_LEN], 7));
        assert!(!invalidate(&mut r, 7), "already invalidated");
    }
}
