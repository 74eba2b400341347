//! The storage-medium conformance suite: the same checks on every medium
//! (memory, disk, and a plain file that exists only here to show what a
//! third medium takes: one `Medium` implementation and `insert_medium`).
//! Reads, copies in and out (with the generation check), invalidations of
//! the named generation only, the object-area bounds, a tier move each way
//! through the generic copy, and a read of the file medium served over TCP.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kvpool_net::auth::Security;
use kvpool_net::conn::FramedConn;
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{ReadReq, SegmentId, Tier, TierMove, DISK_BLOCK};
use kvpool_proto::{Code, KvResult};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::medium::{in_object_area, Copied, Medium};
use super::on_disk::DiskSegment;
use super::serve::Reply;
use super::table::Served;
use super::tests::object;
use super::*;
use crate::disk::DiskFile;
use crate::fence::Fence;
use crate::mapped::MappedRegion;

/// A segment in a plain file, read and written in place on the caller's
/// thread: the whole of a third medium.
struct FileMedium {
    file: File,
    len: u64,
    fence: Fence,
}

impl Medium for FileMedium {
    fn tier(&self) -> Tier {
        Tier::Disk
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn base(&self) -> u64 {
        DISK_BLOCK
    }
    fn fence(&self) -> &Fence {
        &self.fence
    }
    fn spawn_io(&self, job: Box<dyn FnOnce() + Send>) {
        job()
    }
    fn read(&self, offset: u64, len: u64) -> Reply {
        let mut buf = vec![0; len as usize];
        match self.file.read_exact_at(&mut buf, offset) {
            Ok(()) => Reply::Owned(buf),
            Err(e) => Reply::Refused(kvpool_proto::KvError::new(
                Code::TransferFail,
                e.to_string(),
            )),
        }
    }
    fn invalidate(&self, regions: &[(u64, u64)]) -> u64 {
        let mut n = 0;
        for &(offset, generation) in regions {
            let mut head = [0u8; kvpool_format::FIXED_LEN];
            if self.file.read_exact_at(&mut head, offset).is_ok()
                && kvpool_format::scan::invalidate(&mut head, generation)
                && self.file.write_all_at(&head, offset).is_ok()
            {
                n += 1;
            }
        }
        n
    }
    fn copy_out(&self, offset: u64, len: u64) -> KvResult<Copied<'_>> {
        let mut buf = vec![0; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| kvpool_proto::KvError::new(Code::TransferFail, e.to_string()))?;
        Ok(Copied::Owned(buf))
    }
    fn copy_in(&self, offset: u64, bytes: &[u8], holds: &dyn Fn(&[u8]) -> bool) -> KvResult<bool> {
        if !holds(bytes) {
            return Ok(false);
        }
        let split = kvpool_format::FIXED_LEN.min(bytes.len());
        let write = |b: &[u8], at: u64| {
            self.file
                .write_all_at(b, at)
                .map_err(|e| kvpool_proto::KvError::new(Code::TransferFail, e.to_string()))
        };
        write(&bytes[split..], offset + split as u64)?;
        write(&bytes[..split], offset)?;
        Ok(true)
    }
}

const SIZE: u64 = 1 << 20;

/// The fence value every test segment is mounted under.
const FENCE: u64 = 1;

/// A fence at [`FENCE`].
fn mounted() -> Fence {
    let f = Fence::default();
    f.set(FENCE);
    f
}

/// One segment of each medium, with its object area from `DISK_BLOCK`.
fn media(dir: &std::path::Path) -> Vec<(&'static str, Arc<dyn Medium>)> {
    let memory = Served {
        region: Arc::new(MappedRegion::anonymous(SIZE).unwrap()),
        base: DISK_BLOCK,
        fence: mounted(),
        file: None,
        starts: super::starts::Starts::new(SIZE),
    };
    let disk = DiskSegment {
        file: Arc::new(DiskFile::open(&dir.join("disk"), SIZE, 4).unwrap()),
        base: DISK_BLOCK,
        fence: mounted(),
    };
    let path = dir.join("plain");
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(SIZE).unwrap();
    let plain = FileMedium {
        file,
        len: SIZE,
        fence: mounted(),
    };
    vec![
        ("memory", Arc::new(memory) as Arc<dyn Medium>),
        ("disk", Arc::new(disk)),
        ("file", Arc::new(plain)),
    ]
}

