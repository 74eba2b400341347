//! The process side of the supervisor: carrying out the planner's actions,
//! creating instances and starting their containers from the launch plan,
//! reaping exits, finishing stops, and stopping the group in order.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::instance::{remove_volumes, stop_containers, Ctr, CtrState, Instance, Pending, PodRec};
use super::{unix_ms, Supervisor};
use crate::discovery;
use crate::planner::{Action, Crash, Millis};
use crate::revision;
use crate::runtime::launch;
use crate::runtime::probe::{ProbeAction, ProbeState, ProbeTiming};
use crate::runtime::process;
use crate::spec::{Pattern, PodSlot, Role};

impl Supervisor {
    /// Collects exits of container processes.
    pub(super) fn reap(&mut self, now: Millis) {
        let reset = u64::try_from(self.opts.backoff_reset.as_millis()).unwrap_or(u64::MAX);
        let mut lines = Vec::new();
        for inst in self.instances.values_mut() {
            let role = self.group.role(&inst.role);
            for c in &mut inst.ctrs {
                let policy = role
                    .and_then(|r| r.pods.get(c.pod))
                    .and_then(|p| p.template.spec.restart_policy)
                    .unwrap_or_default();
                let Some(child) = c.child.as_mut() else {
                    continue;
                };
                match child.try_wait() {
                    Ok(None) => {
                        if let CtrState::Stopping { deadline } = c.state {
                            if now >= deadline {
                                process::signal_group(c.pid, libc::SIGKILL);
                            }
                        }
                        continue;
                    }
                    Ok(Some(status)) => {
                        // The leader is gone; take any stragglers of its group
                        // with it, as a container's PID namespace would.
                        process::signal_group(c.pid, libc::SIGKILL);
                        c.child = None;
                        if matches!(c.state, CtrState::Stopping { .. }) {
                            c.state = CtrState::Stopped;
                            continue;
                        }
                        if !launch::restarts_after_exit(policy, status.success()) {
                            c.state = CtrState::Completed;
                            lines.push(format!(
                                "{}: container {} exited ({status}); restartPolicy {policy:?} keeps it down",
                                inst.name, c.spec.name
                            ));
                            continue;
                        }
                        c.state = CtrState::Exited;
                        let ran = now.saturating_sub(c.started);
                        inst.streak = if ran >= reset { 1 } else { inst.streak + 1 };
                        inst.crash = Some(Crash {
                            at: now,
                            streak: inst.streak,
                        });
                        lines.push(format!(
                            "{}: container {} exited ({status}) after {:.1}s; restart in {:.1}s",
                            inst.name,
                            c.spec.name,
                            ran as f64 / 1000.0,
                            self.opts.backoff.delay(inst.streak) as f64 / 1000.0
                        ));
                    }
                    Err(e) => {
                        lines.push(format!("{}: waiting on {}: {e}", inst.name, c.spec.name));
                    }
                }
            }
        }
        for l in lines {
            self.say(&l);
        }
    }

    /// Finishes stops that completed: restarts, recreates or removes.
    pub(super) fn advance_pending(&mut self, now: Millis) {
        let keys: Vec<(String, u32)> = self
            .instances
            .iter()
            .filter(|(_, i)| i.pending.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(inst) = self.instances.get(&key) else {
                continue;
            };
            let Some(pending) = inst.pending.clone() else {
                continue;
            };
            let stopping = |names: Option<&BTreeSet<String>>| {
                inst.ctrs
                    .iter()
                    .filter(|c| names.is_none_or(|n| n.contains(&c.key)))
                    .any(Ctr::alive)
            };
            match pending {
                Pending::InPlace(names) => {
                    if stopping(Some(&names)) {
                        continue;
                    }
                    self.finish_in_place(&key, &names, now);
                }
                Pending::Recreate => {
                    if stopping(None) {
                        continue;
                    }
                    let Some(old) = self.instances.remove(&key) else {
                        continue;
                    };
                    remove_volumes(&old);
                    self.create(&key.0, key.1, &old.revision, old.restarts, old.streak, now);
                }
                Pending::Delete => {
                    if stopping(None) {
                        continue;
                    }
                    if let Some(old) = self.instances.remove(&key) {
                        remove_volumes(&old);
                        let name = old.name.clone();
                        self.say(&format!("{name}: deleted"));
                    }
                }
            }
        }
    }

