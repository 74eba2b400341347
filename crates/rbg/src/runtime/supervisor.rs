//! The supervisor: the I/O shell around the planner for the local runtime.
//!
//! One loop on one thread (a current-thread tokio runtime, so every child is
//! forked from the same thread and `PR_SET_PDEATHSIG` stays meaningful):
//! every tick it reaps exited processes, advances pending stops, schedules
//! readiness probes, asks [`crate::planner::plan`] what to do and does it.
//! Control requests and probe results arrive on channels between ticks.
//! The planner owns every decision; this file only observes and executes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::net::UnixListener;
use tokio::sync::mpsc;

use super::control::{self, Incoming, Request, Response};
use super::images::ImageMap;
use super::launch;
pub use super::launch::check_local_limits;
use super::probe::{self, ProbeAction, ProbeState, ProbeTiming};
use super::process;
use super::state::{GroupDir, GroupStatus, HistoryEntry, InstanceStatus, RoleStatus};
use crate::discovery;
use crate::planner::{self, Action, Backoff, Crash, DesiredRole, Millis, ObservedInstance, Wait};
use crate::revision;
use crate::spec::{self, Container, Group, PodTemplateSpec};

/// Settings of a local run.
pub struct Options {
    /// The state directory (holds one directory per group).
    pub state_dir: PathBuf,
    /// The image map.
    pub images: ImageMap,
    /// Crash restart backoff.
    pub backoff: Backoff,
    /// A container that ran this long before crashing restarts its backoff.
    pub backoff_reset: Duration,
    /// Time between passes.
    pub tick: Duration,
    /// Stop grace when the template sets none.
    pub default_grace: Duration,
    /// Upper bound on any stop grace (a local `down` should not take 30 s).
    pub max_grace: Duration,
    /// Working directory of containers without `workingDir`.
    pub cwd: PathBuf,
    /// Receives progress lines for the user.
    pub report: Box<dyn FnMut(&str) + Send>,
}

impl Options {
    /// Defaults for `state_dir`, printing progress to stdout.
    pub fn new(state_dir: PathBuf) -> Options {
        Options {
            state_dir,
            images: ImageMap::default(),
            backoff: Backoff::default(),
            backoff_reset: Duration::from_secs(60),
            tick: Duration::from_millis(100),
            default_grace: Duration::from_secs(5),
            max_grace: Duration::from_secs(10),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            report: Box::new(|line| println!("{line}")),
        }
    }
}

/// Errors that stop a local run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The spec does not load or breaks a local-runtime limit.
    #[error("{0}")]
    Spec(String),
    /// Another `rbg up` already runs this group.
    #[error("group {group:?} is already running (control socket {socket}); use `rbg apply` to change it or `rbg down` to stop it")]
    AlreadyRunning {
        /// Group name.
        group: String,
        /// Its socket.
        socket: String,
    },
    /// State directory or socket trouble.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

#[derive(Debug)]
enum CtrState {
    /// Never started, or stopped on purpose.
    Stopped,
    Running,
    Stopping {
        deadline: Millis,
    },
    /// Exited on its own and will be restarted.
    Exited,
    /// Exited and the Pod restart policy says it stays down.
    Completed,
}

struct Ctr {
    spec: Container,
    child: Option<Child>,
    pid: u32,
    /// Bumped on every start so late probe results of an earlier process
    /// are ignored.
    epoch: u64,
    started: Millis,
    state: CtrState,
    probe: Option<(ProbeState, ProbeAction)>,
}

impl Ctr {
    fn alive(&self) -> bool {
        matches!(self.state, CtrState::Running | CtrState::Stopping { .. })
    }
    fn ready(&self) -> bool {
        matches!(self.state, CtrState::Running) && self.probe.as_ref().is_none_or(|(p, _)| p.ready)
    }
}

#[derive(Debug, Clone)]
enum Pending {
    /// Restart these containers at the instance's (new) revision.
    InPlace(BTreeSet<String>),
    /// Delete and start again at the instance's (new) revision.
    Recreate,
    Delete,
}

