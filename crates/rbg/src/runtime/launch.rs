//! The launch plan of an instance: which directories back its volumes,
//! where each mount points on the host, the facts its environment draws on,
//! the argv, environment, working directory and log of each container, its
//! readiness probe, and the stop grace.
//!
//! Pure functions of the group, the instance and the runtime's settings, so
//! that what an instance is started with can be unit-tested without starting
//! it; the supervisor creates the directories and spawns the processes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::images::ImageMap;
use super::probe::ProbeAction;
use super::process::Spawn;
use super::state::GroupDir;
use crate::discovery::{self, InstanceFacts};
use crate::planner::Millis;
use crate::spec::{
    self, Container, Group, Objects, PodRestartPolicy, PodTemplateSpec, Probe, Role, Volume,
};

/// Checks what the local runtime cannot do with a valid group: every
/// instance, surge ones included, needs a loopback address of its own.
pub fn check_local_limits(g: &Group) -> Result<(), String> {
    let mut errs = Vec::new();
    // One address slot per Pod of an instance, per role.
    let slots: usize = g.roles.iter().map(|r| r.pods.len().max(1)).sum();
    if slots > (discovery::MAX_LOCAL_SLOT as usize) + 1 {
        errs.push(format!(
            "the local runtime supports at most {} Pods per instance summed over roles (this group has {slots})",
            discovery::MAX_LOCAL_SLOT + 1
        ));
    }
    for r in &g.roles {
        let surge = r.update.max_surge_of(r.replicas);
        if u64::from(r.replicas) + u64::from(surge) > u64::from(discovery::MAX_LOCAL_INDEX) + 1 {
            errs.push(format!(
                "role {:?}: replicas {} (+ maxSurge {surge}) exceed the {} instances the local runtime can address in 127.x.y.0/24 per role",
                r.name,
                r.replicas,
                discovery::MAX_LOCAL_INDEX + 1
            ));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n"))
    }
}

/// The host directory of each volume of `instance`, in template order.
/// `emptyDir.medium: Memory` lands on tmpfs when `shm` (a `/dev/shm`
/// exists), on disk otherwise.
pub fn volume_dirs(
    dir: &GroupDir,
    instance: &str,
    t: &PodTemplateSpec,
    shm: bool,
) -> Vec<(String, PathBuf)> {
    t.spec
        .volumes
        .iter()
        .map(|v| {
            let memory = v
                .empty_dir
                .as_ref()
                .is_some_and(|e| e.medium.as_deref() == Some("Memory"));
            let path = if memory && shm {
                dir.memory_volume(instance, &v.name)
            } else {
                dir.volume(instance, &v.name)
            };
            (v.name.clone(), path)
        })
        .collect()
}

/// Where one container path of a mount lives on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMount {
    /// `mountPath` inside the container.
    pub path: String,
    /// The host directory it stands for.
    pub host: PathBuf,
    /// True when `host` is a `subPath` of the volume, which the runtime
    /// creates on first use (the volume itself exists already).
    pub sub_path: bool,
}

/// The host directory of each mount of `c` whose volume exists.
pub fn host_mounts(c: &Container, volumes: &BTreeMap<String, PathBuf>) -> Vec<HostMount> {
    c.volume_mounts
        .iter()
        .filter_map(|m| {
            let base = volumes.get(&m.name)?;
            let (host, sub_path) = match &m.sub_path {
                Some(sp) if !sp.is_empty() => (base.join(sp), true),
                _ => (base.clone(), false),
            };
            Some(HostMount {
                path: m.mount_path.clone(),
                host,
                sub_path,
            })
        })
        .collect()
}

/// The facts env and field refs of instance `index` of `role` draw on.
pub fn instance_facts(
    group: &Group,
    role: &str,
    index: u32,
    ip: Ipv4Addr,
    node: &str,
    config: &Path,
    mounts: &[HostMount],
) -> InstanceFacts {
    let annotations = group
        .role(role)
        .and_then(|r| r.template.metadata.as_ref())
        .map(|m| m.annotations.clone())
        .unwrap_or_default();
    InstanceFacts {
        group: group.name.clone(),
        namespace: group.namespace.clone(),
        role: role.to_string(),
        index,
        ip,
        labels: discovery::instance_labels(group, role),
        annotations,
        node_name: node.to_string(),
        config_path: config.display().to_string(),
        mounts: mounts
            .iter()
            .map(|m| (m.path.clone(), m.host.display().to_string()))
            .collect(),
        pod_suffix: String::new(),
        pattern_env: Vec::new(),
        objects: group.objects.clone(),
    }
}

