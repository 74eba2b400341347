//! The `RoleBasedGroup` object (`workloads.x-k8s.io/v1alpha1`) as users write
//! it, and its validation into a [`Group`] the planner and runtimes consume.
//!
//! Field names follow RBG.md §1 and the Kubernetes Pod template. Every level
//! keeps the keys it does not know in an `extra` map instead of rejecting
//! them, so a user's existing file parses; [`Loaded::unimplemented`] names each
//! of them (with its path) so nothing is silently ignored. Validation collects
//! every problem it finds, each message naming the role and the field.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use crate::merge::strategic_merge;
pub use crate::naming::is_dns_label;

/// The only API version this crate accepts.
pub const API_VERSION: &str = "workloads.x-k8s.io/v1alpha1";
/// The only kind this crate accepts.
pub const KIND: &str = "RoleBasedGroup";
/// Label carrying the group name on everything a group creates.
pub const LABEL_GROUP: &str = "rolebasedgroup.workloads.x-k8s.io/name";
/// Label carrying the role name on everything a group creates.
pub const LABEL_ROLE: &str = "rolebasedgroup.workloads.x-k8s.io/role";

/// Keys present in the file that this crate does not model.
pub type Extra = BTreeMap<String, Value>;

/// An integer or a string such as `"25%"` (Kubernetes `IntOrString`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A plain number.
    Int(i64),
    /// A string: a percentage `"N%"` or, for probe ports, a port name.
    String(String),
}

impl fmt::Display for IntOrString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntOrString::Int(n) => write!(f, "{n}"),
            IntOrString::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// A count given as an absolute number or a percentage of some total.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Amount {
    /// An absolute number of instances.
    Count(u32),
    /// A percentage (0..=100) of the total it is applied to.
    Percent(u32),
}

impl Amount {
    /// Parses an `IntOrString` that must be a non-negative count or `"N%"`.
    pub fn parse(v: &IntOrString) -> Result<Amount, String> {
        match v {
            IntOrString::Int(n) => u32::try_from(*n)
                .map(Amount::Count)
                .map_err(|_| format!("{n} is not a non-negative count")),
            IntOrString::String(s) => {
                let t = s.trim();
                if let Some(p) = t.strip_suffix('%') {
                    match p.trim().parse::<u32>() {
                        Ok(n) if n <= 100 => Ok(Amount::Percent(n)),
                        _ => Err(format!("{s:?} is not a percentage between 0% and 100%")),
                    }
                } else {
                    t.parse::<u32>().map(Amount::Count).map_err(|_| {
                        format!("{s:?} is neither a count nor a percentage like \"10%\"")
                    })
                }
            }
        }
    }

    /// The count this amount stands for out of `total`; percentages round up
    /// when `round_up`, down otherwise (Kubernetes rounds maxSurge up and
    /// maxUnavailable down).
    pub fn of(self, total: u32, round_up: bool) -> u32 {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => {
                let num = u64::from(total) * u64::from(p);
                let v = if round_up {
                    num.div_ceil(100)
                } else {
                    num / 100
                };
                u32::try_from(v).unwrap_or(u32::MAX)
            }
        }
    }

    /// True when this amount is zero whatever it is applied to.
    pub fn is_zero(self) -> bool {
        matches!(self, Amount::Count(0) | Amount::Percent(0))
    }
}

/// The whole object as written in a file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleBasedGroup {
    /// Must be [`API_VERSION`].
    pub api_version: String,
    /// Must be [`KIND`].
    pub kind: String,
    /// Name, namespace and labels of the group.
    pub metadata: ObjectMeta,
    /// Roles, templates and coordination.
    pub spec: GroupSpec,
    /// A status block copied from a cluster; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// Object metadata (the subset that matters here).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Group name; a DNS label.
    #[serde(default)]
    pub name: String,
    /// Namespace; `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `spec` of a group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSpec {
    /// The roles, in the order written.
    #[serde(default)]
    pub roles: Vec<RoleSpec>,
    /// Shared templates that roles reference with `templateRef`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub role_templates: Vec<RoleTemplate>,
    /// Groups of roles that update or scale together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coordination: Vec<Coordination>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// One role as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpec {
    /// Role name; a DNS label, unique in the group.
    #[serde(default)]
    pub name: String,
    /// Instances wanted; 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Roles that must be fully ready before this one is created or updated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// The Kubernetes workload kind backing the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    /// What a restarted instance triggers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// How instances move to a new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,
    /// Named ports published in the discovery file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_ports: Vec<ServicePort>,
    /// The Pod template of each instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    /// Use `spec.roleTemplates[name]` as the template instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,
    /// A strategic-merge patch applied to the referenced template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_patch: Option<Value>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `workload` of a role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// For example `apps/v1`.
    #[serde(default)]
    pub api_version: String,
    /// For example `StatefulSet`.
    #[serde(default)]
    pub kind: String,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// What happens when an instance of the role restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    /// The instance's container is restarted in place (with backoff).
    #[default]
    None,
    /// The whole group is recreated, in dependency order.
    RecreateRBGOnPodRestart,
    /// The whole instance is recreated (fresh volumes).
    RecreateRoleInstanceOnPodRestart,
}

