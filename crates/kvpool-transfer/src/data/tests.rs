//! End-to-end tests of the data plane: a server on a loopback socket and
//! the client side's pipelining against it. They stay together rather than
//! beside each module because every one drives the server through the
//! client functions and shares the fixtures below.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvpool_net::auth::Security;
use kvpool_net::conn::{accept, FramedConn};
use kvpool_proto::frame::{FrameHeader, Limits, Opcode};
use kvpool_proto::msg::{self, Grant, InvalidateReq, ReadReq, SegmentId, WriteReq};
use kvpool_proto::{Code, KvResult};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::mapped::MappedRegion;

/// The object `key` of version `generation` holding `value`: header and value.
pub(super) fn object(key: &str, generation: u64, value: &[u8]) -> Vec<u8> {
    let mut o = kvpool_format::ObjectHeader {
        key: key.into(),
        value_len: value.len() as u64,
        generation,
        checksum: kvpool_format::value_checksum(&[value]),
    }
    .encode();
    o.extend_from_slice(value);
    o
}

/// A write of the object `o` at `offset` of segment 7, granted under `fence`.
fn write_op(offset: u64, generation: u64, fence: u64, o: &[u8]) -> WriteOp<'_> {
    let grant = Grant {
        offset,
        len: o.len() as u64,
        generation,
        fence,
        cap: None,
    };
    WriteOp {
        req: WriteReq {
            segment: SegmentId(7),
            offset,
            grant,
        },
        parts: vec![o],
    }
}

/// Segment 7's current fence in `table`.
fn fence(table: &SegmentTable) -> u64 {
    table.served(SegmentId(7)).unwrap().fence.value()
}

async fn server() -> (String, Arc<SegmentTable>, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let table = Arc::new(SegmentTable::default());
    table.insert(
        SegmentId(7),
        Arc::new(MappedRegion::anonymous(1 << 20).unwrap()),
        0,
    );
    table.refence(SegmentId(7)).unwrap();
    let token = CancellationToken::new();
    tokio::spawn(serve_data(
        listener,
        table.clone(),
        Limits::default(),
        Security::default(),
        token.clone(),
    ));
    (addr, table, token)
}

#[tokio::test]
async fn pipelined_writes_and_reads_round_trip() {
    let (addr, table, token) = server().await;
    let mut c = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    let values: Vec<Vec<u8>> = (0..200u32)
        .map(|i| object("k", i as u64 + 1, &vec![i as u8; 100 + i as usize]))
        .collect();
    let f = fence(&table);
    let writes: Vec<WriteOp> = values
        .iter()
        .enumerate()
        .map(|(i, v)| write_op(i as u64 * 512, i as u64 + 1, f, v))
        .collect();
    let r = write_regions(&mut c, &writes).await.unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    let mut heads = vec![[0u8; 2]; values.len()];
    let mut bodies: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len() - 2]).collect();
    let reads: Vec<ReadOp> = heads
        .iter_mut()
        .zip(bodies.iter_mut())
        .enumerate()
        .map(|(i, (h, b))| ReadOp {
            req: ReadReq {
                segment: SegmentId(7),
                offset: i as u64 * 512,
                len: 2 + b.len() as u64,
                grant: None,
            },
            dst: vec![&mut h[..], &mut b[..]],
        })
        .collect();
    let r = read_regions(&mut c, reads).await.unwrap();
    assert!(r.iter().all(|r| r.is_ok()));
    assert!(heads.iter().all(|h| h == b"KV"));
    for (b, v) in bodies.iter().zip(&values) {
        assert_eq!(b[..], v[2..]);
    }

    // Two connections sharing one queue read every op exactly once.
    let mut whole: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len()]).collect();
    let queue = Mutex::new(
        whole
            .iter_mut()
            .enumerate()
            .map(|(i, b)| {
                let req = ReadReq {
                    segment: SegmentId(7),
                    offset: i as u64 * 512,
                    len: b.len() as u64,
                    grant: None,
                };
                (
                    i,
                    ReadOp {
                        req,
                        dst: vec![&mut b[..]],
                    },
                )
            })
            .collect(),
    );
    let mut d = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    let ((a, ea), (b, eb)) = tokio::join!(
        read_regions_shared(&mut c, &queue),
        read_regions_shared(&mut d, &queue)
    );
    assert!(ea.is_none() && eb.is_none());
    assert!(a.iter().chain(&b).all(|(_, _, r)| r.is_ok()));
    let mut seen: Vec<usize> = a.iter().chain(&b).map(|(i, _, _)| *i).collect();
    seen.sort();
    assert_eq!(seen, (0..values.len()).collect::<Vec<_>>());
    drop((a, b));
    assert_eq!(whole, values);

    token.cancel();

    // A connection that breaks fails what it took and leaves the rest:
    // this peer shakes hands, then hangs up.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hangs_up = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        accept(stream, "test", Limits::default(), &Security::default()).await;
    });
    let mut c = FramedConn::connect(&hangs_up, "test", Limits::default())
        .await
        .unwrap();
    let mut bufs = vec![vec![0u8; 600]; 8];
    let queue = Mutex::new(
        bufs.iter_mut()
            .map(|b| {
                let req = ReadReq {
                    segment: SegmentId(7),
                    offset: 0,
                    len: 600,
                    grant: None,
                };
                (
                    (),
                    ReadOp {
                        req,
                        dst: vec![&mut b[..]],
                    },
                )
            })
            .collect(),
    );
    let (taken, broke) = read_regions_shared(&mut c, &queue).await;
    assert!(broke.is_some(), "the server is gone");
    assert!(taken.iter().all(|(_, _, r)| r.is_err()));
    assert_eq!(taken.len() + queue.lock().len(), 8);
}

