//! A value copied and checksummed in one pass. Shared-memory reads and
//! writes copy every value and hash it (xxh3-64, seed 0): hashing each
//! chunk right after its copy still reads it twice, once to copy and once
//! to hash from the cache, and on a 4 MiB value the hash was a third of
//! the copy's time. Here each 64-byte stripe is loaded once, stored to
//! the destination and folded into the hash from the same registers, so
//! the hash costs little beside the copy.
//!
//! A copy whose destination will not be read again soon (a put into a
//! segment, a big read into caller memory) may ask for non-temporal stores
//! ([`Stores::Streamed`]): they skip reading each destination line into
//! the cache before writing it, a third of a cached copy's memory traffic.
//! They need 32-byte aligned addresses, and a value sits after its header
//! at any alignment, so each aligned store is assembled from the two
//! loaded registers it straddles: the bytes stored are still the bytes
//! hashed, whatever a caller does to its source meanwhile.
//!
//! The result is exactly xxh3-64's for inputs longer than 240 bytes (the
//! "long" algorithm, default secret); shorter values and CPUs without AVX2
//! take the two-step path ([`fused_copy_hash`] answers `None`).

/// XXH3's default secret (the reference `kSecret`).
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;
const PRIME_MX1: u64 = 0x1656_6791_9E37_79F9;

/// Bytes a stripe folds into the accumulators.
const STRIPE: usize = 64;
/// Stripes between scrambles: (192 - 64) / 8.
const STRIPES_PER_BLOCK: usize = 16;
/// Bytes between scrambles.
const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;
/// Shortest input of xxh3's long algorithm.
const LONG: usize = 241;

/// Whether [`fused_copy_hash`] takes values of `len` bytes: more than 240,
/// on a CPU with AVX2.
pub fn fused_applies(len: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        return len >= LONG;
    }
    false
}

/// How [`fused_copy_hash`] writes its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stores {
    /// Through the cache, for a destination read again soon.
    Cached,
    /// Non-temporal, around the cache, for a destination not read again
    /// soon (the floors and their measurements are the callers', in
    /// `header`).
    Streamed,
}

