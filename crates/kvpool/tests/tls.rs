//! TLS on every plane, against the real binaries: a pool with a cluster
//! secret and TLS serves puts and gets (control, data and HTTP over TLS,
//! capabilities checked as without TLS); a plaintext peer, a peer of
//! another CA, and a store without a client certificate are turned away
//! with errors that say why; and masters elect a leader through etcd over
//! https with client certificates, which clients follow with `etcds://`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use kvpool_client::{Client, ClientConfig, ReplicateConfig};
use kvpool_net::auth::{Role, Security};
use kvpool_net::tls::TlsFiles;
use kvpool_net::{CallPolicy, FramedConn, MasterLink};
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::ClientId;
use kvpool_proto::Code;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Puts `n` objects of a few KiB with two replicas, reads them back
/// byte-exact, and returns their keys.
async fn round_trip(client: &Client, prefix: &str, n: usize) -> Vec<String> {
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}/{i}")).collect();
    let values: Vec<Vec<u8>> = keys.iter().map(|k| value_for(k, 64 << 10)).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .map(String::as_str)
        .zip(values.iter().map(Vec::as_slice))
        .collect();
    let cfg = ReplicateConfig {
        replica_num: 2.min(client.status().await.expect("status").segments.len() as u32),
        ..ReplicateConfig::default()
    };
    for (k, r) in keys
        .iter()
        .zip(client.batch_put_values(&items, &cfg, false).await)
    {
        r.unwrap_or_else(|e| panic!("put {k}: {e}"));
    }
    all_there(client, &keys).await;
    keys
}

/// Asserts every one of `keys` reads back byte-exact.
async fn all_there(client: &Client, keys: &[String]) {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (k, got) in keys.iter().zip(client.batch_get(&refs).await) {
        let got = got.unwrap_or_else(|e| panic!("get {k}: {e}"));
        assert!(got == value_for(k, 64 << 10), "{k}: wrong bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_a_secret_and_tls_serves_every_plane() {
    let cluster = Cluster::builder().secured().tls().stores(2).start().await;
    let client = cluster.client().await;
    round_trip(&client, "tls", 64).await;

    // The CLI over TLS with the client key.
    let pki = cluster.pki.as_ref().expect("tls");
    let secrets = cluster.secrets.as_ref().expect("secured");
    let client_key = secrets.client_file.to_string_lossy().into_owned();
    let mut args = vec!["status", "--master", &cluster.master_addr];
    args.extend(["--secret-file", &client_key]);
    let ca_flags = pki.flags(None);
    args.extend(ca_flags.iter().map(String::as_str));
    let out = run_kvpool(&args, Duration::from_secs(15)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("segments: 2"), "{stdout}{:?}", out.stderr);

    // The same command in plaintext is told to use TLS.
    let out = run_kvpool(&args[..5], Duration::from_secs(15)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("accepts TLS only"), "{stderr}");

    // Plaintext to a store's data port: refused the same way.
    let store = client.status().await.expect("status").segments[0]
        .info
        .endpoint
        .clone();
    let e = FramedConn::connect(&store, "plain", Limits::default())
        .await
        .err()
        .expect("a plaintext connection to a TLS store");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
    assert!(e.message.contains("accepts TLS only"), "{e}");

    // A CA of another cluster: the master's certificate does not verify.
    let other = Pki::create(&cluster.dir().join("other-pki"), &["x"]).await;
    let stranger = Security::new(Some(secrets.key(Role::Client)), false, &other.files(None))
        .expect("tls files");
    for addr in [&cluster.master_addr, &store] {
        let e = FramedConn::connect_with(addr, "stranger", Limits::default(), &stranger)
            .await
            .err()
            .expect("a peer of another CA");
        assert_eq!(e.code, Code::Unauthorized, "{e}");
        assert!(e.message.contains("TLS handshake"), "{e}");
    }

    // HTTP: https with the CA; the admin API still wants its token.
    let agent = https_agent(&pki.ca());
    let health = agent
        .get(&format!("https://{}/health", cluster.metrics_addr))
        .call()
        .expect("https /health");
    assert_eq!(health.status(), 200);
    let api = agent
        .get(&format!("https://{}/api/status", cluster.metrics_addr))
        .call();
    assert!(
        matches!(api, Err(ureq::Error::Status(401, _))),
        "the admin API over https without a token: {api:?}"
    );
    let token = secrets.admin.http_token();
    let api = agent
        .get(&format!("https://{}/api/status", cluster.metrics_addr))
        .set("Authorization", &format!("Bearer {token}"))
        .call()
        .expect("the admin API with the admin token");
    assert_eq!(api.status(), 200);
    // Plain HTTP on the https port gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(&cluster.metrics_addr)
        .await
        .expect("connect");
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut answer)).await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP answered on the https port"
    );
}