    pub(super) fn finish_in_place(
        &mut self,
        key: &(String, u32),
        names: &BTreeSet<String>,
        now: Millis,
    ) {
        let Some(pods) = self
            .instances
            .get(key)
            .and_then(|i| self.templates.get(&(i.role.clone(), i.revision.clone())))
            .cloned()
        else {
            return;
        };
        let Some(inst) = self.instances.get_mut(key) else {
            return;
        };
        inst.pending = None;
        inst.crash = None;
        let mut restarted = Vec::new();
        for i in 0..inst.ctrs.len() {
            if !names.contains(&inst.ctrs[i].key) {
                continue;
            }
            let (pod, name) = (inst.ctrs[i].pod, inst.ctrs[i].spec.name.clone());
            if let Some(spec) = pods
                .get(pod)
                .and_then(|p| p.template.spec.containers.iter().find(|c| c.name == name))
            {
                inst.ctrs[i].spec = spec.clone();
            }
            inst.restarts += 1;
            restarted.push(i);
        }
        for i in restarted {
            self.start_container(key, i, now);
        }
    }

    pub(super) async fn act(&mut self, a: Action, now: Millis) {
        match a {
            Action::Create {
                role,
                index,
                revision,
            } => {
                let streak = self
                    .saved_streaks
                    .remove(&(role.clone(), index))
                    .unwrap_or(0);
                self.create(&role, index, &revision, 0, streak, now)
            }
            Action::Delete { role, index } => {
                let grace = self.grace(&role);
                if let Some(inst) = self.instances.get_mut(&(role, index)) {
                    inst.pending = Some(Pending::Delete);
                    stop_containers(inst, None, now + grace);
                    let name = inst.name.clone();
                    self.say(&format!("{name}: stopping to delete"));
                }
            }
            Action::Recreate {
                role,
                index,
                revision,
            } => {
                let grace = self.grace(&role);
                let shape = self.shape_of(&role, &revision);
                if let Some(inst) = self.instances.get_mut(&(role, index)) {
                    inst.pending = Some(Pending::Recreate);
                    if inst.crash.take().is_some() {
                        // RecreateRoleInstanceOnPodRestart: the crash counts.
                        inst.restarts += 1;
                    }
                    let line = format!("{}: recreating at {revision}", inst.name);
                    inst.revision = revision;
                    inst.shape = shape;
                    stop_containers(inst, None, now + grace);
                    self.say(&line);
                }
            }
            Action::RestartInPlace {
                role,
                index,
                revision,
            } => {
                let grace = self.grace(&role);
                let key = (role.clone(), index);
                let old = self
                    .instances
                    .get(&key)
                    .and_then(|i| self.templates.get(&(role.clone(), i.revision.clone())))
                    .cloned();
                let new = self
                    .templates
                    .get(&(role.clone(), revision.clone()))
                    .cloned();
                let shape = self.shape_of(&role, &revision);
                let Some(inst) = self.instances.get_mut(&key) else {
                    return;
                };
                // Restart the containers whose spec changed, and any that is
                // not running (a crash restart), Pod by Pod.
                let mut names = BTreeSet::new();
                for p in 0..inst.pods.len() {
                    let slot = |t: &Option<Vec<PodSlot>>| {
                        t.as_ref()
                            .and_then(|t| t.get(p))
                            .map(|s| s.template.clone())
                    };
                    let ctrs: Vec<&Ctr> = inst.ctrs.iter().filter(|c| c.pod == p).collect();
                    let restart = launch::containers_to_restart(
                        slot(&old).as_ref(),
                        slot(&new).as_ref(),
                        ctrs.iter()
                            .map(|c| (c.spec.name.as_str(), matches!(c.state, CtrState::Running))),
                    );
                    for c in ctrs {
                        if restart.contains(&c.spec.name) {
                            names.insert(c.key.clone());
                        }
                    }
                }
                let line = if inst.revision == revision {
                    format!("{}: restarting {}", inst.name, join(&names))
                } else {
                    format!(
                        "{}: updating in place {} -> {revision} (restarting {})",
                        inst.name,
                        inst.revision,
                        join(&names)
                    )
                };
                inst.revision = revision;
                inst.shape = shape;
                inst.crash = None;
                inst.pending = Some(Pending::InPlace(names.clone()));
                stop_containers(inst, Some(&names), now + grace);
                self.say(&line);
                // Containers already down restart on this very pass.
                self.advance_pending(now);
            }
            Action::RecreateGroup { reason } => {
                self.say(&format!("recreating the whole group: {reason}"));
                self.group_restarts += 1;
                self.saved_streaks = self
                    .instances
                    .iter()
                    .map(|(k, i)| (k.clone(), i.streak))
                    .collect();
                self.stop_all().await;
            }
        }
    }