/// `rolloutStrategy` of a role.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// Only `RollingUpdate` is defined.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Parameters of the rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// How one instance moves to a new revision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateType {
    /// Restart containers inside the instance when only images changed.
    #[default]
    InPlaceIfPossible,
    /// Always delete and recreate the instance.
    Recreate,
}

/// `rolloutStrategy.rollingUpdate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// In place when possible, or recreate.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<UpdateType>,
    /// Instances that may be unready during the update (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Extra instances allowed during the update (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    /// Instances with index below this keep their revision (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<IntOrString>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A named port of a role's service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Port name (key in the discovery file).
    #[serde(default)]
    pub name: String,
    /// Port number.
    pub port: u16,
    /// Container port it maps to; ignored locally (instances own their IP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<IntOrString>,
    /// Ignored locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `templateRef` of a role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// Name of an entry of `spec.roleTemplates`.
    #[serde(default)]
    pub name: String,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// An entry of `spec.roleTemplates`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleTemplate {
    /// Name roles refer to.
    #[serde(default)]
    pub name: String,
    /// The shared Pod template.
    pub template: PodTemplateSpec,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// An entry of `spec.coordination`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Coordination {
    /// Name, for messages.
    #[serde(default)]
    pub name: String,
    /// The roles that move together.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Rolling-update and scaling coordination.
    #[serde(default)]
    pub strategy: CoordinationStrategy,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `coordination[].strategy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinationStrategy {
    /// Roles advance a rollout together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<CoordinatedRollingUpdate>,
    /// Roles grow together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<CoordinatedScaling>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `coordination[].strategy.rollingUpdate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatedRollingUpdate {
    /// Largest allowed difference of updated fractions (default 100%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_skew: Option<IntOrString>,
    /// Overrides each role's partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<IntOrString>,
    /// Overrides each role's maxUnavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// What "progress" means for coordinated scaling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Progression {
    /// An instance counts once it exists (is started).
    #[default]
    OrderScheduled,
    /// An instance counts once it is ready.
    OrderReady,
}

/// `coordination[].strategy.scaling`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatedScaling {
    /// Largest allowed lead of one role's progress over the slowest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_skew: Option<IntOrString>,
    /// When an instance counts as progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progression: Option<Progression>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A Pod template (the subset a local runtime can honour).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateSpec {
    /// Labels and annotations of each instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Containers and volumes.
    #[serde(default)]
    pub spec: PodSpec,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `template.metadata`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// Labels, readable through `metadata.labels['...']` field refs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations, readable through `metadata.annotations['...']`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// Container restart behaviour of a Pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodRestartPolicy {
    /// Restart every exited container.
    #[default]
    Always,
    /// Restart containers that exited non-zero.
    OnFailure,
    /// Never restart.
    Never,
}

/// `template.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// The processes of an instance.
    #[serde(default)]
    pub containers: Vec<Container>,
    /// Volumes (only `emptyDir` is implemented).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Which exited containers are restarted (default Always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<PodRestartPolicy>,
    /// Time between SIGTERM and SIGKILL on stop (default 30 s in
    /// Kubernetes; the local runtime caps it, see the runtime docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<u64>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// One container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// Name, unique in the Pod.
    #[serde(default)]
    pub name: String,
    /// Image; resolved through the image map locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Entrypoint override.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Declared ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
    /// When the container counts as ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    /// Volumes mounted into the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// One environment variable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// Variable name.
    #[serde(default)]
    pub name: String,
    /// Literal value; `$(VAR)` expands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Value read from the instance's own fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `env[].valueFrom`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource {
    /// A field of the instance (Downward API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<FieldRef>,
    /// Unmodelled keys (configMapKeyRef, secretKeyRef, ...).
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `valueFrom.fieldRef`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    /// For example `status.podIP` or `metadata.labels['app']`.
    #[serde(default)]
    pub field_path: String,
    /// Ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A declared container port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    /// Name, usable by probes and published in the discovery file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Port number.
    pub container_port: u16,
    /// Ignored locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A readiness probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// Ready when a TCP connection succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketAction>,
    /// Ready when an HTTP GET answers 200..=399.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    /// Ready when a command exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    /// Seconds after start before the first probe (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<u32>,
    /// Seconds between probes (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<u32>,
    /// Seconds one probe may take (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    /// Consecutive successes to become ready (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<u32>,
    /// Consecutive failures to become unready (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `tcpSocket` probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpSocketAction {
    /// Port number or container port name.
    pub port: IntOrString,
    /// Host; the instance's address when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `httpGet` probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpGetAction {
    /// Path (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Port number or container port name.
    pub port: IntOrString,
    /// Host; the instance's address when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Only `HTTP` is implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Extra request headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_headers: Vec<HttpHeader>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A header of an `httpGet` probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HttpHeader {
    /// Header name.
    pub name: String,
    /// Header value.
    pub value: String,
}