struct Instance {
    role: String,
    index: u32,
    name: String,
    ip: Ipv4Addr,
    revision: String,
    shape: String,
    created: Instant,
    restarts: u32,
    crash: Option<Crash>,
    streak: u32,
    ctrs: Vec<Ctr>,
    pending: Option<Pending>,
    volumes: BTreeMap<String, PathBuf>,
    started_ms: u64,
    ready_since_ms: Option<u64>,
}

impl Instance {
    fn ready(&self) -> bool {
        self.pending.is_none()
            && self.crash.is_none()
            && !self.ctrs.is_empty()
            && self.ctrs.iter().all(Ctr::ready)
    }
    fn running(&self) -> bool {
        self.ctrs.iter().any(Ctr::alive)
    }
    fn state(&self) -> &'static str {
        match (&self.pending, &self.crash) {
            (Some(Pending::Delete), _) => "Terminating",
            (Some(_), _) => "Restarting",
            (None, Some(c)) if c.streak > 1 => "CrashLoopBackOff",
            (None, Some(_)) => "Error",
            (None, None) => {
                if self
                    .ctrs
                    .iter()
                    .all(|c| matches!(c.state, CtrState::Completed))
                {
                    "Completed"
                } else if self.ready() {
                    "Running"
                } else {
                    "Starting"
                }
            }
        }
    }
}