/// Makes `facts` those of Pod `pod` of the instance: its name suffix, its
/// template's labels and annotations, and the variables its pattern injects.
pub fn pod_facts(facts: &mut InstanceFacts, group: &Group, pod: usize) {
    let Some(slot) = group.role(&facts.role).and_then(|r| r.pods.get(pod)) else {
        return;
    };
    facts.pod_suffix = slot.suffix.clone();
    if let Some(m) = &slot.template.metadata {
        for (k, v) in &m.labels {
            facts.labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        facts.annotations = m.annotations.clone();
    }
    facts.pattern_env = discovery::pattern_env(group, &facts.role, facts.index, pod);
}

/// The files a `configMap` or `secret` volume holds: every key at its
/// name, or the `items` at their paths. Any other volume holds none.
pub fn object_files(v: &Volume, objects: &Objects) -> Result<Vec<(String, String)>, String> {
    let (what, src, store) = match (&v.config_map, &v.secret) {
        (Some(s), _) => ("ConfigMap", s, &objects.config_maps),
        (None, Some(s)) => ("Secret", s, &objects.secrets),
        (None, None) => return Ok(Vec::new()),
    };
    let name = src.object();
    let Some(data) = store.get(name) else {
        if src.optional == Some(true) {
            return Ok(Vec::new());
        }
        return Err(format!("{what} {name:?} is not in the file"));
    };
    if src.items.is_empty() {
        return Ok(data.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    }
    let mut out = Vec::new();
    for item in &src.items {
        // A path that climbs out of the volume is refused, as the API does.
        if item.path.starts_with('/') || item.path.split('/').any(|p| p == "..") {
            return Err(format!(
                "items path {:?} must be relative, without ..",
                item.path
            ));
        }
        match data.get(&item.key) {
            Some(text) => out.push((item.path.clone(), text.clone())),
            None if src.optional == Some(true) => {}
            None => return Err(format!("{what} {name:?} has no key {:?}", item.key)),
        }
    }
    Ok(out)
}

/// What every container launch of a group draws on besides the instance.
#[derive(Clone, Copy, Debug)]
pub struct LaunchContext<'a> {
    /// Group host names and their local addresses.
    pub hosts: &'a [(String, String)],
    /// How images run locally.
    pub images: &'a ImageMap,
    /// Working directory of containers without `workingDir`.
    pub default_cwd: &'a Path,
}

/// The process container `c` of the instance described by `facts` starts
/// as, at `revision` after `restarts` restarts, logging to `log`. The image
/// map looks for the program in its directory, the one file-system read here.
pub fn container_spawn(
    c: &Container,
    facts: &InstanceFacts,
    ctx: &LaunchContext<'_>,
    log: PathBuf,
    revision: &str,
    restarts: u32,
) -> Result<Spawn, String> {
    let l = discovery::launch(c, facts, ctx.hosts)?;
    let (argv, path_dir) = ctx
        .images
        .resolve(&c.name, c.image.as_deref(), &l.command, l.has_command)
        .map_err(|e| e.to_string())?;
    let name = facts.name();
    // Kubernetes sets HOSTNAME to the Pod name; the container may override it.
    let mut env = vec![("HOSTNAME".to_string(), name.clone())];
    env.extend(l.env);
    let banner = format!(
        "--- rbg: starting {name} container {} at revision {revision} (restarts {restarts}): {}",
        c.name,
        argv.join(" ").replace('\n', "\\n")
    );
    Ok(Spawn {
        argv,
        env,
        path_dir,
        cwd: Some(
            l.working_dir
                .map(PathBuf::from)
                .unwrap_or_else(|| ctx.default_cwd.to_path_buf()),
        ),
        log,
        banner,
    })
}

/// The readiness probe `p` of container `c` resolved against the instance
/// at `ip`: group host names become instance addresses, other host names go
/// through `resolve` (the system resolver in the runtime). An exec probe
/// runs with the container's full `env` and `cwd`.
pub fn probe_action(
    p: &Probe,
    c: &Container,
    ip: Ipv4Addr,
    hosts: &[(String, String)],
    env: &[(String, String)],
    cwd: Option<PathBuf>,
    resolve: &dyn Fn(&str, u16) -> Option<SocketAddr>,
) -> Result<ProbeAction, String> {
    let host_addr = |host: &Option<String>, port: u16| -> Result<SocketAddr, String> {
        let h = host.as_deref().unwrap_or("");
        if h.is_empty() {
            return Ok(SocketAddr::new(ip.into(), port));
        }
        // Group host names resolve to instance addresses, like everywhere else.
        let h = discovery::rewrite_hosts(h, hosts);
        if let Ok(a) = h.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(a, port));
        }
        resolve(&h, port).ok_or_else(|| format!("readinessProbe host {h:?} does not resolve"))
    };
    if let Some(t) = &p.tcp_socket {
        let port = spec::resolve_port(c, &t.port)?;
        return Ok(ProbeAction::Tcp(host_addr(&t.host, port)?));
    }
    if let Some(h) = &p.http_get {
        let port = spec::resolve_port(c, &h.port)?;
        let addr = host_addr(&h.host, port)?;
        return Ok(ProbeAction::Http {
            addr,
            host: addr.to_string(),
            path: h.path.clone().unwrap_or_else(|| "/".into()),
            headers: h
                .http_headers
                .iter()
                .map(|x| (x.name.clone(), x.value.clone()))
                .collect(),
        });
    }
    if let Some(x) = &p.exec {
        // Kubernetes does not expand $(VAR) in probe commands; group host
        // names still resolve, as they would through cluster DNS.
        return Ok(ProbeAction::Exec {
            argv: x
                .command
                .iter()
                .map(|a| discovery::rewrite_hosts(a, hosts))
                .collect(),
            env: env.to_vec(),
            cwd,
        });
    }
    Err("readinessProbe has no handler".to_string())
}

