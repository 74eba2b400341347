//! Writes the seed corpus: valid inputs for every fuzz target, under
//! `fuzz/corpus/<target>/seed-*` (run from anywhere in the repository:
//! `cargo run -p kvpool-fuzz --example seeds`). Seeds are rewritten in
//! place; inputs libFuzzer found (named by hash) are left alone.

use std::path::{Path, PathBuf};

use kvpool_format::header::{value_checksum, ObjectHeader};
use kvpool_format::superblock::{write_superblock, DATA_BASE, SUPERBLOCK_LEN};
use kvpool_fuzz::message_selector;
use kvpool_net::auth::{Credentials, Role};
use kvpool_proto::frame::{write_frame, FrameHeader};
use kvpool_proto::msg::*;
use kvpool_proto::Rpc;
use kvpool_proto::{Code, Opcode};
use rbg::runtime::control::{Request, Response};
use rbg::runtime::images::ImageMap;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let corpus = root.join("fuzz/corpus");
    let mut w = Writer { corpus, count: 0 };
    messages(&mut w);
    frames(&mut w);
    format(&mut w);
    texts(&mut w);
    http(&mut w);
    rbg_specs(&mut w, &root);
    println!("wrote {} seeds", w.count);
}

/// Writes seed files, counting them.
struct Writer {
    corpus: PathBuf,
    count: usize,
}

impl Writer {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.corpus.join(target);
        std::fs::create_dir_all(&dir).expect("corpus directory");
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed file");
        self.count += 1;
    }
}

