//! The `workloads.x-k8s.io/v1alpha2` objects as users write them: the
//! RoleBasedGroup whose roles use `standalonePattern`, `leaderWorkerPattern`
//! or `customComponentsPattern`, the CoordinatedPolicy that coordinates
//! roles, the RoleBasedGroupScalingAdapter that owns a role's replicas and
//! the RoleBasedGroupSet that stamps out groups.
//!
//! The same structs are the Kubernetes custom resources of `rbg operator`
//! (kube's `CustomResource` derive; `rbg crd` prints the CRDs), so the
//! cluster and the local runtime read one definition. Field names, enums
//! and defaults follow the upstream CRDs (shared/rbg-crds).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use super::pod::PodTemplateSpec;
use super::schema::{pod_template, preserve_unknown};
use super::status::RbgStatus;
use super::types::{
    ComponentSpec, Coordination, EngineRuntime, Extra, ObjectMeta, RestartPolicy, RoleTemplate,
    RolloutStrategy, ScalingAdapterSwitch, ServicePort, TopologyConstraint, Workload,
};

/// A v1alpha2 RoleBasedGroup document as written in a file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleBasedGroupV2 {
    /// `workloads.x-k8s.io/v1alpha2`.
    pub api_version: String,
    /// `RoleBasedGroup`.
    pub kind: String,
    /// Name, namespace and labels of the group.
    pub metadata: ObjectMeta,
    /// Roles and templates.
    pub spec: GroupSpecV2,
    /// A status block copied from a cluster; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: Extra,
}

/// `spec` of a v1alpha2 group; also the custom resource of the operator.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "workloads.x-k8s.io",
    version = "v1alpha2",
    kind = "RoleBasedGroup",
    root = "RoleBasedGroupResource",
    namespaced,
    status = "RbgStatus",
    shortname = "rbg",
    printcolumn = r#"{"name":"READY","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GroupSpecV2 {
    /// The roles, in the order written.
    #[serde(default)]
    pub roles: Vec<RoleSpecV2>,
    /// Shared templates that patterns reference with `templateRef`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub role_templates: Vec<RoleTemplate>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// One v1alpha2 role.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpecV2 {
    /// Role name; a DNS label, unique in the group.
    #[serde(default)]
    pub name: String,
    /// Instances wanted (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    pub replicas: Option<u32>,
    /// Roles that must be fully ready before this one is created or updated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// Labels added to every Pod of the role.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the role; `rbg.workloads.x-k8s.io/role-workload-type`
    /// names the workload kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// One Pod per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standalone_pattern: Option<StandalonePattern>,
    /// A leader Pod and `size - 1` workers per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_worker_pattern: Option<LeaderWorkerPattern>,
    /// Named components, each with its own template and size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_components_pattern: Option<CustomComponentsPattern>,
    /// Engine runtime profiles injected into the Pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_runtimes: Vec<EngineRuntime>,
    /// Named ports of the role's service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_ports: Vec<ServicePort>,
    /// Seconds an instance must stay ready before it counts as available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub min_ready_seconds: Option<u32>,
    /// `Parallel` (default) or `OrderedReady` creation of instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Parallel"))]
    pub pod_management_policy: Option<PodManagementPolicy>,
    /// How instances move to a new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,
    /// Whether a RoleBasedGroupScalingAdapter owns the replica count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_adapter: Option<ScalingAdapterSwitch>,
    /// Each instance's Pods land in one topology domain (KEP-473).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_topology_constraint: Option<TopologyConstraint>,
    /// rbg extension kept from v1alpha1 (roles are open upstream): what a
    /// Pod restart of a standalone role triggers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// rbg extension kept from v1alpha1: the workload kind, when the
    /// annotation does not name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// Instance creation order of a role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PodManagementPolicy {
    /// Instance `i` is created once `0..i` are ready.
    OrderedReady,
    /// Every instance at once.
    #[default]
    Parallel,
}

