//! The suite every [`Transport`] passes, in process: one segment file
//! served by a real data-plane server on 127.0.0.1 (for TCP) and mapped by
//! this process (for shared memory), and each transport driven through
//! the same batches. A new transport adds itself to [`transports`].
//!
//! What it checks: every item of a batch is answered exactly once; bytes
//! round-trip through scattered buffers, also in batches big enough to
//! spread over lanes; a write under a stale fence, or outside the segment,
//! fails alone and lands nothing; a read's check runs on every read and
//! fails only its item; buffers of the wrong length are refused.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kvpool_format::superblock::{write_superblock, DATA_BASE};
use kvpool_format::{header_len, value_checksum, ObjectHeader};
use kvpool_net::auth::Security;
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{Grant, ReadReq, SegmentId, SegmentInfo, Tier, WriteReq};
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::data::{serve_data, serve_data_unix, SegmentTable};
use kvpool_transfer::MappedRegion;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;

const SEGMENT: SegmentId = SegmentId(0x5e9);
const SIZE: u64 = 8 << 20;
/// Room per object in the tests' layout.
const SLOT: u64 = 128 << 10;

/// One segment file, served over TCP and the same-host socket, and
/// mappable here.
struct Fixture {
    _dir: tempfile::TempDir,
    table: Arc<SegmentTable>,
    peer: String,
    fence: u64,
    region: Arc<MappedRegion>,
    info: SegmentInfo,
    stop: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("segment");
    let region = Arc::new(MappedRegion::open_file(&path, SIZE).unwrap());
    // SAFETY: the superblock page lies inside the new mapping, which no
    // one else uses yet.
    write_superblock(
        unsafe { region.slice_mut(0, DATA_BASE) },
        SEGMENT,
        SIZE,
        [7; 16],
    );
    let table = Arc::new(SegmentTable::default());
    table.insert(SEGMENT, region.clone(), DATA_BASE);
    let (fence, _) = table.refence(SEGMENT).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let unix = kvpool_net::local::listen(kvpool_net::local::STORE, &peer).unwrap();
    tokio::spawn(serve_data_unix(
        unix,
        table.clone(),
        Limits::default(),
        Security::default(),
        stop.clone(),
    ));
    tokio::spawn(serve_data(
        listener,
        table.clone(),
        Limits::default(),
        Security::default(),
        stop.clone(),
    ));
    let info = SegmentInfo {
        id: SEGMENT,
        name: "conformance".into(),
        endpoint: peer.clone(),
        base: DATA_BASE,
        size: SIZE,
        path: Some(path.display().to_string()),
        tier: Tier::Memory,
    };
    Fixture {
        _dir: dir,
        table,
        peer,
        fence,
        region,
        info,
        stop,
    }
}

/// Every transport, made ready for the fixture's segment.
fn transports(f: &Fixture) -> Vec<Box<dyn Transport>> {
    let shm = ShmTransport::default();
    shm.map_new(&[SEGMENT], std::slice::from_ref(&f.info));
    assert!(shm.reaches(SEGMENT, Dir::Write), "segment not mapped");
    let tcp = TcpTransport::new(Duration::from_secs(5), Security::default(), false);
    let same_host = TcpTransport::new(Duration::from_secs(5), Security::default(), true);
    vec![Box::new(shm), Box::new(tcp), Box::new(same_host)]
}

fn spread() -> Spread {
    Spread {
        timeout: Duration::from_secs(10),
        lanes_per_peer: 4,
    }
}

/// Object `i`: its key, and a value of `len` bytes that tells it apart.
fn object(i: usize, len: usize) -> (String, Vec<u8>) {
    let value = (0..len).map(|b| (b * 31 + i * 7) as u8).collect();
    (format!("object-{i}"), value)
}

/// Header then value of `key` at generation 1.
fn encoded(key: &str, value: &[u8]) -> Vec<u8> {
    encoded_with(key, value, value_checksum(&[value]))
}