    pub(super) fn shape_of(&self, role: &str, rev: &str) -> String {
        let Some(pods) = self.templates.get(&(role.to_string(), rev.to_string())) else {
            return String::new();
        };
        let mut r = self.group.role(role).cloned().unwrap_or_else(|| Role {
            name: role.to_string(),
            replicas: 0,
            dependencies: Vec::new(),
            restart_policy: Default::default(),
            update: Default::default(),
            service_ports: Vec::new(),
            template: Default::default(),
            pods: Vec::new(),
            pattern: Pattern::Standalone,
            workload_kind: String::new(),
            min_ready_seconds: 0,
            ordered: false,
            restart_delays: None,
        });
        r.pods = pods.clone();
        revision::role_shape(&r)
    }

    pub(super) fn grace(&self, role: &str) -> Millis {
        launch::stop_grace(
            self.group.role(role),
            self.opts.default_grace,
            self.opts.max_grace,
        )
    }

    /// Creates instance `index` of `role` at `rev` and starts its containers.
    pub(super) fn create(
        &mut self,
        role: &str,
        index: u32,
        rev: &str,
        restarts: u32,
        streak: u32,
        now: Millis,
    ) {
        let Some(slots) = self
            .templates
            .get(&(role.to_string(), rev.to_string()))
            .cloned()
        else {
            self.say(&format!("{role}-{index}: no template for revision {rev}"));
            return;
        };
        let name = discovery::instance_name(&self.group.name, role, index);
        let shm = Path::new("/dev/shm").is_dir();
        let mut pods = Vec::new();
        let mut ctrs = Vec::new();
        for (p, slot) in slots.iter().enumerate() {
            let Some(ip) = self.pod_address(role, index, p) else {
                self.say(&format!("{name}: no local address"));
                return;
            };
            let pod_name = format!("{name}{}", slot.suffix);
            let mut volumes = BTreeMap::new();
            for (volume, path) in launch::volume_dirs(&self.dir, &pod_name, &slot.template, shm) {
                if let Err(e) = std::fs::create_dir_all(&path) {
                    self.say(&format!(
                        "{pod_name}: creating volume {}: {e}",
                        path.display()
                    ));
                }
                volumes.insert(volume, path);
            }
            // ConfigMap and Secret volumes get their files now, as the
            // kubelet writes them before the containers start.
            for v in &slot.template.spec.volumes {
                let Some(dir) = volumes.get(&v.name) else {
                    continue;
                };
                match launch::object_files(v, &self.group.objects) {
                    Ok(files) => {
                        for (rel, text) in files {
                            let path = dir.join(rel);
                            if let Some(parent) = path.parent() {
                                let _ = std::fs::create_dir_all(parent);
                            }
                            if let Err(e) = std::fs::write(&path, text) {
                                self.say(&format!("{pod_name}: writing {}: {e}", path.display()));
                            }
                        }
                    }
                    Err(m) => self.say(&format!("{pod_name}: volume {:?}: {m}", v.name)),
                }
            }
            for c in &slot.template.spec.containers {
                ctrs.push(Ctr {
                    pod: p,
                    key: if slot.suffix.is_empty() {
                        c.name.clone()
                    } else {
                        format!("{}/{}", slot.suffix.trim_start_matches('-'), c.name)
                    },
                    spec: c.clone(),
                    child: None,
                    pid: 0,
                    epoch: 0,
                    started: now,
                    state: CtrState::Stopped,
                    probe: None,
                });
            }
            pods.push(PodRec {
                name: pod_name,
                ip,
                volumes,
            });
        }
        let Some(ip) = pods.first().map(|p| p.ip) else {
            self.say(&format!("{name}: the role has no Pods"));
            return;
        };
        let mut r = self.group.role(role).cloned();
        if let Some(r) = r.as_mut() {
            r.pods = slots;
        }
        let inst = Instance {
            role: role.to_string(),
            index,
            name: name.clone(),
            ip,
            revision: rev.to_string(),
            shape: r.as_ref().map(revision::role_shape).unwrap_or_default(),
            created: Instant::now(),
            restarts,
            crash: None,
            streak,
            ctrs,
            pending: None,
            pods,
            started_ms: unix_ms(),
            ready_since_ms: None,
        };
        let n = inst.ctrs.len();
        let key = (role.to_string(), index);
        self.instances.insert(key.clone(), inst);
        self.say(&format!("{name}: created at {rev} on {ip}"));
        for i in 0..n {
            self.start_container(&key, i, now);
        }
    }

