//! The serde types of the object as users write it (RBG.md §1, the
//! Kubernetes Pod template). Every level keeps the keys it does not know in
//! an `extra` map so existing files parse; [`super::ignored_fields`] reports them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use super::amount::IntOrString;
use super::pod::{Container, PodTemplateSpec};
use super::schema::{pod_template, preserve_unknown, update_type};

/// The deprecated API version (still served upstream).
pub const API_VERSION: &str = "workloads.x-k8s.io/v1alpha1";
/// The current API version (served and stored upstream).
pub const API_V1ALPHA2: &str = "workloads.x-k8s.io/v1alpha2";
/// The API group of every rbg kind.
pub const API_GROUP: &str = "workloads.x-k8s.io";
/// The kind of a group.
pub const KIND: &str = "RoleBasedGroup";
/// Annotation through which v1alpha2 names a role's workload type
/// (`apps/v1/StatefulSet`, `workloads.x-k8s.io/v1alpha2/RoleInstanceSet`, ...).
pub const ANNOTATION_WORKLOAD: &str = "rbg.workloads.x-k8s.io/role-workload-type";
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

/// `spec` of a v1alpha1 group; also that version of the operator's
/// custom resource.
#[derive(
    kube::CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "workloads.x-k8s.io",
    version = "v1alpha1",
    kind = "RoleBasedGroup",
    root = "RoleBasedGroupV1Resource",
    storage = false,
    namespaced,
    status = "super::status::RbgStatus",
    shortname = "rbg",
    deprecated = "workloads.x-k8s.io/v1alpha1 RoleBasedGroup is deprecated; use workloads.x-k8s.io/v1alpha2",
    printcolumn = r#"{"name":"READY","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
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
    #[schemars(skip)]
    pub extra: Extra,
}

/// One role as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpec {
    /// Role name; a DNS label, unique in the group.
    #[serde(default)]
    pub name: String,
    /// Instances wanted; 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    pub replicas: Option<u32>,
    /// Roles that must be fully ready before this one is created or updated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// Labels added to every Pod of the role (the template's win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to every Pod of the role (the template's win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Seconds an instance must stay ready before it counts as available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub min_ready_seconds: Option<u32>,
    /// Leader-worker instances (workload `LeaderWorkerSet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_worker_set: Option<LeaderWorkerSetV1>,
    /// Custom components of an instance (workload `InstanceSet`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentSpec>,
    /// Engine runtime profiles injected into the Pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_runtimes: Vec<EngineRuntime>,
    /// Whether a RoleBasedGroupScalingAdapter may set the role's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_adapter: Option<ScalingAdapterSwitch>,
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
    #[schemars(schema_with = "pod_template")]
    pub template: Option<PodTemplateSpec>,
    /// Use `spec.roleTemplates[name]` as the template instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,
    /// A strategic-merge patch applied to the referenced template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub template_patch: Option<Value>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `workload` of a role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    #[schemars(skip)]
    pub extra: Extra,
}

/// What happens when an instance of the role restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// Only `RollingUpdate` is defined.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "RollingUpdate", "enum" = ["RollingUpdate"]))]
    pub kind: Option<String>,
    /// Parameters of the rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// How one instance moves to a new revision (`rollingUpdate.type`).
///
/// Upstream's v1alpha2 API names `InPlaceIfPossible`, `RecreatePod` and
/// `InPlaceOnly`; its v1alpha1 API names `InPlaceIfPossible` and
/// `Recreate`, which its conversion copies into v1alpha2 unchanged. Its CRDs
/// declare the field a plain string and its reconciler reads `""` as
/// `InPlaceIfPossible`. [`UpdateType::parse`] accepts all five.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UpdateType {
    /// Restart containers inside the instance when only images changed.
    #[default]
    #[serde(alias = "")]
    InPlaceIfPossible,
    /// Always delete and recreate the instance (`RecreatePod`, v1alpha1's
    /// `Recreate`).
    #[serde(rename = "RecreatePod", alias = "Recreate")]
    Recreate,
    /// Only image changes are rolled out (in place); any other change is
    /// refused, as upstream's admission webhook refuses it.
    InPlaceOnly,
}

impl UpdateType {
    /// The values `rollingUpdate.type` may take, as messages list them.
    pub const ACCEPTED: &'static str =
        "InPlaceIfPossible (the default, also \"\"), RecreatePod (v1alpha1: Recreate) or InPlaceOnly";

    /// Reads a written `rollingUpdate.type`; `None` for a value upstream
    /// does not define.
    pub fn parse(s: &str) -> Option<UpdateType> {
        match s {
            "" | "InPlaceIfPossible" => Some(UpdateType::InPlaceIfPossible),
            "RecreatePod" | "Recreate" => Some(UpdateType::Recreate),
            "InPlaceOnly" => Some(UpdateType::InPlaceOnly),
            _ => None,
        }
    }

