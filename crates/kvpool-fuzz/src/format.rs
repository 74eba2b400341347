//! Segment memory (`kvpool_format`): object headers, which readers decode
//! from regions other clients wrote; superblocks, which stores and clients
//! read from segment files; and whole segment images, which a restarted
//! store scans for its inventory and invalidates as the master says.

use kvpool_format::header::{header_len, value_checksum, ObjectHeader, FIXED_LEN};
use kvpool_format::scan::{invalidate, key_at, scan, REGION_ALIGN};
use kvpool_format::superblock::{
    has_segment_magic, read_superblock, segment_id, write_superblock, DATA_BASE, SUPERBLOCK_LEN,
};

/// An object header as a reader finds it at the start of a region (and a
/// store, checking a read's key-bound grant, its key); one that decodes
/// must re-encode to the same bytes and show the store the same key.
pub fn object_header(data: &[u8]) {
    let key = key_at(data);
    let Ok(h) = ObjectHeader::decode(data) else {
        return;
    };
    assert_eq!(key, Some(h.key.as_bytes()), "the key a store finds");
    let enc = h.encode();
    assert_eq!(enc[..], data[..enc.len()], "header re-encodes");
    h.expect(&h.key, h.value_len, h.generation)
        .expect("a header matches itself");
}

/// Superblock bytes, read for a segment of the input's length and of the
/// size the bytes claim; one that reads must read the same once rewritten.
pub fn superblock(data: &[u8]) {
    let claimed = data
        .get(32..40)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    for size in [Some(data.len() as u64), claimed].into_iter().flatten() {
        let sb = read_superblock(data, size);
        assert_eq!(segment_id(data, size), sb.map(|s| s.id));
        let Some(sb) = sb else { continue };
        assert!(has_segment_magic(data));
        if let Some(p) = sb.possession {
            let mut again = vec![0u8; SUPERBLOCK_LEN];
            write_superblock(&mut again, sb.id, size, p);
            assert_eq!(
                read_superblock(&again, size),
                Some(sb),
                "rewritten superblock"
            );
        }
    }
}

/// A segment image after the first byte, scanned as a store does after a
/// restart, then every object found invalidated as the master would order.
/// First byte: with the top bit set, the image is a segment file (superblock,
/// then objects from `DATA_BASE`); else the low bits are the scan's base.
pub fn segment(data: &[u8]) {
    let Some((&sel, image)) = data.split_first() else {
        return;
    };
    let mut seg = image.to_vec();
    let base = if sel & 0x80 != 0 {
        let _ = read_superblock(&seg, seg.len() as u64);
        DATA_BASE
    } else {
        u64::from(sel)
    };
    let (found, stats) = scan(&seg, base);
    assert_eq!(stats.objects, found.len() as u64);
    assert_eq!(stats.bytes, found.iter().map(|f| f.region_len).sum::<u64>());
    let mut end = base;
    for f in &found {
        assert!(f.offset >= end, "objects overlap or precede the base");
        assert_eq!(f.offset % REGION_ALIGN, 0);
        let at = &seg[f.offset as usize..];
        let h = ObjectHeader::decode(at).expect("a found object's header decodes");
        assert_eq!(
            (h.key.as_str(), h.generation, h.value_len),
            (f.key.as_str(), f.generation, f.value_len)
        );
        let used = header_len(h.key.len()) as u64 + h.value_len;
        assert!(f.region_len >= used && f.region_len - used < REGION_ALIGN);
        assert_eq!(f.region_len % REGION_ALIGN, 0);
        let value = &at[header_len(h.key.len())..][..h.value_len as usize];
        assert_eq!(value_checksum(&[value]), h.checksum, "found a torn object");
        end = f.offset + f.region_len;
    }
    for f in &found {
        let at = &mut seg[f.offset as usize..];
        assert!(!invalidate(&mut at[..FIXED_LEN - 1], f.generation));
        assert!(
            !invalidate(at, f.generation.wrapping_add(1)),
            "other generation"
        );
        assert!(invalidate(at, f.generation), "invalidating a found object");
    }
    let (again, _) = scan(&seg, base);
    for f in &again {
        let gone = found.iter().any(|g| g.offset == f.offset);
        assert!(!gone, "an invalidated object found again at {}", f.offset);
    }
}