/// [`encoded`] with the header naming `checksum` as the value's.
fn encoded_with(key: &str, value: &[u8], checksum: u64) -> Vec<u8> {
    let mut o = ObjectHeader {
        key: key.into(),
        value_len: value.len() as u64,
        generation: 1,
        checksum,
    }
    .encode();
    o.extend_from_slice(value);
    o
}

/// A write of `bytes` into slot `slot` under `fence`.
fn write<'a>(f: &Fixture, item: usize, slot: u64, fence: u64, bytes: &'a [u8]) -> Write<'a> {
    let offset = DATA_BASE + slot * SLOT;
    let grant = Grant {
        offset,
        len: bytes.len() as u64,
        generation: 1,
        fence,
        cap: None,
    };
    Write {
        item,
        peer: f.peer.clone(),
        op: WriteOp {
            req: WriteReq {
                segment: SEGMENT,
                offset,
                grant,
            },
            parts: vec![bytes],
        },
    }
}

/// A read of `len` bytes of slot `slot` into `dst`.
fn read<'a>(f: &Fixture, item: usize, slot: u64, len: u64, dst: Vec<&'a mut [u8]>) -> Read<'a> {
    Read {
        item,
        peer: f.peer.clone(),
        op: ReadOp {
            req: ReadReq {
                segment: SEGMENT,
                offset: DATA_BASE + slot * SLOT,
                len,
                grant: None,
            },
            dst,
        },
    }
}

/// Runs jobs; each item's one result, failing the test if an item is
/// answered twice.
async fn run<T>(jobs: Vec<Job<'_, T>>) -> HashMap<usize, KvResult<T>> {
    let mut out = HashMap::new();
    for (i, r) in futures::future::join_all(jobs).await.into_iter().flatten() {
        assert!(out.insert(i, r).is_none(), "item {i} answered twice");
    }
    out
}

async fn run_reads(shares: Vec<Share<'_>>) -> HashMap<usize, KvResult<usize>> {
    run(shares.into_iter().flat_map(|s| s.jobs).collect()).await
}

/// Checks a read as the client does: the header is intact and the value
/// matches its checksum; the checksum the transport took as the bytes
/// landed must be the value's.
fn verify(_: usize, dst: &[&mut [u8]], sum: u64) -> KvResult<usize> {
    let (head, value) = dst.split_first().unwrap();
    let h = ObjectHeader::decode(head)?;
    let parts: Vec<&[u8]> = value.iter().map(|v| &v[..]).collect();
    let computed = value_checksum(&parts);
    assert_eq!(sum, computed, "a transport's checksum is not the value's");
    if computed != h.checksum {
        return Err(KvError::from(Code::ChecksumMismatch));
    }
    Ok(h.value_len as usize)
}

/// Writes objects of `lens` (one per slot), then reads each back into two
/// buffers (header and value split at a third), for every transport. The
/// writer's header names `sent(value)` as the value's checksum; what is
/// stored names the true one.
async fn round_trip(lens: &[usize], sent: fn(&[u8]) -> u64) {
    let f = fixture().await;
    for (t, transport) in transports(&f).iter().enumerate() {
        let objects: Vec<_> = (0..lens.len())
            .map(|i| object(i + 1000 * t, lens[i]))
            .collect();
        let bytes: Vec<Vec<u8>> = objects.iter().map(|(k, v)| encoded(k, v)).collect();
        let sending: Vec<Vec<u8>> = (objects.iter())
            .map(|(k, v)| encoded_with(k, v, sent(v)))
            .collect();
        let ops = (sending.iter().enumerate())
            .map(|(i, b)| write(&f, i, i as u64, f.fence, b))
            .collect();
        let written = run(transport.write(ops, spread())).await;
        assert_eq!(written.len(), lens.len(), "{:?}", transport.kind());
        assert!(written.values().all(|r| r.is_ok()), "{written:?}");

        let mut got: Vec<Vec<u8>> = bytes.iter().map(|b| vec![0; b.len()]).collect();
        let ops = (got.iter_mut().enumerate())
            .map(|(i, g)| {
                let len = g.len() as u64;
                let (head, value) = g.split_at_mut(header_len(objects[i].0.len()));
                let (a, b) = value.split_at_mut(value.len() / 3);
                read(&f, i, i as u64, len, vec![head, a, b])
            })
            .collect();
        let read = run_reads(transport.read(ops, &verify, spread())).await;
        assert_eq!(read.len(), lens.len());
        for (i, (_, v)) in objects.iter().enumerate() {
            assert_eq!(read[&i], Ok(v.len()), "{:?} item {i}", transport.kind());
        }
        assert_eq!(got, bytes, "{:?}", transport.kind());
    }
}