    /// The name upstream's v1alpha2 API writes for this type.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateType::InPlaceIfPossible => "InPlaceIfPossible",
            UpdateType::Recreate => "RecreatePod",
            UpdateType::InPlaceOnly => "InPlaceOnly",
        }
    }
}

/// `rolloutStrategy.rollingUpdate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// In place when possible, or recreate.
    // Kept as written (a string, as upstream declares it) so that an
    // object holding a value rbg does not know still deserializes: the
    // operator's watcher would otherwise fail on the whole list, and
    // validation names the value instead (see `UpdateType::parse`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "update_type")]
    pub kind: Option<String>,
    /// Instances that may be unready during the update (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    pub max_unavailable: Option<IntOrString>,
    /// Extra instances allowed during the update (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub max_surge: Option<IntOrString>,
    /// Instances with index below this keep their revision (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub partition: Option<IntOrString>,
    /// While true, no instance moves to a new revision (scaling goes on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// `gracePeriodSeconds` between marking an instance unready and
    /// swapping its images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_update_strategy: Option<InPlaceUpdateStrategy>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// A named port of a role's service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    #[schemars(skip)]
    pub extra: Extra,
}

/// `templateRef` of a role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// Name of an entry of `spec.roleTemplates`.
    #[serde(default)]
    pub name: String,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// An entry of `spec.roleTemplates`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleTemplate {
    /// Name roles refer to.
    #[serde(default)]
    pub name: String,
    /// The shared Pod template.
    #[schemars(schema_with = "pod_template")]
    pub template: PodTemplateSpec,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// An entry of `spec.coordination`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    #[schemars(skip)]
    pub extra: Extra,
}

/// `coordination[].strategy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoordinationStrategy {
    /// Roles advance a rollout together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<CoordinatedRollingUpdate>,
    /// Roles grow together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<CoordinatedScaling>,
    /// Roles are placed together (KEP-473).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<CoordinatedScheduling>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `coordination[].strategy.scheduling`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatedScheduling {
    /// Every Pod of the rule's roles lands in one topology domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_constraint: Option<TopologyConstraint>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// Upstream's `TopologyConstraint` (KEP-473): gather a set of Pods into one
/// domain of the cluster's network topology. Levels are written in the
/// scheduler's own vocabulary and passed through as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyConstraint {
    /// The scheduler's topology resource, on schedulers that have one (KAI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_name: Option<String>,
    /// The levels to pack into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<TopologyPack>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `topologyConstraint.pack`: a hard and a soft level.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyPack {
    /// The Pods must share a domain of this level, or stay pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<String>,
    /// The Pods share a domain of this level when capacity allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred: Option<String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `coordination[].strategy.rollingUpdate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    #[schemars(skip)]
    pub extra: Extra,
}

/// What "progress" means for coordinated scaling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Progression {
    /// An instance counts once it exists (is started).
    #[default]
    OrderScheduled,
    /// An instance counts once it is ready.
    OrderReady,
}

/// `coordination[].strategy.scaling`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    #[schemars(skip)]
    pub extra: Extra,
}

/// `rollingUpdate.inPlaceUpdateStrategy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceUpdateStrategy {
    /// Seconds between marking the instance unready and swapping images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<u32>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// v1alpha1 `leaderWorkerSet` of a role.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetV1 {
    /// Pods per instance, the leader included (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// Strategic-merge patch making the leader's template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub patch_leader_template: Option<Value>,
    /// Strategic-merge patch making the workers' template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub patch_worker_template: Option<Value>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// One component of a custom-components instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    /// Component name; its Pods are `g-r-i-<name>-<j>`.
    #[serde(default)]
    pub name: String,
    /// Pods of this component per instance (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// Governing service name; informational locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Labels merged into the component's Pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations merged into the component's Pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The component's Pod template.
    #[serde(default)]
    #[schemars(schema_with = "preserve_unknown")]
    pub template: PodTemplateSpec,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// An `engineRuntimes[]` entry: a runtime profile injected into the Pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineRuntime {
    /// Name of a ClusterEngineRuntimeProfile.
    #[serde(default)]
    pub profile_name: String,
    /// Containers of the role the profile's env and volumes go into.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inject_containers: Vec<String>,
    /// Command/args overrides of the profile's containers, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::preserve_unknown_list")]
    pub containers: Vec<Container>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `scalingAdapter` of a role.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingAdapterSwitch {
    /// When true a RoleBasedGroupScalingAdapter owns the replica count.
    #[serde(default)]
    pub enable: bool,
    /// Labels of the auto-created adapter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}
