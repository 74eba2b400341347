//! v1alpha2 groups run by the real `rbg` binary with real processes
//! (small shell commands): a leader-worker role whose instances are several
//! Pods started and recreated as one unit, and a coordinated rolling
//! update across roles driven by a CoordinatedPolicy document, checked at
//! every status seen on the way. Every wait has a deadline; each test stops
//! its group when it ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rbg::runtime::state::{GroupStatus, InstanceStatus};

const RBG: &str = env!("CARGO_BIN_EXE_rbg");

/// A group run by `rbg up` in the background, stopped on drop.
struct Up {
    child: Child,
    state: tempfile::TempDir,
    group: String,
    out: PathBuf,
}

impl Up {
    fn start(group: &str, spec: &str) -> Up {
        let state = tempfile::tempdir().expect("tempdir");
        let spec_path = state.path().join("group.yaml");
        std::fs::write(&spec_path, spec).expect("write spec");
        let out = state.path().join("up.log");
        let log = std::fs::File::create(&out).expect("log");
        let child = Command::new(RBG)
            .arg("--state-dir")
            .arg(state.path().join("state"))
            .args(["up", "--backoff-base", "200ms", "-f"])
            .arg(&spec_path)
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

    fn apply(&self, spec: &str) -> Output {
        let p = self.state.path().join("next.yaml");
        std::fs::write(&p, spec).expect("write");
        self.rbg(&["apply", "-f", p.to_str().expect("utf-8 path")])
    }

    fn up_log(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn status(&self) -> Option<GroupStatus> {
        let out = self.rbg(&["status", "-g", &self.group, "-o", "json"]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls status until `pred` holds; `each` sees every status on the way.
    fn wait(
        &mut self,
        what: &str,
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
            if start.elapsed() > Duration::from_secs(60) {
                panic!(
                    "timed out waiting for {what}\nlast status: {last:#?}\nrbg up output:\n{}",
                    self.up_log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
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

fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

const LWS: &str = r#"
apiVersion: workloads.x-k8s.io/v1alpha2
kind: RoleBasedGroup
metadata: {name: lwsrt}
spec:
  roles:
  - name: client
    dependencies: [engine]
    standalonePattern:
      template:
        spec:
          containers:
          - {name: client, command: [sh, -c, 'echo "leader is $LEADER"; exec sleep 1000'],
             env: [{name: LEADER, value: lwsrt-engine-0.s-lwsrt-engine}]}
  - name: engine
    replicas: 2
    leaderWorkerPattern:
      size: 3
      template:
        spec:
          containers:
          - name: engine
            command: [sh, -c, 'echo "worker $LWS_WORKER_INDEX of $LWS_GROUP_SIZE, leader at $LWS_LEADER_ADDRESS"; exec sleep 1000']
      leaderTemplatePatch:
        spec:
          containers:
          - name: engine
            command: [sh, -c, 'echo leader; exec sleep 1000']
---
apiVersion: v1
kind: ConfigMap
metadata: {name: unused}
data: {a: b}
"#;

/// A leader-worker instance is three Pods with their own addresses, the
/// workers told the leader's address; killing one worker recreates the
/// whole instance (RecreateRoleInstanceOnPodRestart, upstream's default).
#[test]
fn leader_worker_instances_run_and_restart_as_units() {
    let mut up = Up::start("lwsrt", LWS);
    let s = up.wait("the group to be Ready", |_| {}, |s| s.ready);
    let e0 = instance(&s, "lwsrt-engine-0");
    let pods: Vec<&String> = e0.pods.keys().collect();
    assert_eq!(
        pods,
        ["lwsrt-engine-0", "lwsrt-engine-0-1", "lwsrt-engine-0-2"]
    );
    let addrs: std::collections::BTreeSet<&String> = e0.pods.values().collect();
    assert_eq!(
        addrs.len(),
        3,
        "each Pod has its own address: {:?}",
        e0.pods
    );
    let leader_ip = e0.pods["lwsrt-engine-0"].clone();
    assert_eq!(e0.address, leader_ip);

    let worker = e0.pids["1/engine"];
    assert!(worker > 0, "{:?}", e0.pids);
    let env = environ(worker);
    assert_eq!(env.get("LWS_LEADER_ADDRESS"), Some(&leader_ip));
    assert_eq!(env.get("LWS_GROUP_SIZE").map(String::as_str), Some("3"));
    assert_eq!(env.get("LWS_WORKER_INDEX").map(String::as_str), Some("1"));
    assert_eq!(
        env.get("HOSTNAME").map(String::as_str),
        Some("lwsrt-engine-0-1")
    );
    let leader_env = environ(e0.pids["engine"]);
    assert_eq!(
        leader_env.get("LWS_WORKER_INDEX").map(String::as_str),
        Some("0")
    );
    // The dependent saw the leader through its host name.
    let client = environ(instance(&s, "lwsrt-client-0").pids["client"]);
    assert_eq!(client.get("LEADER"), Some(&leader_ip));
    // Each Pod logs to its own place.
    let logs = up.rbg(&["logs", "lwsrt-engine-0-2"]);
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(text.contains("worker 2 of 3, leader at "), "{text}");

    // Kill one worker: the leader and the other worker go too.
    let leader = e0.pids["engine"];
    let other = e0.pids["2/engine"];
    // SAFETY: kill has no memory-safety preconditions; the pid is ours.
    unsafe { libc::kill(worker as i32, libc::SIGKILL) };
    let s = up.wait(
        "engine-0 to be recreated as a unit",
        |_| {},
        |s| {
            let i = instance(s, "lwsrt-engine-0");
            s.ready && i.restarts >= 1 && i.pids["engine"] != leader
        },
    );
    let e0 = instance(&s, "lwsrt-engine-0");
    assert_ne!(
        e0.pids["2/engine"], other,
        "the other worker was recreated too"
    );
    assert_eq!(
        e0.pods["lwsrt-engine-0"], leader_ip,
        "same identity and address"
    );
    let e1 = instance(&s, "lwsrt-engine-1");
    assert_eq!(e1.restarts, 0, "the other instance was left alone");

    // The status as upstream shapes it.
    let out = up.rbg(&["status", "-g", "lwsrt", "-o", "yaml"]);
    let y: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).expect("yaml");
    assert_eq!(
        y["apiVersion"].as_str(),
        Some("workloads.x-k8s.io/v1alpha2")
    );
    let conds = y["status"]["conditions"].as_sequence().expect("conditions");
    let ready = conds.iter().find(|c| c["type"] == "Ready").expect("Ready");
    assert_eq!(ready["status"].as_str(), Some("True"));
    let roles = y["status"]["roleStatuses"]
        .as_sequence()
        .expect("roleStatuses");
    assert_eq!(roles[1]["name"].as_str(), Some("engine"));
    assert_eq!(roles[1]["readyReplicas"].as_u64(), Some(2));
    assert!(y["status"]["observedGeneration"].as_u64().is_some());
}

fn coordinated(image: &str, cache_cmd: &str) -> String {
    format!(
        r#"
apiVersion: workloads.x-k8s.io/v1alpha2
kind: RoleBasedGroup
metadata: {{name: coordrt}}
spec:
  roleTemplates:
  - name: engine
    template:
      spec:
        containers:
        - {{name: engine, image: "{image}", command: [sleep, "1000"]}}
  roles:
  - name: cache
    rolloutStrategy:
      rollingUpdate: {{type: InPlaceOnly}}
    standalonePattern:
      template:
        spec:
          containers:
          - {{name: cache, image: "cache:v1", command: [{cache_cmd}]}}
  - name: prefill
    replicas: 4
    rolloutStrategy:
      rollingUpdate: {{type: InPlaceIfPossible, maxUnavailable: 2}}
    standalonePattern: {{templateRef: {{name: engine}}}}
  - name: decode
    replicas: 2
    rolloutStrategy:
      rollingUpdate: {{type: InPlaceIfPossible, maxUnavailable: 2}}
    standalonePattern: {{templateRef: {{name: engine}}}}
---
apiVersion: workloads.x-k8s.io/v1alpha2
kind: CoordinatedPolicy
metadata: {{name: coordrt}}
spec:
  policies:
  - name: pd
    roles: [prefill, decode]
    strategy:
      rollingUpdate: {{maxSkew: "25%"}}
"#
    )
}

/// An image change of a shared template rolls prefill (4) and decode (2)
/// in place while their updated fractions never differ by more than the
/// policy's maxSkew; an InPlaceOnly role refuses a non-image change.
#[test]
fn coordinated_rolling_update_keeps_max_skew() {
    let mut up = Up::start("coordrt", &coordinated("engine:v1", "sleep, \"1000\""));
    let before = up.wait("the group to be Ready", |_| {}, |s| s.ready);
    let out = up.apply(&coordinated("engine:v2", "sleep, \"1000\""));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut worst: f64 = 0.0;
    let mut seen = 0;
    let frac = |s: &GroupStatus, r: &str| {
        let r = s.roles.iter().find(|x| x.name == r).expect("role");
        f64::from(r.updated_replicas) / f64::from(r.replicas)
    };
    let s = up.wait(
        "both roles to be updated and ready",
        |s| {
            seen += 1;
            worst = worst.max((frac(s, "prefill") - frac(s, "decode")).abs());
        },
        |s| {
            s.ready
                && s.roles.iter().all(|r| r.updated_replicas == r.replicas)
                && s.instances.iter().all(|i| i.state == "Running")
        },
    );
    println!("max skew {worst} over {seen} statuses");
    assert!(seen > 0);
    assert!(worst <= 0.25 + 1e-9, "skew {worst} over {seen} statuses");
    // In place: same addresses and creation, one restart each.
    for i in s.instances.iter().filter(|i| i.role != "cache") {
        let b = instance(&before, &i.name);
        assert_eq!(i.address, b.address);
        assert_eq!(i.restarts, 1, "{}", i.name);
        assert!(i.started_ms >= b.started_ms);
    }
    let log = up.up_log();
    assert!(log.contains("updating in place"), "{log}");
    assert!(!log.contains("recreating"), "{log}");

    // InPlaceOnly: a command change is refused, an image change is not.
    let out = up.apply(&coordinated("engine:v2", "sleep, \"999\""));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("InPlaceOnly") && err.contains("cache"),
        "{err}"
    );
}