#[tokio::test]
async fn bad_requests_get_errors_and_the_connection_survives() {
    let (addr, table, token) = server().await;
    let mut c = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    let big = object("k", 1, &[1u8; 4000]);
    let f = fence(&table);
    let mut elsewhere = write_op(0, 1, f, &big);
    elsewhere.req.segment = SegmentId(8);
    let writes = [
        write_op((1 << 20) - 10, 1, f, &big),
        elsewhere,
        write_op(0, 1, f, &big),
    ];
    let r = write_regions(&mut c, &writes).await.unwrap();
    assert_eq!(r[0].as_ref().unwrap_err().code, Code::InvalidParams);
    assert_eq!(r[1].as_ref().unwrap_err().code, Code::SegmentNotFound);
    assert!(r[2].is_ok());
    let mut buf = vec![0u8; big.len()];
    let reads = vec![ReadOp {
        req: ReadReq {
            segment: SegmentId(7),
            offset: 0,
            len: big.len() as u64,
            grant: None,
        },
        dst: vec![&mut buf[..]],
    }];
    assert!(read_regions(&mut c, reads).await.unwrap()[0].is_ok());
    assert_eq!(buf, big);
    token.cancel();
}

#[tokio::test]
async fn invalidate_destroys_only_the_named_generation() {
    let (addr, table, token) = server().await;
    let (region, _) = table.get(SegmentId(7)).unwrap();
    let value = b"value";
    let head = kvpool_format::ObjectHeader {
        key: "k".into(),
        value_len: value.len() as u64,
        generation: 3,
        checksum: kvpool_format::value_checksum(&[value]),
    }
    .encode();
    for offset in [0, 4096] {
        // SAFETY: in bounds; nothing else touches these bytes yet.
        let dst = unsafe { region.slice_mut(offset, (head.len() + value.len()) as u64) };
        dst[..head.len()].copy_from_slice(&head);
        dst[head.len()..].copy_from_slice(value);
    }
    let mut c = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    // Decided under an earlier mount (a deposed leader): refused, and
    // nothing destroyed.
    let stale = InvalidateReq {
        segment: SegmentId(7),
        fence: fence(&table) ^ 1,
        regions: vec![(0, 3), (4096, 2), (1 << 20, 3)],
    };
    assert_eq!(c.call(&stale).await.unwrap_err().code, Code::TransferFail);
    let req = InvalidateReq {
        fence: fence(&table),
        ..stale
    };
    assert_eq!(c.call(&req).await.unwrap(), 1);
    // SAFETY: in bounds.
    let (found, _) = kvpool_format::scan::scan(unsafe { region.slice(0, region.len()) }, 0);
    assert_eq!(found.iter().map(|f| f.offset).collect::<Vec<_>>(), [4096]);
    let unknown = InvalidateReq {
        segment: SegmentId(8),
        fence: 1,
        regions: vec![(0, 3)],
    };
    assert_eq!(
        c.call(&unknown).await.unwrap_err().code,
        Code::SegmentNotFound
    );
    token.cancel();
}

