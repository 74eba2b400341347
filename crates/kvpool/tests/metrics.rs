//! The metrics a pool exports, and the dashboard and alerts built on them.
//!
//! A real master and store (with its `--metrics-port`) serve puts, gets and
//! a remove; the store's counters must move accordingly, and every metric
//! name that a PromQL expression of `deploy/grafana/kvpool-dashboard.json`
//! or `deploy/prometheus/kvpool-alerts.yaml` reads must be one the binaries
//! export, so renaming a metric fails here rather than in someone's Grafana.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use common::*;
use kvpool_client::{Client, ClientConfig, Protocol, ReplicateConfig};

/// Series Prometheus makes itself, not any binary: a target's scrape health.
const SYNTHETIC: &[&str] = &["up"];

/// A master and one store with its metrics port, running until dropped.
struct Pool {
    _dir: tempfile::TempDir,
    master: MasterProcess,
    _store: Process,
    store_metrics: String,
}

async fn start() -> Pool {
    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let mut master = spawn_metered_master("master", &logs).await;
    let port = free_port();
    let mut store = spawn_store_with(
        Path::new(BIN),
        "store",
        "store",
        &master.rpc,
        "64MiB",
        &dir.path().join("store"),
        &logs,
        &["--metrics-port".into(), port.to_string()],
    );
    wait_for_segments(&master.rpc, 1, &mut [&mut store, &mut master.process]).await;
    Pool {
        _dir: dir,
        master,
        _store: store,
        store_metrics: format!("127.0.0.1:{port}"),
    }
}

/// The text of `GET /metrics` at `addr`.
async fn scrape(addr: &str) -> String {
    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200, "{addr}/metrics: {body}");
    body
}

/// The value of the series written exactly `series` (name and labels as
/// exported, e.g. `kvpool_store_bytes_total{op="Read"}`), 0 if absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse::<f64>().expect("a number"))
        .next()
        .unwrap_or(0.0)
}

/// Every series name `text` (Prometheus or OpenMetrics text) lets a query
/// select: the name of each sample, and for each declared family the names
/// its type gives its samples (a histogram's `_bucket`, `_sum`, `_count`,
/// a counter's `_total`), so a family with no series yet still counts.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut it = decl.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                names.insert(line[..end].to_string());
            }
        }
    }
    names
}

/// PromQL words that are not metric names: operators, modifiers, the
/// keywords of aggregation clauses, and aggregations (which may be written
/// `sum by (le) (...)`, not followed by a parenthesis).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects. Strings, label matchers
/// (`{...}`), ranges (`[5m]`) and the label lists of `by`, `without`, `on`,
/// `ignoring` and `group_*` are dropped; of the identifiers left, those
/// called as functions and PromQL keywords are not metrics.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Blank out what is not an identifier of the expression itself.
    let mut cleaned = String::with_capacity(expr.len());
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut quote: Option<char> = None;
    for c in expr.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '{') => depth_brace += 1,
            (None, '}') => depth_brace -= 1,
            (None, '[') => depth_bracket += 1,
            (None, ']') => depth_bracket -= 1,
            (None, c) if depth_brace == 0 && depth_bracket == 0 => {
                cleaned.push(c);
                continue;
            }
            _ => {}
        }
        cleaned.push(' ');
    }
    let tokens = tokenize(&cleaned);
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        let next = tokens.get(i + 1).map(String::as_str);
        let label_list = matches!(
            t.as_str(),
            "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
        );
        if label_list && next == Some("(") {
            // Skip to the closing parenthesis of the label list.
            i += tokens[i..].iter().position(|t| t == ")").unwrap_or(0);
        } else if is_identifier(t) && next != Some("(") && !KEYWORDS.contains(&t.as_str()) {
            names.insert(t.clone());
        }
        i += 1;
    }
    names
}

/// Identifiers, numbers and single punctuation characters of `s`.
fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '.' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn is_identifier(t: &str) -> bool {
    t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Every `expr` string anywhere in a JSON document (Grafana targets).
fn json_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => json_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| json_exprs(v, out)),
        _ => {}
    }
}

/// The PromQL expressions of the dashboard and the alert rules, each with
/// where it came from.
fn deployed_exprs() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read =
        |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let mut out = Vec::new();
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/kvpool-dashboard.json")).expect("JSON");
    let mut exprs = Vec::new();
    json_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "the dashboard has its panels' queries");
    out.extend(exprs.into_iter().map(|e| ("dashboard".to_string(), e)));
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/prometheus/kvpool-alerts.yaml")).expect("YAML");
    let rules = alerts["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter());
    for rule in rules {
        let name = rule["alert"].as_str().expect("an alert name");
        let expr = rule["expr"].as_str().expect("an expr");
        out.push((format!("alert {name}"), expr.to_string()));
    }
    assert!(out.len() >= 20, "dashboard and alerts found");
    out
}

