//! Object keys as a shard's table stores them. Engines' keys are long and
//! alike: SGLang's `{model}_{sha256 hex}_{rank}_k`, vLLM's
//! `{model}@tp_rank:0@...@{sha256 hex}`, LMCache's
//! `{prefix}{model}@{rank}@{group}@{hash hex}`. Stored as sent, the
//! repeated prefix and the hex digest are two thirds of the master's memory
//! per object. A key whose longest run of lowercase hex digits is at least
//! [`MIN_HEX`] long is stored as the text before the run and the text after
//! it, each interned in the shard's [`Dict`] (one byte each), and the run
//! packed two digits to a byte; any other key is stored as its bytes.
//!
//! A compact key starts with a byte UTF-8 never starts with, so both forms
//! share one arena and round-trip exactly. A lookup compares the stored form
//! with the key asked for in place, without decoding it or allocating.

use std::borrow::Cow;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::objects::KeyHasher;

/// First byte of a compact key with an even number of hex digits; not a
/// byte of UTF-8 text.
const EVEN: u8 = 0xFF;
/// First byte of a compact key with an odd number of digits: the first
/// packed byte's high nibble is padding.
const ODD: u8 = 0xFE;
/// Shortest run of hex digits worth packing: shorter runs (ranks, group
/// numbers) are not the keys' digests.
const MIN_HEX: usize = 16;
/// The dictionary id of the empty text (nothing before or after the run).
const EMPTY: u8 = u8::MAX;
/// Texts one shard's dictionary holds at once: ids are one byte.
const MAX_ENTRIES: usize = EMPTY as usize;
/// Bytes of text one shard's dictionary holds: a client sending keys with
/// ever new prefixes costs at most this per shard (32 MiB over 4096
/// shards), and its keys are then stored as sent.
const MAX_BYTES: usize = 8 << 10;
/// Longest text interned: longer ones are not a shared prefix.
const MAX_TEXT: usize = 1 << 10;

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// One interned text and the stored keys that use it.
struct Entry {
    text: Box<[u8]>,
    /// Keys using it; 0: the id is free.
    refs: u32,
}

/// The texts before and after the digests of one shard's keys, each stored
/// once while a key uses it.
#[derive(Default)]
pub(super) struct Dict {
    entries: Vec<Entry>,
    /// Ids whose entry no key uses.
    free: Vec<u8>,
    /// Ids by their text's hash.
    index: HashTable<u8>,
    /// Bytes of text held.
    bytes: usize,
    hasher: KeyHasher,
}

/// The digit value of a lowercase hex byte.
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// The longest run of lowercase hex digits in `key` (the first of equals),
/// if it is [`MIN_HEX`] long or longer.
fn digest_run(key: &[u8]) -> Option<(usize, usize)> {
    let (mut best, mut start) = ((0, 0), None);
    for (i, &c) in key.iter().chain([&0]).enumerate() {
        match (nibble(c).is_some(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if i - s > best.1 - best.0 {
                    best = (s, i);
                }
                start = None;
            }
            _ => {}
        }
    }
    (best.1 - best.0 >= MIN_HEX).then_some(best)
}

/// A compact key's parts: prefix id, suffix id, packed digits and how many.
fn parts(stored: &[u8]) -> Option<(u8, u8, &[u8], usize)> {
    let (&tag, rest) = stored.split_first()?;
    if tag != EVEN && tag != ODD {
        return None;
    }
    let (&[p, s], packed) = rest.split_first_chunk::<2>()?;
    let digits = (packed.len() * 2).checked_sub(usize::from(tag == ODD))?;
    Some((p, s, packed, digits))
}

/// The hex digits `packed` holds (`digits` of them, right-aligned).
fn unpack(packed: &[u8], digits: usize) -> impl Iterator<Item = u8> + '_ {
    let skip = packed.len() * 2 - digits;
    packed
        .iter()
        .flat_map(|&b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        .skip(skip)
}

impl Dict {
    fn text(&self, id: u8) -> &[u8] {
        match id {
            EMPTY => &[],
            _ => self.entries.get(usize::from(id)).map_or(&[], |e| &e.text),
        }
    }

    /// The id of `text`, interned now if it is not yet; `None` when the
    /// dictionary is full.
    fn intern(&mut self, text: &[u8]) -> Option<u8> {
        if text.is_empty() {
            return Some(EMPTY);
        }
        let h = self.hasher.hash_one(text);
        let Dict {
            entries,
            index,
            free,
            bytes,
            hasher,
        } = self;
        if let Some(&id) = index.find(h, |&id| *entries[usize::from(id)].text == *text) {
            entries[usize::from(id)].refs += 1;
            return Some(id);
        }
        if text.len() > MAX_TEXT || *bytes + text.len() > MAX_BYTES {
            return None;
        }
        let entry = Entry {
            text: text.into(),
            refs: 1,
        };
        let id = match free.pop() {
            Some(id) => {
                entries[usize::from(id)] = entry;
                id
            }
            None if entries.len() < MAX_ENTRIES => {
                entries.push(entry);
                (entries.len() - 1) as u8
            }
            None => return None,
        };
        *bytes += text.len();
        index.insert_unique(h, id, |&id| {
            hasher.hash_one(&*entries[usize::from(id)].text)
        });
        Some(id)
    }