/// Copies `src` into `dst` (same length) and returns xxh3-64 of the bytes,
/// in one pass; `None`, with nothing copied, when this path does not apply
/// (lengths that differ, or not [`fused_applies`]).
pub fn fused_copy_hash(dst: &mut [u8], src: &[u8], stores: Stores) -> Option<u64> {
    if dst.len() != src.len() || !fused_applies(src.len()) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 is there and the lengths are equal and at least one
        // stripe (`fused_applies`).
        Some(unsafe {
            match stores {
                Stores::Cached => avx2::copy_hash::<false, 0, 0>(dst, src),
                Stores::Streamed => avx2::copy_hash_streamed(dst, src),
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = stores;
        None
    }
}

/// Folds the accumulators into the 64-bit result (xxh3's merge step).
fn merge(acc: &[u64; 8], len: usize) -> u64 {
    let mut h = (len as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let s = 11 + 16 * i;
        let lo = acc[2 * i] ^ u64::from_le_bytes(SECRET[s..s + 8].try_into().unwrap_or_default());
        let hi = acc[2 * i + 1]
            ^ u64::from_le_bytes(SECRET[s + 8..s + 16].try_into().unwrap_or_default());
        let m = (lo as u128).wrapping_mul(hi as u128);
        h = h.wrapping_add((m as u64) ^ ((m >> 64) as u64));
    }
    h ^= h >> 37;
    h = h.wrapping_mul(PRIME_MX1);
    h ^ (h >> 32)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`fused_copy_hash`] with non-temporal stores: [`copy_hash`] for
    /// the distance from `dst` to the next 32-byte aligned address.
    ///
    /// # Safety
    /// As [`copy_hash`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_hash_streamed(dst: &mut [u8], src: &[u8]) -> u64 {
        macro_rules! by_lead {
            ($($lead:literal $minus16:literal)*) => {
                // By address: `align_offset` may answer usize::MAX.
                match (32 - dst.as_ptr() as usize % 32) % 32 {
                    $($lead => unsafe { copy_hash::<true, $lead, $minus16>(dst, src) },)*
                    _ => unsafe { copy_hash::<true, 0, 0>(dst, src) }, // aligned
                }
            };
        }
        by_lead!(
            1 0 2 0 3 0 4 0 5 0 6 0 7 0 8 0 9 0 10 0 11 0 12 0 13 0 14 0 15 0
            16 0 17 1 18 2 19 3 20 4 21 5 22 6 23 7 24 8 25 9 26 10 27 11 28 12 29 13 30 14 31 15
        )
    }

    /// [`fused_copy_hash`] with AVX2: non-temporal stores with `NT`, where
    /// `dst` is `LEAD` bytes short of a 32-byte aligned address (`LEAD16`
    /// is `LEAD - 16` from 16 up, for the shift's second form).
    ///
    /// # Safety
    /// The CPU has AVX2; `dst.len() == src.len() >= LONG`; with `NT`,
    /// `dst` is `LEAD` bytes before a 32-byte aligned address.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_hash<const NT: bool, const LEAD: i32, const LEAD16: i32>(
        dst: &mut [u8],
        src: &[u8],
    ) -> u64 {
        let len = src.len();
        let init = [
            PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
        ];
        // SAFETY (every block below): loads and stores of 32 bytes stay
        // inside `src`, `dst` and `SECRET` by the offsets computed from
        // their lengths; unaligned forms throughout but the non-temporal
        // stores, at `dst + LEAD` plus multiples of 32.
        let mut acc = unsafe {
            [
                _mm256_loadu_si256(init.as_ptr().cast()),
                _mm256_loadu_si256(init.as_ptr().add(4).cast()),
            ]
        };
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut prev = _mm256_setzero_si256();
        let mut stripe_at = |acc: &mut [__m256i; 2], at: usize, secret: usize| unsafe {
            let data = load(s.add(at));
            store::<NT, LEAD, LEAD16>(d, at, data[0], &mut prev);
            store::<NT, LEAD, LEAD16>(d, at + 32, data[1], &mut prev);
            fold(acc, data, secret);
        };
        let blocks = (len - 1) / BLOCK;
        for b in 0..blocks {
            for stripe in 0..STRIPES_PER_BLOCK {
                stripe_at(&mut acc, b * BLOCK + stripe * STRIPE, stripe * 8);
            }
            unsafe { scramble(&mut acc) };
        }
        let tail = blocks * BLOCK;
        let stripes = ((len - 1) - tail) / STRIPE;
        for stripe in 0..stripes {
            stripe_at(&mut acc, tail + stripe * STRIPE, stripe * 8);
        }
        let copied = tail + stripes * STRIPE;
        if NT {
            // The last register's bytes past the last aligned store, then
            // every non-temporal store made visible before anything the
            // caller writes or sends after this copy (a seal, a commit).
            unsafe {
                if LEAD != 0 {
                    _mm256_storeu_si256(d.add(copied - 32).cast(), prev);
                }
                _mm_sfence();
            }
        }
        dst[copied..].copy_from_slice(&src[copied..]);
        // The last stripe, overlapping what came before, from the bytes
        // as they landed.
        unsafe {
            fold(
                &mut acc,
                load(dst.as_ptr().add(len - STRIPE)),
                192 - STRIPE - 7,
            )
        };
        let mut out = [0u64; 8];
        unsafe {
            _mm256_storeu_si256(out.as_mut_ptr().cast(), acc[0]);
            _mm256_storeu_si256(out.as_mut_ptr().add(4).cast(), acc[1]);
        }
        merge(&out, len)
    }

    /// The stripe of 64 bytes at `input`.
    ///
    /// # Safety
    /// AVX2; 64 bytes readable at `input`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn load(input: *const u8) -> [__m256i; 2] {
        // SAFETY: the caller's range.
        unsafe {
            [
                _mm256_loadu_si256(input.cast()),
                _mm256_loadu_si256(input.add(32).cast()),
            ]
        }
    }

    /// Stores `r`, the source's 32 bytes at `at`, to `d + at`. Non-temporal
    /// stores go to aligned addresses only, so from a destination `LEAD`
    /// bytes short of one, each is the 32 bytes straddling `prev` (the
    /// register before) and `r`, and the first register goes through the
    /// cache whole; [`copy_hash`] stores the last one's rest.
    ///
    /// # Safety
    /// AVX2; 32 bytes writable at `d + at`; registers given in order of
    /// `at`, from 0, 32 apart.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn store<const NT: bool, const LEAD: i32, const LEAD16: i32>(
        d: *mut u8,
        at: usize,
        r: __m256i,
        prev: &mut __m256i,
    ) {
        // SAFETY: the caller's range; with `NT` and a `LEAD`, the store at
        // `at - 32 + LEAD` ends before `at + 32`.
        unsafe {
            if !NT {
                _mm256_storeu_si256(d.add(at).cast(), r);
            } else if LEAD == 0 {
                _mm256_stream_si256(d.add(at).cast(), r);
            } else if at == 0 {
                _mm256_storeu_si256(d.cast(), r);
            } else {
                // Bytes LEAD..LEAD+32 of `prev` then `r`: `mid` is the
                // middle 32 (prev's high lane, r's low), and each lane's
                // byte shift takes from the lane pair it needs.
                let mid = _mm256_permute2x128_si256::<0x21>(*prev, r);
                let straddle = if LEAD < 16 {
                    _mm256_alignr_epi8::<LEAD>(mid, *prev)
                } else {
                    _mm256_alignr_epi8::<LEAD16>(r, mid)
                };
                _mm256_stream_si256(d.add(at - 32 + LEAD as usize).cast(), straddle);
            }
        }
        *prev = r;
    }

    /// Folds the stripe `data` into `acc` with the secret at `secret`
    /// (xxh3's accumulate step).
    ///
    /// # Safety
    /// AVX2; `secret + 64 <= 192`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn fold(acc: &mut [__m256i; 2], data: [__m256i; 2], secret: usize) {
        for (i, (a, data)) in acc.iter_mut().zip(data).enumerate() {
            // SAFETY: 32 bytes inside the secret.
            unsafe {
                let key = _mm256_loadu_si256(SECRET.as_ptr().add(secret + 32 * i).cast());
                let data_key = _mm256_xor_si256(data, key);
                let data_key_lo = _mm256_shuffle_epi32::<0x31>(data_key);
                let product = _mm256_mul_epu32(data_key, data_key_lo);
                let swapped = _mm256_shuffle_epi32::<0x4E>(data);
                *a = _mm256_add_epi64(product, _mm256_add_epi64(*a, swapped));
            }
        }
    }

    /// Scrambles the accumulators at the end of a block (xxh3's
    /// scramble step, with the secret's last 64 bytes).
    ///
    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn scramble(acc: &mut [__m256i; 2]) {
        let prime = _mm256_set1_epi32(PRIME32_1 as i32);
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: 32 bytes inside the secret's last 64.
            let key =
                unsafe { _mm256_loadu_si256(SECRET.as_ptr().add(192 - STRIPE + 32 * i).cast()) };
            let shifted = _mm256_srli_epi64::<47>(*a);
            let data = _mm256_xor_si256(*a, shifted);
            let data_key = _mm256_xor_si256(data, key);
            let data_key_hi = _mm256_shuffle_epi32::<0x31>(data_key);
            let lo = _mm256_mul_epu32(data_key, prime);
            let hi = _mm256_mul_epu32(data_key_hi, prime);
            *a = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Copies `src` each way, and streamed to each alignment: the bytes
    /// and the hash are exact, and nothing around the destination moves.
    fn check(src: &[u8]) {
        let ways =
            std::iter::once((Stores::Cached, 0)).chain((0..32).map(|o| (Stores::Streamed, o)));
        for (stores, o) in ways {
            let mut buf = vec![0xa5u8; src.len() + 96];
            let base = buf.as_ptr().align_offset(32);
            let at = base + o;
            let dst = &mut buf[at..at + src.len()];
            match fused_copy_hash(dst, src, stores) {
                Some(h) => {
                    assert_eq!(h, crate::xxh3_64(src), "len {} {stores:?} +{o}", src.len());
                    assert!(dst == src, "len {} {stores:?} +{o}", src.len());
                }
                None => assert!(!fused_applies(src.len())),
            }
            let around = buf[..at].iter().chain(&buf[at + src.len()..]);
            assert!(
                around.into_iter().all(|&b| b == 0xa5),
                "len {} {stores:?} +{o}",
                src.len()
            );
        }
    }

    #[test]
    fn every_length_around_the_block_and_stripe_edges() {
        let src: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in (0..=2200).chain([3071, 3072, 3073, 4096, 4097, 5000]) {
            check(&src[..len]);
        }
    }

    #[test]
    fn a_big_value() {
        let src: Vec<u8> = (0..(4 << 20) + 13u32)
            .map(|i| (i ^ (i >> 9)) as u8)
            .collect();
        check(&src);
    }

    proptest! {
        #[test]
        fn same_as_xxh3(src in proptest::collection::vec(any::<u8>(), 0..20_000)) {
            check(&src);
        }
    }
}