/// `exec` probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecAction {
    /// Command run with the container's environment.
    #[serde(default)]
    pub command: Vec<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A volume mount.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    /// Volume name.
    #[serde(default)]
    pub name: String,
    /// Path inside the container; rewritten to the host directory locally.
    #[serde(default)]
    pub mount_path: String,
    /// Ignored locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Sub-directory of the volume to mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Name mounts refer to.
    #[serde(default)]
    pub name: String,
    /// A per-instance scratch directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDir>,
    /// Unmodelled keys (other volume sources).
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `emptyDir` volume source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDir {
    /// `Memory` for tmpfs; default disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,
    /// Not enforced locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Value>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// Errors from loading a group.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The text is not YAML of the right shape; `path` locates the field.
    #[error("{path}: {message}")]
    Parse {
        /// Dotted path of the offending field (`.` for the document).
        path: String,
        /// What serde_yaml said, with line and column.
        message: String,
    },
    /// The object parsed but breaks the rules of RBG.md; one message each.
    #[error("invalid RoleBasedGroup:\n{}", bullet(.0))]
    Invalid(Vec<String>),
}

fn bullet(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("  - {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A validated group with every template resolved: what the planner plans.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// Group name.
    pub name: String,
    /// Namespace (`default` when absent).
    pub namespace: String,
    /// Roles, in the order written.
    pub roles: Vec<Role>,
    /// Validated coordination entries.
    pub coordination: Vec<CoordinationPolicy>,
}

/// A validated role with its resolved template.
#[derive(Clone, Debug, PartialEq)]
pub struct Role {
    /// Role name.
    pub name: String,
    /// Instances wanted.
    pub replicas: u32,
    /// Roles that must be ready first.
    pub dependencies: Vec<String>,
    /// What a restarted instance triggers.
    pub restart_policy: RestartPolicy,
    /// How instances update.
    pub update: UpdatePolicy,
    /// Named service ports.
    pub service_ports: Vec<ServicePort>,
    /// The resolved Pod template (templateRef and templatePatch applied).
    pub template: PodTemplateSpec,
    /// `workload.kind` (StatefulSet by default).
    pub workload_kind: String,
}

impl Group {
    /// The role called `name`.
    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }
}

/// A role's validated rolling-update parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdatePolicy {
    /// In place when possible, or recreate.
    pub kind: UpdateType,
    /// Unready instances allowed during an update.
    pub max_unavailable: Amount,
    /// Extra instances allowed during an update.
    pub max_surge: Amount,
    /// Indexes below this keep their revision.
    pub partition: Amount,
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        UpdatePolicy {
            kind: UpdateType::InPlaceIfPossible,
            max_unavailable: Amount::Count(1),
            max_surge: Amount::Count(0),
            partition: Amount::Count(0),
        }
    }
}

/// A validated coordination entry.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinationPolicy {
    /// Name, for messages.
    pub name: String,
    /// Roles it covers.
    pub roles: Vec<String>,
    /// Coordinated rollout, if any.
    pub rolling_update: Option<RolloutCoordination>,
    /// Coordinated scaling, if any.
    pub scaling: Option<ScalingCoordination>,
}

/// Validated `strategy.rollingUpdate` of a coordination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RolloutCoordination {
    /// Largest allowed difference of updated fractions, 0..=1.
    pub max_skew: f64,
    /// Overrides the roles' partition.
    pub partition: Option<Amount>,
    /// Overrides the roles' maxUnavailable.
    pub max_unavailable: Option<Amount>,
}

/// Validated `strategy.scaling` of a coordination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalingCoordination {
    /// Largest allowed lead over the slowest role's progress, 0..=1.
    pub max_skew: f64,
    /// When an instance counts as progress.
    pub progression: Progression,
}

/// A loaded group plus what the file contained that is not implemented.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The object as written.
    pub raw: RoleBasedGroup,
    /// The validated, resolved group.
    pub group: Group,
    /// One line per field present in the file that is not implemented
    /// (`path: note`); callers print these as warnings.
    pub unimplemented: Vec<String>,
}

/// Parses and validates a group from YAML text.
pub fn load(text: &str) -> Result<Loaded, SpecError> {
    let raw = parse(text)?;
    let group = validate(&raw)?;
    let unimplemented = unimplemented(&raw);
    Ok(Loaded {
        raw,
        group,
        unimplemented,
    })
}

/// Parses YAML text into the object, with the path of any bad field.
pub fn parse(text: &str) -> Result<RoleBasedGroup, SpecError> {
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        SpecError::Parse {
            path,
            message: e.into_inner().to_string(),
        }
    })
}

fn dns_problem(what: &str, s: &str) -> Option<String> {
    if is_dns_label(s) {
        None
    } else if s.is_empty() {
        Some(format!("{what}: name is empty"))
    } else {
        Some(format!(
            "{what}: {s:?} is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
        ))
    }
}

