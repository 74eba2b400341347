//! The supervisor: the I/O shell around the planner for the local runtime.
//!
//! One loop on one thread (a current-thread tokio runtime, so every child is
//! forked from the same thread and `PR_SET_PDEATHSIG` stays meaningful):
//! every tick it reaps exited processes, advances pending stops, schedules
//! readiness probes, asks [`crate::planner::plan`] what to do and does it.
//! Control requests and probe results arrive on channels between ticks.
//! The planner owns every decision; this module only observes and executes.
//!
//! This file holds the loop and the pass; `desired` installs specs and
//! answers control requests, `lifecycle` starts and stops processes from
//! the pure plan in [`crate::runtime::launch`], `instance` is the record of
//! what runs.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::net::UnixListener;
use tokio::sync::mpsc;

mod desired;
mod instance;
mod lifecycle;

use instance::{CtrState, Instance};

use super::control::{self, Incoming, Request, Response};
use super::images::ImageMap;
pub use super::launch::check_local_limits;
use super::probe;
use super::state::{GroupDir, HistoryEntry};
use crate::discovery;
use crate::planner::{self, Action, Backoff, DesiredRole, Millis, Wait};
use crate::spec::{self, Group, PodSlot};

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
    /// The Pods of an instance of each (role, revision) seen.
    templates: BTreeMap<(String, String), Vec<PodSlot>>,
    /// How many address slots each role holds (one per Pod of an instance).
    slot_sizes: BTreeMap<String, u32>,
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
    /// The upstream-shaped status of the last pass (keeps condition
    /// transition times).
    rbg_status: crate::status::RbgStatus,
    /// API version of the applied spec.
    api_version: String,
}

/// Runs group `name` of `spec_text` (the only group when `None`) in the
/// foreground until `down`, SIGINT or SIGTERM. Caller must run this on a
/// current-thread tokio runtime (see module docs).
pub async fn run(spec_text: &str, name: Option<&str>, opts: Options) -> Result<(), RuntimeError> {
    let loaded = load_group(spec_text, name)?;
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
        slot_sizes: BTreeMap::new(),
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
        rbg_status: Default::default(),
        api_version: loaded.api_version.clone(),
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

/// Group `name` of a file (the only one when `None`), with the file's
/// notes added to its report.
pub(super) fn load_group(text: &str, name: Option<&str>) -> Result<spec::Loaded, RuntimeError> {
    let spec_err = |e: spec::SpecError| RuntimeError::Spec(e.to_string());
    let Some(name) = name else {
        return spec::load(text).map_err(spec_err);
    };
    let bundle = spec::load_all(text).map_err(spec_err)?;
    let notes = bundle.notes.clone();
    let fields = bundle.fields.clone();
    let mut l = bundle
        .take(name)
        .ok_or_else(|| RuntimeError::Spec(format!("the file holds no group {name:?}")))?;
    l.unimplemented
        .extend(fields.iter().map(ToString::to_string));
    l.unimplemented.extend(notes);
    l.fields.extend(fields);
    Ok(l)
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
        self.pod_address(role, index, 0)
    }

    /// Address of Pod `pod` of instance `index`: each Pod position of a
    /// role has its own slot, so leaders and workers can bind one port.
    fn pod_address(&self, role: &str, index: u32, pod: usize) -> Option<Ipv4Addr> {
        let slot = *self.slots.get(role)? + u32::try_from(pod).ok()?;
        discovery::local_address(self.octet, slot, index)
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
        let waiting: Vec<(String, String)> = self
            .waiting
            .iter()
            .filter_map(|w| match w {
                Wait::Dependency { role, dependency } => Some((role.clone(), dependency.clone())),
                _ => None,
            })
            .collect();
        let restarting = self
            .instances
            .values()
            .filter(|i| i.crash.is_some() || matches!(i.pending, Some(instance::Pending::Recreate)))
            .count();
        let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let mut status = crate::status::compute(crate::status::StatusInput {
            roles: &self.desired,
            observed: &observed,
            generation: i64::try_from(self.history.last().map_or(0, |h| h.number)).unwrap_or(0),
            waiting: &waiting,
            restarting: u32::try_from(restarting).unwrap_or(u32::MAX),
            previous: Some(&self.rbg_status),
            now: &now,
        });
        crate::status::add_topology(
            &mut status,
            &self.group.placements,
            false,
            Some(&self.rbg_status),
            &now,
        );
        self.rbg_status = status;
        let ready = planner::group_ready(&self.desired, &observed);
        if ready && !self.was_ready {
            let name = self.group.name.clone();
            self.say(&format!("group {name} is Ready"));
        }
        self.was_ready = ready;
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
}
