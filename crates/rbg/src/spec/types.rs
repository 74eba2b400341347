//! The serde types of the object as users write it (RBG.md §1, the
//! Kubernetes Pod template). Every level keeps the keys it does not know in
//! an `extra` map so existing files parse; [`super::unimplemented`] reports them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use super::amount::IntOrString;

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