/// A ureq agent trusting `ca`.
fn https_agent(ca: &Path) -> ureq::Agent {
    let tls = TlsFiles {
        ca: Some(ca.to_path_buf()),
        ..TlsFiles::default()
    }
    .load()
    .expect("CA")
    .expect("tls");
    ureq::AgentBuilder::new()
        .tls_config(tls.client_config())
        .timeout(Duration::from_secs(10))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_and_admin_roles_need_a_client_certificate() {
    let cluster = Cluster::builder().secured().tls().start().await;
    let client = cluster.client().await;
    let kept = round_trip(&client, "kept", 16).await;
    let pki = cluster.pki.as_ref().expect("tls");
    let secrets = cluster.secrets.as_ref().expect("secured");

    // A stolen store key without a certificate proves only the client role:
    // it cannot lend a segment that would swallow everyone's puts.
    let link = MasterLink::new(
        &cluster.master_addr,
        ClientId(rand::random()),
        "thief",
        "thief",
        CallPolicy::default(),
        Security::new(Some(secrets.key(Role::Store)), false, &pki.files(None)).expect("tls"),
    )
    .expect("link");
    let fake = common::black_hole_mount(link.client_id());
    let e = link
        .call_once(&fake)
        .await
        .expect_err("mounted without a certificate");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
    assert!(e.message.contains("proved client"), "{e}");

    // An admin key without a certificate cannot drain; the CLI says why.
    let admin_key = secrets.admin_file.to_string_lossy().into_owned();
    let ca = pki.ca().to_string_lossy().into_owned();
    let drain = [
        "drain",
        "--master",
        &cluster.master_addr,
        "--segment",
        "store-0",
        "--grace",
        "0s",
        "--secret-file",
        &admin_key,
        "--tls-ca",
        &ca,
    ];
    let out = run_kvpool(&drain, Duration::from_secs(15)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "drained without a certificate");
    assert!(stderr.contains("needs a client certificate"), "{stderr}");
    assert!(stderr.contains("takes the admin key"), "{stderr}");

    // A store whose certificate comes from another CA fails the TLS
    // handshake with the master and exits saying so.
    let other = Pki::create(&cluster.dir().join("other-pki"), &["rogue"]).await;
    let flags = [
        "--secret-file".to_string(),
        secrets.store_file.to_string_lossy().into(),
        "--tls-ca".into(),
        ca.clone(),
        "--tls-cert".into(),
        other.dir.join("rogue.pem").to_string_lossy().into(),
        "--tls-key".into(),
        other.dir.join("rogue.key").to_string_lossy().into(),
    ];
    let mut rogue = spawn_store_with(
        Path::new(BIN),
        "rogue",
        "rogue",
        &cluster.master_addr,
        "32MiB",
        &cluster.dir().join("rogue"),
        &cluster.dir().join("logs"),
        &flags,
    );
    eventually(
        "the master to refuse the rogue store",
        STARTUP,
        async || {
            cluster
                .master_process_logs()
                .contains("TLS handshake failed")
                .then_some(())
        },
    )
    .await;
    rogue.kill9();

    // A store with no certificate at all cannot serve TLS: it refuses to start.
    let mut certless = spawn_store_with(
        Path::new(BIN),
        "certless",
        "certless",
        &cluster.master_addr,
        "32MiB",
        &cluster.dir().join("certless"),
        &cluster.dir().join("logs"),
        &[flags[0].clone(), flags[1].clone(), flags[2].clone(), ca],
    );
    assert!(!certless.wait_exit(STARTUP).await.success());
    assert!(
        certless.logs().contains("needs a certificate"),
        "{}",
        certless.logs()
    );

    // Nothing was mounted or drained, and nothing stored was touched.
    let st = client.status().await.expect("status");
    assert_eq!(st.segments.len(), 1, "{:?}", st.segments);
    assert_eq!(st.segments[0].state, "live", "{:?}", st.segments);
    all_there(&client, &kept).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_require_client_certificates_turn_away_the_rest() {
    let cluster = Cluster::builder()
        .tls()
        .master_flag("--tls-require-client-cert", "true")
        .start()
        .await;
    let pki = cluster.pki.as_ref().expect("tls");
    // With a certificate (and no secret at all: certificates authenticate).
    let mut cfg = ClientConfig::new(&cluster.master_addr);
    cfg.security = Security::new(None, false, &pki.files(Some("store"))).expect("tls");
    let client = Client::connect(cfg)
        .await
        .expect("a client with a certificate");
    let keys: Vec<String> = (0..8).map(|i| format!("mtls/{i}")).collect();
    for k in &keys {
        client
            .put(k, &value_for(k, 4096), &ReplicateConfig::default())
            .await
            .expect("put");
        assert_eq!(client.get(k).await.expect("get"), value_for(k, 4096));
    }
    // Without one: the master refuses at the handshake.
    let certless = Security::new(None, false, &pki.files(None)).expect("tls");
    let e = FramedConn::connect_with(
        &cluster.master_addr,
        "certless",
        Limits::default(),
        &certless,
    )
    .await
    .err()
    .expect("no certificate, required");
    assert!(matches!(e.code, Code::Unauthorized | Code::RpcFail), "{e}");
}

/// Starts etcd serving https on free ports with `pki`'s `etcd`
/// certificate, demanding client certificates of `pki`'s CA.
async fn spawn_etcd_tls(pki: &Pki, log_dir: &Path) -> (Process, String) {
    let (client, peer) = (free_port(), free_port());
    let data = log_dir.join(format!("etcd-{client}"));
    let endpoint = format!("127.0.0.1:{client}");
    let path = |f: &str| pki.dir.join(f).to_string_lossy().into_owned();
    let mut etcd = Process::spawn_bin(
        "etcd",
        Path::new("etcd"),
        [
            "--data-dir".to_string(),
            data.to_string_lossy().into_owned(),
            "--listen-client-urls".into(),
            format!("https://{endpoint}"),
            "--advertise-client-urls".into(),
            format!("https://{endpoint}"),
            "--listen-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
            "--cert-file".into(),
            path("etcd.pem"),
            "--key-file".into(),
            path("etcd.key"),
            "--trusted-ca-file".into(),
            path("ca.pem"),
            "--client-cert-auth".into(),
        ],
        log_dir,
    );
    let ep = endpoint.clone();
    eventually("etcd to listen with TLS", STARTUP, async || {
        assert!(etcd.try_exit().is_none(), "etcd exited:\n{}", etcd.logs());
        tokio::net::TcpStream::connect(&ep).await.ok().map(|_| ())
    })
    .await;
    (etcd, endpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_elect_a_leader_through_etcd_over_https() {
    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let pki = Pki::create(&dir.path().join("pki"), &["etcd", "master", "store"]).await;
    let (_etcd, endpoint) = spawn_etcd_tls(&pki, &logs).await;
    let https = format!("https://{endpoint}");
    let mut master_flags = pki.flags(Some("master"));
    let master = spawn_master("master", &logs, |rpc, metrics| {
        let mut args: Vec<String> = [
            "master",
            "--rpc-port",
            &rpc.to_string(),
            "--metrics-port",
            &metrics.to_string(),
            "--enable-ha",
            "--etcd-endpoints",
            &https,
            "--cluster-id",
            "tls-ha",
            "--ha-lease-ttl",
            "2s",
        ]
        .map(String::from)
        .to_vec();
        args.append(&mut master_flags.clone());
        args
    })
    .await;
    master_flags.clear();
    let pool = format!("etcds://{endpoint}/tls-ha");
    let _store = spawn_store_with(
        Path::new(BIN),
        "store",
        "store",
        &pool,
        "32MiB",
        &dir.path().join("store"),
        &logs,
        &pki.flags(Some("store")),
    );
    // Clients follow the leader through etcd over https (etcd wants a
    // client certificate, so this client shows the store's).
    let mut cfg = ClientConfig::new(&pool);
    cfg.security = Security::new(None, false, &pki.files(Some("store"))).expect("tls");
    let client = eventually("a client through etcds://", STARTUP, async || {
        let c = Client::connect(cfg.clone()).await.ok()?;
        let st = c.status().await.ok()?;
        (st.segments.len() == 1).then_some(c)
    })
    .await;
    round_trip_one(&client).await;
    drop(master);

    // Without the CA, an etcds:// address is refused up front.
    let e = Client::connect(ClientConfig::new(&pool))
        .await
        .err()
        .expect("etcds:// without a CA");
    assert!(e.message.contains("KVPOOL_ETCD_CA"), "{e}");
}

async fn round_trip_one(client: &Client) {
    let v = value_for("etcds/one", 8192);
    client
        .put("etcds/one", &v, &ReplicateConfig::default())
        .await
        .expect("put");
    assert_eq!(client.get("etcds/one").await.expect("get"), v);
}

/// A store with a certificate serves its `/metrics` over https only, with
/// the certificate of its data port: a scraper trusting the cluster's CA
/// reads it; plain HTTP gets no HTTP answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_tls_serves_its_metrics_over_https_only() {
    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let pki = Pki::create(&dir.path().join("pki"), &["master", "store"]).await;
    let master_tls = pki.flags(Some("master"));
    let mut master = spawn_master("master", &logs, |rpc, metrics| {
        let ports = ["--rpc-port", &rpc.to_string()].map(String::from);
        let metrics = ["--metrics-port", &metrics.to_string()].map(String::from);
        let mut args = vec!["master".to_string()];
        args.extend(ports.into_iter().chain(metrics).chain(master_tls.clone()));
        args
    })
    .await;
    let port = free_port();
    let mut extra = pki.flags(Some("store"));
    extra.extend(["--metrics-port".to_string(), port.to_string()]);
    let mut store = spawn_store_with(
        Path::new(BIN),
        "store",
        "store",
        &master.rpc,
        "32MiB",
        &dir.path().join("store"),
        &logs,
        &extra,
    );
    let status_flags = pki.flags(None);
    let mut watch = [&mut store, &mut master.process];
    wait_for_segments_as(&master.rpc, 1, &mut watch, &status_flags).await;
    let addr = format!("127.0.0.1:{port}");

    let agent = https_agent(&pki.ca());
    let url = format!("https://{addr}/metrics");
    let metrics = tokio::task::spawn_blocking(move || {
        let r = agent.get(&url).call().expect("https /metrics");
        assert_eq!(r.status(), 200);
        r.into_string().expect("a text body")
    })
    .await
    .expect("join");
    assert!(
        metrics.contains("kvpool_store_segments{tier=\"memory\"} 1"),
        "{metrics}"
    );

    // Plain HTTP on the https port gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut answer)).await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP answered on the store's https metrics port: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(store.try_exit().is_none(), "{}", store.logs());
}