/// Time between SIGTERM and SIGKILL when stopping an instance of `role`:
/// the template's grace, or `default`, but never more than `max` (a local
/// `down` should not take Kubernetes' 30 s).
pub fn stop_grace(role: Option<&Role>, default: Duration, max: Duration) -> Millis {
    let g = role
        .and_then(|r| r.template.spec.termination_grace_period_seconds)
        .map_or(default, Duration::from_secs)
        .min(max);
    u64::try_from(g.as_millis()).unwrap_or(u64::MAX)
}

/// Whether a container that exited (`success`: with status 0) is started
/// again under the Pod's restart policy.
pub fn restarts_after_exit(policy: PodRestartPolicy, success: bool) -> bool {
    match policy {
        PodRestartPolicy::Always => true,
        PodRestartPolicy::OnFailure => !success,
        PodRestartPolicy::Never => false,
    }
}

/// The containers an in-place restart from template `old` to `new` must
/// restart: those whose spec changed, and any not running (a crash
/// restart). `containers` is `(name, running)` of the instance.
pub fn containers_to_restart<'a>(
    old: Option<&PodTemplateSpec>,
    new: Option<&PodTemplateSpec>,
    containers: impl IntoIterator<Item = (&'a str, bool)>,
) -> BTreeSet<String> {
    fn find<'t>(t: Option<&'t PodTemplateSpec>, name: &str) -> Option<&'t Container> {
        t.and_then(|t| t.spec.containers.iter().find(|x| x.name == name))
    }
    containers
        .into_iter()
        .filter(|(name, running)| find(old, name) != find(new, name) || !running)
        .map(|(name, _)| name.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GROUP: &str = r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: demo}