/// What a read answered, as bytes.
async fn bytes_of(r: Reply) -> Vec<u8> {
    match r {
        Reply::Region(region, offset, len) => unsafe { region.slice(offset, len) }.to_vec(),
        Reply::Reading(read, _) => read.await.unwrap().bytes().to_vec(),
        Reply::Owned(b) => b,
        _ => panic!("not a read's answer"),
    }
}

fn intact(generation: u64) -> impl Fn(&[u8]) -> bool {
    move |b: &[u8]| kvpool_format::scan::intact(b, generation)
}

#[tokio::test]
async fn every_medium_copies_reads_and_invalidates_alike() {
    let dir = tempfile::tempdir().unwrap();
    for (name, m) in media(dir.path()) {
        let at = DISK_BLOCK * 2;
        let o = object("k", 5, &[7u8; 3000]);
        let len = o.len() as u64;
        in_object_area(&*m, at, len).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            in_object_area(&*m, 0, 16).unwrap_err().code,
            Code::InvalidParams,
            "{name}"
        );
        assert_eq!(
            in_object_area(&*m, SIZE - 8, 16).unwrap_err().code,
            Code::InvalidParams,
            "{name}"
        );

        // A copy the check refuses writes nothing.
        assert!(!m.copy_in(at, &o, &intact(6)).unwrap(), "{name}");
        assert!(
            !intact(5)(m.copy_out(at, len).unwrap().bytes()),
            "{name}: a refused copy landed"
        );
        assert!(m.copy_in(at, &o, &intact(5)).unwrap(), "{name}");
        assert_eq!(m.copy_out(at, len).unwrap().bytes(), &o[..], "{name}");
        assert_eq!(bytes_of(m.read(at, len)).await, o, "{name}");

        // Only the named generation is destroyed, once.
        assert_eq!(m.invalidate(&[(at, 4)]), 0, "{name}");
        assert!(intact(5)(m.copy_out(at, len).unwrap().bytes()), "{name}");
        assert_eq!(m.invalidate(&[(at, 5)]), 1, "{name}");
        assert_eq!(m.invalidate(&[(at, 5)]), 0, "{name}");
        assert!(!intact(5)(m.copy_out(at, len).unwrap().bytes()), "{name}");
    }
}

#[tokio::test]
async fn tier_moves_go_both_ways_through_any_medium() {
    let dir = tempfile::tempdir().unwrap();
    let all = media(dir.path());
    let memory = all[0].1.clone();
    for (name, other) in &all[1..] {
        let o = object("m", 9, &[3u8; 5000]);
        assert!(memory.copy_in(DISK_BLOCK, &o, &intact(9)).unwrap());
        let mv = |from_offset, to_offset| TierMove {
            from: SegmentId(1),
            from_offset,
            to: SegmentId(2),
            to_offset,
            len: o.len() as u64,
            generation: 9,
            fence: FENCE,
        };
        media::tier_move(&*memory, &**other, &mv(DISK_BLOCK, DISK_BLOCK * 4), None).unwrap();
        assert_eq!(
            other
                .copy_out(DISK_BLOCK * 4, o.len() as u64)
                .unwrap()
                .bytes(),
            &o[..],
            "{name}"
        );
        media::tier_move(
            &**other,
            &*memory,
            &mv(DISK_BLOCK * 4, DISK_BLOCK * 8),
            None,
        )
        .unwrap();
        assert_eq!(
            memory
                .copy_out(DISK_BLOCK * 8, o.len() as u64)
                .unwrap()
                .bytes(),
            &o[..],
            "{name}"
        );
        // A move of a generation the source no longer holds is refused.
        let e = media::tier_move(
            &*memory,
            &**other,
            &TierMove {
                generation: 8,
                ..mv(DISK_BLOCK, DISK_BLOCK * 12)
            },
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, Code::ObjectNotFound, "{name}");
        // Not between two segments of one tier.
        let e = media::tier_move(
            &**other,
            &**other,
            &mv(DISK_BLOCK * 4, DISK_BLOCK * 16),
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, Code::InvalidParams, "{name}");
        // A move whose request was given up writes nothing, either way.
        let given_up = parking_lot::Mutex::new(true);
        for (src, dst, from_offset, to_offset) in [
            (&memory, other, DISK_BLOCK, DISK_BLOCK * 20),
            (other, &memory, DISK_BLOCK * 4, DISK_BLOCK * 24),
        ] {
            let e = media::tier_move(&**src, &**dst, &mv(from_offset, to_offset), Some(&given_up))
                .unwrap_err();
            assert_eq!(e.code, Code::TransferFail, "{name}");
            let there = dst.copy_out(to_offset, o.len() as u64).unwrap();
            assert!(!intact(9)(there.bytes()), "{name}: a given-up move landed");
        }
    }
}

