//! Data-plane capabilities: the master signs each replica it hands out
//! (a put's regions to write, a location's regions to read) and a store
//! serves a client's read or write only inside a region signed for it.
//!
//! Authentication alone lets any engine holding the client key write any
//! offset of any segment, forging objects whose headers and checksums are
//! computable. With capabilities it can touch only what the master granted
//! it, for as long as the grant lasts, and only under the segment's mount
//! fence it names (see `kvpool-transfer`'s `fence`). The key derives from
//! the store key, so masters and stores hold it and engines cannot mint
//! grants. Expiry is
//! wall-clock time (the master's when signed, the store's when checked),
//! so the hosts' clocks must agree within [`CLOCK_SKEW`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use kvpool_proto::msg::{Capability, Grant, SegmentId};
use kvpool_proto::{Code, KvError, KvResult};
use sha2::Sha256;

use crate::auth::{Credentials, Role};

/// How far a store's clock may run ahead of the master's before the
/// grants it checks look expired.
pub const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// The key capabilities are signed and checked with.
#[derive(Clone)]
pub struct CapabilityKey {
    /// Keyed once; each signature starts from a copy.
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey")
    }
}

impl CapabilityKey {
    /// The capability key of a store or admin key; `None` for a client key,
    /// which must not be able to grant itself access.
    pub fn new(credentials: &Credentials) -> Option<CapabilityKey> {
        let store = credentials.derive(Role::Store)?;
        let key = store.subkey("data-plane capability");
        // HMAC takes keys of any length; 32 bytes cannot fail.
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("HMAC key");
        Some(CapabilityKey { mac })
    }

    /// Signs `access` (bits of [`Capability::READ`] and
    /// [`Capability::WRITE`]) to the region `(offset, len)` of `segment`
    /// under its mount `fence`, holding the object version `generation`,
    /// until `expires_ms` (Unix ms). With `key`, the grant is bound to the
    /// object of that key ([`Capability::KEY`]).
    pub fn sign(
        &self,
        access: u8,
        segment: SegmentId,
        region: (u64, u64),
        (generation, fence): (u64, u64),
        expires_ms: u64,
        key: Option<&[u8]>,
    ) -> Capability {
        let access = match key {
            Some(_) => access | Capability::KEY,
            None => access & !Capability::KEY,
        };
        let tag = self
            .keyed(
                access,
                segment,
                region,
                (generation, fence),
                expires_ms,
                key,
            )
            .finalize()
            .into_bytes();
        let mut mac = [0u8; 16];
        mac.copy_from_slice(&tag[..16]);
        Capability {
            expires_ms,
            access,
            mac,
        }
    }