#[tokio::test]
async fn a_write_that_comes_after_its_invalidation_is_refused() {
    // A writer cut off from the pool has its frames delivered after the
    // master gave its put up and invalidated the region: the region may
    // hold another object by then, and the object it writes must not be
    // found by a later scan (a new leader would take it back from the
    // inventory, long after the key was removed).
    let (addr, table, token) = server().await;
    let (region, _) = table.get(SegmentId(7)).unwrap();
    let value = b"late value";
    let head = |generation| {
        kvpool_format::ObjectHeader {
            key: "k".into(),
            value_len: value.len() as u64,
            generation,
            checksum: kvpool_format::value_checksum(&[value]),
        }
        .encode()
    };
    let mut c = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    let req = InvalidateReq {
        segment: SegmentId(7),
        fence: fence(&table),
        regions: vec![(0, 3), (4096, 3)],
    };
    assert_eq!(c.call(&req).await.unwrap(), 0, "nothing written yet");
    let (late, other) = (head(3), head(4));
    let f = fence(&table);
    let writes = [(0, &late, 3), (4096, &other, 4)].map(|(offset, h, generation)| {
        let mut op = write_op(offset, generation, f, h);
        op.req.grant.len += value.len() as u64;
        op.parts.push(&value[..]);
        op
    });
    let r = write_regions(&mut c, &writes).await.unwrap();
    assert_eq!(r[0].as_ref().unwrap_err().code, Code::TransferFail);
    assert!(r[1].is_ok(), "another version in the same region is kept");
    // Refused before a byte landed: the region may be another object's.
    // SAFETY: in bounds.
    assert!(unsafe { region.slice(0, 4096) }.iter().all(|&b| b == 0));
    // SAFETY: in bounds.
    let (found, _) = kvpool_format::scan::scan(unsafe { region.slice(0, region.len()) }, 0);
    assert_eq!(
        found
            .iter()
            .map(|f| (f.offset, f.generation))
            .collect::<Vec<_>>(),
        [(4096, 4)]
    );
    // A grant kept after its object was destroyed writes nothing again.
    let req = InvalidateReq {
        segment: SegmentId(7),
        fence: fence(&table),
        regions: vec![(4096, 4)],
    };
    assert_eq!(c.call(&req).await.unwrap(), 1);
    let r = write_regions(&mut c, &writes[1..]).await.unwrap();
    assert_eq!(r[0].as_ref().unwrap_err().code, Code::TransferFail);
    token.cancel();
}

