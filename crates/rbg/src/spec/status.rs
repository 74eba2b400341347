//! The `status` block of the RoleBasedGroup custom resource (v1alpha1 and
//! v1alpha2 alike): `observedGeneration`, `conditions` and `roleStatuses`.
//!
//! Only the shape lives here, beside the resources whose CRD derive names
//! it; [`crate::status`] computes it from the planner's view. Keeping the
//! shape in `spec` is what keeps the module graph acyclic: `spec` must not
//! depend on `status`, which depends on the planner, which reads the spec.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `status` of a RoleBasedGroup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RbgStatus {
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions, one per type.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// One entry per role, in spec order.
    #[serde(default)]
    pub role_statuses: Vec<RoleStatusEntry>,
}

/// One condition (the shape of metav1.Condition).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `Progressing`, `RollingUpdateInProgress`, `RestartInProgress`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
    /// RFC 3339 time the status last flipped.
    pub last_transition_time: String,
    /// Generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// `roleStatuses[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatusEntry {
    /// Role name.
    pub name: String,
    /// Desired instances.
    pub replicas: u32,
    /// Ready (available) instances.
    pub ready_replicas: u32,
    /// Instances at the desired revision.
    pub updated_replicas: u32,
}
