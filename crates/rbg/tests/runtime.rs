//! The local runtime with real processes: the `rbg` binary runs the
//! deploy/kvpool-cache.yaml example (renamed per test so groups get distinct
//! addresses) against the real `kvpool` binary.
//!
//! `kvpool` comes from `KVPOOL_BIN`, else it is built once with
//! `cargo build -p kvpool --bin kvpool` next to the `rbg` binary under test.
//! Every wait has a deadline; each test stops its group when it ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rbg::discovery::group_octet;
use rbg::runtime::state::{GroupStatus, InstanceStatus};

const RBG: &str = env!("CARGO_BIN_EXE_rbg");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The kvpool binary, built on first use when not given.
fn kvpool_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("KVPOOL_BIN") {
            return PathBuf::from(p);
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        // Built in the profile of the rbg binary under test, beside it.
        let release = Path::new(RBG)
            .parent()
            .is_some_and(|d| d.ends_with("release"));
        let profile = if release {
            "--release"
        } else {
            "--profile=dev"
        };
        let status = Command::new(cargo)
            .args(["build", profile, "-p", "kvpool", "--bin", "kvpool"])
            .current_dir(workspace())
            .status()
            .expect("running cargo build -p kvpool");
        // The rbg binary under test sits in the same profile directory.
        let bin = Path::new(RBG).with_file_name("kvpool");
        // A stale binary would test yesterday's kvpool: fail instead.
        assert!(status.success(), "cargo build -p kvpool failed");
        assert!(bin.is_file(), "{} missing after build", bin.display());
        bin
    })
}

/// A group run by `rbg up` in the background, stopped on drop.
struct Up {
    child: Child,
    state: tempfile::TempDir,
    group: String,
    out: PathBuf,
}

