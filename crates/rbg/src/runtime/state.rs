//! The state directory and what the runtime reports about a running group.
//!
//! Layout (one directory per group under the state dir):
//!
//! ```text
//! <state>/<group>/control.sock      control socket of the running `rbg up`
//! <state>/<group>/rbg.pid           its process id
//! <state>/<group>/config.yaml       the discovery file (RBG_CONFIG)
//! <state>/<group>/history/<n>.yaml  every applied spec, numbered from 1
//! <state>/<group>/instances/<g-r-i>/<container>.log
//! <state>/<group>/instances/<g-r-i>/volumes/<volume>/   emptyDir volumes
//! ```
//!
//! `emptyDir` volumes with `medium: Memory` live under
//! `/dev/shm/rbg-<uid>/<group>/<g-r-i>/` instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The default state directory: `$XDG_RUNTIME_DIR/rbg`, else `/tmp/rbg-$UID`.
pub fn default_state_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("rbg"),
        _ => PathBuf::from(format!("/tmp/rbg-{}", uid())),
    }
}

/// The real user id.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Paths of one group's state.
#[derive(Clone, Debug)]
pub struct GroupDir {
    /// `<state>/<group>`.
    pub root: PathBuf,
    /// Group name.
    pub group: String,
}

impl GroupDir {
    /// The directory of `group` under `state_dir`.
    pub fn new(state_dir: &Path, group: &str) -> GroupDir {
        GroupDir {
            root: state_dir.join(group),
            group: group.to_string(),
        }
    }
    /// The control socket.
    pub fn socket(&self) -> PathBuf {
        self.root.join("control.sock")
    }
    /// The pid file of the supervisor.
    pub fn pid_file(&self) -> PathBuf {
        self.root.join("rbg.pid")
    }
    /// The discovery file.
    pub fn config(&self) -> PathBuf {
        self.root.join("config.yaml")
    }
    /// Directory of applied specs.
    pub fn history(&self) -> PathBuf {
        self.root.join("history")
    }
    /// Directory of all instances.
    pub fn instances(&self) -> PathBuf {
        self.root.join("instances")
    }
    /// Directory of one instance.
    pub fn instance(&self, name: &str) -> PathBuf {
        self.instances().join(name)
    }
    /// Log file of one container of an instance.
    pub fn log(&self, instance: &str, container: &str) -> PathBuf {
        self.instance(instance).join(format!("{container}.log"))
    }
    /// Directory of a disk-backed emptyDir volume.
    pub fn volume(&self, instance: &str, volume: &str) -> PathBuf {
        self.instance(instance).join("volumes").join(volume)
    }
    /// Directory of a memory-backed emptyDir volume (tmpfs).
    pub fn memory_volume(&self, instance: &str, volume: &str) -> PathBuf {
        self.memory_root().join(instance).join(volume)
    }
    /// Root of this group's tmpfs volumes.
    pub fn memory_root(&self) -> PathBuf {
        PathBuf::from(format!("/dev/shm/rbg-{}", uid())).join(&self.group)
    }
}

/// One row of `rbg status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// Role name.
    pub role: String,
    /// Instance name `g-r-i`.
    pub name: String,
    /// Instance index.
    pub index: u32,
    /// Its address.
    pub address: String,
    /// Readiness.
    pub ready: bool,
    /// Revision it runs.
    pub revision: String,
    /// Container restarts.
    pub restarts: u32,
    /// Seconds since the instance was created (kept across in-place restarts).
    pub age_secs: u64,
    /// Running, Starting, Terminating, CrashLoopBackOff, Completed.
    pub state: String,
    /// Host directory of each volume, by name.
    pub volumes: BTreeMap<String, String>,
    /// Its Pods (one, or a leader and workers, or components) and their
    /// addresses, by Pod name.
    #[serde(default)]
    pub pods: BTreeMap<String, String>,
    /// Process ids of its containers, by container name (`<pod>/<name>`
    /// past the first Pod; 0 when stopped).
    pub pids: BTreeMap<String, u32>,
    /// When its containers were last started (Unix epoch, milliseconds).
    pub started_ms: u64,
    /// When it last became ready (Unix epoch, milliseconds), if it is ready.
    pub ready_since_ms: Option<u64>,
}

/// One role's summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleStatus {
    /// Role name.
    pub name: String,
    /// Dependency level.
    pub level: usize,
    /// Replicas wanted.
    pub replicas: u32,
    /// Replicas ready.
    pub ready_replicas: u32,
    /// Replicas at the desired revision.
    pub updated_replicas: u32,
    /// The desired revision.
    pub revision: String,
    /// Why the role is not moving, if it is waiting.
    pub waiting: Option<String>,
}

/// What `rbg status` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// Group name.
    pub name: String,
    /// Every role has all replicas ready.
    pub ready: bool,
    /// Current history number.
    pub generation: u64,
    /// Roles in spec order.
    pub roles: Vec<RoleStatus>,
    /// Instances by role then index.
    pub instances: Vec<InstanceStatus>,
    /// Group restarts done under RecreateRBGOnPodRestart.
    pub group_restarts: u32,
    /// Namespace of the group.
    #[serde(default)]
    pub namespace: String,
    /// API version the group was written in.
    #[serde(default)]
    pub api_version: String,
    /// The status as upstream reports it (`rbg status -o yaml`).
    #[serde(default)]
    pub upstream: crate::status::RbgStatus,
}

/// One entry of `rbg rollout history`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// History number, from 1.
    pub number: u64,
    /// Seconds since the Unix epoch when it was applied.
    pub applied_at: u64,
    /// Revision of each role.
    pub revisions: BTreeMap<String, String>,
    /// What caused it (`up`, `apply`, `undo to N`).
    pub cause: String,
}
