//! The alert rules of `deploy/prometheus/kvpool-alerts.yaml`, shown to fire.
//!
//! `promtool test rules` runs `deploy/prometheus/kvpool-alerts.test.yaml`,
//! which has a case where each alert fires and one where it does not; the
//! input series of those cases must be series a real master and store
//! export (name and every label but the `job` and `instance` Prometheus
//! adds), checked here against a live scrape. Then a real Prometheus
//! scrapes a real master and store, loads the rules, and a frozen store
//! sets off the store alerts.
//!
//! promtool and Prometheus come from Debian's `prometheus` package, which
//! scripts/test.sh installs; without them these tests fail and say so.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use kvpool_client::{ClientConfig, Protocol, ReplicateConfig};

/// The rules, and their `promtool test rules` cases.
const RULES: &str = "deploy/prometheus/kvpool-alerts.yaml";
const CASES: &str = "deploy/prometheus/kvpool-alerts.test.yaml";
/// The scrape jobs the rules assume (see the rule file's header).
const MASTER_JOB: &str = "kvpool-master";
const STORE_JOB: &str = "kvpool-store";
/// The store's name in the pool started here, which the cases' segment
/// labels use.
const STORE: &str = "store-0";
/// Longest Prometheus may take to start, scrape, evaluate or fire here.
const PROMETHEUS_WAIT: Duration = Duration::from_secs(60);

/// A path in the repository.
fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn read_yaml(path: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The path of `tool` on PATH; panics, naming the package, when it is not
/// installed (a missing tool fails the test rather than skipping it).
fn need(tool: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{tool} not found on PATH: install Debian's `prometheus` package \
                 (apt-get install prometheus); scripts/test.sh installs it"
            )
        })
}

/// Every alert name of the rule file.
fn alert_names() -> BTreeSet<String> {
    let rules = read_yaml(RULES);
    let groups = rules["groups"].as_sequence().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .map(|r| r["alert"].as_str().expect("an alert name").to_string())
        .collect()
}

/// A series: its name and labels.
type Series = (String, BTreeMap<String, String>);

/// Parses `name{k="v", ...}` (a promtool input series, or a line of the
/// text exposition with its value cut off).
fn parse_series(s: &str) -> Series {
    let s = s.trim();
    let Some((name, rest)) = s.split_once('{') else {
        return (s.to_string(), BTreeMap::new());
    };
    let body = rest
        .strip_suffix('}')
        .unwrap_or_else(|| panic!("no closing brace: {s}"));
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ',' || c.is_whitespace()).is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('='), "{s}");
        assert_eq!(chars.next(), Some('"'), "{s}");
        let mut value = String::new();
        loop {
            match chars.next() {
                Some('"') => break,
                Some('\\') => value.extend(chars.next()),
                Some(c) => value.push(c),
                None => panic!("unterminated label value: {s}"),
            }
        }
        labels.insert(key.trim().to_string(), value);
    }
    (name.to_string(), labels)
}

/// The series of a `/metrics` text, values dropped.
fn exported_series(text: &str) -> Vec<Series> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| match l.rfind('}') {
            Some(end) => parse_series(&l[..=end]),
            None => parse_series(l.split_whitespace().next().unwrap_or_default()),
        })
        .collect()
}

/// Whether label values `a` and `b` of `key` are the same: bucket bounds
/// (`le`) as numbers, which Prometheus may print differently.
fn same_value(key: &str, a: &str, b: &str) -> bool {
    let num = |v: &str| match v {
        "+Inf" => Some(f64::INFINITY),
        v => v.parse::<f64>().ok(),
    };
    a == b || (key == "le" && num(a).is_some() && num(a) == num(b))
}

/// Every input series of the promtool cases.
fn case_series() -> Vec<Series> {
    let cases = read_yaml(CASES);
    let tests = cases["tests"].as_sequence().expect("tests");
    tests
        .iter()
        .flat_map(|t| t["input_series"].as_sequence().expect("input_series"))
        .map(|s| parse_series(s["series"].as_str().expect("a series")))
        .collect()
}