    /// Checks that `grant` allows `access` (one access bit) to `len` bytes
    /// at `offset` of `segment` at `now_ms` (Unix ms): signed by this key,
    /// for that access, not expired, and covering the whole range; for a
    /// grant bound to a key, all but the signature, which needs the
    /// object's key: `Ok(true)` when that is still to check
    /// ([`CapabilityKey::check_key`], once a write's header has arrived or
    /// from the header a read finds, before any byte is served).
    pub fn admit(
        &self,
        access: u8,
        segment: SegmentId,
        grant: Option<&Grant>,
        (offset, len): (u64, u64),
        now_ms: u64,
    ) -> KvResult<bool> {
        let Some((g, cap)) = grant.and_then(|g| g.cap.map(|c| (g, c))) else {
            return Err(denied(
                "this store requires the master's signed grant with every read and write",
            ));
        };
        let bound = cap.access & Capability::KEY != 0;
        if !bound && !self.signed(segment, g, &cap, None) {
            return Err(denied("the grant's signature does not match"));
        }
        if cap.access & access == 0 {
            return Err(denied("the grant does not allow this access"));
        }
        if now_ms > cap.expires_ms.saturating_add(CLOCK_SKEW.as_millis() as u64) {
            return Err(denied("the grant has expired; ask the master again"));
        }
        let inside = offset >= g.offset
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= g.offset.saturating_add(g.len));
        if !inside {
            return Err(denied(&format!(
                "{offset}+{len} lies outside the granted region {}+{}",
                g.offset, g.len
            )));
        }
        Ok(bound)
    }

    /// Checks the signature of a grant bound to a key against `key`, the
    /// key of the object at the granted region's start (`None`: none is).
    pub fn check_key(&self, segment: SegmentId, g: &Grant, key: Option<&[u8]>) -> KvResult<()> {
        let Some(cap) = g.cap else {
            return Err(denied("the grant is not signed"));
        };
        let Some(key) = key else {
            return Err(denied("the grant's object is not in its region"));
        };
        if !self.signed(segment, g, &cap, Some(key)) {
            return Err(denied(
                "the grant's signature does not match (another region, or an object of another key)",
            ));
        }
        Ok(())
    }

    fn signed(&self, segment: SegmentId, g: &Grant, cap: &Capability, key: Option<&[u8]>) -> bool {
        let fields = (g.generation, g.fence);
        let mac = self.keyed(
            cap.access,
            segment,
            (g.offset, g.len),
            fields,
            cap.expires_ms,
            key,
        );
        mac.verify_truncated_left(&cap.mac).is_ok()
    }

    fn keyed(
        &self,
        access: u8,
        segment: SegmentId,
        (offset, len): (u64, u64),
        (generation, fence): (u64, u64),
        expires_ms: u64,
        key: Option<&[u8]>,
    ) -> Hmac<Sha256> {
        let mut m = self.mac.clone();
        // Fixed-width fields, then the key last with its length: no two
        // different grants hash alike.
        m.update(&[access]);
        m.update(&segment.0.to_le_bytes());
        for v in [offset, len, generation, fence, expires_ms] {
            m.update(&v.to_le_bytes());
        }
        if let Some(key) = key {
            m.update(&(key.len() as u64).to_le_bytes());
            m.update(key);
        }
        m
    }
}