const ID: ClientId = ClientId(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
const SEG: SegmentId = SegmentId(0xfedc_ba98_7654_3210_fedc_ba98_7654_3210);

fn info() -> SegmentInfo {
    SegmentInfo {
        id: SEG,
        name: "store-1".into(),
        endpoint: "127.0.0.1:7000".into(),
        base: DATA_BASE,
        size: 64 << 20,
        path: Some("/dev/shm/kvpool/seg-1".into()),
        tier: Default::default(),
    }
}

fn replica() -> Replica {
    Replica {
        segment: SEG,
        endpoint: "[::1]:7000".into(),
        offset: 4096,
        len: 4224,
        cap: Some(CAP),
        tier: Default::default(),
        fence: 0x9e37_79b9_7f4a_7c15,
    }
}

/// A capability as a secured master signs it (the MAC is arbitrary here).
const CAP: Capability = Capability {
    expires_ms: 1_800_000_000_000,
    access: Capability::READ | Capability::WRITE,
    mac: [0x5c; 16],
};

fn grant() -> Grant {
    Grant {
        offset: 8192,
        len: 4224,
        generation: 42,
        fence: 0x9e37_79b9_7f4a_7c15,
        cap: Some(CAP),
    }
}

fn keys() -> Vec<String> {
    vec!["prefix/layer-0/block-7".into(), "k".into(), "ключ".into()]
}

/// A typical request and response of `op`, encoded.
fn sample(op: Opcode) -> (Vec<u8>, Vec<u8>) {
    fn both<T: Rpc>(req: T, resp: T::Response) -> (Vec<u8>, Vec<u8>) {
        (encode(&req), encode(&resp))
    }
    let code = Code::ObjectNotFound.as_i32();
    match op {
        Opcode::Hello => both(
            Hello {
                version: 3,
                min_version: 3,
                role: "client".into(),
                nonce: [7; 16],
            },
            HelloReply {
                version: 3,
                server: "master".into(),
                challenge: Some(Challenge {
                    nonce: [9; 16],
                    max_role: 3,
                }),
            },
        ),
        Opcode::Auth => both(
            Auth {
                role: 2,
                proof: [0xab; 32],
            },
            AuthReply { proof: [0xcd; 32] },
        ),
        Opcode::Write => both(
            WriteReq {
                segment: SEG,
                offset: 8192,
                grant: grant(),
            },
            (),
        ),
        Opcode::Read => both(
            ReadReq {
                segment: SEG,
                offset: 8192,
                len: 4096,
                grant: Some(grant()),
            },
            (),
        ),
        Opcode::Invalidate => both(
            InvalidateReq {
                segment: SEG,
                fence: 1,
                regions: vec![(4096, 1), (8192, u64::MAX)],
            },
            2,
        ),
        Opcode::TierMove => both(
            TierMoveReq {
                moves: vec![TierMove {
                    from: SEG,
                    from_offset: 4096,
                    len: 5000,
                    to: SegmentId(2),
                    to_offset: 8192,
                    generation: 7,
                    fence: 0x9e37_79b9_7f4a_7c15,
                }],
            },
            vec![0, -704],
        ),
        Opcode::TierMoveCancel => both(
            TierMoveCancel {
                requests: vec![RequestId(0x5eed), RequestId(u64::MAX)],
            },
            (),
        ),
        Opcode::RegisterClient => both(
            RegisterClient {
                client_id: ID,
                hostname: "node-1".into(),
            },
            RegisterReply {
                heartbeat_interval_ms: 1000,
                client_ttl_ms: 10_000,
            },
        ),
        Opcode::Heartbeat => both(
            Heartbeat {
                client_id: ID,
                io: vec![io()],
                held: vec![(SEG, 8192, 4224)],
            },
            HeartbeatReply { known: true },
        ),
        Opcode::MountSegment => both(
            MountSegment {
                client_id: ID,
                segment: info(),
                objects: 3,
                scan_age_ms: 12,
                possession: [5; 16],
                fence: 0x9e37_79b9_7f4a_7c15,
                held: vec![(8192, 4224)],
            },
            (),
        ),
        Opcode::UnmountSegment => both(
            UnmountSegment {
                client_id: ID,
                segment: SEG,
            },
            (),
        ),
        Opcode::ReportObjects => both(
            ReportObjects {
                client_id: ID,
                segment: SEG,
                objects: keys()
                    .into_iter()
                    .enumerate()
                    .map(|(i, key)| InventoryItem {
                        key,
                        generation: 1 << 40,
                        value_len: 100,
                        offset: 4096 + 4096 * i as u64,
                        region_len: 192,
                    })
                    .collect(),
                last: true,
            },
            InventoryVerdict {
                accepted: 2,
                rejected: vec![(8192, 1 << 40)],
            },
        ),
        Opcode::DrainSegment => both(
            DrainSegment {
                segment: "store-1".into(),
                unmount_after_ms: Some(30_000),
            },
            vec![SEG],
        ),
        Opcode::DrainOwn => both(
            DrainOwn {
                segment: SEG,
                possession: [7; 16],
            },
            (),
        ),
        Opcode::PutStart => both(
            PutStart {
                client_id: ID,
                op: 1,
                items: keys()
                    .into_iter()
                    .map(|key| PutItem {
                        key,
                        value_len: 4096,
                        region_len: 4160,
                    })
                    .collect(),
                config: ReplicateConfig {
                    replica_num: 2,
                    with_soft_pin: true,
                    soft_pin_ttl_ms: Some(60_000),
                    with_hard_pin: false,
                    preferred_segments: vec!["store-1".into()],
                },
                upsert: false,
            },
            vec![
                Ok(PutGrant::Write {
                    generation: 9,
                    replicas: vec![replica(), replica()],
                }),
                Ok(PutGrant::Exists),
                Err(Code::NoAvailableHandle.as_i32()),
            ],
        ),
        Opcode::PutEnd => both(
            PutEnd {
                client_id: ID,
                items: keys()
                    .into_iter()
                    .map(|key| PutEndItem { key, generation: 9 })
                    .collect(),
            },
            vec![Ok(()), Err(code)],
        ),
        Opcode::PutRevoke => both(
            PutRevoke {
                client_id: ID,
                keys: keys(),
            },
            vec![Ok(()), Err(code)],
        ),
        Opcode::PutCancel => both(
            PutCancel {
                client_id: ID,
                ops: vec![0x5eed_0001, u64::MAX],
            },
            2,
        ),
        Opcode::GetReplicaList => both(
            GetReplicaList { keys: keys() },
            vec![
                Ok(ObjectLocation {
                    value_len: 4096,
                    generation: 9,
                    lease_ms: 10_000,
                    replicas: vec![replica()],
                }),
                Err(code),
            ],
        ),
        Opcode::Exist => both(Exist { keys: keys() }, vec![Ok(4096), Err(code)]),
        Opcode::ExistLeased => both(ExistLeased { keys: keys() }, vec![Ok(4096), Err(code)]),
        Opcode::ListKeys => both(
            ListKeys {
                prefix: "prefix/".into(),
                cursor: 7u64.to_le_bytes().to_vec(),
                limit: 500,
            },
            KeyPage {
                keys: keys().into_iter().map(|k| (k, 4096)).collect(),
                cursor: (1u64 << 32 | 9).to_le_bytes().to_vec(),
            },
        ),
        Opcode::Remove => both(
            Remove {
                keys: keys(),
                force: true,
            },
            vec![Ok(()), Err(code)],
        ),
        Opcode::Touch => both(
            Touch {
                items: keys()
                    .into_iter()
                    .map(|key| TouchItem {
                        key,
                        generation: 9,
                        age_us: 1500,
                    })
                    .collect(),
            },
            vec![true, false],
        ),
        Opcode::RemoveByRegex => both(
            RemoveByRegex {
                pattern: "^prefix/.*-[0-9]+$".into(),
                force: false,
            },
            7,
        ),
        Opcode::RemoveAll => both(RemoveAll { force: true }, 42),
        Opcode::Status => both(
            Status {},
            ClusterStatus {
                role: "leader".into(),
                segments: vec![SegmentStatus {
                    info: info(),
                    used: 1 << 20,
                    regions: 12,
                    state: "live".into(),
                    io: Some(io()),
                }],
                keys: 12,
                pending: 1,
                capacity: 64 << 20,
                used: 1 << 20,
                clients: 2,
                evictions: 0,
                demotions: 3,
                promotions: 1,
                replicas_lost: 0,
            },
        ),
        Opcode::StoreAbout => both(
            StoreAbout {},
            StoreAboutReply {
                master: "127.0.0.1:50051".into(),
                segments: vec![info()],
            },
        ),
        Opcode::ReplicaAdd => both(
            ReplicaAdd {
                client_id: ID,
                key: "prefix/layer-0/block-7".into(),
                targets: vec!["a".into(), "b".into()],
            },
            ReplicaPlan {
                value_len: 4096,
                generation: 9,
                lease_ms: 10_000,
                sources: vec![replica()],
                targets: vec![Ok(Some(replica())), Ok(None), Err(code)],
            },
        ),
        Opcode::ReplicaCommit => both(
            ReplicaCommit {
                client_id: ID,
                key: "k".into(),
                generation: 9,
                written: vec![SEG],
                failed: vec![],
                drop: vec![SEG],
            },
            (),
        ),
        Opcode::ReplicaClear => both(
            ReplicaClear {
                keys: keys(),
                segment: Some("a".into()),
            },
            vec![true, false],
        ),
        Opcode::TaskCreate => both(
            TaskCreate {
                client_id: ID,
                kind: 1,
                key: "k".into(),
                source: "a".into(),
                targets: vec!["b".into()],
            },
            u128::MAX - 7,
        ),
        Opcode::TaskUpdate => both(
            TaskUpdate {
                client_id: ID,
                id: 7,
                status: 3,
                message: "done".into(),
            },
            (),
        ),
        Opcode::TaskQuery => both(
            TaskQuery { id: 7 },
            TaskInfo {
                id: 7,
                kind: 0,
                status: 1,
                created_ms: 1_800_000_000_000,
                updated_ms: 1_800_000_000_100,
                assigned_client: ID,
                message: String::new(),
            },
        ),
        Opcode::EngineWrite => both(
            EngineWriteReq {
                addr: 0x7f12_3456_0000,
                len: 4096,
            },
            (),
        ),
        Opcode::EngineRead => both(
            EngineReadReq {
                addr: 0x7f12_3456_0000,
                len: 4096,
            },
            (),
        ),
        Opcode::EngineNotify => both(
            EngineNotifyReq {
                name: "prefill-0".into(),
                msg: "req-42 done".into(),
            },
            (),
        ),
        Opcode::EngineAbout => both(
            EngineAbout {},
            EngineAboutReply {
                first_buffer: Some(0x7f12_3456_0000),
            },
        ),
        Opcode::EngineWriteFrom => both(
            EngineWriteFromReq {
                addr: 0x7f12_3456_0000,
                len: 4096,
                caller_addr: 0x7f00_0000_1000,
            },
            (),
        ),
        Opcode::EngineReadInto => both(
            EngineReadIntoReq {
                addr: 0x7f12_3456_0000,
                len: 4096,
                caller_addr: 0x7f00_0000_1000,
            },
            (),
        ),
    }
}

/// A disk segment's I/O as a store reports it.
fn io() -> SegmentIo {
    SegmentIo {
        segment: SEG,
        read_ops: 10,
        read_bytes: 40960,
        read_us: 900,
        write_ops: 2,
        write_bytes: 8192,
        write_us: 300,
        errors: 0,
    }
}

/// Every request and response type, behind its selector byte.
fn messages(w: &mut Writer) {
    for &op in Opcode::ALL {
        let (req, resp) = sample(op);
        let name = op.name();
        let sel = message_selector(op, false);
        w.put("message", name, &[&[sel], &req[..]].concat());
        let sel = message_selector(op, true);
        w.put(
            "message",
            &format!("{name}-reply"),
            &[&[sel], &resp[..]].concat(),
        );
    }
}

/// Request/response exchanges per opcode, and a stream with an error answer.
fn frames(w: &mut Writer) {
    let mut all = vec![0u8];
    for (i, &op) in Opcode::ALL.iter().enumerate() {
        let (req, resp) = sample(op);
        let payload: &[u8] = if op == Opcode::Write {
            b"value bytes"
        } else {
            b""
        };
        let h = FrameHeader::request(op, i as u64, req.len() as u32, payload.len() as u64);
        let mut out = vec![0u8];
        write_frame(&mut out, &h, &req, payload);
        let back: &[u8] = if op == Opcode::Read {
            b"read bytes"
        } else {
            b""
        };
        let r = FrameHeader::response(&h, 0, resp.len() as u32, back.len() as u64);
        write_frame(&mut out, &r, &resp, back);
        w.put("frame", op.name(), &out);
        all.extend_from_slice(&out[1..]);
    }
    w.put("frame", "all", &all);
    let (req, _) = sample(Opcode::GetReplicaList);
    let h = FrameHeader::request(Opcode::GetReplicaList, 1, req.len() as u32, 0);
    let msg = b"malformed message: unexpected end";
    let r = FrameHeader::response(&h, Code::InvalidParams.as_i32(), msg.len() as u32, 0);
    let mut out = vec![1u8];
    write_frame(&mut out, &h, &req, &[]);
    write_frame(&mut out, &r, msg, &[]);
    // A partial frame at the end, as a read may leave it.
    out.extend_from_slice(&h.encode()[..20]);
    w.put("frame", "error-and-partial", &out);
}

/// `key` with `value` as a client writes it into a region.
fn object(key: &str, generation: u64, value: &[u8]) -> Vec<u8> {
    let mut b = ObjectHeader {
        key: key.into(),
        value_len: value.len() as u64,
        generation,
        checksum: value_checksum(&[value]),
    }
    .encode();
    b.extend_from_slice(value);
    b
}

/// Places objects at 64-byte aligned offsets from `at`; a region is left
/// free between objects, and the last one is torn.
fn objects(image: &mut Vec<u8>, at: usize) {
    let list: [(&str, u64, Vec<u8>); 4] = [
        ("a", 1, vec![1; 100]),
        ("prefix/layer-0/block-7", 2, (0..=255).collect()),
        ("", 3, Vec::new()),
        ("torn", 4, vec![4; 300]),
    ];
    let mut off = at;
    for (i, (key, gen, value)) in list.iter().enumerate() {
        let o = object(key, *gen, value);
        image.resize(off + o.len(), 0);
        image[off..].copy_from_slice(&o);
        if i == list.len() - 1 {
            image[off + o.len() - 10] ^= 0xff;
        }
        off = (off + o.len()).div_ceil(64) * 64 + 64;
    }
    image.resize(off, 0);
}

fn format(w: &mut Writer) {
    for (name, key, value) in [
        ("short", "k", &b"v"[..]),
        ("empty-key", "", &b""[..]),
        ("long-key", &"x".repeat(300)[..], &b"value"[..]),
    ] {
        w.put("object_header", name, &object(key, 77, value));
    }
    let mut sb = vec![0u8; SUPERBLOCK_LEN];
    write_superblock(&mut sb, SegmentId(42), 1 << 20, [7; 16]);
    w.put("superblock", "format-2", &sb);
    let mut own = vec![0u8; SUPERBLOCK_LEN];
    write_superblock(&mut own, SegmentId(43), SUPERBLOCK_LEN as u64, [8; 16]);
    w.put("superblock", "format-2-own-size", &own);
    // Format 1, as written before the possession secret existed.
    let mut v1 = sb[..56].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let c = xxhash_rust::xxh3::xxh3_64(&v1[..48]);
    v1[48..56].copy_from_slice(&c.to_le_bytes());
    w.put("superblock", "format-1", &v1);

    let mut bare = Vec::new();
    objects(&mut bare, 0);
    w.put("segment", "objects", &[&[0u8], &bare[..]].concat());
    let mut file = vec![0u8; DATA_BASE as usize];
    objects(&mut file, DATA_BASE as usize);
    let size = file.len() as u64;
    write_superblock(&mut file[..DATA_BASE as usize], SEG, size, [3; 16]);
    w.put("segment", "segment-file", &[&[0x80u8], &file[..]].concat());
}

fn texts(w: &mut Writer) {
    let admin = Credentials::parse("a cluster secret long enough").expect("secret");
    let store = admin.derive(Role::Store).expect("store key");
    let texts = [
        ("size", "4GiB".to_string()),
        ("size-mb", "16MB".into()),
        ("size-frac", "1.5k".into()),
        ("size-bytes", "1073741824".into()),
        ("duration", "10s".into()),
        ("duration-ms", "500ms".into()),
        ("duration-frac", "2.5".into()),
        ("endpoint", "127.0.0.1:9000".into()),
        ("endpoint-v6", "[::1]:65535".into()),
        ("endpoint-name", "store-3.example.com:1".into()),
        ("key", "prefix/layer-0/block-7".into()),
        ("secret", "a cluster secret long enough".into()),
        ("role-key", store.encode()),
    ];
    for (name, t) in texts {
        w.put("validators", name, t.as_bytes());
    }
}

fn http(w: &mut Writer) {
    let lines: [(&str, &str); 5] = [
        (
            "put-get-delete",
            "PUT /metadata?key=a hello\nGET /metadata?key=a\nDELETE /metadata?key=a\nGET /metadata?key=a\n",
        ),
        (
            "limits",
            "PUT /metadata?key=k1 v\nPOST /metadata?key=k2 v\nPUT /metadata?key=k3 v\nPUT /metadata?key=k4 v\nPUT /metadata?key=k5 v\nPUT /metadata?key=k1 0123456789012345678901234567890123456789012345678901234567890123456789\n",
        ),
        (
            "admin",
            "GET /api/keys/some%2Fkey\nGET /api/status\nGET /api/segments\nGET /metrics\nGET /health\nGET /\n",
        ),
        (
            "methods",
            "PATCH /metadata?key=a x\nPOST /metadata?key=b%20c y z\nHEAD /metadata?key=b%20c\nGET /metadata\nGET /metadata?key=a&key=b\n",
        ),
        (
            "absolute",
            "PUT http://127.0.0.1:8080/metadata?key=mooncake%2Fram%2Fnode-1 {\"segment\":1}\nGET http://127.0.0.1:8080/metadata?key=mooncake%2Fram%2Fnode-1\n",
        ),
    ];
    for (name, t) in lines {
        w.put("http", name, t.as_bytes());
    }
}

/// More of the spec than the deploy examples use: rollout strategy,
/// volumes, restart policy, field refs, patches that delete.
const FEATURES: &str = r#"apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: feat, namespace: ml}
spec:
  roleTemplates:
  - name: base
    template:
      metadata:
        labels: {tier: gpu}
        annotations: {note: "x"}
      spec:
        restartPolicy: Always
        terminationGracePeriodSeconds: 5
        containers:
        - name: main
          image: engine:v1
          command: [serve, --data=/data/sub, --peer=$(PEER)]
          workingDir: /data
          env:
          - {name: PEER, value: feat-a-0.s-feat-a.ml.svc:80}
          - name: TIER
            valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}
          - name: NAME
            valueFrom: {fieldRef: {fieldPath: metadata.name}}
          ports: [{name: http, containerPort: 80}, {containerPort: 81}]
          volumeMounts: [{name: data, mountPath: /data, subPath: sub}]
        - name: side
          image: side:v1
          command: [sleep, "1"]
        volumes:
        - {name: data, emptyDir: {}}
  roles:
  - name: a
    replicas: 3
    restartPolicy: RecreateRoleInstanceOnPodRestart
    rolloutStrategy:
      rollingUpdate: {maxUnavailable: "34%", maxSurge: 1, partition: 1}
    templateRef: {name: base}
    templatePatch:
      spec:
        containers:
        - {name: side, $patch: delete}
  - name: b
    replicas: 0
    dependencies: [a]
    restartPolicy: RecreateRBGOnPodRestart
    templateRef: {name: base}
  coordination:
  - name: ab
    roles: [a, b]
    strategy:
      scaling: {maxSkew: 1, progression: OrderScheduled}