/// Every alert has a promtool case where it fires and one where it does
/// not, and promtool passes them (and checks the rule file).
#[test]
fn every_alert_has_promtool_cases_that_pass() {
    let alerts = alert_names();
    assert!(alerts.len() >= 14, "alerts: {alerts:?}");
    let cases = read_yaml(CASES);
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in cases["tests"].as_sequence().expect("tests") {
        for t in test["alert_rule_test"]
            .as_sequence()
            .expect("alert_rule_test")
        {
            let name = t["alertname"].as_str().expect("alertname").to_string();
            assert!(alerts.contains(&name), "{CASES} tests {name}, not a rule");
            match t["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()) {
                true => fires.insert(name),
                false => quiet.insert(name),
            };
        }
    }
    let never_fires: Vec<_> = alerts.difference(&fires).collect();
    let never_quiet: Vec<_> = alerts.difference(&quiet).collect();
    assert!(
        never_fires.is_empty() && never_quiet.is_empty(),
        "{CASES} must show each alert firing and not firing; \
         no firing case: {never_fires:?}, no quiet case: {never_quiet:?}"
    );
    let promtool = need("promtool");
    for args in [["check", "rules", RULES], ["test", "rules", CASES]] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(repo(""))
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A master and a store named [`STORE`] with a disk tier and its metrics
/// port, having served puts and gets over TCP (so the latency histograms
/// of both have series), running until dropped.
struct Pool {
    dir: tempfile::TempDir,
    master: MasterProcess,
    store: Process,
    store_metrics: String,
}

async fn start() -> Pool {
    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    // Heartbeats missed for 2 s make the store suspect; it stays so for a
    // minute before the master drops it.
    let mut master = spawn_master("master", &logs, |rpc, metrics| {
        [
            "master",
            "--rpc-port",
            &rpc.to_string(),
            "--metrics-port",
            &metrics.to_string(),
            "--client-ttl",
            "2s",
            "--store-grace",
            "60s",
        ]
        .map(String::from)
        .to_vec()
    })
    .await;
    let port = free_port();
    let disk = dir.path().join("disk").to_string_lossy().into_owned();
    let extra = ["--metrics-port", &port.to_string()]
        .into_iter()
        .chain(["--disk-dir", &disk, "--disk-size", "16MiB"])
        .map(String::from)
        .collect::<Vec<_>>();
    let mut store = spawn_store_with(
        Path::new(BIN),
        STORE,
        STORE,
        &master.rpc,
        "64MiB",
        &dir.path().join("store"),
        &logs,
        &extra,
    );
    wait_for_segments(&master.rpc, 2, &mut [&mut store, &mut master.process]).await;
    // The master exports a disk tier's I/O once the store's heartbeats
    // have reported it.
    let disk_errors = format!("kvpool_disk_errors{{segment=\"{STORE}/disk\"}}");
    eventually("the store's disk I/O report", STARTUP, async || {
        let text = scrape(&master.metrics).await;
        value(&text, &disk_errors).map(drop)
    })
    .await;
    let mut cfg = ClientConfig::new(&master.rpc);
    cfg.protocol = Protocol::Tcp;
    let client = kvpool_client::Client::connect(cfg).await.expect("connect");
    for i in 0..8 {
        let key = format!("alerts/{i}");
        let value = value_for(&key, 4096);
        client
            .put(&key, &value, &ReplicateConfig::default())
            .await
            .expect("put");
        assert_eq!(client.get(&key).await.expect("get"), value);
    }
    Pool {
        dir,
        master,
        store,
        store_metrics: format!("127.0.0.1:{port}"),
    }
}

/// The text of `GET /metrics` at `addr`.
async fn scrape(addr: &str) -> String {
    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200, "{addr}/metrics: {body}");
    body
}

/// The value of the series written exactly `series` in `text`, if there.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
}

/// Freezes the store until the master shows its segment suspect; returns
/// the master's `/metrics` then. The store is resumed before returning.
async fn suspect_scrape(pool: &Pool) -> String {
    let suspect = format!("kvpool_segment_state{{segment=\"{STORE}\",state=\"suspect\"}}");
    pool.store.freeze(true);
    let text = eventually("the master to see the store suspect", STARTUP, async || {
        let text = scrape(&pool.master.metrics).await;
        (value(&text, &suspect) == Some(1.0)).then_some(text)
    })
    .await;
    pool.store.freeze(false);
    text
}

