//! A client that dies in the middle of a put leaves nothing half-visible: the
//! object is never readable, and once the client's TTL runs out the master
//! revokes the put; its region is free again once a write granted on it can
//! no longer land (the put timeout, which these tests shorten to 3 s).

mod common;

use std::time::Duration;

use common::{random_bytes, Cluster, CLIENT_TTL, TTL_MARGIN};
use kvpool_client::{Client, ReplicateConfig};
use kvpool_format::{value_checksum, ObjectHeader};
use kvpool_net::{FramedConn, MasterLink};
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{self, ClusterStatus, PutGrant, PutItem, PutStart, Replica, WriteReq};
use kvpool_proto::Code;
use kvpool_transfer::data::{write_regions, WriteOp};
use rand::rngs::StdRng;
use rand::SeedableRng;

const VALUE_LEN: usize = 1 << 20;
/// How long a put may stay in flight, and a revoked one's region held.
const PUT_TIMEOUT: &str = "3s";

/// Waits until the master has no put in flight, and returns its status then.
async fn wait_no_pending(client: &Client) -> ClusterStatus {
    common::eventually("no put in flight", CLIENT_TTL + TTL_MARGIN, async || {
        let st = client.status().await.ok()?;
        (st.pending == 0).then_some(st)
    })
    .await
}

/// Starts a put of a new `key` as `link`'s client, as a client library
/// would before writing: the generation and the regions to write.
async fn start_put(
    link: &MasterLink,
    key: &str,
    value_len: u64,
    region_len: u64,
) -> (u64, Vec<Replica>) {
    let grants = link
        .call(&PutStart {
            client_id: link.client_id(),
            op: 1,
            items: vec![PutItem {
                key: key.into(),
                value_len,
                region_len,
            }],
            config: ReplicateConfig::default(),
            upsert: false,
        })
        .await
        .expect("PutStart");
    let grant = msg::from_wire(grants.into_iter().next().expect("one grant")).expect("granted");
    let PutGrant::Write {
        generation,
        replicas,
    } = grant
    else {
        panic!("a new key must get regions to write, got {grant:?}");
    };
    (generation, replicas)
}

/// Writes `parts` (the object of version `generation`) into `replica`'s
/// region over a connection of its own, as a client's data path would (an
/// unsigned grant: these pools have no secret); the store's answer.
async fn write_to(
    replica: &Replica,
    generation: u64,
    parts: &[&[u8]],
) -> kvpool_proto::KvResult<()> {
    let mut conn = FramedConn::connect(&replica.endpoint, "test", Limits::default())
        .await
        .expect("connect to the store");
    let op = WriteOp {
        req: WriteReq {
            segment: replica.segment,
            offset: replica.offset,
            grant: replica.grant(generation),
        },
        parts: parts.to_vec(),
    };
    let mut acks = write_regions(&mut conn, &[op])
        .await
        .expect("data connection");
    acks.remove(0)
}