    /// Starts container `ci` of an instance; a failure counts as a crash.
    pub(super) fn start_container(&mut self, key: &(String, u32), ci: usize, now: Millis) {
        self.epoch += 1;
        let epoch = self.epoch;
        let Some(inst) = self.instances.get_mut(key) else {
            return;
        };
        let Some(c) = inst.ctrs.get_mut(ci) else {
            return;
        };
        let Some(pod) = inst.pods.get(c.pod) else {
            return;
        };
        let pod_ip = pod.ip;
        let mounts = launch::host_mounts(&c.spec, &pod.volumes);
        for m in mounts.iter().filter(|m| m.sub_path) {
            let _ = std::fs::create_dir_all(&m.host);
        }
        let mut facts = launch::instance_facts(
            &self.group,
            &key.0,
            key.1,
            pod_ip,
            &self.node,
            &self.dir.config(),
            &mounts,
        );
        launch::pod_facts(&mut facts, &self.group, c.pod);
        let ctx = launch::LaunchContext {
            hosts: &self.hosts,
            images: &self.opts.images,
            default_cwd: &self.opts.cwd,
        };
        let log = self.dir.log(&pod.name, &c.spec.name);
        let spawned = launch::container_spawn(
            &c.spec,
            &facts,
            &ctx,
            log.clone(),
            &inst.revision,
            inst.restarts,
        )
        .and_then(|spawn| {
            let full_env = spawn.environment();
            process::spawn(&spawn)
                .map(|child| (child, full_env, spawn.cwd.clone()))
                .map_err(|e| format!("starting {}: {e}", spawn.argv.join(" ")))
        });
        c.epoch = epoch;
        c.started = now;
        let mut probe_error = None;
        match spawned {
            Ok((child, full_env, cwd)) => {
                c.pid = child.id();
                c.child = Some(child);
                c.state = CtrState::Running;
                c.probe = None;
                if let Some(p) = c.spec.readiness_probe.as_ref() {
                    let timing = ProbeTiming::of(p);
                    match launch::probe_action(
                        p,
                        &c.spec,
                        pod_ip,
                        &self.hosts,
                        &full_env,
                        cwd,
                        &dns_resolve,
                    ) {
                        Ok(action) => c.probe = Some((ProbeState::new(timing, now), action)),
                        Err(m) => {
                            // Never ready rather than ready without checking.
                            let mut never = ProbeState::new(timing, u64::MAX / 2);
                            never.in_flight = true;
                            let action = ProbeAction::Exec {
                                argv: Vec::new(),
                                env: Vec::new(),
                                cwd: None,
                            };
                            c.probe = Some((never, action));
                            probe_error =
                                Some(format!("{}: container {}: {m}", inst.name, c.spec.name));
                        }
                    }
                }
                inst.started_ms = unix_ms();
            }
            Err(msg) => {
                use std::io::Write as _;
                if let Some(parent) = log.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                {
                    let _ = writeln!(f, "--- rbg: {msg}");
                }
                c.state = CtrState::Exited;
                c.pid = 0;
                inst.streak += 1;
                inst.crash = Some(Crash {
                    at: now,
                    streak: inst.streak,
                });
                let line = format!("{}: container {}: {msg}", inst.name, c.spec.name);
                self.say(&line);
            }
        }
        if let Some(m) = probe_error {
            self.say(&m);
        }
    }

    /// Stops every instance, highest dependency level first, each level
    /// waiting for the previous one to be gone; then deletes them.
    pub(super) async fn stop_all(&mut self) {
        let levels = self.levels.clone();
        let mut order: Vec<Vec<(String, u32)>> = Vec::new();
        // Instances of roles no longer in the spec go first.
        order.push(
            self.instances
                .keys()
                .filter(|(r, _)| !levels.iter().any(|l| l.contains(r)))
                .cloned()
                .collect(),
        );
        for level in levels.iter().rev() {
            order.push(
                self.instances
                    .keys()
                    .filter(|(r, _)| level.contains(r))
                    .cloned()
                    .collect(),
            );
        }
        for keys in order {
            if keys.is_empty() {
                continue;
            }
            let now = self.now();
            let mut deadline = now;
            for k in &keys {
                let grace = self.grace(&k.0);
                deadline = deadline.max(now + grace);
                if let Some(inst) = self.instances.get_mut(k) {
                    stop_containers(inst, None, now + grace);
                }
            }
            loop {
                let now = self.now();
                self.reap(now);
                let alive = keys.iter().any(|k| {
                    self.instances
                        .get(k)
                        .is_some_and(|i| i.ctrs.iter().any(Ctr::alive))
                });
                if !alive {
                    break;
                }
                if now > deadline + 2_000 {
                    // SIGKILL was sent at the deadline; a process that still
                    // has not been reaped is stuck in the kernel. Move on.
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let roles: BTreeSet<&str> = keys.iter().map(|k| k.0.as_str()).collect();
            let roles = roles.into_iter().collect::<Vec<_>>().join(", ");
            self.say(&format!("stopped {roles}"));
            for k in &keys {
                if let Some(inst) = self.instances.remove(k) {
                    remove_volumes(&inst);
                }
            }
        }
    }
}

fn join(names: &BTreeSet<String>) -> String {
    names.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// The system resolver, for probe hosts outside the group.
fn dns_resolve(host: &str, port: u16) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
}