fn amount(errs: &mut Vec<String>, field: &str, v: Option<&IntOrString>, default: Amount) -> Amount {
    match v {
        None => default,
        Some(v) => match Amount::parse(v) {
            Ok(a) => a,
            Err(e) => {
                errs.push(format!("{field}: {e}"));
                default
            }
        },
    }
}

fn skew(errs: &mut Vec<String>, field: &str, v: Option<&IntOrString>) -> f64 {
    match v {
        None => 1.0,
        // A bare number means percentage points: a count of instances would
        // mean different fractions for roles of different sizes.
        Some(IntOrString::Int(n)) if (0..=100).contains(n) => *n as f64 / 100.0,
        Some(v) => match Amount::parse(v) {
            Ok(Amount::Percent(p)) => f64::from(p) / 100.0,
            Ok(Amount::Count(_)) | Err(_) => {
                errs.push(format!("{field}: {v} is not a percentage like \"10%\""));
                1.0
            }
        },
    }
}

/// Resolves a role's template: its own, or a roleTemplate with the patch
/// strategically merged onto it.
fn resolve_template(
    role: &RoleSpec,
    templates: &BTreeMap<&str, &RoleTemplate>,
    errs: &mut Vec<String>,
) -> Option<PodTemplateSpec> {
    let at = format!("role {:?}", role.name);
    match (&role.template, &role.template_ref) {
        (Some(_), Some(_)) => {
            errs.push(format!(
                "{at}: template and templateRef are both set; use one"
            ));
            None
        }
        (None, None) => {
            errs.push(format!("{at}: neither template nor templateRef is set"));
            None
        }
        (Some(t), None) => {
            if role.template_patch.is_some() {
                errs.push(format!(
                    "{at}: templatePatch is only allowed together with templateRef"
                ));
            }
            Some(t.clone())
        }
        (None, Some(r)) => {
            let Some(base) = templates.get(r.name.as_str()) else {
                errs.push(format!(
                    "{at}: templateRef.name {:?} is not in spec.roleTemplates",
                    r.name
                ));
                return None;
            };
            let Some(patch) = &role.template_patch else {
                return Some(base.template.clone());
            };
            let base_v = match serde_yaml::to_value(&base.template) {
                Ok(v) => v,
                Err(e) => {
                    errs.push(format!("{at}: roleTemplate {:?}: {e}", r.name));
                    return None;
                }
            };
            let merged = strategic_merge(&base_v, patch);
            match serde_path_to_error::deserialize::<_, PodTemplateSpec>(merged) {
                Ok(t) => Some(t),
                Err(e) => {
                    errs.push(format!(
                        "{at}: templatePatch on {:?} gives an invalid template at {}: {}",
                        r.name,
                        e.path(),
                        e.inner()
                    ));
                    None
                }
            }
        }
    }
}

fn validate_template(at: &str, t: &PodTemplateSpec, errs: &mut Vec<String>) {
    let spec = &t.spec;
    if spec.containers.is_empty() {
        errs.push(format!("{at}: template.spec.containers is empty"));
    }
    let volumes: BTreeSet<&str> = spec.volumes.iter().map(|v| v.name.as_str()).collect();
    let mut seen = BTreeSet::new();
    for v in &spec.volumes {
        if let Some(p) = dns_problem(&format!("{at}: volume"), &v.name) {
            errs.push(p);
        }
        if !seen.insert(v.name.as_str()) {
            errs.push(format!("{at}: volume {:?} is declared twice", v.name));
        }
        if let Some(ed) = &v.empty_dir {
            match ed.medium.as_deref() {
                None | Some("") | Some("Memory") => {}
                Some(m) => errs.push(format!(
                    "{at}: volume {:?}: emptyDir.medium {m:?} is not \"\" or \"Memory\"",
                    v.name
                )),
            }
        }
    }
    let mut names = BTreeSet::new();
    for c in &spec.containers {
        let cat = format!("{at}: container {:?}", c.name);
        if let Some(p) = dns_problem(&format!("{at}: container"), &c.name) {
            errs.push(p);
        }
        if !names.insert(c.name.as_str()) {
            errs.push(format!("{cat} is declared twice"));
        }
        let mut env_seen = BTreeSet::new();
        for e in &c.env {
            if e.name.is_empty() {
                errs.push(format!("{cat}: env entry without a name"));
            }
            if !env_seen.insert(e.name.as_str()) {
                // Kubernetes keeps the last one; say so rather than guess.
                errs.push(format!("{cat}: env {:?} is set twice", e.name));
            }
            match (&e.value, &e.value_from) {
                (Some(_), Some(_)) => errs.push(format!(
                    "{cat}: env {:?} has both value and valueFrom",
                    e.name
                )),
                (_, Some(src)) => {
                    if let Some(f) = &src.field_ref {
                        if let Err(m) = crate::field_path::check_field_path(&f.field_path) {
                            errs.push(format!("{cat}: env {:?}: {m}", e.name));
                        }
                    }
                }
                _ => {}
            }
        }
        for m in &c.volume_mounts {
            if !volumes.contains(m.name.as_str()) {
                errs.push(format!(
                    "{cat}: volumeMount {:?} names no volume of the template",
                    m.name
                ));
            }
            if !m.mount_path.starts_with('/') {
                errs.push(format!(
                    "{cat}: volumeMount {:?}: mountPath {:?} is not absolute",
                    m.name, m.mount_path
                ));
            }
        }
        if let Some(p) = &c.readiness_probe {
            let handlers = usize::from(p.tcp_socket.is_some())
                + usize::from(p.http_get.is_some())
                + usize::from(p.exec.is_some());
            if handlers != 1 {
                errs.push(format!(
                    "{cat}: readinessProbe needs exactly one of tcpSocket, httpGet, exec (has {handlers})"
                ));
            }
            let port = p
                .tcp_socket
                .as_ref()
                .map(|t| &t.port)
                .or(p.http_get.as_ref().map(|h| &h.port));
            if let Some(port) = port {
                if let Err(m) = resolve_port(c, port) {
                    errs.push(format!("{cat}: readinessProbe: {m}"));
                }
            }
            if let Some(h) = &p.http_get {
                if let Some(s) = &h.scheme {
                    if !s.eq_ignore_ascii_case("http") {
                        errs.push(format!(
                            "{cat}: readinessProbe.httpGet.scheme {s:?} is not implemented (only HTTP)"
                        ));
                    }
                }
            }
            if let Some(x) = &p.exec {
                if x.command.is_empty() {
                    errs.push(format!("{cat}: readinessProbe.exec.command is empty"));
                }
            }
            if p.period_seconds == Some(0) {
                errs.push(format!(
                    "{cat}: readinessProbe.periodSeconds must be at least 1"
                ));
            }
        }
    }
}

