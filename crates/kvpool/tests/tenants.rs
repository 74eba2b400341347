//! Tenants against the real master and stores: a tenant's key reaches only
//! its own namespace (attack 3 of the tenancy issue: "read, overwrite,
//! force-remove and ReplicaClear any key it can name"), reads a namespace
//! an admin marked shared without writing it, and is held to its quota
//! (attack 4's "lock others out" per tenant), also after a master restart
//! rebuilt the index from the stores.

mod common;

use std::time::Duration;

use common::{http_get, master_link_as, run_kvpool, Cluster};
use kvpool_client::{Client, ReplicateConfig};
use kvpool_net::auth::{Credentials, Role, Security};
use kvpool_net::{FramedConn, MasterLink};
use kvpool_proto::msg;
use kvpool_proto::tenant::scoped;
use kvpool_proto::Code;

/// A client of `cluster` proving `key`.
async fn client_as(cluster: &Cluster, key: Credentials) -> Client {
    cluster
        .client_with(|c| c.security.credentials = Some(key))
        .await
}

/// A raw link to the master proving `key`, registered.
async fn link_as(cluster: &Cluster, key: Credentials) -> std::sync::Arc<MasterLink> {
    let link = master_link_as(&cluster.master_addr, "tenant", Some(key));
    link.register().await.expect("register");
    link
}