#[tokio::test]
async fn only_the_granted_version_lands_and_only_under_the_current_fence() {
    let (addr, table, token) = server().await;
    let mut c = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    let (region, _) = table.get(SegmentId(7)).unwrap();
    let refused = |r: &KvResult<()>, what: &str| {
        let e = r.as_ref().expect_err(what);
        assert_eq!(e.code, Code::TransferFail, "{what}: {e}");
    };
    // Mounted again: the old fence's grants are void, the new one's land.
    let old = fence(&table);
    let (new, held) = table.refence(SegmentId(7)).unwrap();
    assert!(held.is_empty());
    assert_ne!(new, old);
    let o = object("k", 5, b"value");
    let r = write_regions(
        &mut c,
        &[write_op(0, 5, old, &o), write_op(4096, 5, new, &o)],
    )
    .await
    .unwrap();
    refused(&r[0], "a write granted under the previous mount");
    assert!(r[1].is_ok(), "{:?}", r[1]);
    // SAFETY: in bounds; nothing writes meanwhile.
    assert!(unsafe { region.slice(0, 4096) }.iter().all(|&b| b == 0));
    // A newer object in the region: an older grant's write is refused.
    let newer = object("k", 9, b"newer");
    let r = write_regions(
        &mut c,
        &[write_op(8192, 9, new, &newer), write_op(8192, 5, new, &o)],
    )
    .await
    .unwrap();
    assert!(r[0].is_ok());
    refused(&r[1], "a stale grant over a newer object");
    // SAFETY: in bounds.
    assert_eq!(
        unsafe { region.slice(8192, newer.len() as u64) },
        &newer[..]
    );
    // The object written must be the version granted.
    let r = write_regions(&mut c, &[write_op(12288, 6, new, &o)])
        .await
        .unwrap();
    refused(&r[0], "an object of another version than the grant's");
    // Not a whole object at the start of its region: a caller's error.
    let mut inside = write_op(16384, 5, new, &o);
    inside.req.offset += 64;
    let r = write_regions(&mut c, &[inside]).await.unwrap();
    assert_eq!(r[0].as_ref().unwrap_err().code, Code::InvalidParams);
    let count = |reason| {
        table
            .metrics
            .writes_refused
            .get_or_create(&crate::metrics::RefusedLabel { reason })
            .get()
    };
    assert_eq!((count("fence"), count("generation")), (1, 2));
    // The connection still works.
    let r = write_regions(&mut c, &[write_op(16384, 5, new, &o)])
        .await
        .unwrap();
    assert!(r[0].is_ok());
    token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_stops_landing_when_its_segment_is_mounted_again() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, table, token) = server().await;
    let (region, _) = table.get(SegmentId(7)).unwrap();
    let o = object("k", 5, &vec![0xA5u8; 256 << 10]);
    let req = write_op(0, 5, fence(&table), &o).req;
    let meta = msg::encode(&req);
    let h = FrameHeader::request(Opcode::Write, 1, meta.len() as u32, o.len() as u64);
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let hello = msg::encode(&msg::Hello {
        version: kvpool_proto::PROTOCOL_VERSION,
        min_version: kvpool_proto::frame::MIN_PROTOCOL_VERSION,
        role: "test".into(),
        nonce: [0; 16],
    });
    let hh = FrameHeader::request(Opcode::Hello, 0, hello.len() as u32, 0);
    raw.write_all(&hh.encode()).await.unwrap();
    raw.write_all(&hello).await.unwrap();
    let mut reply = [0u8; kvpool_proto::HEADER_LEN];
    raw.read_exact(&mut reply).await.unwrap();
    let rh = FrameHeader::decode(&reply, &Limits::default()).unwrap();
    let mut skip = vec![0u8; rh.meta_len as usize];
    raw.read_exact(&mut skip).await.unwrap();
    // The header, the message and half the object; then the writer stalls.
    let half = o.len() / 2;
    raw.write_all(&h.encode()).await.unwrap();
    raw.write_all(&meta).await.unwrap();
    raw.write_all(&o[..half]).await.unwrap();
    let t0 = Instant::now();
    // SAFETY: in bounds; read while the server writes: compared only.
    while unsafe { region.slice(0, half as u64) } != &o[..half] {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the first half never landed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    table.refence(SegmentId(7)).unwrap();
    // The rest arrives after the new mount: not one byte of it lands.
    raw.write_all(&o[half..]).await.unwrap();
    raw.read_exact(&mut reply).await.unwrap();
    let rh = FrameHeader::decode(&reply, &Limits::default()).unwrap();
    assert_eq!(rh.status, Code::TransferFail.as_i32());
    // SAFETY: in bounds; the server is done with this region.
    let rest = unsafe { region.slice(half as u64, (o.len() - half) as u64) };
    assert!(
        rest.iter().all(|&b| b == 0),
        "bytes landed after the fence moved"
    );
    token.cancel();
}