    /// Drops one use of `id`; the last frees it.
    fn unref(&mut self, id: u8) {
        let Some(e) = self.entries.get_mut(usize::from(id)).filter(|e| e.refs > 0) else {
            return;
        };
        e.refs -= 1;
        if e.refs > 0 {
            return;
        }
        let text = std::mem::take(&mut e.text);
        self.bytes -= text.len();
        let h = self.hasher.hash_one(&*text);
        if let Ok(found) = self.index.find_entry(h, |&i| i == id) {
            found.remove();
        }
        self.free.push(id);
    }

    /// Appends the stored form of `key` to `out`, taking a use of the texts
    /// it names.
    pub(super) fn encode(&mut self, key: &[u8], out: &mut Vec<u8>) {
        if let Some((start, end)) = digest_run(key) {
            if let Some(p) = self.intern(&key[..start]) {
                if let Some(s) = self.intern(&key[end..]) {
                    let run = &key[start..end];
                    let odd = !run.len().is_multiple_of(2);
                    out.push(if odd { ODD } else { EVEN });
                    out.extend([p, s]);
                    // An odd run is padded with a zero digit in front.
                    let pad = odd.then_some(b'0');
                    let mut digits = pad.into_iter().chain(run.iter().copied());
                    while let (Some(hi), Some(lo)) = (digits.next(), digits.next()) {
                        let n = |c| nibble(c).unwrap_or(0);
                        out.push(n(hi) << 4 | n(lo));
                    }
                    return;
                }
                self.unref(p);
            }
        }
        out.extend_from_slice(key);
    }

    /// Gives back the uses [`Dict::encode`] took for the stored form `stored`.
    pub(super) fn release(&mut self, stored: &[u8]) {
        if let Some((p, s, _, _)) = parts(stored) {
            for id in [p, s] {
                if id != EMPTY {
                    self.unref(id);
                }
            }
        }
    }

    /// Whether the stored form `stored` is `key`.
    pub(super) fn matches(&self, stored: &[u8], key: &[u8]) -> bool {
        let Some((p, s, packed, digits)) = parts(stored) else {
            return stored == key;
        };
        let (p, s) = (self.text(p), self.text(s));
        key.len() == p.len() + digits + s.len()
            && key.starts_with(p)
            && key.ends_with(s)
            && unpack(packed, digits).eq(key[p.len()..p.len() + digits].iter().copied())
    }

    /// The first byte of the key stored as `stored`, without building it.
    pub(super) fn first_byte(&self, stored: &[u8]) -> Option<u8> {
        match parts(stored) {
            None => stored.first().copied(),
            Some((p, _, packed, digits)) => {
                (self.text(p).first().copied()).or_else(|| unpack(packed, digits).next())
            }
        }
    }

