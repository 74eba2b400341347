//! Messages as the released v5 build sends them, recorded once into
//! `tests/data/v5/` and decoded here with today's decoders: a change that
//! stops this build reading a v5 peer fails here, not in a rolling upgrade.
//!
//! The files are whole request frames (header, then message). They are
//! written only when `KVPOOL_RECORD_V5=1` is set, which must never be needed
//! again: a v5 frame that this build encodes differently is a broken wire,
//! not a fixture to refresh.

use std::path::PathBuf;

use kvpool_proto::compat::decode_with;
use kvpool_proto::frame::{parse_frame, write_frame, FrameHeader, Limits};
use kvpool_proto::msg::{self, *};
use kvpool_proto::{Opcode, Rpc};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/v5")
}

/// Checks one recorded frame against `want`: the header, the message as
/// today's decoder reads it (with the v6 trailer absent) and the bytes this
/// build encodes for the same message in the v5 shape.
fn check<R: Rpc + PartialEq + std::fmt::Debug>(name: &str, request_id: u64, want: &R) {
    let meta = msg::encode(want);
    let h = FrameHeader::request(R::OPCODE, request_id, meta.len() as u32, 0);
    let mut frame = Vec::new();
    write_frame(&mut frame, &h, &meta, &[]);
    let path = dir().join(format!("{name}.bin"));
    if std::env::var_os("KVPOOL_RECORD_V5").is_some() {
        std::fs::write(&path, &frame).unwrap();
    }
    let recorded = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (recorded v5 frames are committed)", path.display()));
    let f = parse_frame(&recorded, &Limits::default())
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: an incomplete frame"));
    assert_eq!(f.consumed, recorded.len(), "{name}");
    assert_eq!(f.header, h, "{name}");
    assert_eq!(f.header.opcode, R::OPCODE, "{name}");
    assert_eq!(&msg::decode::<R>(f.meta).unwrap(), want, "{name}");
    let (got, trailer) = decode_with::<R, RequestTrailer>(f.meta).unwrap();
    assert_eq!(&got, want, "{name}");
    assert_eq!(
        trailer.id,
        RequestId::NONE,
        "{name}: v5 sends no request id"
    );
    assert_eq!(f.meta, &meta[..], "{name}: the v5 encoding changed");
}

fn grant() -> Grant {
    Grant {
        offset: 8192,
        len: 4352,
        generation: 41,
        fence: 0x1234_5678_9abc_def0,
        cap: Some(Capability {
            expires_ms: 1_700_000_123_456,
            access: Capability::READ | Capability::WRITE,
            mac: [0xa5; 16],
        }),
    }
}

const CLIENT: ClientId = ClientId(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
const SEGMENT: SegmentId = SegmentId(0xdead_beef_0000_0001_0000_0000_cafe_f00d);

#[test]
fn hello() {
    check(
        "hello",
        1,
        &Hello {
            version: 5,
            min_version: 5,
            role: "client".into(),
            nonce: *b"0123456789abcdef",
        },
    );
}

#[test]
fn register_client() {
    check(
        "register_client",
        2,
        &RegisterClient {
            client_id: CLIENT,
            hostname: "node-7.example".into(),
        },
    );
}

#[test]
fn heartbeat() {
    check(
        "heartbeat",
        3,
        &Heartbeat {
            client_id: CLIENT,
            io: vec![SegmentIo {
                segment: SEGMENT,
                read_ops: 10,
                read_bytes: 40960,
                read_us: 1500,
                write_ops: 2,
                write_bytes: 8192,
                write_us: 300,
                errors: 0,
            }],
            held: vec![(SEGMENT, 4096, 8192)],
        },
    );
}

#[test]
fn put_start() {
    check(
        "put_start",
        4,
        &PutStart {
            client_id: CLIENT,
            op: 77,
            items: vec![
                PutItem {
                    key: "layer.0/block.17".into(),
                    value_len: 4096,
                    region_len: 4352,
                },
                PutItem {
                    key: "layer.0/block.18".into(),
                    value_len: 1,
                    region_len: 256,
                },
            ],
            config: ReplicateConfig {
                replica_num: 2,
                with_soft_pin: true,
                soft_pin_ttl_ms: Some(60_000),
                with_hard_pin: false,
                preferred_segments: vec!["seg-a".into()],
            },
            upsert: true,
        },
    );
}

#[test]
fn put_end() {
    check(
        "put_end",
        5,
        &PutEnd {
            client_id: CLIENT,
            items: vec![PutEndItem {
                key: "layer.0/block.17".into(),
                generation: 41,
            }],
        },
    );
}

#[test]
fn get_replica_list() {
    check(
        "get_replica_list",
        6,
        &GetReplicaList {
            keys: vec!["layer.0/block.17".into(), "missing".into()],
        },
    );
}

#[test]
fn write() {
    check(
        "write",
        7,
        &WriteReq {
            segment: SEGMENT,
            offset: 8192,
            grant: grant(),
        },
    );
}

#[test]
fn read() {
    check(
        "read",
        u64::MAX,
        &ReadReq {
            segment: SEGMENT,
            offset: 8192,
            len: 4352,
            grant: Some(grant()),
        },
    );
}

/// Every file in the directory is checked by a test above: a recording
/// nobody reads protects nothing.
#[test]
fn every_recording_is_checked() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let want = [
        "get_replica_list.bin",
        "heartbeat.bin",
        "hello.bin",
        "put_end.bin",
        "put_start.bin",
        "read.bin",
        "register_client.bin",
        "write.bin",
    ];
    assert_eq!(names, want);
    assert_eq!(Opcode::Hello as u16, 1, "the handshake opcode never moves");
}
