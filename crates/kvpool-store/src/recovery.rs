//! Finding the objects a segment file holds, after a restart or when a new
//! master asks for them, and invalidating freed regions so they never come
//! back.
//!
//! The scan walks the object area in 64-byte steps (the allocator's
//! alignment). Where a header decodes and its value's checksum verifies, the
//! whole object is taken and the walk jumps past it, so header-like bytes
//! inside a value are never mistaken for an object; anything else (torn
//! writes, stale or invalidated regions, zeroes) is stepped over.

use kvpool_transfer::MappedRegion;
use xxhash_rust::xxh3::xxh3_64;

use crate::header::{header_len, ObjectHeader, FIXED_LEN, OBJECT_MAGIC};

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

/// Reads the object at `offset` if one is intact there.
fn object_at(region: &MappedRegion, offset: u64) -> Result<Option<Found>, ()> {
    let size = region.len();
    if !region.contains(offset, FIXED_LEN as u64) {
        return Ok(None);
    }
    // SAFETY: in bounds (checked above).
    let fixed = unsafe { region.slice(offset, FIXED_LEN as u64) };
    if fixed[..4] != OBJECT_MAGIC {
        return Ok(None);
    }
    let key_len = u16::from_le_bytes([fixed[6], fixed[7]]) as u64;
    let hl = header_len(key_len as usize) as u64;
    if !region.contains(offset, hl) {
        return Ok(None);
    }
    // SAFETY: in bounds (checked above).
    let Ok(h) = ObjectHeader::decode(unsafe { region.slice(offset, hl) }) else {
        return Ok(None);
    };
    let Some(total) = hl
        .checked_add(h.value_len)
        .filter(|t| offset.checked_add(*t).is_some_and(|e| e <= size))
    else {
        return Err(());
    };
    // SAFETY: in bounds (checked above).
    let value = unsafe { region.slice(offset + hl, h.value_len) };
    if xxh3_64(value) != h.checksum {
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

/// Every intact object in `[base, len)` of `region`, in offset order.
pub fn scan(region: &MappedRegion, base: u64) -> (Vec<Found>, ScanStats) {
    let mut found = Vec::new();
    let mut stats = ScanStats::default();
    let mut off = round_up(base);
    while off < region.len() {
        match object_at(region, off) {
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

/// Destroys the object at `offset` if its header still carries `generation`,
/// so a freed region can never be found again by a scan. A region already
/// reused by a newer object (another generation) is left alone.
pub fn invalidate(region: &MappedRegion, offset: u64, generation: u64) -> bool {
    if !region.contains(offset, FIXED_LEN as u64) {
        return false;
    }
    // SAFETY: in bounds (checked above).
    let fixed = unsafe { region.slice(offset, FIXED_LEN as u64) };
    let gen = u64::from_le_bytes(fixed[16..24].try_into().unwrap_or([0; 8]));
    if fixed[..4] != OBJECT_MAGIC || gen != generation {
        return false;
    }
    // SAFETY: in bounds; a concurrent writer of a new object here rewrites the
    // whole header after this, so clearing the magic cannot damage it.
    unsafe { region.slice_mut(offset, 4) }.fill(0);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::value_checksum;

    fn write(region: &MappedRegion, offset: u64, key: &str, generation: u64, value: &[u8]) -> u64 {
        let h = ObjectHeader {
            key: key.into(),
            value_len: value.len() as u64,
            generation,
            checksum: value_checksum(&[value]),
        }
        .encode();
        let dst = unsafe { region.slice_mut(offset, (h.len() + value.len()) as u64) };
        dst[..h.len()].copy_from_slice(&h);
        dst[h.len()..].copy_from_slice(value);
        round_up((h.len() + value.len()) as u64)
    }

    #[test]
    fn finds_intact_objects_and_skips_torn_and_invalidated_ones() {
        let r = MappedRegion::anonymous(1 << 20).unwrap();
        let base = 4096;
        let a = write(&r, base, "a", 1, &[1; 1000]);
        let b_off = base + a;
        let b = write(&r, b_off, "b", 2, &[2; 5000]);
        let c_off = b_off + b + 640; // a gap of stale zeroes
        let c = write(&r, c_off, "c", 3, &[3; 70]);
        let d_off = c_off + c;
        write(&r, d_off, "torn", 4, &[4; 3000]);
        let byte = unsafe { r.slice_mut(d_off + 2000, 1) };
        byte[0] ^= 0xff;
        // A value that itself contains a valid object: must not be found inside.
        let mut inner = vec![0u8; 4096];
        let inner_obj = MappedRegion::anonymous(8192).unwrap();
        let n = write(&inner_obj, 0, "fake", 9, b"x") as usize;
        inner[64..64 + n].copy_from_slice(unsafe { inner_obj.slice(0, n as u64) });
        let e_off = d_off + 8192;
        write(&r, e_off, "e", 5, &inner);

        let (found, stats) = scan(&r, base);
        let keys: Vec<&str> = found.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "e"]);
        assert_eq!(stats.torn, 1);
        assert_eq!(found[1].offset, b_off);
        assert_eq!(found[1].region_len, b);
        assert_eq!(found[3].generation, 5);

        assert!(
            !invalidate(&r, b_off, 99),
            "wrong generation must not invalidate"
        );
        assert!(invalidate(&r, b_off, 2));
        let (found, _) = scan(&r, base);
        let keys: Vec<&str> = found.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["a", "c", "e"]);
    }

    #[test]
    fn garbage_segment_never_panics() {
        let r = MappedRegion::anonymous(64 << 10).unwrap();
        let bytes = unsafe { r.slice_mut(0, 64 << 10) };
        let mut x: u32 = 12345;
        for (i, b) in bytes.iter_mut().enumerate() {
            x = x.wrapping_mul(1103515245).wrapping_add(12345);
            *b = if i % 64 < 4 {
                OBJECT_MAGIC[i % 64]
            } else {
                (x >> 16) as u8
            };
        }
        let (found, _) = scan(&r, 0);
        assert!(found.is_empty());
    }
}