/// `templateRef` of a v1alpha2 pattern: a roleTemplate plus a patch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRefV2 {
    /// Name of an entry of `spec.roleTemplates`.
    #[serde(default)]
    pub name: String,
    /// Strategic-merge patch applied to that template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub patch: Option<Value>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `standalonePattern`: one Pod per instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandalonePattern {
    /// The Pod template, inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_template")]
    pub template: Option<PodTemplateSpec>,
    /// Or a roleTemplate plus a patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRefV2>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// The restart policy of a multi-Pod pattern and its backoff.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartPolicyConfig {
    /// `None` or `RecreateRoleInstanceOnPodRestart` (the default).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<RestartPolicy>,
    /// First delay before recreating (default 30 s), doubling per restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_delay_seconds: Option<u32>,
    /// Largest delay (default 600 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_seconds: Option<u32>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `leaderWorkerPattern`: a leader and `size - 1` workers per instance,
/// started and restarted as one unit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerPattern {
    #[schemars(extend("default" = 1))]
    /// Pods per instance, the leader included (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// The template both leader and workers start from, inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_template")]
    pub template: Option<PodTemplateSpec>,
    /// Or a roleTemplate plus a patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRefV2>,
    /// Strategic-merge patch making the leader's template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub leader_template_patch: Option<Value>,
    /// Strategic-merge patch making the workers' template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub worker_template_patch: Option<Value>,
    /// Deprecated upstream; `restartPolicyConfig.type` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// Restart policy and backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy_config: Option<RestartPolicyConfig>,
    /// `All` or `LeaderOnly`: which Pods the role's service selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_service_selection: Option<SharedServiceSelection>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// Which Pods of a leader-worker role the role's service selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SharedServiceSelection {
    /// Leaders and workers.
    All,
    /// Leaders only.
    LeaderOnly,
}

/// `customComponentsPattern`: named components per instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomComponentsPattern {
    /// The components of each instance.
    #[serde(default)]
    pub components: Vec<ComponentSpec>,
    /// Deprecated upstream; `restartPolicyConfig.type` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// Restart policy and backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy_config: Option<RestartPolicyConfig>,
    /// Unmodelled keys.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec` of a CoordinatedPolicy (v1alpha2): rules that make roles of the
/// group with the same name roll out and scale together.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "workloads.x-k8s.io",
    version = "v1alpha2",
    kind = "CoordinatedPolicy",
    namespaced,
    shortname = "cpolicy"
)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatedPolicySpec {
    /// The rules.
    #[serde(default)]
    pub policies: Vec<Coordination>,
}

/// `spec` of a RoleBasedGroupScalingAdapter: the replica count of one role.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "workloads.x-k8s.io",
    version = "v1alpha2",
    kind = "RoleBasedGroupScalingAdapter",
    namespaced,
    status = "ScalingAdapterStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ScalingAdapterSpec {
    /// The replica count to give the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// The group and role it scales.
    pub scale_target_ref: ScaleTargetRef,
}

/// `status` of a scaling adapter (the shape upstream reports; rbg's
/// operator reads adapters and does not write it yet).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingAdapterStatus {
    /// Current replicas of the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Ready replicas of the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<u32>,
    /// Label selector of the role's Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Phase of the adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When the role was last scaled (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<String>,
}

/// `scaleTargetRef` of a scaling adapter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ScaleTargetRef {
    /// Group name.
    #[serde(default)]
    pub name: String,
    /// Role name.
    #[serde(default)]
    pub role: String,
}

/// A RoleBasedGroupSet as written: `replicas` groups `<set>-<i>` from one
/// template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleBasedGroupSetDoc {
    /// `workloads.x-k8s.io/v1alpha1` or `v1alpha2`.
    pub api_version: String,
    /// `RoleBasedGroupSet`.
    pub kind: String,
    /// Name and namespace of the set.
    pub metadata: ObjectMeta,
    /// Replicas and the group template.
    pub spec: GroupSetSpec,
}

/// `spec` of a RoleBasedGroupSet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSetSpec {
    /// Groups to create (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// What each group looks like; `spec` is a group spec of the set's
    /// API version.
    pub group_template: GroupTemplate,
}

/// `spec.groupTemplate` of a RoleBasedGroupSet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupTemplate {
    /// Labels of each group.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of each group.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The group spec, read by the set's API version.
    pub spec: Value,
}