spec:
  roles:
  - name: master
    template:
      metadata:
        labels: {app: kv}
        annotations: {note: hi}
      spec:
        terminationGracePeriodSeconds: 3
        volumes: [{name: data, emptyDir: {}}, {name: shm, emptyDir: {medium: Memory}}]
        containers:
        - name: m
          image: "kvpool:v1"
          command: [kvpool, master, "--addr=demo-master-0.s-demo-master:1", "--dir=/data"]
          args: ["$(ROLE_NAME)"]
          env: [{name: ME, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
          ports: [{name: rpc, containerPort: 50051}]
          volumeMounts: [{name: data, mountPath: /data}, {name: data, mountPath: /logs, subPath: log}]
        - name: side
          image: side:v1
          workingDir: /data/w
"#;

    fn group() -> Group {
        spec::load(GROUP).expect("test group loads").group
    }

    fn dir() -> GroupDir {
        GroupDir::new(Path::new("/state"), "demo")
    }

    fn facts(g: &Group, mounts: &[HostMount]) -> InstanceFacts {
        let ip = Ipv4Addr::new(127, 9, 1, 1);
        instance_facts(
            g,
            "master",
            0,
            ip,
            "node1",
            Path::new("/state/demo/config.yaml"),
            mounts,
        )
    }

    fn volumes(g: &Group) -> BTreeMap<String, PathBuf> {
        volume_dirs(&dir(), "demo-master-0", &g.roles[0].template, false)
            .into_iter()
            .collect()
    }

    #[test]
    fn memory_volumes_go_to_tmpfs_only_when_there_is_one() {
        let g = group();
        let t = &g.roles[0].template;
        let d = dir();
        let on_disk = volume_dirs(&d, "demo-master-0", t, false);
        assert_eq!(
            on_disk,
            vec![
                ("data".to_string(), d.volume("demo-master-0", "data")),
                ("shm".to_string(), d.volume("demo-master-0", "shm")),
            ]
        );
        let with_shm = volume_dirs(&d, "demo-master-0", t, true);
        assert_eq!(with_shm[0].1, d.volume("demo-master-0", "data"));
        assert_eq!(with_shm[1].1, d.memory_volume("demo-master-0", "shm"));
    }

    #[test]
    fn mounts_point_at_volume_dirs_and_sub_paths() {
        let g = group();
        let vols = volumes(&g);
        let c = &g.roles[0].template.spec.containers[0];
        let data = vols["data"].clone();
        assert_eq!(
            host_mounts(c, &vols),
            vec![
                HostMount {
                    path: "/data".into(),
                    host: data.clone(),
                    sub_path: false
                },
                HostMount {
                    path: "/logs".into(),
                    host: data.join("log"),
                    sub_path: true
                },
            ]
        );
        // A mount whose volume has no directory is left out.
        assert!(host_mounts(c, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn facts_carry_labels_annotations_and_mounts() {
        let g = group();
        let vols = volumes(&g);
        let mounts = host_mounts(&g.roles[0].template.spec.containers[0], &vols);
        let f = facts(&g, &mounts);
        assert_eq!(f.name(), "demo-master-0");
        assert_eq!(f.namespace, "default");
        assert_eq!(f.labels.get("app").map(String::as_str), Some("kv"));
        assert_eq!(
            f.labels.get(spec::LABEL_ROLE).map(String::as_str),
            Some("master")
        );
        assert_eq!(f.annotations.get("note").map(String::as_str), Some("hi"));
        assert_eq!(f.config_path, "/state/demo/config.yaml");
        assert_eq!(
            f.mounts[0],
            ("/data".to_string(), vols["data"].display().to_string())
        );
    }

    #[test]
    fn spawn_has_rewritten_argv_env_cwd_and_banner() {
        let g = group();
        let vols = volumes(&g);
        let c = &g.roles[0].template.spec.containers[0];
        let f = facts(&g, &host_mounts(c, &vols));
        let hosts =
            discovery::host_table(&g, &|_, i, _| Some(Ipv4Addr::new(127, 9, 1, i as u8 + 1)));
        let images = ImageMap::default();
        let ctx = LaunchContext {
            hosts: &hosts,
            images: &images,
            default_cwd: Path::new("/work"),
        };
        let log = PathBuf::from("/state/demo/m.log");
        let s = container_spawn(c, &f, &ctx, log.clone(), "abc", 2).expect("spawn plan");
        let data = vols["data"].display().to_string();
        assert_eq!(
            s.argv,
            vec![
                "kvpool".to_string(),
                "master".to_string(),
                "--addr=127.9.1.1:1".to_string(),
                format!("--dir={data}"),
                "master".to_string(),
            ]
        );
        assert_eq!(
            s.env[0],
            ("HOSTNAME".to_string(), "demo-master-0".to_string())
        );
        assert!(s.env.contains(&("ME".to_string(), "127.9.1.1".to_string())));
        assert!(s
            .env
            .contains(&("RBG_ROLE_INDEX".to_string(), "0".to_string())));
        assert_eq!(s.cwd, Some(PathBuf::from("/work")));
        assert_eq!(s.log, log);
        assert!(
            s.banner.starts_with(
                "--- rbg: starting demo-master-0 container m at revision abc (restarts 2): kvpool master"
            ),
            "{}",
            s.banner
        );

        // workingDir under a mount is rewritten; no command and no image
        // entry is an error naming the container.
        let side = &g.roles[0].template.spec.containers[1];
        let mut with_cmd = side.clone();
        with_cmd.command = vec!["sleep".into()];
        let s = container_spawn(&with_cmd, &f, &ctx, log.clone(), "abc", 0).expect("plan");
        assert_eq!(s.cwd, Some(PathBuf::from(format!("{data}/w"))));
        let e = container_spawn(side, &f, &ctx, log, "abc", 0).expect_err("no command");
        assert!(e.contains("\"side\""), "{e}");
    }

    #[test]
    fn probes_resolve_ports_and_hosts() {
        let g = group();
        let c = &g.roles[0].template.spec.containers[0];
        let ip = Ipv4Addr::new(127, 9, 1, 1);
        let hosts = vec![("s-demo-master".to_string(), "127.9.1.1".to_string())];
        let nowhere = |_: &str, _: u16| None;
        let probe = |yaml: &str| -> Probe { serde_yaml::from_str(yaml).expect("probe yaml") };

        let tcp = probe("tcpSocket: {port: rpc}");
        assert_eq!(
            probe_action(&tcp, c, ip, &hosts, &[], None, &nowhere),
            Ok(ProbeAction::Tcp(SocketAddr::new(ip.into(), 50051)))
        );
        let http = probe("httpGet: {port: 8080, host: s-demo-master, path: /ready}");
        match probe_action(&http, c, ip, &hosts, &[], None, &nowhere) {
            Ok(ProbeAction::Http { addr, path, .. }) => {
                assert_eq!(addr, SocketAddr::new(ip.into(), 8080));
                assert_eq!(path, "/ready");
            }
            other => panic!("{other:?}"),
        }
        let elsewhere = probe("tcpSocket: {port: 1, host: example.invalid}");
        let e = probe_action(&elsewhere, c, ip, &hosts, &[], None, &nowhere).expect_err("no dns");
        assert!(e.contains("does not resolve"), "{e}");
        let resolved = SocketAddr::new(Ipv4Addr::new(10, 0, 0, 1).into(), 1);
        let dns = move |_: &str, _: u16| Some(resolved);
        assert_eq!(
            probe_action(&elsewhere, c, ip, &hosts, &[], None, &dns),
            Ok(ProbeAction::Tcp(resolved))
        );
        let exec = probe("exec: {command: [check, s-demo-master]}");
        let env = vec![("A".to_string(), "1".to_string())];
        assert_eq!(
            probe_action(&exec, c, ip, &hosts, &env, Some("/w".into()), &nowhere),
            Ok(ProbeAction::Exec {
                argv: vec!["check".into(), "127.9.1.1".into()],
                env,
                cwd: Some("/w".into()),
            })
        );
        let bad_port = probe("tcpSocket: {port: nope}");
        assert!(probe_action(&bad_port, c, ip, &hosts, &[], None, &nowhere).is_err());
    }

    #[test]
    fn grace_is_the_templates_capped() {
        let g = group();
        let s = Duration::from_secs;
        assert_eq!(stop_grace(g.role("master"), s(5), s(10)), 3_000);
        assert_eq!(stop_grace(g.role("master"), s(5), s(2)), 2_000);
        assert_eq!(stop_grace(None, s(5), s(10)), 5_000);
    }

    #[test]
    fn restart_policy_table() {
        use PodRestartPolicy::*;
        let cases = [
            (Always, true, true),
            (Always, false, true),
            (OnFailure, true, false),
            (OnFailure, false, true),
            (Never, true, false),
            (Never, false, false),
        ];
        for (policy, success, want) in cases {
            assert_eq!(
                restarts_after_exit(policy, success),
                want,
                "{policy:?} {success}"
            );
        }
    }

    #[test]
    fn in_place_restarts_changed_and_stopped_containers() {
        let g = group();
        let old = g.roles[0].template.clone();
        let mut new = old.clone();
        new.spec.containers[1].image = Some("side:v2".into());
        let restart = containers_to_restart(Some(&old), Some(&new), [("m", true), ("side", true)]);
        assert_eq!(restart, BTreeSet::from(["side".to_string()]));
        let restart = containers_to_restart(Some(&old), Some(&old), [("m", false), ("side", true)]);
        assert_eq!(restart, BTreeSet::from(["m".to_string()]));
    }

    #[test]
    fn local_limits() {
        let g = group();
        assert!(check_local_limits(&g).is_ok());
        let mut big = g.clone();
        big.roles[0].replicas = 255;
        big.roles[0].update.max_surge = spec::Amount::Count(1);
        let e = check_local_limits(&big).expect_err("256 instances");
        assert!(e.contains("role \"master\""), "{e}");
    }
}