impl Up {
    fn start(group: &str, spec: &str, images: &str, extra: &[&str]) -> Up {
        let state = tempfile::tempdir().expect("tempdir");
        let spec_path = state.path().join("group.yaml");
        std::fs::write(&spec_path, spec).expect("write spec");
        let images_path = state.path().join("images.yaml");
        std::fs::write(&images_path, images).expect("write images");
        let out = state.path().join("up.log");
        let log = std::fs::File::create(&out).expect("log");
        let child = Command::new(RBG)
            .arg("--state-dir")
            .arg(state.path().join("state"))
            .arg("up")
            .arg("-f")
            .arg(&spec_path)
            .arg("--images")
            .arg(&images_path)
            .args(extra)
            .stdout(Stdio::from(log.try_clone().expect("clone")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn rbg up");
        Up {
            child,
            state,
            group: group.to_string(),
            out,
        }
    }

    fn rbg(&self, args: &[&str]) -> Output {
        Command::new(RBG)
            .arg("--state-dir")
            .arg(self.state.path().join("state"))
            .args(args)
            .output()
            .expect("run rbg")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.state.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn up_log(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn status(&self) -> Option<GroupStatus> {
        let out = self.rbg(&["status", "-g", &self.group, "--json"]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls status until `pred` holds; panics with the last status after
    /// `timeout`. `each` sees every status seen on the way.
    fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        mut each: impl FnMut(&GroupStatus),
        pred: impl Fn(&GroupStatus) -> bool,
    ) -> GroupStatus {
        let start = Instant::now();
        let mut last = None;
        loop {
            if let Ok(Some(code)) = self.child.try_wait() {
                panic!(
                    "rbg up exited ({code}) while waiting for {what}:\n{}",
                    self.up_log()
                );
            }
            if let Some(s) = self.status() {
                each(&s);
                if pred(&s) {
                    return s;
                }
                last = Some(s);
            }
            if start.elapsed() > timeout {
                panic!(
                    "timed out after {timeout:?} waiting for {what}\nlast status: {last:#?}\nrbg up output:\n{}",
                    self.up_log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ready(&mut self, timeout: Duration) -> GroupStatus {
        self.wait("the group to be Ready", timeout, |_| {}, |s| s.ready)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.rbg(&["down", "-g", &self.group]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn instance<'a>(s: &'a GroupStatus, name: &str) -> &'a InstanceStatus {
    s.instances
        .iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("no instance {name} in {s:#?}"))
}

fn pid(s: &GroupStatus, name: &str, container: &str) -> u32 {
    instance(s, name).pids.get(container).copied().unwrap_or(0)
}

/// The cache example under another group name, with tweaks.
fn cache_spec(group: &str, engine_replicas: u32) -> String {
    let text = std::fs::read_to_string(workspace().join("deploy/kvpool-cache.yaml"))
        .expect("deploy/kvpool-cache.yaml");
    let text = text.replace("kvcache", group).replace("64MiB", "16MiB");
    let engine = "  - name: engine\n    replicas: 1\n";
    assert!(text.contains(engine), "engine role layout changed");
    text.replace(
        engine,
        &format!("  - name: engine\n    replicas: {engine_replicas}\n"),
    )
}

fn images(extra: &str) -> String {
    let dir = kvpool_bin().parent().expect("bin dir");
    format!("kvpool:v1: {}\n{extra}", dir.display())
}

fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

fn cmdline(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

#[test]
fn test_groups_get_distinct_addresses() {
    let names = ["rtcache", "rtroll", "rtcrash", "rtgroup"];
    let mut octets: Vec<u8> = names.iter().map(|n| group_octet(n)).collect();
    octets.sort();
    octets.dedup();
    assert_eq!(octets.len(), names.len(), "tests would share addresses");
}

#[test]
fn cache_group_starts_in_order_with_discovery() {
    let g = "rtcache";
    let mut up = Up::start(g, &cache_spec(g, 1), &images(""), &[]);
    let s = up.ready(Duration::from_secs(30));
    let oct = group_octet(g);

    // Order: no store was started before the master's probe passed.
    let master = instance(&s, &format!("{g}-master-0"));
    let master_ready = master.ready_since_ms.expect("master ready");
    for i in 0..3 {
        let st = instance(&s, &format!("{g}-store-{i}"));
        assert!(
            st.started_ms >= master_ready,
            "store {i} started at {} before the master was ready at {master_ready}",
            st.started_ms
        );
        assert_eq!(st.address, format!("127.{oct}.2.{}", i + 1));
    }
    let log = up.up_log();
    let master_line = log
        .find(&format!("{g}-master-0: created"))
        .expect("master created");
    let store_line = log
        .find(&format!("{g}-store-0: created"))
        .expect("store created");
    assert!(master_line < store_line);

    // Discovery: env and args of a store.
    let store1 = format!("{g}-store-1");
    let p = pid(&s, &store1, "store");
    let env = environ(p);
    let want = [
        ("GROUP_NAME", g.to_string()),
        ("ROLE_NAME", "store".to_string()),
        ("ROLE_INDEX", "1".to_string()),
        ("RBG_GROUP_NAME", g.to_string()),
        ("RBG_ROLE_NAME", "store".to_string()),
        ("RBG_ROLE_INDEX", "1".to_string()),
        ("POD_IP", format!("127.{oct}.2.2")),
        ("HOSTNAME", store1.clone()),
    ];
    for (k, v) in want {
        assert_eq!(env.get(k), Some(&v), "{k} in {env:?}");
    }
    assert!(!env.contains_key("REPLICAS") && !env.keys().any(|k| k.contains("SIZE")));
    let args = cmdline(p);
    let data_dir = instance(&s, &store1).volumes["data"].clone();
    assert!(
        args.contains(&format!("--master=127.{oct}.1.1:50051")),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("--address=127.{oct}.2.2")),
        "{args:?}"
    );
    assert!(args.contains(&format!("--data-dir={data_dir}")), "{args:?}");
    assert!(
        data_dir.starts_with("/dev/shm/"),
        "medium: Memory is tmpfs: {data_dir}"
    );

    // Discovery file.
    let config_path = env.get("RBG_CONFIG").expect("RBG_CONFIG").clone();
    let config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&config_path).expect("config"))
            .expect("yaml");
    assert_eq!(config["group"]["name"].as_str(), Some(g));
    assert_eq!(config["group"]["size"].as_u64(), Some(3));
    assert_eq!(config["roles"]["store"]["size"].as_u64(), Some(3));
    assert_eq!(
        config["roles"]["store"]["instances"][2]["address"].as_str(),
        Some(format!("127.{oct}.2.3").as_str())
    );
    assert_eq!(
        config["roles"]["master"]["instances"][0]["ports"]["rpc"].as_u64(),
        Some(50051)
    );

    // `rbg status` (the table) reports Ready.
    let out = up.rbg(&["status"]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&format!("GROUP {g}  Ready")), "{table}");
    assert_eq!(table.matches(" true ").count(), 5, "{table}");

    // The engine reaches the master by its service name and reports hits.
    let logs_ok = |up: &Up| {
        let out = up.rbg(&["logs", &format!("{g}-engine-0")]);
        // The banner quotes the script, so look for a printed number.
        String::from_utf8_lossy(&out.stdout).lines().any(|l| {
            l.starts_with("engine: get hit rate ")
                && l[21..].starts_with(|c: char| c.is_ascii_digit())
        })
    };
    let start = Instant::now();
    while !logs_ok(&up) {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "engine printed no hit rate:\n{}",
            String::from_utf8_lossy(&up.rbg(&["logs", &format!("{g}-engine-0")]).stdout)
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // A second `up` of the same group is refused.
    let again = up.rbg(&[
        "up",
        "-f",
        up.state.path().join("group.yaml").to_str().expect("utf8"),
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));

    // SIGTERM stops the group in reverse dependency order, leaving nothing.
    let pids: Vec<u32> = up
        .status()
        .expect("status")
        .instances
        .iter()
        .flat_map(|i| i.pids.values().copied())
        .collect();
    // SAFETY: plain kill(2) of the `rbg up` this test started.
    unsafe {
        libc::kill(i32::try_from(up.child.id()).expect("pid"), libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while up.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "rbg up did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = up.up_log();
    let level1 = log
        .find("stopped engine, store")
        .unwrap_or_else(|| panic!("{log}"));
    let level0 = log
        .find("stopped master")
        .unwrap_or_else(|| panic!("{log}"));
    assert!(level1 < level0, "{log}");
    for p in pids {
        assert!(
            !Path::new(&format!("/proc/{p}")).exists() || is_zombie(p),
            "pid {p} survived"
        );
    }
}

#[test]
fn store_image_change_restarts_each_store_in_place() {
    let g = "rtroll";
    let v2 = tempfile::tempdir().expect("tempdir");
    std::fs::copy(kvpool_bin(), v2.path().join("kvpool")).expect("copy kvpool as v2");
    let map = images(&format!("kvpool:v2: {}\n", v2.path().display()));
    let spec = cache_spec(g, 0);
    let mut up = Up::start(g, &spec, &map, &[]);
    let before = up.ready(Duration::from_secs(30));
    let stores: Vec<String> = (0..3).map(|i| format!("{g}-store-{i}")).collect();
    let old: Vec<InstanceStatus> = stores
        .iter()
        .map(|n| instance(&before, n).clone())
        .collect();

    // Cache written before the upgrade, kept in the pool.
    let master = format!(
        "{}:50051",
        instance(&before, &format!("{g}-master-0")).address
    );
    let bench = |ops: &str| {
        let out = Command::new(kvpool_bin())
            .args([
                "bench", "--master", &master, "--ops", ops, "--keys", "600", "--keep",
            ])
            .args([
                "--prefix",
                "pre-upgrade",
                "--sizes",
                "4KiB",
                "--duration",
                "1s",
            ])
            .output()
            .expect("run kvpool bench");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "bench {ops}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    bench("put");

    // Only the store's image changes.
    let store_at = spec.find("- name: store").expect("store role");
    let img_at = store_at
        + spec[store_at..]
            .find("image: kvpool:v1")
            .expect("store image");
    let new_spec = format!(
        "{}image: kvpool:v2{}",
        &spec[..img_at],
        &spec[img_at + "image: kvpool:v1".len()..]
    );
    let path = up.write("v2.yaml", &new_spec);
    let map_path = up.write("images-v2.yaml", &map);
    let out = up.rbg(&[
        "apply",
        "-f",
        path.to_str().expect("utf8"),
        "--images",
        map_path.to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let old_rev = before.roles[1].revision.clone();

    let mut max_unready = 0;
    let after = up.wait(
        "stores on the new revision",
        Duration::from_secs(40),
        |s| {
            let unready = s
                .instances
                .iter()
                .filter(|i| i.role == "store" && !i.ready)
                .count();
            max_unready = max_unready.max(unready);
        },
        |s| {
            s.ready
                && s.roles[1].updated_replicas == 3
                && s.instances.iter().all(|i| i.state == "Running")
        },
    );
    assert_ne!(
        after.roles[1].revision, old_rev,
        "the store revision changed"
    );
    assert_eq!(
        after.roles[0].revision, before.roles[0].revision,
        "master untouched"
    );
    assert!(
        max_unready <= 1,
        "maxUnavailable 1, saw {max_unready} stores unready"
    );
    // One at a time, highest index first (the order `up` acted in).
    let log = up.up_log();
    let at = |n: &str| {
        log.find(&format!("{n}: updating in place"))
            .unwrap_or_else(|| panic!("{n} not updated in place:\n{log}"))
    };
    assert!(at(&stores[2]) < at(&stores[1]) && at(&stores[1]) < at(&stores[0]));
    assert!(!log.contains(": recreating"), "{log}");

    let master = instance(&after, &format!("{g}-master-0"));
    assert_eq!(master.restarts, 0);
    assert_eq!(
        master.pids,
        instance(&before, &format!("{g}-master-0")).pids
    );
    for (name, o) in stores.iter().zip(&old) {
        let n = instance(&after, name);
        // In place: same identity, address and data directory.
        assert_eq!(n.address, o.address, "{name}");
        assert_eq!(n.volumes, o.volumes, "{name}");
        assert_eq!(n.restarts, o.restarts + 1, "{name}");
        assert!(n.age_secs >= o.age_secs, "{name} was not recreated");
        let p = n.pids["store"];
        assert_ne!(p, o.pids["store"], "{name} restarted");
        let exe = std::fs::read_link(format!("/proc/{p}/exe")).expect("exe");
        assert!(exe.starts_with(v2.path()), "{name} runs {}", exe.display());
        assert!(
            Path::new(&n.volumes["data"]).is_dir(),
            "{name}: data dir kept across the restart"
        );
    }
    let hist = String::from_utf8_lossy(&up.rbg(&["rollout", "history"]).stdout).into_owned();
    assert!(hist.contains("apply"), "{hist}");

    // The stores came back with their cache: the keys written before the
    // upgrade are still there.
    let out = bench("get");
    let rate: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("get 4.0 KiB hit rate "))
        .and_then(|l| l.split('%').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no hit rate in:\n{out}"));
    assert!(
        rate >= 99.0,
        "hit rate {rate}% on keys written before the upgrade:\n{out}"
    );
}

#[test]
fn killed_instance_restarts_with_backoff() {
    let g = "rtcrash";
    let mut up = Up::start(
        g,
        &cache_spec(g, 0),
        &images(""),
        &["--backoff-base", "400ms"],
    );
    let s = up.ready(Duration::from_secs(30));
    let name = format!("{g}-store-0");
    let mut last_pid = pid(&s, &name, "store");
    // Two crashes in a row: the second waits twice as long.
    for (round, min_delay) in [(1u32, 400u64), (2, 800)] {
        let killed_at = Instant::now();
        // SAFETY: plain kill(2) of a process this test's group started.
        unsafe {
            libc::kill(i32::try_from(last_pid).expect("pid"), libc::SIGKILL);
        }
        let mut restarted_at = None;
        let s = up.wait(
            "the killed store to come back",
            Duration::from_secs(20),
            |s| {
                let p = pid(s, &name, "store");
                if p != 0 && p != last_pid && restarted_at.is_none() {
                    restarted_at = Some(Instant::now());
                }
            },
            |s| {
                let i = instance(s, &name);
                i.restarts == round && i.ready && s.ready
            },
        );
        let delay = restarted_at.expect("new pid seen") - killed_at;
        assert!(
            delay >= Duration::from_millis(min_delay),
            "round {round}: restarted after {delay:?}, backoff {min_delay} ms"
        );
        last_pid = pid(&s, &name, "store");
    }
    assert!(up.up_log().contains("restart in 0.8s"), "{}", up.up_log());
}

#[test]
fn recreate_rbg_on_pod_restart_restarts_the_group_in_order() {
    let g = "rtgroup";
    let spec = format!(
        r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {{name: {g}}}
spec:
  roles:
  - name: db
    template:
      spec:
        containers:
        - name: db
          image: kvpool:v1
          command: [kvpool, master, --rpc-address=$(IP), --metrics-address=$(IP)]
          env: [{{name: IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
          readinessProbe: {{httpGet: {{path: /health, port: 9003}}, periodSeconds: 1}}
  - name: app
    replicas: 2
    dependencies: [db]
    restartPolicy: RecreateRBGOnPodRestart
    template:
      spec:
        containers:
        - name: app
          command: [sleep, "1000"]
          readinessProbe: {{exec: {{command: [sh, -c, "test -n \"$GROUP_NAME\""]}}}}
  - name: web
    dependencies: [app]
    template:
      spec:
        containers:
        - name: web
          command: [sleep, "1000"]
"#
    );
    let mut up = Up::start(g, &spec, &images(""), &["--backoff-base", "200ms"]);
    let before = up.ready(Duration::from_secs(30));
    let names = [
        format!("{g}-db-0"),
        format!("{g}-app-0"),
        format!("{g}-app-1"),
        format!("{g}-web-0"),
    ];
    let old_pids: Vec<u32> = before
        .instances
        .iter()
        .flat_map(|i| i.pids.values().copied())
        .collect();
    let victim = pid(&before, &names[1], "app");
    // SAFETY: plain kill(2) of a process this test's group started.
    unsafe {
        libc::kill(i32::try_from(victim).expect("pid"), libc::SIGKILL);
    }
    let after = up.wait(
        "the group to be recreated",
        Duration::from_secs(30),
        |_| {},
        |s| s.group_restarts == 1 && s.ready,
    );
    // Everyone is new, and nobody of the old group survived.
    for n in &names {
        let i = instance(&after, n);
        assert_eq!(i.restarts, 0, "{n} is a fresh instance");
        for p in i.pids.values() {
            assert!(!old_pids.contains(p), "{n} kept pid {p}");
        }
    }
    for p in old_pids {
        assert!(
            !Path::new(&format!("/proc/{p}")).exists() || is_zombie(p),
            "old pid {p} alive"
        );
    }
    // In dependency order: db ready before app started, app ready before web.
    let t = |n: &str| instance(&after, n).clone();
    let db_ready = t(&names[0]).ready_since_ms.expect("db ready");
    assert!(t(&names[1]).started_ms >= db_ready);
    assert!(t(&names[2]).started_ms >= db_ready);
    let app_ready = t(&names[1])
        .ready_since_ms
        .expect("app ready")
        .max(t(&names[2]).ready_since_ms.expect("app ready"));
    assert!(t(&names[3]).started_ms >= app_ready);
    let log = up.up_log();
    let cut = log
        .find("recreating the whole group")
        .expect("group restart logged");
    let rest = &log[cut..];
    let pos = |s: &str| rest.find(s).unwrap_or_else(|| panic!("{s} not in\n{rest}"));
    // Stopped in reverse order, started in order.
    assert!(pos("stopped web") < pos("stopped app"));
    assert!(pos("stopped app") < pos("stopped db"));
    assert!(pos(&format!("{}: created", names[0])) < pos(&format!("{}: created", names[1])));
    assert!(pos(&format!("{}: created", names[1])) < pos(&format!("{}: created", names[3])));
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z "))
        .unwrap_or(true)
}

/// Runs `rbg validate <flags> -f <path>`.
fn validate(path: impl AsRef<std::ffi::OsStr>, flags: &[&str]) -> std::process::Output {
    Command::new(RBG)
        .arg("validate")
        .args(flags)
        .arg("-f")
        .arg(path)
        .output()
        .expect("run")
}

#[test]
fn cli_reports_bad_input_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: workloads.x-k8s.io/v1alpha1\nkind: RoleBasedGroup\nmetadata: {name: x}\nspec:\n  roles:\n  - name: a\n    replicas: many\n",
    )
    .expect("write");
    let out = validate(&bad, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.roles[0].replicas") && err.contains("line 7"),
        "{err}"
    );

    let cyc = dir.path().join("cycle.yaml");
    std::fs::write(
        &cyc,
        "apiVersion: workloads.x-k8s.io/v1alpha1\nkind: RoleBasedGroup\nmetadata: {name: x}\nspec:\n  roles:\n  - {name: a, dependencies: [b], template: {spec: {containers: [{name: c, command: [x]}]}}}\n  - {name: b, dependencies: [a], template: {spec: {containers: [{name: c, command: [x]}]}}}\n",
    )
    .expect("write");
    let out = validate(&cyc, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dependency cycle: a -> b -> a"), "{err}");

    let out = Command::new(RBG)
        .arg("--state-dir")
        .arg(dir.path().join("nothing"))
        .arg("status")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no group is running"));

    // Unknown fields are reported with their paths; --strict fails on them.
    let misspelt = dir.path().join("misspelt.yaml");
    std::fs::write(
        &misspelt,
        "apiVersion: workloads.x-k8s.io/v1alpha2\nkind: RoleBasedGroup\nmetadata: {name: x}\nspec:\n  roles:\n  - name: a\n    replcias: 2\n    gangPolicy: {minMember: 2}\n    standalonePattern: {template: {spec: {containers: [{name: c, command: [x]}]}}}\n",
    )
    .expect("write");
    let out = validate(&misspelt, &[]);
    assert!(out.status.success(), "warnings only without --strict");
    let text = String::from_utf8_lossy(&out.stdout);
    for path in ["spec.roles[a].replcias", "spec.roles[a].gangPolicy"] {
        assert!(text.contains(&format!("warning: {path}")), "{path}: {text}");
    }
    let out = validate(&misspelt, &["--strict"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "--strict fails on unknown fields"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "2 unknown field(s) (--strict): spec.roles[a].gangPolicy, spec.roles[a].replcias"
        ),
        "{err}"
    );

    // Fields upstream has and rbg does not support are warnings, even with
    // --strict; so are Kubernetes Pod fields the local runtime ignores.
    let unsupported = dir.path().join("unsupported.yaml");
    std::fs::write(
        &unsupported,
        "apiVersion: workloads.x-k8s.io/v1alpha1\nkind: RoleBasedGroup\nmetadata: {name: x, uid: u-1}\nspec:\n  podGroupPolicy: {kubeScheduling: {}}\n  roles:\n  - name: a\n    template: {spec: {nodeSelector: {gpu: h200}, containers: [{name: c, command: [x], resources: {limits: {cpu: 1}}}]}}\n",
    )
    .expect("write");
    let out = validate(&unsupported, &["--strict"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "warning: spec.podGroupPolicy: not supported by rbg, ignored (gang scheduling plugins are not supported)",
        "warning: spec.roles[a].template.spec.nodeSelector: not supported by the local runtime, ignored (the operator passes it to the cluster)",
        "warning: spec.roles[a].template.spec.containers[c].resources: not supported by the local runtime, ignored (the operator passes it to the cluster)",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    assert!(!text.contains("metadata.uid"), "{text}");

    // Upstream's own update-strategy example (RecreatePod, InPlaceOnly).
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream/rolling-update.yaml");
    let out = validate(&example, &["--strict"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("group rolling-update-demo (workloads.x-k8s.io/v1alpha2) is valid"),
        "{text}"
    );

    for example in ["deploy/kvpool-cache.yaml", "deploy/pd-router.yaml"] {
        let out = validate(workspace().join(example), &[]);
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("warning"), "{example}: {text}");
    }
}