/// Every input series of the promtool cases is one the binaries export:
/// the same name, the same labels, the same values but for `job` and
/// `instance` (which Prometheus adds) and the `up` Prometheus makes, so
/// the cases cannot drift from what a real pool exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_cases_use_series_a_real_pool_exports() {
    let pool = start().await;
    let mut by_job: BTreeMap<&str, Vec<Series>> = BTreeMap::new();
    let master = scrape(&pool.master.metrics).await;
    by_job.insert(MASTER_JOB, exported_series(&master));
    by_job.insert(
        STORE_JOB,
        exported_series(&scrape(&pool.store_metrics).await),
    );
    // A segment's suspect state is exported only while it is suspect.
    let suspect = suspect_scrape(&pool).await;
    by_job
        .entry(MASTER_JOB)
        .or_default()
        .extend(exported_series(&suspect));
    let mut wrong = Vec::new();
    for (name, mut labels) in case_series() {
        let job = labels.remove("job").unwrap_or_default();
        let instance = labels.remove("instance");
        let shown = format!("{name}{labels:?} (job {job:?})");
        if instance.is_none() {
            wrong.push(format!("{shown}: no instance label, which a scrape adds"));
            continue;
        }
        let Some(exported) = by_job.get(job.as_str()) else {
            wrong.push(format!(
                "{shown}: job is neither {MASTER_JOB} nor {STORE_JOB}"
            ));
            continue;
        };
        if name == "up" {
            if !labels.is_empty() {
                wrong.push(format!("{shown}: `up` has only job and instance"));
            }
            continue;
        }
        let matches = |(n, l): &&Series| {
            *n == name
                && l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.get(k).is_some_and(|w| same_value(k, v, w)))
        };
        if !exported.iter().any(|s| matches(&s)) {
            // What it does export under that name: each label's values.
            let mut seen: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
            for (_, l) in exported.iter().filter(|(n, _)| *n == name) {
                for (k, v) in l {
                    seen.entry(k).or_default().insert(v);
                }
            }
            wrong.push(format!(
                "{shown}: not exported by {job}, whose {name} has labels {seen:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{CASES} has input series the binaries do not export:\n{}",
        wrong.join("\n")
    );
}

/// The JSON answer of Prometheus's HTTP API at `base` (`127.0.0.1:port`)
/// for `path` with `query` parameters; `None` until it answers with
/// `"status": "success"`.
async fn api(base: &str, path: &str, query: &[(&str, &str)]) -> Option<serde_json::Value> {
    let url = format!("http://{base}{path}");
    let query: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let call = move || {
        let mut req = ureq::get(&url).timeout(Duration::from_secs(5));
        for (k, v) in &query {
            req = req.query(k, v);
        }
        req.call().ok()?.into_json::<serde_json::Value>().ok()
    };
    let answer = tokio::task::spawn_blocking(call).await.expect("join")?;
    (answer["status"] == "success").then_some(answer)
}

/// The rule groups Prometheus loaded, by name: each rule's name, and the
/// rule (its health, state and last error).
fn rule_groups(rules: &serde_json::Value) -> BTreeMap<String, BTreeMap<String, serde_json::Value>> {
    let groups = rules["data"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    groups
        .into_iter()
        .map(|g| {
            let rules = g["rules"].as_array().cloned().unwrap_or_default();
            let by_name = rules
                .into_iter()
                .map(|r| (r["name"].as_str().unwrap_or_default().to_string(), r))
                .collect();
            (g["name"].as_str().unwrap_or_default().to_string(), by_name)
        })
        .collect()
}

/// The group of the test-local copy of the rules with `for:` shortened.
const SHORT_GROUP: &str = "kvpool-short-for";

/// Writes the test-local copy of the rule file into `dir`: the same rules
/// as group [`SHORT_GROUP`], every `for:` cut to 1 s, so an alert can fire
/// within a test. The deployed file is loaded too, unchanged.
fn short_for_copy(dir: &Path) -> PathBuf {
    let mut rules = read_yaml(RULES);
    for group in rules["groups"].as_sequence_mut().expect("groups") {
        group["name"] = SHORT_GROUP.into();
        for rule in group["rules"].as_sequence_mut().expect("rules") {
            if let Some(r) = rule.as_mapping_mut() {
                if r.contains_key("for") {
                    r.insert("for".into(), "1s".into());
                }
            }
        }
    }
    let path = dir.join("kvpool-alerts-short-for.yaml");
    std::fs::write(&path, serde_yaml::to_string(&rules).expect("YAML")).expect("write rules");
    path
}

/// Prometheus scraping `pool` every second with the deployed rules and
/// their short-`for` copy loaded; returns the process and its address.
async fn spawn_prometheus(pool: &Pool) -> (Process, String) {
    let prometheus = need("prometheus");
    let dir = pool.dir.path().join("prometheus");
    std::fs::create_dir_all(&dir).expect("prometheus dir");
    let short = short_for_copy(&dir);
    let config = serde_json::json!({
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        },
        "rule_files": [repo(RULES), short],
        "scrape_configs": [
            {
                "job_name": MASTER_JOB,
                "static_configs": [{"targets": [pool.master.metrics]}],
            },
            {
                "job_name": STORE_JOB,
                "static_configs": [{"targets": [pool.store_metrics]}],
            },
        ],
    });
    // JSON is YAML: Prometheus reads it as its config file.
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, config.to_string()).expect("write config");
    let addr = format!("127.0.0.1:{}", free_port());
    let process = Process::spawn_bin(
        "prometheus",
        &prometheus,
        [
            format!("--config.file={}", config_file.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={addr}"),
        ],
        &pool.dir.path().join("logs"),
    );
    let ready = addr.clone();
    eventually("Prometheus to be ready", PROMETHEUS_WAIT, async || {
        let (code, _) = match tokio::net::TcpStream::connect(&ready).await {
            Ok(_) => http_get(&ready, "/-/ready").await,
            Err(_) => (0, String::new()),
        };
        (code == 200).then_some(())
    })
    .await;
    (process, addr)
}

/// A real Prometheus scrapes a real master and store: both targets are
/// up, every metric the promtool cases read has series under its job, and
/// the rules load and evaluate without error. Then the store is frozen:
/// it stops answering scrapes and heartbeats, so KvpoolStoreDown and
/// KvpoolStoreSuspect fire in the short-`for` copy and go pending under
/// the deployed rules' one-minute `for:`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_a_pool_and_a_frozen_store_sets_off_its_alerts() {
    let pool = start().await;
    let (mut prometheus, base) = spawn_prometheus(&pool).await;
    let b = base.clone();
    eventually("both targets up", PROMETHEUS_WAIT, async || {
        let targets = api(&b, "/api/v1/targets", &[]).await?;
        let active = targets["data"]["activeTargets"].as_array()?;
        let up: BTreeSet<&str> = active
            .iter()
            .filter(|t| t["health"] == "up")
            .filter_map(|t| t["labels"]["job"].as_str())
            .collect();
        (up == BTreeSet::from([MASTER_JOB, STORE_JOB])).then_some(())
    })
    .await;

    // Every metric the promtool cases read, under the job they give it.
    let wanted: BTreeSet<(String, String)> = case_series()
        .into_iter()
        .filter(|(name, _)| name != "up")
        .map(|(name, labels)| (name, labels["job"].clone()))
        .collect();
    let query = [(
        "query",
        r#"count by (__name__, job) ({__name__=~"kvpool_.+"})"#,
    )];
    let deadline = tokio::time::Instant::now() + PROMETHEUS_WAIT;
    loop {
        let answer = api(&b, "/api/v1/query", &query).await;
        let have: BTreeSet<(String, String)> = answer
            .iter()
            .flat_map(|a| a["data"]["result"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| {
                let m = &r["metric"];
                Some((m["__name__"].as_str()?.into(), m["job"].as_str()?.into()))
            })
            .collect();
        let missing: Vec<_> = wanted.difference(&have).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "series Prometheus did not get within {PROMETHEUS_WAIT:?}: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The deployed rules and the copy loaded, and evaluated without error.
    let alerts = alert_names();
    eventually("the rules evaluated", PROMETHEUS_WAIT, async || {
        let groups = rule_groups(&api(&b, "/api/v1/rules", &[]).await?);
        for group in ["kvpool", SHORT_GROUP] {
            let rules = groups.get(group)?;
            let names: BTreeSet<String> = rules.keys().cloned().collect();
            assert_eq!(names, alerts, "rules of group {group}");
            for (name, rule) in rules {
                assert_eq!(rule["lastError"].as_str().unwrap_or(""), "", "{name}");
                if rule["health"] != "ok" {
                    assert_eq!(rule["health"], "unknown", "{name}: {rule}");
                    return None;
                }
            }
        }
        Some(())
    })
    .await;

    // A frozen store answers neither scrapes nor heartbeats.
    pool.store.freeze(true);
    let fired = ["KvpoolStoreDown", "KvpoolStoreSuspect"];
    let firing = eventually(
        "the store alerts firing (copy) and pending (deployed)",
        PROMETHEUS_WAIT,
        async || {
            assert!(prometheus.try_exit().is_none(), "{}", prometheus.logs());
            let groups = rule_groups(&api(&b, "/api/v1/rules", &[]).await?);
            let state = |group: &str, alert: &str| groups.get(group)?.get(alert).cloned();
            let mut firing = Vec::new();
            for alert in fired {
                let short = state(SHORT_GROUP, alert)?;
                let deployed = state("kvpool", alert)?;
                if short["state"] != "firing" || deployed["state"] != "pending" {
                    return None;
                }
                firing.push(short["alerts"].clone());
            }
            Some(firing)
        },
    )
    .await;
    pool.store.freeze(false);
    let [down, suspect] = &firing[..] else {
        unreachable!("two alerts")
    };
    let labels = |alerts: &serde_json::Value| -> Vec<serde_json::Value> {
        let list = alerts.as_array().cloned().unwrap_or_default();
        list.into_iter().map(|a| a["labels"].clone()).collect()
    };
    let down = labels(down);
    assert_eq!(down.len(), 1, "{down:?}");
    assert_eq!(down[0]["job"], STORE_JOB);
    assert_eq!(down[0]["instance"], pool.store_metrics.as_str());
    // The memory segment and the disk tier of the frozen store.
    let mut segments: Vec<String> = labels(suspect)
        .iter()
        .filter_map(|l| l["segment"].as_str().map(String::from))
        .collect();
    segments.sort();
    assert_eq!(segments, [STORE.to_string(), format!("{STORE}/disk")]);
    assert!(prometheus.try_exit().is_none(), "{}", prometheus.logs());
}