/// The port number a probe port (number or container port name) stands for.
pub fn resolve_port(c: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port {n} is not between 1 and 65535")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("port {name:?} names no port of the container"))
        }
    }
}

/// Checks every rule of RBG.md and resolves templates.
pub fn validate(raw: &RoleBasedGroup) -> Result<Group, SpecError> {
    let mut errs = Vec::new();
    if raw.api_version != API_VERSION {
        errs.push(format!(
            "apiVersion: {:?} is not {API_VERSION:?}",
            raw.api_version
        ));
    }
    if raw.kind != KIND {
        errs.push(format!("kind: {:?} is not {KIND:?}", raw.kind));
    }
    if let Some(p) = dns_problem("metadata.name", &raw.metadata.name) {
        errs.push(p);
    }
    let spec = &raw.spec;
    if spec.roles.is_empty() {
        errs.push("spec.roles: a group needs at least one role".to_string());
    }

    let mut templates = BTreeMap::new();
    for t in &spec.role_templates {
        if let Some(p) = dns_problem("spec.roleTemplates", &t.name) {
            errs.push(p);
        }
        if templates.insert(t.name.as_str(), t).is_some() {
            errs.push(format!(
                "spec.roleTemplates: {:?} is declared twice",
                t.name
            ));
        }
    }

    let mut names = BTreeSet::new();
    for r in &spec.roles {
        if let Some(p) = dns_problem("spec.roles", &r.name) {
            errs.push(p);
        } else {
            // Kubernetes names the service s-<group>-<role>: it must be a label too.
            let svc = crate::naming::service_name(&raw.metadata.name, &r.name);
            if svc.len() > 63 {
                errs.push(format!(
                    "role {:?}: service name {svc:?} is longer than 63 characters",
                    r.name
                ));
            }
        }
        if !names.insert(r.name.as_str()) {
            errs.push(format!("role {:?}: duplicate role name", r.name));
        }
    }

    let mut roles = Vec::new();
    for r in &spec.roles {
        let at = format!("role {:?}", r.name);
        for d in &r.dependencies {
            if !names.contains(d.as_str()) {
                errs.push(format!("{at}: dependencies: unknown role {d:?}"));
            }
        }
        let ru = r
            .rollout_strategy
            .as_ref()
            .and_then(|s| s.rolling_update.clone())
            .unwrap_or_default();
        if let Some(k) = r.rollout_strategy.as_ref().and_then(|s| s.kind.as_deref()) {
            if k != "RollingUpdate" {
                errs.push(format!(
                    "{at}: rolloutStrategy.type {k:?} is not \"RollingUpdate\""
                ));
            }
        }
        let field = |f: &str| format!("{at}: rolloutStrategy.rollingUpdate.{f}");
        let update = UpdatePolicy {
            kind: ru.kind.unwrap_or_default(),
            max_unavailable: amount(
                &mut errs,
                &field("maxUnavailable"),
                ru.max_unavailable.as_ref(),
                Amount::Count(1),
            ),
            max_surge: amount(
                &mut errs,
                &field("maxSurge"),
                ru.max_surge.as_ref(),
                Amount::Count(0),
            ),
            partition: amount(
                &mut errs,
                &field("partition"),
                ru.partition.as_ref(),
                Amount::Count(0),
            ),
        };
        if update.max_unavailable.is_zero() && update.max_surge.is_zero() {
            errs.push(format!(
                "{at}: rolloutStrategy.rollingUpdate: maxSurge and maxUnavailable are both 0, so no instance could ever be updated"
            ));
        }
        let mut port_names = BTreeSet::new();
        for p in &r.service_ports {
            if p.name.is_empty() {
                errs.push(format!(
                    "{at}: servicePorts entry for port {} has no name",
                    p.port
                ));
            } else if !port_names.insert(p.name.as_str()) {
                errs.push(format!("{at}: servicePorts {:?} is declared twice", p.name));
            }
        }
        let workload_kind = r
            .workload
            .as_ref()
            .map(|w| w.kind.clone())
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| "StatefulSet".to_string());
        let template = resolve_template(r, &templates, &mut errs);
        if let Some(t) = &template {
            validate_template(&at, t, &mut errs);
        }
        roles.push(Role {
            name: r.name.clone(),
            replicas: r.replicas.unwrap_or(1),
            dependencies: r.dependencies.clone(),
            restart_policy: r.restart_policy.unwrap_or_default(),
            update,
            service_ports: r.service_ports.clone(),
            template: template.unwrap_or_default(),
            workload_kind,
        });
    }

    // Cycles only make sense to report once every dependency is known.
    if errs.is_empty() {
        if let Err(e) = crate::graph::levels_of(
            roles
                .iter()
                .map(|r: &Role| (r.name.as_str(), r.dependencies.as_slice())),
        ) {
            errs.push(e.to_string());
        }
    }

    let mut coordination = Vec::new();
    let mut in_rollout = BTreeMap::new();
    let mut in_scaling = BTreeMap::new();
    for (i, c) in spec.coordination.iter().enumerate() {
        let at = if c.name.is_empty() {
            format!("coordination[{i}]")
        } else {
            format!("coordination {:?}", c.name)
        };
        if c.roles.is_empty() {
            errs.push(format!("{at}: roles is empty"));
        }
        let mut seen = BTreeSet::new();
        for r in &c.roles {
            if !names.contains(r.as_str()) {
                errs.push(format!("{at}: roles: unknown role {r:?}"));
            }
            if !seen.insert(r.as_str()) {
                errs.push(format!("{at}: roles: {r:?} is listed twice"));
            }
        }
        let rolling_update = c
            .strategy
            .rolling_update
            .as_ref()
            .map(|u| RolloutCoordination {
                max_skew: skew(
                    &mut errs,
                    &format!("{at}: strategy.rollingUpdate.maxSkew"),
                    u.max_skew.as_ref(),
                ),
                partition: u.partition.as_ref().map(|p| {
                    amount(
                        &mut errs,
                        &format!("{at}: strategy.rollingUpdate.partition"),
                        Some(p),
                        Amount::Count(0),
                    )
                }),
                max_unavailable: u.max_unavailable.as_ref().map(|p| {
                    amount(
                        &mut errs,
                        &format!("{at}: strategy.rollingUpdate.maxUnavailable"),
                        Some(p),
                        Amount::Count(1),
                    )
                }),
            });
        let scaling = c.strategy.scaling.as_ref().map(|s| ScalingCoordination {
            max_skew: skew(
                &mut errs,
                &format!("{at}: strategy.scaling.maxSkew"),
                s.max_skew.as_ref(),
            ),
            progression: s.progression.unwrap_or_default(),
        });
        for r in &c.roles {
            if rolling_update.is_some() {
                if let Some(prev) = in_rollout.insert(r.clone(), at.clone()) {
                    errs.push(format!(
                        "{at}: role {r:?} is already in the rolling-update coordination {prev}"
                    ));
                }
            }
            if scaling.is_some() {
                if let Some(prev) = in_scaling.insert(r.clone(), at.clone()) {
                    errs.push(format!(
                        "{at}: role {r:?} is already in the scaling coordination {prev}"
                    ));
                }
            }
        }
        coordination.push(CoordinationPolicy {
            name: if c.name.is_empty() {
                format!("coordination-{i}")
            } else {
                c.name.clone()
            },
            roles: c.roles.clone(),
            rolling_update,
            scaling,
        });
    }

    if !errs.is_empty() {
        return Err(SpecError::Invalid(errs));
    }
    Ok(Group {
        name: raw.metadata.name.clone(),
        namespace: raw
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string()),
        roles,
        coordination,
    })
}