    /// The key whose stored form is `stored`.
    pub(super) fn decode<'a>(&self, stored: &'a [u8]) -> Cow<'a, str> {
        let Some((p, s, packed, digits)) = parts(stored) else {
            // Stored from a `&str`, whole.
            return String::from_utf8_lossy(stored);
        };
        let (p, s) = (self.text(p), self.text(s));
        let mut key = Vec::with_capacity(p.len() + digits + s.len());
        key.extend_from_slice(p);
        key.extend(unpack(packed, digits));
        key.extend_from_slice(s);
        // Texts cut from UTF-8 keys at ASCII digits, and the digits: valid.
        Cow::Owned(
            String::from_utf8(key)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        )
    }

    /// Texts held, and their bytes.
    #[cfg(test)]
    pub(super) fn held(&self) -> (usize, usize) {
        (self.index.len(), self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Keys made of hex runs, separators and other text, as engines and
    /// hostile clients might send them.
    fn any_key() -> impl Strategy<Value = String> {
        let part = prop_oneof!["[0-9a-f]{0,70}", "[_@/:.-]{1,2}", "[A-Za-z0-9\u{1}é]{0,12}",];
        prop::collection::vec(part, 0..6).prop_map(|p| p.concat())
    }

    proptest! {
        #[test]
        fn every_key_round_trips_and_matches_only_itself(
            keys in prop::collection::vec(any_key(), 1..40),
            other in any_key(),
        ) {
            let mut d = Dict::default();
            let stored: Vec<Vec<u8>> = keys.iter().map(|k| {
                let mut out = Vec::new();
                d.encode(k.as_bytes(), &mut out);
                out
            }).collect();
            for (k, s) in keys.iter().zip(&stored) {
                prop_assert_eq!(d.decode(s), k.as_str());
                prop_assert_eq!(d.first_byte(s), k.bytes().next());
                prop_assert!(d.matches(s, k.as_bytes()));
                prop_assert!(s.len() <= k.len());
                prop_assert_eq!(d.matches(s, other.as_bytes()), *k == other);
            }
            for s in &stored {
                d.release(s);
            }
            prop_assert_eq!(d.held(), (0, 0));
        }
    }

    fn stored(d: &mut Dict, key: &str) -> Vec<u8> {
        let mut out = Vec::new();
        d.encode(key.as_bytes(), &mut out);
        assert!(d.matches(&out, key.as_bytes()), "{key:?}");
        assert_eq!(d.decode(&out), key);
        assert_eq!(d.first_byte(&out), key.bytes().next());
        out
    }

    const SHA: &str = "3f4e9a0c5b1d2e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7";

    #[test]
    fn engine_keys_round_trip_in_fewer_bytes() {
        let mut d = Dict::default();
        let sglang = format!("meta-llama-Llama-3.1-8B-Instruct_{SHA}_0_k");
        let vllm =
            format!("meta-llama/Llama-3.1-8B-Instruct@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{SHA}");
        let lmcache = format!("lmcache/meta-llama/Llama-3.1-8B@0000000a@0@{SHA}");
        for key in [&sglang, &vllm, &lmcache] {
            // A tag, two ids and 32 bytes of digest.
            assert_eq!(stored(&mut d, key).len(), 35, "{key}");
        }
        // Three prefixes and one suffix ("_0_k"); vLLM's and LMCache's have none.
        assert_eq!(d.held().0, 4);
    }

    #[test]
    fn other_keys_are_stored_as_sent() {
        let mut d = Dict::default();
        for key in [
            "",
            "k-0000000012",
            "abcdef012345678",
            "ABCDEF0123456789AB",
            "\u{1}t\u{1}x",
        ] {
            assert_eq!(stored(&mut d, key), key.as_bytes());
        }
        assert_eq!(d.held(), (0, 0));
    }

    #[test]
    fn odd_runs_edges_and_near_misses() {
        let mut d = Dict::default();
        let odd = "p/0123456789abcdef0/s";
        let s = stored(&mut d, odd);
        assert_eq!((s[0], s.len()), (ODD, 3 + 9));
        stored(&mut d, "0123456789abcdef");
        stored(&mut d, "x0123456789abcdef");
        stored(&mut d, "0123456789abcdefx");
        // The longest run is packed, the shorter one stays in the text.
        let two = "abc0123_00112233445566778899aabbccddeeff";
        let s = stored(&mut d, two);
        assert_eq!(s.len(), 3 + 16);
        // Same lengths, other digits or texts: no match.
        let key = format!("m_{SHA}_0_k");
        let s = stored(&mut d, &key);
        for other in [
            format!("m_{}0_0_k", &SHA[..63]),
            format!("n_{SHA}_0_k"),
            format!("m_{SHA}_0_v"),
            format!("m_{SHA}_0_kk"),
            format!("m_{}_0_k", SHA.to_uppercase()),
        ] {
            assert!(!d.matches(&s, other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn texts_are_freed_with_their_last_key_and_bounded() {
        let mut d = Dict::default();
        let a = stored(&mut d, &format!("a_{SHA}_0_k"));
        let b = stored(&mut d, &format!("a_{SHA}_0_v"));
        assert_eq!(d.held(), (3, 2 + 4 + 4));
        d.release(&a);
        assert_eq!(d.held(), (2, 2 + 4));
        d.release(&b);
        assert_eq!(d.held(), (0, 0));
        // Ever new prefixes fill the dictionary; then keys are stored as sent.
        let mut kept = Vec::new();
        for n in 0..1000 {
            let key = format!("tenant-{n:04}/{}/{SHA}", "x".repeat(40));
            kept.push((key.clone(), stored(&mut d, &key)));
        }
        assert!(d.held().1 <= MAX_BYTES && d.held().0 <= MAX_ENTRIES);
        assert!(kept.iter().any(|(k, s)| s.as_slice() == k.as_bytes()));
        // A prefix too long to intern.
        let long = format!("{}{SHA}", "p".repeat(MAX_TEXT + 1));
        let mut fresh = Dict::default();
        assert_eq!(stored(&mut fresh, &long), long.as_bytes());
        for (k, s) in &kept {
            assert_eq!(d.decode(s), *k);
            d.release(s);
        }
        assert_eq!(d.held(), (0, 0));
        // Freed ids are used again.
        stored(&mut d, &format!("b_{SHA}"));
        assert_eq!(d.held().0, 1);
    }
}