/// Asserts that `key` is not visible to `client` in any way.
async fn assert_invisible(client: &Client, key: &str, when: &str) {
    let e = client
        .get(key)
        .await
        .expect_err("a half-written object must not be readable");
    assert_eq!(e.code, Code::ObjectNotFound, "{when}: get({key}) error");
    assert_eq!(Code::ObjectNotFound.as_i32(), -704);
    assert!(
        !client.exist(key).await.expect("exist"),
        "{when}: exist({key})"
    );
    let e = client
        .get_size(key)
        .await
        .expect_err("no size for a half-written object");
    assert_eq!(
        e.code,
        Code::ObjectNotFound,
        "{when}: get_size({key}) error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_abandoned_mid_write_is_invisible_then_revoked() {
    let mut cluster = Cluster::builder()
        .master_flag("--put-timeout", PUT_TIMEOUT)
        .start()
        .await;
    let observer = cluster.client().await;
    let before = observer.status().await.expect("status");
    assert_eq!(before.pending, 0);

    // The dying client: registered, but it never heartbeats.
    let link = cluster.master_link("dying-client");
    link.register().await.expect("register");
    let key = "client-death/torn";
    let value = random_bytes(&mut StdRng::seed_from_u64(7), VALUE_LEN);
    let header = ObjectHeader {
        key: key.into(),
        value_len: VALUE_LEN as u64,
        generation: 0,
        checksum: value_checksum(&[&value]),
    };
    let region_len = (header.encode().len() + VALUE_LEN) as u64;
    let (generation, replicas) = start_put(&link, key, VALUE_LEN as u64, region_len).await;
    assert_eq!(replicas.len(), 1);
    let head = ObjectHeader {
        generation,
        ..header
    }
    .encode();

    // Write the header and half of the value, then vanish: no PutEnd, no revoke.
    let ack = write_to(&replicas[0], generation, &[&head, &value[..VALUE_LEN / 2]]).await;
    assert!(ack.is_ok(), "half write refused: {ack:?}");
    drop(link);

    assert_invisible(&observer, key, "while the put is in flight").await;
    let mid = observer.status().await.expect("status");
    assert_eq!(mid.pending, 1, "the abandoned put is in flight");
    assert_eq!(mid.keys, before.keys, "an uncommitted put is not a key");
    assert!(
        mid.used >= before.used + region_len,
        "the put reserves its region"
    );
    assert_eq!(mid.clients, before.clients + 1);

    let after = wait_no_pending(&observer).await;
    assert!(
        after.used >= before.used + region_len,
        "the revoked put's region is held while a write granted on it may land"
    );
    common::eventually(
        "the revoked put's region to be free again",
        Duration::from_secs(10),
        async || {
            let st = observer.status().await.ok()?;
            (st.used == before.used).then_some(st)
        },
    )
    .await;
    assert_eq!(
        after.clients, before.clients,
        "the silent client was dropped"
    );
    assert_eq!(after.keys, before.keys);
    assert_invisible(&observer, key, "after the put was revoked").await;

    // The key is not stuck: another client can write it.
    observer
        .put(key, &value, &ReplicateConfig::default())
        .await
        .expect("put after revoke");
    assert!(
        observer.get(key).await.expect("get") == value,
        "the new value reads back"
    );
    cluster.assert_alive();
}

/// A client cut off after its put began (its link down, its process
/// paused) may deliver the object after the master gave the put up. The
/// store refuses it, so nothing is left for a scan to find: a master that
/// rebuilds from the stores (a restart, a new HA leader) must not bring back
/// a value that was never committed, or one removed since. The chaos
/// harness found such a value served again after a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_its_put_was_given_up_is_refused_and_never_comes_back() {
    let mut cluster = Cluster::builder()
        .master_flag("--put-timeout", PUT_TIMEOUT)
        .start()
        .await;
    let observer = cluster.client().await;
    let link = cluster.master_link("cut-off-client");
    link.register().await.expect("register");
    let key = "client-death/late";
    let value = random_bytes(&mut StdRng::seed_from_u64(8), 4096);
    let (generation, replicas) = start_put(&link, key, value.len() as u64, 8192).await;
    let head = ObjectHeader {
        key: key.into(),
        value_len: value.len() as u64,
        generation,
        checksum: value_checksum(&[&value]),
    }
    .encode();
    drop(link);
    // The master expires the silent client, gives its put up and sends the
    // store the region's invalidation, before any byte of it arrived.
    wait_no_pending(&observer).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let ack = write_to(&replicas[0], generation, &[&head, &value]).await;
    assert_eq!(
        ack.expect_err("a late write is refused").code,
        Code::TransferFail
    );

    cluster.kill9_master();
    cluster.restart_master().await;
    let fresh = cluster.client().await;
    common::eventually(
        "the store back in the pool",
        CLIENT_TTL + TTL_MARGIN,
        async || {
            let st = fresh.status().await.ok()?;
            (st.segments.len() == 1).then_some(())
        },
    )
    .await;
    assert_invisible(&fresh, key, "after the master rebuilt from the store").await;
    cluster.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_a_bench_mid_put_leaves_no_put_in_flight() {
    let mut cluster = Cluster::builder()
        .segment_size("256MiB")
        .master_flag("--put-timeout", PUT_TIMEOUT)
        .start()
        .await;
    let observer = cluster.client().await;
    let before = observer.status().await.expect("status");
    let mut bench = cluster.spawn(
        "bench",
        [
            "bench",
            "--master",
            &cluster.master_addr,
            "--ops",
            "put",
            "--sizes",
            "1MiB",
            "--duration",
            "30s",
            "--batch",
            "8",
            "--concurrency",
            "4",
        ],
    );
    common::eventually(
        "the bench to have committed objects and have puts in flight",
        Duration::from_secs(20),
        async || {
            assert!(
                bench.try_exit().is_none(),
                "the bench exited early\n{}",
                bench.logs()
            );
            // Frozen, the bench cannot finish its puts between this look
            // and the kill.
            bench.freeze(true);
            let st = observer.status().await.ok();
            if st.as_ref().is_some_and(|st| st.keys > 0 && st.pending > 0) {
                return Some(());
            }
            bench.freeze(false);
            None
        },
    )
    .await;
    let at_kill = observer.status().await.expect("status");
    bench.kill9();

    assert_eq!(
        at_kill.clients,
        before.clients + 1,
        "the bench's client is still registered"
    );
    assert!(
        at_kill.pending > 0,
        "puts of the killed bench are still in flight"
    );
    assert!(
        at_kill.keys > 0,
        "the bench committed some objects before it died"
    );

    let after = wait_no_pending(&observer).await;
    assert_eq!(
        after.clients, before.clients,
        "the killed bench's client was dropped"
    );
    // Every byte still reserved belongs to a committed object: removing them all empties the pool.
    let removed = observer.remove_all(true).await.expect("remove_all");
    assert!(removed > 0);
    common::eventually(
        "the pool to be empty",
        Duration::from_secs(10),
        async || {
            let st = observer.status().await.ok()?;
            (st.used == before.used && st.keys == 0).then_some(())
        },
    )
    .await;
    cluster.assert_alive();
}
