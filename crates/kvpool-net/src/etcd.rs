//! The few etcd v3 operations kvpool needs for master high availability:
//! leases, a create-if-absent transaction, and reading a key. They go through
//! etcd's JSON gateway (`POST /v3/...`), which every etcd 3.4+ serves on its
//! client port, so building kvpool needs no protobuf compiler (the gRPC client
//! crates generate code with `protoc` at build time).
//!
//! Master addresses of the form `etcd://host:port[;host:port...][/cluster]`
//! are resolved here: the leader publishes its RPC address under
//! [`leader_key`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use kvpool_proto::{Code, KvError, KvResult};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::Security;

/// Cluster id used when an `etcd://` address names none.
pub const DEFAULT_CLUSTER: &str = "kvpool";

/// The etcd key under which the leader of `cluster` publishes its address.
pub fn leader_key(cluster: &str) -> String {
    format!("/kvpool/{cluster}/master")
}

/// The etcd key under which the leader of `cluster` lists the segments that
/// may hold objects, for the next leader to expect back.
pub fn segments_key(cluster: &str) -> String {
    format!("/kvpool/{cluster}/segments")
}

/// The etcd key under which the leader of `cluster` keeps the removals
/// some store has not heard of, for the next leader to honour.
pub fn tombstones_key(cluster: &str) -> String {
    format!("/kvpool/{cluster}/tombstones")
}

/// How long a request waits on one endpoint before the next is asked too.
/// etcd answers in milliseconds; a member cut off from its quorum holds a
/// request until the timeout (3 s), longer than a 2 s leadership lease, so
/// waiting it out costs the leader its lease.
const NEXT_ENDPOINT_AFTER: Duration = Duration::from_millis(250);

/// A set of etcd endpoints: the one that answered last is asked first, and
/// the next ones too when it is slow or fails.
#[derive(Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    /// The endpoint that answered last.
    preferred: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

#[derive(Deserialize)]
struct RangeKv {
    value: Option<String>,
}

#[derive(Deserialize)]
struct RangeReply {
    kvs: Option<Vec<RangeKv>>,
}

#[derive(Deserialize)]
struct GrantReply {
    #[serde(rename = "ID")]
    id: Option<String>,
}

#[derive(Deserialize)]
struct KeepAliveResult {
    #[serde(rename = "TTL")]
    ttl: Option<String>,
}

#[derive(Deserialize)]
struct KeepAliveReply {
    result: Option<KeepAliveResult>,
}

#[derive(Deserialize)]
struct TxnReply {
    succeeded: Option<bool>,
}

fn etcd_error(msg: impl Into<String>) -> KvError {
    KvError::new(Code::EtcdOperationError, msg)
}