struct ProbeResult {
    key: (String, u32),
    container: usize,
    epoch: u64,
    passed: bool,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // on success (truncation is handled by searching for the NUL).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_string();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The running group.
pub struct Supervisor {
    opts: Options,
    dir: GroupDir,
    octet: u8,
    group: Group,
    desired: Vec<DesiredRole>,
    levels: Vec<Vec<String>>,
    slots: BTreeMap<String, u32>,
    templates: BTreeMap<(String, String), PodTemplateSpec>,
    current_revision: BTreeMap<String, String>,
    instances: BTreeMap<(String, u32), Instance>,
    history: Vec<HistoryEntry>,
    history_specs: BTreeMap<u64, String>,
    hosts: Vec<(String, String)>,
    clock: Instant,
    node: String,
    epoch: u64,
    probe_tx: mpsc::UnboundedSender<ProbeResult>,
    waiting: Vec<Wait>,
    last_progress: String,
    was_ready: bool,
    group_restarts: u32,
    /// Crash streaks of instances removed by a group restart, by identity,
    /// so a member that keeps crashing still backs off exponentially.
    saved_streaks: BTreeMap<(String, u32), u32>,
}

/// Runs `spec_text` in the foreground until `down`, SIGINT or SIGTERM.
/// Caller must run this on a current-thread tokio runtime (see module docs).
pub async fn run(spec_text: &str, opts: Options) -> Result<(), RuntimeError> {
    let loaded = spec::load(spec_text).map_err(|e| RuntimeError::Spec(e.to_string()))?;
    check_local_limits(&loaded.group).map_err(RuntimeError::Spec)?;
    let dir = GroupDir::new(&opts.state_dir, &loaded.group.name);
    prepare_dirs(&opts.state_dir, &dir).await?;
    let listener = UnixListener::bind(dir.socket())
        .map_err(io_err(format!("binding {}", dir.socket().display())))?;
    std::fs::write(dir.pid_file(), format!("{}\n", std::process::id()))
        .map_err(io_err("writing the pid file"))?;

    let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
    let (ctl_tx, mut ctl_rx) = mpsc::channel::<Incoming>(16);
    let server = tokio::spawn(control::serve(listener, ctl_tx));

    let mut sup = Supervisor {
        octet: discovery::group_octet(&loaded.group.name),
        group: loaded.group.clone(),
        dir,
        opts,
        desired: Vec::new(),
        levels: Vec::new(),
        slots: BTreeMap::new(),
        templates: BTreeMap::new(),
        current_revision: BTreeMap::new(),
        instances: BTreeMap::new(),
        history: Vec::new(),
        history_specs: BTreeMap::new(),
        hosts: Vec::new(),
        clock: Instant::now(),
        node: hostname(),
        epoch: 0,
        probe_tx,
        waiting: Vec::new(),
        last_progress: String::new(),
        was_ready: false,
        group_restarts: 0,
        saved_streaks: BTreeMap::new(),
    };
    for u in &loaded.unimplemented {
        sup.say(&format!("warning: {u}"));
    }
    sup.install(loaded.group, spec_text, "up")?;
    sup.say(&format!(
        "group {} up: addresses 127.{}.<role>.<index>, state in {}",
        sup.group.name,
        sup.octet,
        sup.dir.root.display()
    ));

    let mut sigint = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(sup.opts.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut down_reply = None;
    loop {
        tokio::select! {
            _ = tick.tick() => sup.pass().await,
            Some(r) = probe_rx.recv() => sup.probe_result(r),
            Some((req, reply)) = ctl_rx.recv() => {
                if matches!(req, Request::Down) {
                    down_reply = Some(reply);
                    break;
                }
                let resp = sup.handle(req);
                let _ = reply.send(resp);
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    sup.say("stopping the group in reverse dependency order");
    sup.stop_all().await;
    sup.say(&format!("group {} stopped", sup.group.name));
    let _ = std::fs::remove_file(sup.dir.socket());
    let _ = std::fs::remove_file(sup.dir.pid_file());
    let _ = std::fs::remove_dir_all(sup.dir.memory_root());
    if let Some(parent) = sup.dir.memory_root().parent() {
        // Only succeeds when no other group of this user still uses it.
        let _ = std::fs::remove_dir(parent);
    }
    if let Some(reply) = down_reply {
        let _ = reply.send(Response::Stopped);
        // Give the connection task a moment to write the answer.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.abort();
    Ok(())
}

fn signal(
    kind: tokio::signal::unix::SignalKind,
) -> Result<tokio::signal::unix::Signal, RuntimeError> {
    tokio::signal::unix::signal(kind).map_err(io_err("installing signal handlers"))
}

async fn prepare_dirs(state: &Path, dir: &GroupDir) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state)
        .map_err(io_err(format!(
            "creating the state dir {}",
            state.display()
        )))?;
    std::fs::create_dir_all(&dir.root)
        .map_err(io_err(format!("creating {}", dir.root.display())))?;
    let sock = dir.socket();
    if control::is_live(&sock).await {
        return Err(RuntimeError::AlreadyRunning {
            group: dir.group.clone(),
            socket: sock.display().to_string(),
        });
    }
    // A socket nobody answers on is left over from a run that died.
    let _ = std::fs::remove_file(&sock);
    // Instances never outlive their supervisor: start from a clean slate.
    for d in [dir.instances(), dir.memory_root(), dir.history()] {
        let _ = std::fs::remove_dir_all(&d);
    }
    std::fs::create_dir_all(dir.instances()).map_err(io_err("creating the instances dir"))?;
    std::fs::create_dir_all(dir.history()).map_err(io_err("creating the history dir"))?;
    Ok(())
}

impl Supervisor {
    fn now(&self) -> Millis {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn say(&mut self, line: &str) {
        let t = self.clock.elapsed().as_secs_f64();
        (self.opts.report)(&format!("[{t:7.2}s] {line}"));
    }

    fn level_of(&self, role: &str) -> usize {
        self.levels
            .iter()
            .position(|l| l.iter().any(|r| r == role))
            .unwrap_or(0)
    }

    /// The dependency `role` is frozen on, if the last pass found one.
    fn waiting_for(&self, role: &str) -> Option<&str> {
        self.waiting.iter().find_map(|w| match w {
            Wait::Dependency {
                role: r,
                dependency,
            } if r == role => Some(dependency.as_str()),
            _ => None,
        })
    }

    fn address(&self, role: &str, index: u32) -> Option<Ipv4Addr> {
        let slot = *self.slots.get(role)?;
        discovery::local_address(self.octet, slot, index)
    }

    /// Makes `group` the desired state; records history when a revision
    /// changed. Returns the `role: old -> new` changes.
    fn install(
        &mut self,
        group: Group,
        text: &str,
        cause: &str,
    ) -> Result<Vec<String>, RuntimeError> {
        let mut changed = Vec::new();
        let mut desired = Vec::new();
        for r in &group.roles {
            if !self.slots.contains_key(&r.name) {
                let next = self.slots.values().max().map_or(0, |m| m + 1);
                self.slots.insert(r.name.clone(), next);
            }
            let mut d = DesiredRole::from_role(r);
            self.templates
                .insert((r.name.clone(), d.revision.clone()), r.template.clone());
            match self.desired.iter().find(|o| o.name == r.name) {
                Some(old) if old.revision != d.revision => {
                    changed.push(format!("{}: {} -> {}", r.name, old.revision, d.revision));
                    self.current_revision
                        .insert(r.name.clone(), old.revision.clone());
                }
                Some(_) => {}
                None => changed.push(format!("{}: new at {}", r.name, d.revision)),
            }
            d.current_revision = self.current_revision.get(&r.name).cloned();
            desired.push(d);
        }
        for old in &self.desired {
            if group.role(&old.name).is_none() {
                changed.push(format!("{}: removed", old.name));
            }
        }
        self.levels = planner::group_levels(&group);
        self.group = group;
        self.desired = desired;
        self.hosts = discovery::host_table(&self.group, &|role, index| self.address(role, index));
        self.write_discovery()?;
        if !changed.is_empty() || self.history.is_empty() {
            let number = self.history.last().map_or(1, |h| h.number + 1);
            let entry = HistoryEntry {
                number,
                applied_at: unix_ms() / 1000,
                revisions: self
                    .desired
                    .iter()
                    .map(|d| (d.name.clone(), d.revision.clone()))
                    .collect(),
                cause: cause.to_string(),
            };
            let path = self.dir.history().join(format!("{number}.yaml"));
            std::fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))?;
            self.history.push(entry);
            self.history_specs.insert(number, text.to_string());
        }
        Ok(changed)
    }

    fn write_discovery(&self) -> Result<(), RuntimeError> {
        let addr = |role: &str, index: u32| {
            self.address(role, index)
                .map_or_else(String::new, |a| a.to_string())
        };
        let file = discovery::discovery_file(&self.group, &addr);
        let text = serde_yaml::to_string(&file).unwrap_or_default();
        let path = self.dir.config();
        let tmp = path.with_extension("yaml.tmp");
        std::fs::write(&tmp, text).map_err(io_err("writing the discovery file"))?;
        std::fs::rename(&tmp, &path).map_err(io_err("writing the discovery file"))
    }

    fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Status => Response::Status {
                status: self.status(),
            },
            Request::History => Response::History {
                entries: self.history.clone(),
            },
            Request::Apply { spec, images } => {
                if let Some(m) = images {
                    self.opts.images = m;
                }
                self.apply(&spec, "apply")
            }
            Request::Undo { to } => {
                let target = match to {
                    Some(n) => Some(n),
                    None => self
                        .history
                        .len()
                        .checked_sub(2)
                        .and_then(|i| self.history.get(i))
                        .map(|h| h.number),
                };
                let Some(n) = target else {
                    return Response::Error {
                        message: "there is no earlier revision to go back to".into(),
                    };
                };
                let Some(text) = self.history_specs.get(&n).cloned() else {
                    return Response::Error {
                        message: format!("history has no entry {n}"),
                    };
                };
                self.apply(&text, &format!("undo to {n}"))
            }
            Request::Down => Response::Stopped,
        }
    }

    fn apply(&mut self, text: &str, cause: &str) -> Response {
        let loaded = match spec::load(text) {
            Ok(l) => l,
            Err(e) => {
                return Response::Error {
                    message: e.to_string(),
                }
            }
        };
        if loaded.group.name != self.group.name {
            return Response::Error {
                message: format!(
                    "this is group {:?}; the spec names {:?} (run `rbg up` for a new group)",
                    self.group.name, loaded.group.name
                ),
            };
        }
        if let Err(m) = check_local_limits(&loaded.group) {
            return Response::Error { message: m };
        }
        match self.install(loaded.group, text, cause) {
            Ok(changed) => {
                for c in &changed {
                    self.say(&format!("{cause}: {c}"));
                }
                Response::Applied {
                    generation: self.history.last().map_or(0, |h| h.number),
                    changed,
                    unimplemented: loaded.unimplemented,
                }
            }
            Err(e) => Response::Error {
                message: e.to_string(),
            },
        }
    }

    fn status(&self) -> GroupStatus {
        let observed = self.observed();
        let mut roles = Vec::new();
        for d in &self.desired {
            let waiting = self
                .waiting_for(&d.name)
                .map(|dep| format!("waiting for {dep}"));
            roles.push(RoleStatus {
                name: d.name.clone(),
                level: self.level_of(&d.name),
                replicas: d.replicas,
                ready_replicas: planner::ready_count(d, &observed),
                updated_replicas: planner::updated_count(d, &observed),
                revision: d.revision.clone(),
                waiting,
            });
        }
        let order: BTreeMap<&str, usize> = self
            .group
            .roles
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name.as_str(), i))
            .collect();
        let mut insts: Vec<&Instance> = self.instances.values().collect();
        insts.sort_by_key(|i| {
            (
                order.get(i.role.as_str()).copied().unwrap_or(usize::MAX),
                i.index,
            )
        });
        let instances = insts
            .into_iter()
            .map(|i| InstanceStatus {
                role: i.role.clone(),
                name: i.name.clone(),
                index: i.index,
                address: i.ip.to_string(),
                ready: i.ready(),
                revision: i.revision.clone(),
                restarts: i.restarts,
                age_secs: i.created.elapsed().as_secs(),
                state: i.state().to_string(),
                volumes: i
                    .volumes
                    .iter()
                    .map(|(k, v)| (k.clone(), v.display().to_string()))
                    .collect(),
                pids: i
                    .ctrs
                    .iter()
                    .map(|c| (c.spec.name.clone(), if c.alive() { c.pid } else { 0 }))
                    .collect(),
                started_ms: i.started_ms,
                ready_since_ms: if i.ready() { i.ready_since_ms } else { None },
            })
            .collect();
        GroupStatus {
            name: self.group.name.clone(),
            ready: planner::group_ready(&self.desired, &observed),
            generation: self.history.last().map_or(0, |h| h.number),
            roles,
            instances,
            group_restarts: self.group_restarts,
        }
    }

    fn observed(&self) -> planner::Observed {
        let mut o = planner::Observed::new();
        for i in self.instances.values() {
            o.entry(i.role.clone()).or_default().push(ObservedInstance {
                index: i.index,
                revision: i.revision.clone(),
                shape: i.shape.clone(),
                ready: i.ready(),
                running: i.running(),
                restarts: i.restarts,
                crash: if i.pending.is_none() { i.crash } else { None },
                busy: i.pending.is_some(),
            });
        }
        o
    }

    /// One pass: observe, plan, act, report.
    async fn pass(&mut self) {
        let now = self.now();
        self.reap(now);
        self.advance_pending(now);
        self.schedule_probes(now);
        self.update_ready_marks();

        // Instances of roles no longer in the spec are deleted outright.
        let gone: Vec<(String, u32)> = self
            .instances
            .iter()
            .filter(|(_, i)| self.group.role(&i.role).is_none() && i.pending.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        for (role, index) in gone {
            self.act(Action::Delete { role, index }, now).await;
        }

        let observed = self.observed();
        let plan = planner::plan(planner::PlanInput {
            roles: &self.desired,
            coordination: &self.group.coordination,
            observed: &observed,
            now,
            backoff: self.opts.backoff,
        });
        self.waiting = plan.waiting;
        for a in plan.actions {
            self.act(a, now).await;
        }
        self.report_progress();
    }

    fn update_ready_marks(&mut self) {
        let ms = unix_ms();
        for i in self.instances.values_mut() {
            let ready = i.ready();
            match (ready, i.ready_since_ms) {
                (true, None) => i.ready_since_ms = Some(ms),
                (false, Some(_)) => i.ready_since_ms = None,
                _ => {}
            }
        }
    }

    fn report_progress(&mut self) {
        let observed = self.observed();
        let mut parts = Vec::new();
        for (lv, roles) in self.levels.iter().enumerate() {
            let mut rs = Vec::new();
            for name in roles {
                let Some(d) = self.desired.iter().find(|d| &d.name == name) else {
                    continue;
                };
                let mut s = format!(
                    "{name} {}/{}",
                    planner::ready_count(d, &observed),
                    d.replicas
                );
                let updated = planner::updated_count(d, &observed);
                let outdated = observed
                    .get(name)
                    .is_some_and(|l| l.iter().any(|i| i.revision != d.revision));
                if outdated {
                    s.push_str(&format!(" ({updated}/{} updated)", d.replicas));
                }
                if let Some(dep) = self.waiting_for(name) {
                    s.push_str(&format!(" waiting for {dep}"));
                }
                rs.push(s);
            }
            parts.push(format!("level {lv}: {}", rs.join(", ")));
        }
        let line = parts.join(" | ");
        if line != self.last_progress {
            self.last_progress = line.clone();
            self.say(&format!("ready {line}"));
        }
        let ready = planner::group_ready(&self.desired, &observed);
        if ready && !self.was_ready {
            let name = self.group.name.clone();
            self.say(&format!("group {name} is Ready"));
        }
        self.was_ready = ready;
    }

    /// Collects exits of container processes.
    fn reap(&mut self, now: Millis) {
        let reset = u64::try_from(self.opts.backoff_reset.as_millis()).unwrap_or(u64::MAX);
        let mut lines = Vec::new();
        for inst in self.instances.values_mut() {
            let policy = self
                .group
                .role(&inst.role)
                .and_then(|r| r.template.spec.restart_policy)
                .unwrap_or_default();
            for c in &mut inst.ctrs {
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
    fn advance_pending(&mut self, now: Millis) {
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
                    .filter(|c| names.is_none_or(|n| n.contains(&c.spec.name)))
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

    fn finish_in_place(&mut self, key: &(String, u32), names: &BTreeSet<String>, now: Millis) {
        let Some(template) = self
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
            let name = inst.ctrs[i].spec.name.clone();
            if !names.contains(&name) {
                continue;
            }
            if let Some(spec) = template.spec.containers.iter().find(|c| c.name == name) {
                inst.ctrs[i].spec = spec.clone();
            }
            inst.restarts += 1;
            restarted.push(i);
        }
        for i in restarted {
            self.start_container(key, i, now);
        }
    }

    fn schedule_probes(&mut self, now: Millis) {
        for (key, inst) in &mut self.instances {
            for (ci, c) in inst.ctrs.iter_mut().enumerate() {
                if !matches!(c.state, CtrState::Running) {
                    continue;
                }
                let Some((state, action)) = c.probe.as_mut() else {
                    continue;
                };
                if !state.due(now) {
                    continue;
                }
                state.in_flight = true;
                let action = action.clone();
                let timeout = Duration::from_millis(state.timing.timeout);
                let tx = self.probe_tx.clone();
                let key = key.clone();
                let epoch = c.epoch;
                tokio::spawn(async move {
                    let passed = probe::run(&action, timeout).await;
                    let _ = tx.send(ProbeResult {
                        key,
                        container: ci,
                        epoch,
                        passed,
                    });
                });
            }
        }
    }

    fn probe_result(&mut self, r: ProbeResult) {
        let now = self.now();
        let Some(inst) = self.instances.get_mut(&r.key) else {
            return;
        };
        let Some(c) = inst.ctrs.get_mut(r.container) else {
            return;
        };
        if c.epoch != r.epoch {
            return;
        }
        if let Some((state, _)) = c.probe.as_mut() {
            state.record(r.passed, now);
        }
        // Status may be asked before the next pass: keep the mark in step.
        self.update_ready_marks();
    }

    async fn act(&mut self, a: Action, now: Millis) {
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
                // not running (a crash restart).
                let names = launch::containers_to_restart(
                    old.as_ref(),
                    new.as_ref(),
                    inst.ctrs
                        .iter()
                        .map(|c| (c.spec.name.as_str(), matches!(c.state, CtrState::Running))),
                );
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

    fn shape_of(&self, role: &str, rev: &str) -> String {
        self.templates
            .get(&(role.to_string(), rev.to_string()))
            .map(revision::shape)
            .unwrap_or_default()
    }

    fn grace(&self, role: &str) -> Millis {
        launch::stop_grace(
            self.group.role(role),
            self.opts.default_grace,
            self.opts.max_grace,
        )
    }

    /// Creates instance `index` of `role` at `rev` and starts its containers.
    fn create(
        &mut self,
        role: &str,
        index: u32,
        rev: &str,
        restarts: u32,
        streak: u32,
        now: Millis,
    ) {
        let Some(template) = self
            .templates
            .get(&(role.to_string(), rev.to_string()))
            .cloned()
        else {
            self.say(&format!("{role}-{index}: no template for revision {rev}"));
            return;
        };
        let Some(ip) = self.address(role, index) else {
            self.say(&format!("{role}-{index}: no local address"));
            return;
        };
        let name = discovery::instance_name(&self.group.name, role, index);
        let mut volumes = BTreeMap::new();
        let shm = Path::new("/dev/shm").is_dir();
        for (volume, path) in launch::volume_dirs(&self.dir, &name, &template, shm) {
            if let Err(e) = std::fs::create_dir_all(&path) {
                self.say(&format!("{name}: creating volume {}: {e}", path.display()));
            }
            volumes.insert(volume, path);
        }
        let inst = Instance {
            role: role.to_string(),
            index,
            name: name.clone(),
            ip,
            revision: rev.to_string(),
            shape: revision::shape(&template),
            created: Instant::now(),
            restarts,
            crash: None,
            streak,
            ctrs: template
                .spec
                .containers
                .iter()
                .map(|c| Ctr {
                    spec: c.clone(),
                    child: None,
                    pid: 0,
                    epoch: 0,
                    started: now,
                    state: CtrState::Stopped,
                    probe: None,
                })
                .collect(),
            pending: None,
            volumes,
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
    fn start_container(&mut self, key: &(String, u32), ci: usize, now: Millis) {
        self.epoch += 1;
        let epoch = self.epoch;
        let Some(inst) = self.instances.get_mut(key) else {
            return;
        };
        let Some(c) = inst.ctrs.get_mut(ci) else {
            return;
        };
        let mounts = launch::host_mounts(&c.spec, &inst.volumes);
        for m in mounts.iter().filter(|m| m.sub_path) {
            let _ = std::fs::create_dir_all(&m.host);
        }
        let facts = launch::instance_facts(
            &self.group,
            &key.0,
            key.1,
            inst.ip,
            &self.node,
            &self.dir.config(),
            &mounts,
        );
        let ctx = launch::LaunchContext {
            hosts: &self.hosts,
            images: &self.opts.images,
            default_cwd: &self.opts.cwd,
        };
        let log = self.dir.log(&inst.name, &c.spec.name);
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
                        inst.ip,
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
    async fn stop_all(&mut self) {
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

/// Sends SIGTERM to the containers named (all when `None`) that are alive.
fn stop_containers(inst: &mut Instance, names: Option<&BTreeSet<String>>, deadline: Millis) {
    for c in &mut inst.ctrs {
        if names.is_some_and(|n| !n.contains(&c.spec.name)) {
            continue;
        }
        match c.state {
            CtrState::Running => {
                process::signal_group(c.pid, libc::SIGTERM);
                c.state = CtrState::Stopping { deadline };
            }
            CtrState::Stopping { .. } => {}
            _ => c.state = CtrState::Stopped,
        }
    }
}

fn remove_volumes(inst: &Instance) {
    for p in inst.volumes.values() {
        let _ = std::fs::remove_dir_all(p);
    }
}

/// The system resolver, for probe hosts outside the group.
fn dns_resolve(host: &str, port: u16) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
}