/// Now, in ms since the Unix epoch (the clock capabilities expire by).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn denied(why: &str) -> KvError {
    KvError::new(Code::Unauthorized, format!("access denied: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    impl CapabilityKey {
        /// The whole check a store makes: [`CapabilityKey::admit`], then
        /// for a bound grant its signature with `key`, the key of the
        /// object at the region's start (`None` when none is there).
        fn check(
            &self,
            access: u8,
            segment: SegmentId,
            grant: Option<&Grant>,
            range: (u64, u64),
            now_ms: u64,
            key: Option<&[u8]>,
        ) -> KvResult<()> {
            match (self.admit(access, segment, grant, range, now_ms)?, grant) {
                (true, Some(g)) => self.check_key(segment, g, key),
                _ => Ok(()),
            }
        }
    }

    fn key() -> CapabilityKey {
        let admin = Credentials::parse("a cluster secret long enough").unwrap();
        CapabilityKey::new(&admin).unwrap()
    }

    fn grant(k: &CapabilityKey, access: u8, seg: u128, region: (u64, u64), gen: u64) -> Grant {
        Grant {
            offset: region.0,
            len: region.1,
            generation: gen,
            fence: 42,
            cap: Some(k.sign(access, SegmentId(seg), region, (gen, 42), 1_000_000, None)),
        }
    }

    #[test]
    fn only_store_and_admin_keys_grant() {
        let admin = Credentials::parse("a cluster secret long enough").unwrap();
        let store = admin.derive(Role::Store).unwrap();
        let client = admin.derive(Role::Client).unwrap();
        assert!(CapabilityKey::new(&client).is_none());
        let g = grant(
            &CapabilityKey::new(&admin).unwrap(),
            Capability::READ,
            1,
            (64, 64),
            3,
        );
        let by_store = CapabilityKey::new(&store).unwrap();
        assert!(by_store
            .check(Capability::READ, SegmentId(1), Some(&g), (64, 64), 0, None)
            .is_ok());
        let other = Credentials::parse("another cluster's secret!").unwrap();
        let e = CapabilityKey::new(&other)
            .unwrap()
            .check(Capability::READ, SegmentId(1), Some(&g), (64, 64), 0, None)
            .unwrap_err();
        assert_eq!(e.code, Code::Unauthorized);
    }

    #[test]
    fn expiry_allows_for_clock_skew_and_no_more() {
        let k = key();
        let g = grant(&k, Capability::WRITE, 1, (0, 8), 1);
        let skew = CLOCK_SKEW.as_millis() as u64;
        let at = |now| k.check(Capability::WRITE, SegmentId(1), Some(&g), (0, 8), now, None);
        assert!(at(1_000_000 + skew).is_ok());
        assert!(at(1_000_001 + skew).is_err());
        let missing = k.check(Capability::WRITE, SegmentId(1), None, (0, 8), 0, None);
        assert_eq!(missing.unwrap_err().code, Code::Unauthorized);
        let unsigned = Grant { cap: None, ..g };
        let r = k.check(
            Capability::WRITE,
            SegmentId(1),
            Some(&unsigned),
            (0, 8),
            0,
            None,
        );
        assert_eq!(r.unwrap_err().code, Code::Unauthorized);
    }

    #[test]
    fn a_grant_bound_to_a_key_serves_only_that_keys_object() {
        let k = key();
        let region = (4096, 4096);
        let cap = k.sign(
            Capability::WRITE,
            SegmentId(3),
            region,
            (7, 42),
            1_000_000,
            Some(b"mine"),
        );
        assert_eq!(cap.access, Capability::WRITE | Capability::KEY);
        let g = Grant {
            offset: region.0,
            len: region.1,
            generation: 7,
            fence: 42,
            cap: Some(cap),
        };
        let at =
            |key: Option<&[u8]>| k.check(Capability::WRITE, SegmentId(3), Some(&g), region, 0, key);
        assert!(at(Some(b"mine")).is_ok());
        for other in [Some(&b"theirs"[..]), Some(b"min"), Some(b"mine\0"), None] {
            assert_eq!(at(other).unwrap_err().code, Code::Unauthorized, "{other:?}");
        }
        let admitted = k.admit(Capability::WRITE, SegmentId(3), Some(&g), region, 0);
        assert!(admitted.unwrap(), "the key is still to check");
        // Dropping the binding bit breaks the signature.
        let mut unbound = g;
        unbound.cap.as_mut().unwrap().access = Capability::WRITE;
        let r = k.check(
            Capability::WRITE,
            SegmentId(3),
            Some(&unbound),
            region,
            0,
            Some(b"mine"),
        );
        assert_eq!(r.unwrap_err().code, Code::Unauthorized);
    }

    proptest! {
        /// A grant admits exactly the sub-ranges of its own region, for its
        /// own access and segment.
        #[test]
        fn grants_cover_exactly_their_region(
            start in 0u64..1 << 40, len in 1u64..1 << 20,
            off in 0u64..1 << 41, n in 0u64..1 << 21,
        ) {
            let k = key();
            let g = grant(&k, Capability::READ, 9, (start, len), 5);
            let inside = off >= start && off + n <= start + len;
            let r = k.check(Capability::READ, SegmentId(9), Some(&g), (off, n), 0, None);
            prop_assert_eq!(r.is_ok(), inside);
            let w = k.check(Capability::WRITE, SegmentId(9), Some(&g), (start, len), 0, None);
            prop_assert!(w.is_err(), "a read grant does not write");
            let s = k.check(Capability::READ, SegmentId(8), Some(&g), (start, len), 0, None);
            prop_assert!(s.is_err(), "nor reach another segment");
        }

        /// Changing any signed field (or the signature) breaks the grant.
        #[test]
        fn any_tampering_is_caught(field in 0usize..7, delta in 1u64..u64::MAX, bit in 0usize..128) {
            let k = key();
            let mut g = grant(&k, Capability::WRITE, 4, (4096, 4096), 77);
            let cap = g.cap.as_mut().unwrap();
            match field {
                0 => g.offset = g.offset.wrapping_add(delta),
                1 => g.len = g.len.wrapping_add(delta),
                2 => g.generation = g.generation.wrapping_add(delta),
                3 => cap.expires_ms = cap.expires_ms.wrapping_add(delta),
                4 => cap.access = 3,
                5 => g.fence = g.fence.wrapping_add(delta),
                _ => cap.mac[bit / 8] ^= 1 << (bit % 8),
            }
            let r = k.check(Capability::WRITE, SegmentId(4), Some(&g), (g.offset, 0), 0, None);
            prop_assert_eq!(r.unwrap_err().code, Code::Unauthorized);
        }
    }
}