impl Etcd {
    /// Endpoints as `host:port` separated by `;` or `,`, plaintext unless
    /// written `https://host:port`; `tls` verifies `https://` endpoints
    /// (and gives the client certificate etcd may ask for).
    pub fn new(endpoints: &str, tls: Option<Arc<rustls::ClientConfig>>) -> KvResult<Etcd> {
        let endpoints: Vec<String> = endpoints
            .split([';', ','])
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                let e = e.trim_end_matches('/');
                if e.starts_with("http://") || e.starts_with("https://") {
                    e.to_string()
                } else {
                    format!("http://{e}")
                }
            })
            .collect();
        if endpoints.is_empty() {
            return Err(KvError::new(Code::InvalidParams, "no etcd endpoints given"));
        }
        let mut agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(1))
            .timeout(Duration::from_secs(3));
        if endpoints.iter().any(|e| e.starts_with("https://")) {
            let tls = tls.ok_or_else(|| {
                KvError::new(
                    Code::InvalidParams,
                    format!(
                        "https:// etcd endpoints need a CA bundle: set KVPOOL_ETCD_CA (or \
                         --tls-ca) [{}]",
                        endpoints.join(", ")
                    ),
                )
            })?;
            agent = agent.tls_config(tls);
        }
        Ok(Etcd {
            endpoints,
            agent: agent.build(),
            preferred: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// POSTs `body` to `path`: to the endpoint that answered last, then to
    /// the next one as soon as that fails or after [`NEXT_ENDPOINT_AFTER`]
    /// without an answer, and so on; the first answer wins. Every request
    /// kvpool makes may be sent twice: reads, keep-alives and revokes are
    /// idempotent, the writes are compare-and-set transactions, and a
    /// second lease granted is never kept alive, so it expires.
    async fn post<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        body: Value,
    ) -> KvResult<T> {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let (tx, mut rx) = tokio::sync::mpsc::channel(n);
        let mut last = String::new();
        let (mut asked, mut answered) = (0, 0);
        while answered < n {
            if asked < n {
                let i = (first + asked) % n;
                asked += 1;
                let (agent, tx) = (self.agent.clone(), tx.clone());
                let url = format!("{}{path}", self.endpoints[i]);
                let body = body.clone();
                tokio::task::spawn_blocking(move || {
                    let r = agent
                        .post(&url)
                        .send_json(body)
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.into_json::<T>().map_err(|e| e.to_string()))
                        .map_err(|e| format!("{url}: {e}"));
                    let _ = tx.try_send((i, r));
                });
            }
            let got = if asked < n {
                match tokio::time::timeout(NEXT_ENDPOINT_AFTER, rx.recv()).await {
                    Ok(got) => got,
                    Err(_) => continue,
                }
            } else {
                rx.recv().await
            };
            let Some((i, r)) = got else { break };
            answered += 1;
            match r {
                Ok(v) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) => last = e,
            }
        }
        Err(etcd_error(last))
    }

    /// The value of `key`, if set.
    pub async fn get(&self, key: &str) -> KvResult<Option<String>> {
        let r: RangeReply = self
            .post("/v3/kv/range", json!({ "key": B64.encode(key) }))
            .await?;
        let Some(v) = r
            .kvs
            .and_then(|kvs| kvs.into_iter().next())
            .and_then(|kv| kv.value)
        else {
            return Ok(None);
        };
        let bytes = B64
            .decode(v)
            .map_err(|e| etcd_error(format!("bad value of {key}: {e}")))?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| etcd_error(format!("value of {key} is not UTF-8")))
    }

    /// A lease of `ttl`; keys attached to it vanish when it is not kept alive.
    pub async fn grant(&self, ttl: Duration) -> KvResult<i64> {
        let r: GrantReply = self
            .post("/v3/lease/grant", json!({ "TTL": ttl.as_secs().max(1) }))
            .await?;
        r.id.and_then(|id| id.parse().ok())
            .ok_or_else(|| etcd_error("lease grant returned no id"))
    }

    /// Refreshes a lease; false once it has expired.
    pub async fn keep_alive(&self, lease: i64) -> KvResult<bool> {
        let r: KeepAliveReply = self
            .post("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))
            .await?;
        let ttl: i64 = r
            .result
            .and_then(|r| r.ttl)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        Ok(ttl > 0)
    }

    /// Ends a lease now (its keys vanish at once).
    pub async fn revoke(&self, lease: i64) -> KvResult<()> {
        let _: Value = self
            .post("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
            .await?;
        Ok(())
    }

    /// Sets `key` to `value` under `lease` only if the key does not exist;
    /// true if this call created it.
    pub async fn create(&self, key: &str, value: &str, lease: i64) -> KvResult<bool> {
        let k = B64.encode(key);
        let body = json!({
            "compare": [{ "target": "CREATE", "key": k, "create_revision": "0", "result": "EQUAL" }],
            "success": [{ "request_put": { "key": k, "value": B64.encode(value), "lease": lease.to_string() } }],
        });
        let r: TxnReply = self.post("/v3/kv/txn", body).await?;
        Ok(r.succeeded.unwrap_or(false))
    }

    /// Sets `key` to `value` (with no lease: it outlives the writer) only
    /// while `guard` is held under `lease`, as a leader writes what only the
    /// leader may; true if written.
    pub async fn put_if_held(
        &self,
        key: &str,
        value: &str,
        guard: &str,
        lease: i64,
    ) -> KvResult<bool> {
        let body = json!({
            "compare": [{ "target": "LEASE", "key": B64.encode(guard), "lease": lease.to_string(), "result": "EQUAL" }],
            "success": [{ "request_put": { "key": B64.encode(key), "value": B64.encode(value) } }],
        });
        let r: TxnReply = self.post("/v3/kv/txn", body).await?;
        Ok(r.succeeded.unwrap_or(false))
    }
}

/// A master address: a fixed `host:port`, or the leader published in etcd.
#[derive(Debug, Clone)]
pub enum MasterAddr {
    /// `host:port`.
    Static(String),
    /// `etcd://endpoints[/cluster]`: whoever holds the leader key.
    Etcd {
        /// The etcd cluster.
        etcd: Etcd,
        /// The leader key.
        key: String,
    },
}

impl MasterAddr {
    /// Parses `host:port` or `etcd://h:p[;h:p...][/cluster]` (or
    /// `etcds://...` for etcd over TLS, verified with `security`'s etcd
    /// TLS); without a cluster in the address, `KVPOOL_CLUSTER_ID` or
    /// [`DEFAULT_CLUSTER`].
    pub fn parse(addr: &str, security: &Security) -> KvResult<MasterAddr> {
        let (rest, scheme) = if let Some(rest) = addr.strip_prefix("etcd://") {
            (rest, "http://")
        } else if let Some(rest) = addr.strip_prefix("etcds://") {
            (rest, "https://")
        } else {
            return Ok(MasterAddr::Static(addr.to_string()));
        };
        let (endpoints, cluster) = match rest.split_once('/') {
            Some((e, c)) if !c.is_empty() => (e, c.to_string()),
            Some((e, _)) => (e, default_cluster()),
            None => (rest, default_cluster()),
        };
        let endpoints: Vec<String> = endpoints
            .split([';', ','])
            .filter(|e| !e.trim().is_empty())
            .map(|e| format!("{scheme}{}", e.trim()))
            .collect();
        Ok(MasterAddr::Etcd {
            etcd: Etcd::new(&endpoints.join(";"), security.etcd_tls.clone())?,
            key: leader_key(&cluster),
        })
    }

    /// The master's `host:port` now (asks etcd for the leader).
    pub async fn resolve(&self) -> KvResult<String> {
        match self {
            MasterAddr::Static(a) => Ok(a.clone()),
            MasterAddr::Etcd { etcd, key } => etcd.get(key).await?.ok_or_else(|| {
                KvError::new(
                    Code::UnavailableInCurrentStatus,
                    format!("no master leader in etcd under {key}"),
                )
            }),
        }
    }
}

fn default_cluster() -> String {
    std::env::var("KVPOOL_CLUSTER_ID").unwrap_or_else(|_| DEFAULT_CLUSTER.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::AtomicU64;

    /// An endpoint that accepts connections and never answers (an etcd
    /// member cut off from its quorum); counts the connections.
    fn silent() -> (String, Arc<AtomicU64>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen = Arc::new(AtomicU64::new(0));
        let count = seen.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in l.incoming().flatten() {
                count.fetch_add(1, Ordering::Relaxed);
                held.push(c);
            }
        });
        (addr, seen)
    }

    /// An endpoint that answers every range request with `value`.
    fn answering(value: &str) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let body = json!({ "kvs": [{ "value": B64.encode(value) }] }).to_string();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                // The whole request first: closing with unread bytes would
                // reset the connection under the answer (a request split in
                // two segments on a loaded machine did).
                read_request(&mut c);
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        addr
    }

    /// Reads one HTTP request: its headers, then the body its
    /// `Content-Length` announces.
    fn read_request(c: &mut std::net::TcpStream) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let Ok(n) = c.read(&mut buf) else { return };
            if n == 0 {
                return;
            }
            got.extend_from_slice(&buf[..n]);
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let body: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + body {
                return;
            }
        }
    }

    /// A member that holds requests costs a read [`NEXT_ENDPOINT_AFTER`],
    /// not its whole timeout (3 s, past a 2 s lease), and once another
    /// has answered it is not asked first again.
    #[tokio::test]
    async fn a_silent_member_is_overtaken_and_then_asked_last() {
        let (hung, seen) = silent();
        let good = answering("10.0.0.1:50051");
        let etcd = Etcd::new(&format!("{hung};{good}"), None).unwrap();
        let t0 = std::time::Instant::now();
        let got = etcd.get("/kvpool/x/master").await.unwrap();
        assert_eq!(got.as_deref(), Some("10.0.0.1:50051"));
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "waited out the silent member's timeout: {:?}",
            t0.elapsed()
        );
        assert_eq!(seen.load(Ordering::Relaxed), 1);
        for _ in 0..3 {
            assert!(etcd.get("/kvpool/x/master").await.unwrap().is_some());
        }
        assert_eq!(
            seen.load(Ordering::Relaxed),
            1,
            "the silent one was asked again first"
        );
    }

    #[test]
    fn addresses_parse() {
        assert!(
            matches!(MasterAddr::parse("10.0.0.1:50051", &Security::default()).unwrap(), MasterAddr::Static(a) if a == "10.0.0.1:50051")
        );
        let MasterAddr::Etcd { etcd, key } = MasterAddr::parse(
            "etcd://127.0.0.1:2379;127.0.0.2:2379/prod",
            &Security::default(),
        )
        .unwrap() else {
            panic!("not etcd")
        };
        assert_eq!(
            etcd.endpoints,
            ["http://127.0.0.1:2379", "http://127.0.0.2:2379"]
        );
        assert_eq!(key, "/kvpool/prod/master");
        assert!(MasterAddr::parse("etcd://", &Security::default()).is_err());
        let e = MasterAddr::parse("etcds://127.0.0.1:2379", &Security::default())
            .err()
            .unwrap();
        assert!(e.message.contains("KVPOOL_ETCD_CA"), "{e}");
    }
}
