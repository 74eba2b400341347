//! The Pod template as users write it (the subset a local runtime can
//! honour, plus ConfigMap/Secret references): containers, env, probes,
//! volumes. Unknown keys are kept in `extra` maps and reported, never
//! rejected, so existing templates parse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use super::amount::IntOrString;
use super::types::Extra;

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
    /// Whole ConfigMaps or Secrets as environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
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
    /// A key of a ConfigMap of the same file (locally) or namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeySelector>,
    /// A key of a Secret of the same file (locally) or namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeySelector>,
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
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
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
    /// The keys of a ConfigMap as files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ObjectVolume>,
    /// The keys of a Secret as files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectVolume>,
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

/// `configMapKeyRef` / `secretKeyRef` of an env var.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeySelector {
    /// Object name.
    #[serde(default)]
    pub name: String,
    /// Key in its data.
    #[serde(default)]
    pub key: String,
    /// When true a missing object or key leaves the variable unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `envFrom[]` of a container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromSource {
    /// Prefix put before every key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Every key of a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ObjectRef>,
    /// Every key of a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<ObjectRef>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A reference to a ConfigMap or Secret by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// Object name.
    #[serde(default)]
    pub name: String,
    /// When true a missing object is not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// A `configMap` or `secret` volume source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectVolume {
    /// ConfigMap name (`configMap.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Secret name (`secret.secretName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Only these keys, at these paths (default: every key at its name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<KeyToPath>,
    /// When true a missing object gives an empty directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// File mode; not applied locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<u32>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

impl ObjectVolume {
    /// The object the volume shows (`name` or `secretName`).
    pub fn object(&self) -> &str {
        self.name
            .as_deref()
            .or(self.secret_name.as_deref())
            .unwrap_or("")
    }
}

/// One `items[]` entry of a ConfigMap/Secret volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyToPath {
    /// Key in the object.
    pub key: String,
    /// Relative file path in the volume.
    pub path: String,
    /// Not applied locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}