/// Names every field of `raw` that this crate keeps but does not act on.
pub fn unimplemented(raw: &RoleBasedGroup) -> Vec<String> {
    let mut out = Vec::new();
    extras(&mut out, "", &raw.extra);
    extras(&mut out, "metadata", &raw.metadata.extra);
    let spec = &raw.spec;
    extras(&mut out, "spec", &spec.extra);
    for r in &spec.roles {
        let at = format!("spec.roles[{}]", r.name);
        extras(&mut out, &at, &r.extra);
        if let Some(w) = &r.workload {
            extras(&mut out, &format!("{at}.workload"), &w.extra);
            if !matches!(w.kind.as_str(), "" | "StatefulSet" | "Deployment") {
                out.push(format!(
                    "{at}.workload.kind: {:?} is run like a StatefulSet by the local runtime",
                    w.kind
                ));
            }
        }
        if let Some(s) = &r.rollout_strategy {
            extras(&mut out, &format!("{at}.rolloutStrategy"), &s.extra);
            if let Some(u) = &s.rolling_update {
                extras(
                    &mut out,
                    &format!("{at}.rolloutStrategy.rollingUpdate"),
                    &u.extra,
                );
            }
        }
        for p in &r.service_ports {
            extras(
                &mut out,
                &format!("{at}.servicePorts[{}]", p.name),
                &p.extra,
            );
        }
        if let Some(t) = &r.template_ref {
            extras(&mut out, &format!("{at}.templateRef"), &t.extra);
        }
        if let Some(t) = &r.template {
            template_extras(&mut out, &format!("{at}.template"), t);
        }
    }
    for t in &spec.role_templates {
        let at = format!("spec.roleTemplates[{}]", t.name);
        extras(&mut out, &at, &t.extra);
        template_extras(&mut out, &format!("{at}.template"), &t.template);
    }
    for c in &spec.coordination {
        let at = format!("spec.coordination[{}]", c.name);
        extras(&mut out, &at, &c.extra);
        extras(&mut out, &format!("{at}.strategy"), &c.strategy.extra);
        if let Some(u) = &c.strategy.rolling_update {
            extras(&mut out, &format!("{at}.strategy.rollingUpdate"), &u.extra);
        }
        if let Some(s) = &c.strategy.scaling {
            extras(&mut out, &format!("{at}.strategy.scaling"), &s.extra);
        }
    }
    out
}