/// The master's `/metrics` page.
async fn metrics(cluster: &Cluster) -> String {
    let (status, body) = http_get(&cluster.metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    body
}

/// Puts `value` under `{prefix}0..n` through `client`, every one of which
/// must go through (a tenant not held back by another's quota).
async fn puts_go_through(
    client: &Client,
    prefix: &str,
    n: usize,
    value: &[u8],
    cfg: &ReplicateConfig,
) {
    for i in 0..n {
        let key = format!("{prefix}{i}");
        (client.put(&key, value, cfg).await).unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}

/// The value `who` stores under `key`.
fn value(who: &str, key: &str) -> Vec<u8> {
    common::value_for(&format!("{who}/{key}"), 4096)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reaches_only_its_own_namespace() {
    let cluster = Cluster::builder()
        .secured()
        .master_flag("--shared-tenant", "base")
        .start()
        .await;
    let admin = cluster.secrets.as_ref().expect("secured").admin.clone();
    let tenant = |name: &str| admin.for_tenant(name).expect("tenant key");
    let acme = client_as(&cluster, tenant("acme")).await;
    let evil = client_as(&cluster, tenant("evil")).await;
    let base = client_as(&cluster, tenant("base")).await;
    let plain = cluster.client().await;
    let cfg = ReplicateConfig::default();

    // The same key names in three namespaces are three objects.
    let keys: Vec<String> = (0..16).map(|i| format!("page-{i}")).collect();
    for k in &keys {
        acme.put(k, &value("acme", k), &cfg)
            .await
            .expect("acme put");
        plain
            .put(k, &value("plain", k), &cfg)
            .await
            .expect("plain put");
    }
    base.put("system", &value("base", "system"), &cfg)
        .await
        .expect("base put");
    for k in &keys {
        assert_eq!(acme.get(k).await.expect("acme get"), value("acme", k));
        assert_eq!(plain.get(k).await.expect("plain get"), value("plain", k));
        let e = evil
            .get(k)
            .await
            .expect_err("evil sees acme's or plain's page");
        assert_eq!(e.code, Code::ObjectNotFound, "{e}");
    }

    // A listing sees the caller's own namespace only, without its prefix;
    // a prefix naming another namespace finds nothing.
    let listed = |c: &Client, prefix: &str| {
        let (c, prefix) = (c.clone(), prefix.to_string());
        async move {
            let (mut all, mut cursor) = (Vec::new(), Vec::new());
            loop {
                let page = c.list_keys(&prefix, &cursor, 5).await.expect("list");
                assert!(page.keys.len() <= 5);
                all.extend(page.keys.into_iter().map(|(k, _)| k));
                if page.cursor.is_empty() {
                    all.sort();
                    return all;
                }
                cursor = page.cursor;
            }
        }
    };
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(listed(&acme, "page-").await, sorted);
    assert_eq!(listed(&plain, "page-").await, sorted);
    assert!(listed(&plain, "")
        .await
        .iter()
        .all(|k| !k.contains('\u{1}')));
    assert!(listed(&evil, "").await.is_empty());
    assert!(listed(&evil, &scoped(Some("acme"), "")).await.is_empty());

    // Naming another namespace outright: refused, for every call that
    // names keys, from another tenant and from the untenanted client key.
    let victim = scoped(Some("acme"), "page-3");
    let client_key = cluster.secrets.as_ref().expect("secured").key(Role::Client);
    for (who, key) in [("evil", tenant("evil")), ("client key", client_key)] {
        let link = link_as(&cluster, key).await;
        let id = link.client_id();
        let refusals = [
            (
                "read",
                link.call_once(&msg::GetReplicaList {
                    keys: vec![victim.clone()],
                })
                .await
                .err(),
            ),
            (
                "exist",
                link.call_once(&msg::Exist {
                    keys: vec![victim.clone()],
                })
                .await
                .err(),
            ),
            (
                "remove",
                link.call_once(&msg::Remove {
                    keys: vec![victim.clone()],
                    force: true,
                })
                .await
                .err(),
            ),
            (
                "replica clear",
                link.call_once(&msg::ReplicaClear {
                    keys: vec![victim.clone()],
                    segment: None,
                })
                .await
                .err(),
            ),
            (
                "overwrite",
                link.call_once(&msg::PutStart {
                    client_id: id,
                    op: 1,
                    items: vec![msg::PutItem {
                        key: victim.clone(),
                        value_len: 10,
                        region_len: 200,
                    }],
                    config: ReplicateConfig::default(),
                    upsert: true,
                })
                .await
                .err(),
            ),
            (
                "copy",
                link.call_once(&msg::TaskCreate {
                    client_id: id,
                    kind: 0,
                    key: victim.clone(),
                    source: String::new(),
                    targets: vec![Cluster::store_name(0)],
                })
                .await
                .err(),
            ),
        ];
        for (what, e) in refusals {
            let e = e.unwrap_or_else(|| panic!("{who}: {what} of acme's key was answered"));
            assert_eq!(e.code, Code::Unauthorized, "{who} {what}: {e}");
        }
    }
    // Through the client API too: an explicit namespace is left as named.
    let e = evil.remove(&victim, true).await.expect_err("evil removed");
    assert_eq!(e.code, Code::Unauthorized, "{e}");

    // The shared namespace: readable by every client, writable by its own.
    let system = scoped(Some("base"), "system");
    for (who, c) in [("acme", &acme), ("evil", &evil), ("plain", &plain)] {
        let got = c
            .get(&system)
            .await
            .unwrap_or_else(|e| panic!("{who}: {e}"));
        assert_eq!(got, value("base", "system"), "{who}");
        let e = (c.upsert(&system, b"poison", &cfg).await).expect_err("wrote a shared key");
        assert_eq!(e.code, Code::Unauthorized, "{who}: {e}");
        let e = c
            .remove(&system, true)
            .await
            .expect_err("removed a shared key");
        assert_eq!(e.code, Code::Unauthorized, "{who}: {e}");
    }

    // A tenant's status counts its own objects.
    assert_eq!(acme.status().await.expect("status").keys, keys.len() as u64);
    // Everything is where its owner put it; the admin sees every namespace.
    for k in &keys {
        assert_eq!(acme.get(k).await.expect("acme get"), value("acme", k));
        assert_eq!(plain.get(k).await.expect("plain get"), value("plain", k));
    }
    let as_admin = link_as(&cluster, admin.clone()).await;
    let sizes = as_admin
        .call_once(&msg::Exist {
            keys: vec![victim.clone(), system.clone()],
        })
        .await
        .expect("admin exist");
    let want = [value("acme", "page-3"), value("base", "system")].map(|v| Ok(v.len() as u64));
    assert_eq!(sizes, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_held_to_its_quota() {
    let mut cluster = Cluster::builder()
        .secured()
        .master_flag("--tenant-quota", "acme:objects=10,bytes=40KiB,clients=3")
        .start()
        .await;
    let admin = cluster.secrets.as_ref().expect("secured").admin.clone();
    let acme = client_as(&cluster, admin.for_tenant("acme").expect("key")).await;
    let other = client_as(&cluster, admin.for_tenant("other").expect("key")).await;
    let cfg = ReplicateConfig::default();
    let small = vec![1u8; 1024];
    for i in 0..10 {
        acme.put(&format!("k{i}"), &small, &cfg)
            .await
            .expect("within the quota");
    }
    let over = |r: kvpool_proto::KvResult<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.code, Code::QuotaExceeded, "{what}: {e}");
    };
    over(acme.put("k10", &small, &cfg).await, "an eleventh object");
    // Another tenant is not held back.
    puts_go_through(&other, "k", 20, &small, &cfg).await;
    // Room comes back with a removal; bytes count as well as objects.
    acme.remove("k0", true).await.expect("remove");
    over(
        acme.put("big", &vec![2u8; 32 << 10], &cfg).await,
        "past the byte quota",
    );
    acme.put("k10", &small, &cfg).await.expect("the freed slot");

    // Client ids: the client itself holds one of three.
    let key = admin.for_tenant("acme").expect("key");
    let _a = link_as(&cluster, key.clone()).await;
    let _b = link_as(&cluster, key.clone()).await;
    let link = master_link_as(&cluster.master_addr, "tenant", Some(key));
    let e = link.register().await.expect_err("a fourth client id");
    assert_eq!(e.code, Code::QuotaExceeded, "{e}");

    // Usage is visible in the metrics.
    let body = metrics(&cluster).await;
    for line in [
        "kvpool_tenant_objects{tenant=\"acme\"} 10",
        "kvpool_tenant_clients{tenant=\"acme\"} 3",
        "kvpool_tenant_objects{tenant=\"other\"} 20",
    ] {
        assert!(body.contains(line), "no {line:?} in the metrics");
    }
    assert!(
        body.contains("reason=\"tenant_quota\""),
        "quota refusals counted"
    );

    // After a master restart the index (and the usage) is rebuilt from the
    // stores: the quota still holds.
    cluster.kill9_master();
    cluster.restart_master().await;
    common::eventually("acme's objects back", Duration::from_secs(30), async || {
        (acme.status().await.ok()?.keys == 10).then_some(())
    })
    .await;
    over(
        acme.put("k11", &small, &cfg).await,
        "an eleventh object after the restart",
    );
    assert_eq!(acme.get("k10").await.expect("get"), small);
}

/// Hard pins (which eviction never frees) count against their tenant's
/// `pinned` quota over all its clients: past it a pinned put is refused
/// before anything is reserved, other tenants and unpinned puts go on, and
/// a removal gives the room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_hard_pins_are_held_to_its_quota() {
    let cluster = Cluster::builder()
        .secured()
        .master_flag("--tenant-quota", "acme:pinned=64KiB")
        .start()
        .await;
    let admin = cluster.secrets.as_ref().expect("secured").admin.clone();
    let acme = client_as(&cluster, admin.for_tenant("acme").expect("key")).await;
    let acme2 = client_as(&cluster, admin.for_tenant("acme").expect("key")).await;
    let other = client_as(&cluster, admin.for_tenant("other").expect("key")).await;
    let pinned = ReplicateConfig {
        with_hard_pin: true,
        ..ReplicateConfig::default()
    };
    // 16 KiB values take a little more than 16 KiB placed (the header):
    // three fit in 64 KiB, a fourth does not.
    let page = vec![7u8; 16 << 10];
    for i in 0..3 {
        acme.put(&format!("pin{i}"), &page, &pinned)
            .await
            .expect("within the pin quota");
    }
    for (who, c) in [("acme", &acme), ("acme's second client", &acme2)] {
        let e = c
            .put("pin3", &page, &pinned)
            .await
            .expect_err("past the pin quota");
        assert_eq!(e.code, Code::QuotaExceeded, "{who}: {e}");
    }
    acme.put("plain", &page, &ReplicateConfig::default())
        .await
        .expect("an unpinned put is not held back");
    puts_go_through(&other, "pin", 8, &page, &pinned).await;
    let body = metrics(&cluster).await;
    let acme_pins = body
        .lines()
        .find_map(|l| l.strip_prefix("kvpool_tenant_pinned_bytes{tenant=\"acme\"} "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("acme's pinned bytes in the metrics");
    assert!(
        (3 * (16 << 10)..=64 << 10).contains(&acme_pins),
        "{acme_pins}"
    );
    assert!(body.contains("reason=\"hard_pinned_bytes_tenant\""));
    acme.remove("pin0", true).await.expect("remove");
    acme2
        .put("pin3", &page, &pinned)
        .await
        .expect("the room a removal gave back");
}

/// Puts started and never ended (each holds its regions until it expires)
/// stop at the tenant's `puts` quota, over all its clients: past it a put
/// is refused before anything is reserved, other tenants go on, and a
/// revoke gives the room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_puts_in_flight_are_held_to_its_quota() {
    let cluster = Cluster::builder()
        .secured()
        .master_flag("--tenant-quota", "acme:puts=8")
        .start()
        .await;
    let admin = cluster.secrets.as_ref().expect("secured").admin.clone();
    let key = admin.for_tenant("acme").expect("key");
    let link = link_as(&cluster, key.clone()).await;
    let start = |op: u64, keys: std::ops::Range<u32>| msg::PutStart {
        client_id: link.client_id(),
        op,
        items: keys
            .map(|i| msg::PutItem {
                key: scoped(Some("acme"), &format!("held{i}")),
                value_len: 64,
                region_len: 4096,
            })
            .collect(),
        config: ReplicateConfig::default(),
        upsert: false,
    };
    let granted = link.call_once(&start(1, 0..10)).await.expect("put start");
    let codes: Vec<_> = (granted.iter())
        .map(|g| g.as_ref().err().map(|&c| Code::from_i32(c)))
        .collect();
    assert!(codes[..8].iter().all(Option::is_none), "{codes:?}");
    assert!(
        codes[8..].iter().all(|c| *c == Some(Code::QuotaExceeded)),
        "{codes:?}"
    );
    let acme2 = client_as(&cluster, key).await;
    let page = vec![3u8; 4096];
    let cfg = ReplicateConfig::default();
    let e = acme2
        .put("k", &page, &cfg)
        .await
        .expect_err("a ninth put in flight, from another client");
    assert_eq!(e.code, Code::QuotaExceeded, "{e}");
    let other = client_as(&cluster, admin.for_tenant("other").expect("key")).await;
    puts_go_through(&other, "k", 16, &page, &cfg).await;
    let body = metrics(&cluster).await;
    assert!(
        body.contains("kvpool_tenant_puts_in_flight{tenant=\"acme\"} 8"),
        "acme's puts in flight in the metrics"
    );
    let revoke = msg::PutRevoke {
        client_id: link.client_id(),
        keys: vec![scoped(Some("acme"), "held0")],
    };
    link.call_once(&revoke).await.expect("revoke");
    acme2
        .put("k", &page, &cfg)
        .await
        .expect("the room a revoke gave back");
    assert_eq!(acme2.get("k").await.expect("get"), page);
    // A committed put holds no room: the quota bounds puts in flight, not objects.
    acme2.put("k2", &page, &cfg).await.expect("after a commit");
    let body = metrics(&cluster).await;
    assert!(body.contains("kvpool_tenant_puts_in_flight{tenant=\"acme\"} 7"));
}

/// Connections are counted per identity: a tenant on a host whose address
/// holds its share of connections still gets in, and its own connections
/// stop at the same share, from any address, unless its quota sets
/// another (`connections`, lower or higher).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_has_its_own_share_of_connections() {
    const SHARE: usize = 48;
    let cluster = Cluster::builder()
        .secured()
        .master_flag("--max-connections-per-ip", &SHARE.to_string())
        .master_flag("--tenant-quota", "small:connections=5;big:connections=60")
        .start()
        .await;
    let s = cluster.secrets.as_ref().expect("secured");
    // An admitted connection answers a call; a refused one is closed
    // after its handshake.
    let open = async |key: &Credentials| {
        let security = Security::with_key(Some(key.clone()));
        let limits = kvpool_proto::frame::Limits::default();
        let addr = &cluster.master_addr;
        let mut conn = FramedConn::connect_with(addr, "flood", limits, &security)
            .await
            .ok()?;
        conn.call(&msg::Status {}).await.ok().map(|_| conn)
    };
    // The client key fills 127.0.0.1's share (the store holds some).
    let client = s.key(Role::Client);
    let mut held = Vec::new();
    while let Some(c) = open(&client).await {
        held.push(c);
        assert!(held.len() <= SHARE, "past the address's share");
    }
    // A tenant from the same address gets a share of its own.
    let acme = s.admin.for_tenant("acme").expect("key");
    let mut tenant = Vec::new();
    while let Some(c) = open(&acme).await {
        tenant.push(c);
        assert!(tenant.len() <= SHARE, "past the tenant's share");
    }
    assert_eq!(tenant.len(), SHARE);
    // Another tenant too, while the first holds all of its own.
    open(&s.admin.for_tenant("other").expect("key"))
        .await
        .expect("another tenant");
    // Tenants with a quota of their own get that many, fewer or more.
    for (name, quota) in [("small", 5), ("big", 60)] {
        let key = s.admin.for_tenant(name).expect("key");
        let mut theirs = Vec::new();
        while let Some(c) = open(&key).await {
            theirs.push(c);
            assert!(theirs.len() <= quota, "{name}: past its quota");
        }
        assert_eq!(theirs.len(), quota, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_keys_come_from_the_store_key_or_the_secret() {
    let cluster = Cluster::builder().secured().start().await;
    let s = cluster.secrets.as_ref().expect("secured");
    let derive = async |file: &std::path::Path| {
        let file = file.to_string_lossy();
        let args = [
            "secret",
            "derive",
            "--tenant",
            "acme",
            "--secret-file",
            &file,
        ];
        run_kvpool(&args, Duration::from_secs(10)).await
    };
    let out = derive(&s.store_file).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = Credentials::parse(&String::from_utf8_lossy(&out.stdout)).expect("a key");
    assert_eq!(key, s.admin.for_tenant("acme").expect("key"));
    assert_eq!(key.tenant(), Some("acme"));
    // The client key derives no tenant's key.
    let out = derive(&s.client_file).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("store key"));
    // The key works against the pool; a made-up one does not.
    let acme = client_as(&cluster, key).await;
    acme.put("k", b"v", &ReplicateConfig::default())
        .await
        .expect("put");
    let forged =
        Credentials::parse(&format!("kvpool-client@acme:{}", "ab".repeat(32))).expect("parses");
    let mut cfg = kvpool_client::ClientConfig::new(&cluster.master_addr);
    cfg.security = Security::with_key(Some(forged));
    let e = Client::connect(cfg)
        .await
        .err()
        .expect("a forged tenant key connected");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
}