/// The master gives a tier move request up when it stops waiting for its
/// answer, then frees the regions it reserved for it: from the answer to
/// the cancellation on, none of its moves may write, whether the request
/// is running or still on its way.
#[tokio::test]
async fn a_cancelled_tier_move_request_writes_nothing_however_late_it_comes() {
    use kvpool_proto::msg::{RequestId, TierMoveCancel, TierMoveReq};
    let dir = tempfile::tempdir().unwrap();
    let all = media(dir.path());
    let table = SegmentTable::default();
    table.insert_medium(SegmentId(1), all[0].1.clone());
    table.insert_medium(SegmentId(2), all[1].1.clone());
    let o = object("c", 4, &[8u8; 6000]);
    assert!(all[0].1.copy_in(DISK_BLOCK, &o, &intact(4)).unwrap());
    let req = |to_offset| TierMoveReq {
        moves: vec![TierMove {
            from: SegmentId(1),
            from_offset: DISK_BLOCK,
            to: SegmentId(2),
            to_offset,
            len: o.len() as u64,
            generation: 4,
            fence: FENCE,
        }],
    };
    let cancel = |ids: Vec<RequestId>| async {
        match media::cancel_moves(&table, TierMoveCancel { requests: ids }) {
            Reply::Pending(done) => done.await,
            _ => panic!("a cancellation is answered once its moves are stopped"),
        }
    };
    let (late, on_time) = (RequestId(7), RequestId(8));
    cancel(vec![late, RequestId::NONE]).await;
    let codes = media::tier_moves(&table, req(DISK_BLOCK * 4), late).await;
    assert_eq!(codes, vec![Code::TransferFail.as_i32()]);
    let there = all[1].1.copy_out(DISK_BLOCK * 4, o.len() as u64).unwrap();
    assert!(
        !intact(4)(there.bytes()),
        "a cancelled request's move landed"
    );
    // Others run, and a cancellation after one finished changes nothing.
    assert_eq!(
        media::tier_moves(&table, req(DISK_BLOCK * 8), on_time).await,
        vec![0]
    );
    cancel(vec![on_time]).await;
    let there = all[1].1.copy_out(DISK_BLOCK * 8, o.len() as u64).unwrap();
    assert_eq!(there.bytes(), &o[..]);
    // A master that names no request cannot cancel it.
    assert_eq!(
        media::tier_moves(&table, req(DISK_BLOCK * 12), RequestId::NONE).await,
        vec![0]
    );
}

#[tokio::test]
async fn a_registered_medium_is_served_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let plain = media(dir.path()).pop().unwrap().1;
    let o = object("t", 2, &[1u8; 700]);
    assert!(plain.copy_in(DISK_BLOCK, &o, &intact(2)).unwrap());
    let table = Arc::new(SegmentTable::default());
    table.insert_medium(SegmentId(9), plain);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let token = CancellationToken::new();
    tokio::spawn(serve_data(
        listener,
        table,
        Limits::default(),
        Security::default(),
        token.clone(),
    ));
    let mut c = FramedConn::connect(&addr, "test", Limits::default())
        .await
        .unwrap();
    let mut got = vec![0u8; o.len()];
    let read = ReadOp {
        req: ReadReq {
            segment: SegmentId(9),
            offset: DISK_BLOCK,
            len: o.len() as u64,
            grant: None,
        },
        dst: vec![&mut got[..]],
    };
    let r = read_regions(&mut c, vec![read]).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    assert_eq!(got, o);
    token.cancel();
}