fn extras(out: &mut Vec<String>, at: &str, extra: &Extra) {
    for k in extra.keys() {
        if at.is_empty() {
            out.push(format!("{k}: not implemented, ignored"));
        } else {
            out.push(format!("{at}.{k}: not implemented, ignored"));
        }
    }
}

fn template_extras(out: &mut Vec<String>, at: &str, t: &PodTemplateSpec) {
    extras(out, at, &t.extra);
    if let Some(m) = &t.metadata {
        extras(out, &format!("{at}.metadata"), &m.extra);
    }
    extras(out, &format!("{at}.spec"), &t.spec.extra);
    for v in &t.spec.volumes {
        let vat = format!("{at}.spec.volumes[{}]", v.name);
        extras(out, &vat, &v.extra);
        if let Some(e) = &v.empty_dir {
            extras(out, &format!("{vat}.emptyDir"), &e.extra);
            if e.size_limit.is_some() {
                out.push(format!("{vat}.emptyDir.sizeLimit: not enforced locally"));
            }
        }
    }
    for c in &t.spec.containers {
        let cat = format!("{at}.spec.containers[{}]", c.name);
        extras(out, &cat, &c.extra);
        for e in &c.env {
            extras(out, &format!("{cat}.env[{}]", e.name), &e.extra);
            if let Some(src) = &e.value_from {
                extras(out, &format!("{cat}.env[{}].valueFrom", e.name), &src.extra);
                if let Some(f) = &src.field_ref {
                    extras(
                        out,
                        &format!("{cat}.env[{}].valueFrom.fieldRef", e.name),
                        &f.extra,
                    );
                }
            }
        }
        for p in &c.ports {
            extras(out, &format!("{cat}.ports[{}]", p.container_port), &p.extra);
        }
        for m in &c.volume_mounts {
            extras(
                out,
                &format!("{cat}.volumeMounts[{}]", m.mount_path),
                &m.extra,
            );
        }
        if let Some(p) = &c.readiness_probe {
            let pat = format!("{cat}.readinessProbe");
            extras(out, &pat, &p.extra);
            if let Some(t) = &p.tcp_socket {
                extras(out, &format!("{pat}.tcpSocket"), &t.extra);
            }
            if let Some(h) = &p.http_get {
                extras(out, &format!("{pat}.httpGet"), &h.extra);
            }
            if let Some(x) = &p.exec {
                extras(out, &format!("{pat}.exec"), &x.extra);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: demo}
spec:
  roles:
  - name: master
    template:
      spec:
        containers: [{name: m, image: "kvpool:v1", command: [kvpool, master]}]
  - name: store
    replicas: 3
    dependencies: [master]
    rolloutStrategy:
      rollingUpdate: {type: InPlaceIfPossible, maxUnavailable: "50%", partition: 1}
    template:
      spec:
        containers: [{name: s, image: "kvpool:v1", command: [kvpool, store]}]
"#;

    fn errors(text: &str) -> Vec<String> {
        match load(text) {
            Err(SpecError::Invalid(e)) => e,
            Err(e) => vec![e.to_string()],
            Ok(_) => vec![],
        }
    }

    #[test]
    fn loads_base() {
        let l = load(BASE).expect("base loads");
        assert_eq!(l.group.roles.len(), 2);
        let s = &l.group.roles[1];
        assert_eq!(s.replicas, 3);
        assert_eq!(s.update.max_unavailable, Amount::Percent(50));
        assert_eq!(s.update.partition, Amount::Count(1));
        assert_eq!(l.group.roles[0].replicas, 1);
        assert!(l.unimplemented.is_empty(), "{:?}", l.unimplemented);
    }

    #[test]
    fn parse_errors_name_the_path() {
        let bad = BASE.replace("replicas: 3", "replicas: three");
        let e = load(&bad).expect_err("bad replicas").to_string();
        assert!(e.contains("spec.roles[1].replicas"), "{e}");
        assert!(e.contains("line"), "{e}");
        let e = load("{{{").expect_err("not yaml").to_string();
        assert!(!e.is_empty());
        let e = load("").expect_err("empty").to_string();
        assert!(!e.is_empty());
    }

    #[test]
    fn rule_violations_name_role_and_field() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "dependencies: [master]",
                "dependencies: [nope]",
                "role \"store\": dependencies: unknown role \"nope\"",
            ),
            (
                "- name: store",
                "- name: master",
                "role \"master\": duplicate role name",
            ),
            (
                "- name: store",
                "- name: Store",
                "\"Store\" is not a DNS label",
            ),
            (
                "maxUnavailable: \"50%\"",
                "maxUnavailable: 0, maxSurge: 0",
                "maxSurge and maxUnavailable are both 0",
            ),
            (
                "maxUnavailable: \"50%\"",
                "maxUnavailable: \"150%\"",
                "maxUnavailable: \"150%\" is not a percentage",
            ),
            (
                "metadata: {name: demo}",
                "metadata: {name: demo_x}",
                "metadata.name",
            ),
            (
                "kind: RoleBasedGroup",
                "kind: Deployment",
                "kind: \"Deployment\"",
            ),
        ];
        for (from, to, want) in cases {
            let errs = errors(&BASE.replace(from, to));
            assert!(
                errs.iter().any(|e| e.contains(want)),
                "{to}: want {want:?} in {errs:?}"
            );
        }
    }

    #[test]
    fn cycle_is_named() {
        let text = BASE.replace(
            "  - name: master\n",
            "  - name: master\n    dependencies: [store]\n",
        );
        let errs = errors(&text);
        assert!(
            errs.iter().any(
                |e| e.contains("cycle") && e.contains("master -> store -> master")
                    || e.contains("store -> master -> store")
            ),
            "{errs:?}"
        );
    }

    #[test]
    fn template_and_ref_rules() {
        let both = BASE.replace(
            "  - name: master\n",
            "  - name: master\n    templateRef: {name: t}\n",
        );
        assert!(errors(&both)
            .iter()
            .any(|e| e.contains("template and templateRef are both set")));
        let neither = r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: demo}