#[test]
fn metric_names_are_read_from_promql() {
    let e = r#"histogram_quantile(0.99, sum by (le, op) (rate(kvpool_store_request_seconds_bucket{op=~"Read|Write"}[5m]))) > 0.05 or on(instance) (kvpool_a / ignoring(tier) kvpool_b:ratio) or vector(0)"#;
    let names: Vec<String> = metric_names(e).into_iter().collect();
    assert_eq!(
        names,
        [
            "kvpool_a",
            "kvpool_b:ratio",
            "kvpool_store_request_seconds_bucket"
        ]
    );
    let text = "# TYPE a counter\n# TYPE h histogram\ng{x=\"1\"} 2\n# EOF\n";
    let got: Vec<String> = exported(text).into_iter().collect();
    assert_eq!(got, ["a_total", "g", "h_bucket", "h_count", "h_sum"]);
}

/// Every metric a dashboard panel or an alert reads is exported by the
/// master or the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_read_only_exported_metrics() {
    let pool = start().await;
    let client = Client::connect(ClientConfig::new(&pool.master.rpc))
        .await
        .expect("connect");
    let cfg = ReplicateConfig::default();
    client.put("warm", b"value", &cfg).await.expect("put");
    client.get("warm").await.expect("get");
    let mut names = exported(&scrape(&pool.master.metrics).await);
    names.extend(exported(&scrape(&pool.store_metrics).await));
    let mut missing: HashMap<String, Vec<String>> = HashMap::new();
    for (source, expr) in deployed_exprs() {
        for name in metric_names(&expr) {
            if !names.contains(&name) && !SYNTHETIC.contains(&name.as_str()) {
                missing.entry(name).or_default().push(source.clone());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metrics read by the dashboard or alerts that no binary exports: {missing:#?}\nexported: {names:#?}"
    );
}

/// The store's counters follow what it serves: writes and reads in bytes
/// and requests, latency observations, connections, invalidations; the
/// client counts the same keys and bytes; the master shows the segment
/// live and itself leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_counters_move_with_traffic() {
    let pool = start().await;
    let before = scrape(&pool.store_metrics).await;
    assert_eq!(
        value(&before, "kvpool_store_segments{tier=\"memory\"}"),
        1.0
    );
    assert_eq!(
        value(
            &before,
            "kvpool_store_recovery_scans_total{tier=\"memory\"}"
        ),
        1.0
    );
    // Over TCP, so the bytes pass through the store process.
    let mut cfg = ClientConfig::new(&pool.master.rpc);
    cfg.protocol = Protocol::Tcp;
    let client = Client::connect(cfg).await.expect("connect");
    let (n, len) = (20usize, 10_000usize);
    for i in 0..n {
        let v = value_for(&format!("k{i}"), len);
        let v = &v[..len.min(v.len())];
        client
            .put(&format!("k{i}"), v, &ReplicateConfig::default())
            .await
            .expect("put");
    }
    let mut read = 0usize;
    for i in 0..n {
        read += client.get(&format!("k{i}")).await.expect("get").len();
    }
    // Forced: the gets above hold read leases on it.
    client.remove("k0", true).await.expect("remove");
    let after = scrape(&pool.store_metrics).await;
    let grew = |series: &str| value(&after, series) - value(&before, series);
    // Writes carry the object header too: at least the values' bytes.
    assert!(
        grew("kvpool_store_bytes_total{op=\"Write\"}") >= read as f64,
        "write bytes\n{after}"
    );
    assert!(
        grew("kvpool_store_bytes_total{op=\"Read\"}") >= read as f64,
        "read bytes\n{after}"
    );
    assert!(grew("kvpool_store_requests_total{op=\"Write\"}") >= n as f64);
    assert!(grew("kvpool_store_requests_total{op=\"Read\"}") >= n as f64);
    assert!(grew("kvpool_store_request_seconds_count{op=\"Read\"}") >= n as f64);
    assert!(grew("kvpool_store_connections_accepted_total") >= 1.0);
    assert!(value(&after, "kvpool_store_connections_open") >= 1.0);
    // A remove answers once the old version is destroyed on its store.
    assert!(
        grew("kvpool_store_invalidations_received_total") >= 1.0,
        "{after}"
    );
    assert!(
        grew("kvpool_store_invalidations_applied_total") >= 1.0,
        "{after}"
    );
    // The client counted the same traffic from its side.
    let c = client.metrics().snapshot();
    let at = |k: &str| c.get(k).copied().unwrap_or(0.0);
    assert_eq!(
        at(r#"kvpool_client_keys_total{op="get",result="ok"}"#),
        n as f64
    );
    assert_eq!(
        at(r#"kvpool_client_value_bytes_total{op="get"}"#),
        read as f64
    );
    assert!(
        at(r#"kvpool_client_transfer_bytes_total{direction="read",transport="tcp"}"#)
            >= read as f64
    );
    assert_eq!(
        at(r#"kvpool_client_keys_total{op="remove",result="ok"}"#),
        1.0
    );
    let master = scrape(&pool.master.metrics).await;
    assert_eq!(
        value(
            &master,
            "kvpool_segment_state{segment=\"store\",state=\"live\"}"
        ),
        1.0,
        "{master}"
    );
    assert_eq!(value(&master, "kvpool_master_role{role=\"leader\"}"), 1.0);
    assert_eq!(
        value(
            &master,
            "kvpool_segment_objects{segment=\"store\",tier=\"memory\"}"
        ),
        (n - 1) as f64
    );
}