/// The TCP transport reaches a store on this host through its same-host
/// socket when asked to (`protocol = auto`), and over TCP otherwise
/// (`protocol = tcp`): the store counts its same-host connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_on_this_host_is_reached_through_its_socket_unless_tcp_is_asked() {
    let f = fixture().await;
    let same_host = || f.table.metrics().same_host_connections.get();
    for (t, (asked, connections)) in [(false, 0), (true, 1)].into_iter().enumerate() {
        let transport = TcpTransport::new(Duration::from_secs(5), Security::default(), asked);
        let (key, value) = object(t, 70_000);
        let bytes = encoded(&key, &value);
        let written =
            run(transport.write(vec![write(&f, 0, t as u64, f.fence, &bytes)], spread())).await;
        assert_eq!(written[&0], Ok(()));
        let mut got = vec![0; bytes.len()];
        let (head, rest) = got.split_at_mut(header_len(key.len()));
        let ops = vec![read(&f, 0, t as u64, bytes.len() as u64, vec![head, rest])];
        let read = run_reads(transport.read(ops, &verify, spread())).await;
        assert_eq!(read[&0], Ok(value.len()));
        assert_eq!(got, bytes);
        assert_eq!(same_host(), connections, "same host asked: {asked}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_batches_round_trip() {
    round_trip(&[0, 1, 100, 4096, 5000], |v| value_checksum(&[v])).await;
}

/// What a put sends (no checksum: it is sealed where the bytes land), and
/// a writer's wrong checksum, both store the checksum of the bytes stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_checksum_is_of_the_bytes_stored() {
    round_trip(&[1, 100, 70_000, 130_000], |_| 0).await;
    round_trip(&[5, 5000], |v| !value_checksum(&[v])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_batches_spread_and_round_trip() {
    // 40 objects of up to 100 KiB: well past the size that spreads a
    // batch over lanes.
    let lens: Vec<usize> = (0..40).map(|i| 60_000 + i * 1000).collect();
    round_trip(&lens, |v| value_checksum(&[v])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_batch_answers_nothing() {
    let f = fixture().await;
    for transport in transports(&f) {
        assert!(run(transport.write(Vec::new(), spread())).await.is_empty());
        assert!(run_reads(transport.read(Vec::new(), &verify, spread()))
            .await
            .is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_stray_write_fails_alone_and_lands_nothing() {
    let f = fixture().await;
    for (t, transport) in transports(&f).iter().enumerate() {
        let base = 10 * t as u64;
        let (key, value) = object(t, 3000);
        let good = encoded(&key, &value);
        let mut stray = write(&f, 2, 0, f.fence, &good);
        stray.op.req.offset = SIZE - 10;
        stray.op.req.grant.offset = SIZE - 10;
        let ops = vec![
            write(&f, 0, base, f.fence, &good),
            write(&f, 1, base + 1, f.fence.wrapping_add(1), &good),
            stray,
        ];
        let r = run(transport.write(ops, spread())).await;
        assert_eq!(r.len(), 3);
        assert_eq!(r[&0], Ok(()), "{:?}", transport.kind());
        assert!(
            r[&1].is_err(),
            "{:?}: stale fence written",
            transport.kind()
        );
        assert!(
            r[&2].is_err(),
            "{:?}: stray range written",
            transport.kind()
        );
        let offset = DATA_BASE + (base + 1) * SLOT;
        // SAFETY: in bounds; no write to this region runs now.
        let landed = unsafe { f.region.slice(offset, good.len() as u64) };
        assert!(landed.iter().all(|&b| b == 0), "{:?}", transport.kind());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_run_on_every_read_and_fail_only_their_item() {
    let f = fixture().await;
    for (t, transport) in transports(&f).iter().enumerate() {
        let slots: Vec<u64> = (0..6).map(|i| 20 + 10 * t as u64 + i).collect();
        let objects: Vec<_> = slots.iter().map(|&s| object(s as usize, 2000)).collect();
        let bytes: Vec<Vec<u8>> = objects.iter().map(|(k, v)| encoded(k, v)).collect();
        let ops = (bytes.iter().zip(&slots).enumerate())
            .map(|(i, (b, &s))| write(&f, i, s, f.fence, b))
            .collect();
        assert!(run(transport.write(ops, spread()))
            .await
            .values()
            .all(|r| r.is_ok()));
        let odd_fails = |i: usize, dst: &[&mut [u8]], sum: u64| {
            if i % 2 == 1 {
                return Err(KvError::from(Code::LeaseExpired));
            }
            verify(i, dst, sum)
        };
        let mut got: Vec<Vec<u8>> = bytes.iter().map(|b| vec![0; b.len()]).collect();
        let mut ops: Vec<Read> = (got.iter_mut().zip(&slots).enumerate())
            .map(|(i, (g, &s))| {
                let len = g.len() as u64;
                let (head, value) = g.split_at_mut(header_len(objects[i].0.len()));
                read(&f, i, s, len, vec![head, value])
            })
            .collect();
        // One read whose buffers do not add up to its length.
        ops[4].op.req.len += 1;
        let r = run_reads(transport.read(ops, &odd_fails, spread())).await;
        assert_eq!(r.len(), 6);
        for i in [0, 2] {
            assert_eq!(r[&i], Ok(2000), "{:?}", transport.kind());
        }
        for i in [1, 3, 5] {
            assert_eq!(r[&i].as_ref().unwrap_err().code, Code::LeaseExpired);
        }
        let e = r[&4].as_ref().unwrap_err();
        assert_eq!(e.code, Code::InvalidParams, "{:?}", transport.kind());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_nothing_reaches_fail_every_item_once() {
    let f = fixture().await;
    // No segment of this id is served or mapped, and no store listens
    // there.
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = gone.local_addr().unwrap().to_string();
    drop(gone);
    let elsewhere = |mut w: Write<'static>| {
        w.op.req.segment = SegmentId(0xdead);
        w.peer = peer.clone();
        w
    };
    let body: &'static [u8] = &[1; 300];
    for transport in transports(&f) {
        let ops = (0..5)
            .map(|i| elsewhere(write(&f, i, i as u64, f.fence, body)))
            .collect();
        let r = run(transport.write(ops, spread())).await;
        assert_eq!(r.len(), 5, "{:?}", transport.kind());
        assert!(r.values().all(|r| r.is_err()), "{r:?}");

        let mut bufs = vec![vec![0u8; 300]; 5];
        let ops = (bufs.iter_mut().enumerate())
            .map(|(i, b)| {
                let mut r = read(&f, i, i as u64, 300, vec![&mut b[..]]);
                r.op.req.segment = SegmentId(0xdead);
                r.peer = peer.clone();
                r
            })
            .collect();
        let r = run_reads(transport.read(ops, &verify, spread())).await;
        assert_eq!(r.len(), 5, "{:?}", transport.kind());
        assert!(r.values().all(|r| r.is_err()), "{r:?}");
    }
}