spec:
  roles: [{name: a}]
"#;
        assert!(errors(neither)
            .iter()
            .any(|e| e.contains("role \"a\": neither template nor templateRef")));
    }

    #[test]
    fn template_ref_with_patch() {
        let text = r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: pd}
spec:
  roleTemplates:
  - name: engine
    template:
      spec:
        containers:
        - name: main
          image: engine:v1
          command: [serve]
          env: [{name: MODE, value: any}, {name: TP, value: "1"}]
  roles:
  - name: prefill
    templateRef: {name: engine}
    templatePatch:
      spec:
        containers:
        - name: main
          env: [{name: MODE, value: prefill}]
  - name: decode
    templateRef: {name: engine}
"#;
        let l = load(text).expect("loads");
        let p = &l.group.roles[0].template.spec.containers[0];
        assert_eq!(p.image.as_deref(), Some("engine:v1"));
        let env: Vec<(&str, &str)> = p
            .env
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(env, vec![("MODE", "prefill"), ("TP", "1")]);
        let d = &l.group.roles[1].template.spec.containers[0];
        assert_eq!(d.env[0].value.as_deref(), Some("any"));
    }

    #[test]
    fn unknown_fields_are_reported_by_path() {
        let text = BASE
            .replace(
                "    replicas: 3\n",
                "    replicas: 3\n    leaderWorkerSet: {size: 2}\n",
            )
            .replace(
                "command: [kvpool, store]}",
                "command: [kvpool, store], resources: {limits: {cpu: 1}}}",
            );
        let l = load(&text).expect("loads");
        assert!(l
            .unimplemented
            .iter()
            .any(|u| u.starts_with("spec.roles[store].leaderWorkerSet")));
        assert!(l
            .unimplemented
            .iter()
            .any(|u| u.starts_with("spec.roles[store].template.spec.containers[s].resources")));
    }

    #[test]
    fn amounts() {
        assert_eq!(
            Amount::parse(&IntOrString::String("10%".into())),
            Ok(Amount::Percent(10))
        );
        assert_eq!(Amount::parse(&IntOrString::Int(3)), Ok(Amount::Count(3)));
        assert!(Amount::parse(&IntOrString::Int(-1)).is_err());
        assert!(Amount::parse(&IntOrString::String("x%".into())).is_err());
        assert_eq!(Amount::Percent(25).of(10, false), 2);
        assert_eq!(Amount::Percent(25).of(10, true), 3);
    }
}