#[tokio::test]
async fn garbage_header_is_answered_and_server_keeps_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _t, token) = server().await;
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    raw.write_all(&[0xAB; 64]).await.unwrap();
    let mut resp = Vec::new();
    raw.read_to_end(&mut resp).await.unwrap();
    let h = kvpool_proto::frame::FrameHeader::decode(
        resp[..32].try_into().unwrap(),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(h.status, Code::InvalidParams.as_i32());
    // A fresh connection still works.
    assert!(FramedConn::connect(&addr, "test", Limits::default())
        .await
        .is_ok());
    token.cancel();
}

#[tokio::test]
async fn a_write_whose_header_does_not_check_is_refused() {
    // A header whose own checksum is wrong cannot be sealed, and an object
    // nobody could read must not be acknowledged.
    let (addr, table, token) = server().await;
    let (region, _) = table.get(SegmentId(7)).unwrap();
    let mut o = object("k", 3, b"value");
    o[33] ^= 1;
    let mut c = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    let r = write_regions(&mut c, &[write_op(0, 3, fence(&table), &o)])
        .await
        .unwrap();
    let e = r[0].as_ref().unwrap_err();
    assert_eq!(e.code, Code::TransferFail);
    assert!(e.message.contains("does not check"), "{}", e.message);
    // SAFETY: in bounds.
    let (found, _) = kvpool_format::scan::scan(unsafe { region.slice(0, region.len()) }, 0);
    assert!(found.is_empty(), "{found:?}");
    token.cancel();
}

#[test]
fn an_invalidation_racing_a_new_writer_never_damages_the_new_object() {
    // The master returns a freed memory region to its allocator at once and
    // queues the old object's destruction: a client writing a new object
    // there through shared memory copies while the store destroys the old
    // header, started together here round after round. Whatever the
    // interleaving, the new object is intact and holds its own bytes, both
    // where it starts at the old header and where the old header lies
    // inside its value.
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    const ROUNDS: u64 = 100_000;
    const OLD: u64 = 4096;
    let region = Arc::new(MappedRegion::anonymous(1 << 20).unwrap());
    // Round i: the writer sets `go` to i, the invalidator answers by
    // setting `started` to i, then `done` once it has invalidated.
    let [go, started, done] = [(); 3].map(|_| Arc::new(AtomicU64::new(0)));
    let invalidator = {
        let (region, go, started, done) =
            (region.clone(), go.clone(), started.clone(), done.clone());
        std::thread::spawn(move || {
            for i in 1..=2 * ROUNDS {
                while go.load(SeqCst) != i {
                    std::hint::spin_loop();
                }
                started.store(i, SeqCst);
                invalidate_object(&region, OLD, i);
                done.store(i, SeqCst);
            }
        })
    };
    let mut damaged = [0; 2];
    for i in 1..=2 * ROUNDS {
        // Generation i is intact at OLD; generation i + 1 is written at OLD,
        // or (odd rounds) from 64 bytes before it.
        let at = if i % 2 == 0 { OLD } else { OLD - 64 };
        let value = vec![(i % 251) as u8 + 1; 4000];
        let new = object("k", i + 1, &value);
        let old = object("k", i, &value);
        // SAFETY: in bounds; the invalidator waits for this round.
        let area = unsafe { region.slice_mut(OLD - 64, 8192) };
        area.fill(0);
        area[64..64 + old.len()].copy_from_slice(&old);
        go.store(i, SeqCst);
        while started.load(SeqCst) != i {
            std::hint::spin_loop();
        }
        // SAFETY: in bounds; nothing else writes here.
        let dst = unsafe { region.slice_mut(at, new.len() as u64) };
        let (head, tail) = new.split_at(kvpool_format::value_start(&new).unwrap());
        let sealed = kvpool_format::copy_sealed(dst, &[head, tail]);
        while done.load(SeqCst) != i {
            std::hint::spin_loop();
        }
        let ok = sealed && dst[..] == new[..];
        damaged[(i % 2) as usize] += u64::from(!ok);
    }
    invalidator.join().unwrap();
    assert_eq!(
        damaged,
        [0, 0],
        "new objects damaged (at the old header, around it)"
    );
}
