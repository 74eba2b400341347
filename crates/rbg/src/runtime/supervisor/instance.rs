//! The supervisor's record of each running instance and its containers,
//! and what their states mean for readiness, `rbg status` and stopping.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Child;
use std::time::Instant;

use crate::planner::{Crash, Millis};
use crate::runtime::probe::{ProbeAction, ProbeState};
use crate::runtime::process;
use crate::spec::Container;

/// Where one container process is in its life.
#[derive(Debug)]
pub(super) enum CtrState {
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

/// One container of an instance and its process, if started.
pub(super) struct Ctr {
    /// Which Pod of the instance it belongs to (index into `pods`).
    pub(super) pod: usize,
    /// `name` in the first Pod, `<pod suffix>/name` in the others: unique
    /// in the instance, used for in-place restarts and `rbg status` pids.
    pub(super) key: String,
    pub(super) spec: Container,
    pub(super) child: Option<Child>,
    pub(super) pid: u32,
    /// Bumped on every start so late probe results of an earlier process
    /// are ignored.
    pub(super) epoch: u64,
    pub(super) started: Millis,
    pub(super) state: CtrState,
    pub(super) probe: Option<(ProbeState, ProbeAction)>,
}

impl Ctr {
    pub(super) fn alive(&self) -> bool {
        matches!(self.state, CtrState::Running | CtrState::Stopping { .. })
    }
    pub(super) fn ready(&self) -> bool {
        matches!(self.state, CtrState::Running) && self.probe.as_ref().is_none_or(|(p, _)| p.ready)
    }
}

/// What an instance does once the containers being stopped are gone.
#[derive(Debug, Clone)]
pub(super) enum Pending {
    /// Restart these containers (by key) at the instance's (new) revision.
    InPlace(BTreeSet<String>),
    /// Delete and start again at the instance's (new) revision.
    Recreate,
    Delete,
}

/// One Pod of an instance: its name, address and volumes.
pub(super) struct PodRec {
    pub(super) name: String,
    pub(super) ip: Ipv4Addr,
    pub(super) volumes: BTreeMap<String, PathBuf>,
}

/// One instance (`g-r-i`) of a role: identity, revision, crash streak,
/// its Pods (one, or a leader and workers, or components) and their
/// containers. All of them start, stop and restart as one unit.
pub(super) struct Instance {
    pub(super) role: String,
    pub(super) index: u32,
    pub(super) name: String,
    /// The first Pod's address (the leader's).
    pub(super) ip: Ipv4Addr,
    pub(super) revision: String,
    pub(super) shape: String,
    pub(super) created: Instant,
    pub(super) restarts: u32,
    pub(super) crash: Option<Crash>,
    pub(super) streak: u32,
    pub(super) ctrs: Vec<Ctr>,
    pub(super) pending: Option<Pending>,
    pub(super) pods: Vec<PodRec>,
    pub(super) started_ms: u64,
    pub(super) ready_since_ms: Option<u64>,
}

impl Instance {
    pub(super) fn ready(&self) -> bool {
        self.pending.is_none()
            && self.crash.is_none()
            && !self.ctrs.is_empty()
            && self.ctrs.iter().all(Ctr::ready)
    }
    pub(super) fn running(&self) -> bool {
        self.ctrs.iter().any(Ctr::alive)
    }
    pub(super) fn state(&self) -> &'static str {
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

/// Sends SIGTERM to the containers named (all when `None`) that are alive.
pub(super) fn stop_containers(
    inst: &mut Instance,
    names: Option<&BTreeSet<String>>,
    deadline: Millis,
) {
    for c in &mut inst.ctrs {
        if names.is_some_and(|n| !n.contains(&c.key)) {
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

/// Deletes the instance's volume directories (emptyDir dies with the Pod).
pub(super) fn remove_volumes(inst: &Instance) {
    for p in inst.pods.iter().flat_map(|p| p.volumes.values()) {
        let _ = std::fs::remove_dir_all(p);
    }
}