"#;

const BASE: &str = "apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: g}
spec:
  roles:
  - name: a
    replicas: 2
    template: {spec: {containers: [{name: c, command: [x]}]}}
";

fn rbg_specs(w: &mut Writer, root: &Path) {
    let mut specs = vec![("base".to_string(), BASE.to_string())];
    specs.push(("features".into(), FEATURES.into()));
    for name in ["kvpool-cache", "pd-router"] {
        let path = root.join(format!("deploy/{name}.yaml"));
        let text = std::fs::read_to_string(&path).expect("deploy example");
        specs.push((name.into(), text));
    }
    // Upstream-style multi-document files of both API versions.
    for version in ["v1alpha1", "v1alpha2"] {
        let dir = root.join("deploy/examples").join(version);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("deploy/examples")
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        for path in files {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            let text = std::fs::read_to_string(&path).expect("example");
            let name = format!("{version}-{}", stem.unwrap_or_default());
            match rbg::spec::load_all(&text) {
                Ok(_) => w.put("rbg_spec", &name, text.as_bytes()),
                Err(e) => panic!("seed file {name} does not load: {e}"),
            }
        }
    }
    for (name, text) in &specs {
        match rbg::spec::load(text) {
            Ok(_) => w.put("rbg_spec", name, text.as_bytes()),
            Err(e) => panic!("seed spec {name} does not load: {e}"),
        }
    }
    let images_path = root.join("deploy/images.yaml");
    let text = std::fs::read_to_string(&images_path).expect("image map");
    let images = ImageMap::parse(&text, Path::new("/opt/kvpool"), &images_path).expect("map");
    let requests = [
        ("status", Request::Status),
        ("history", Request::History),
        ("down", Request::Down),
        ("undo", Request::Undo { to: Some(3) }),
        (
            "apply",
            Request::Apply {
                spec: specs[1].1.clone(),
                images: Some(images),
            },
        ),
    ];
    for (name, req) in requests {
        let line = serde_json::to_vec(&req).expect("request JSON");
        w.put("rbg_control", name, &line);
    }
    let responses = [
        (
            "error",
            Response::Error {
                message: "no".into(),
            },
        ),
        ("stopped", Response::Stopped),
        (
            "applied",
            Response::Applied {
                generation: 2,
                changed: vec!["a: 1f2e -> 3c4d".into()],
                unimplemented: vec!["spec.x: not implemented".into()],
            },
        ),
    ];
    for (name, resp) in responses {
        let line = serde_json::to_vec(&resp).expect("response JSON");
        w.put("rbg_control", &format!("reply-{name}"), &line);
    }
}
