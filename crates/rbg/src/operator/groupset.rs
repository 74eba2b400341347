//! RoleBasedGroupSets on the cluster: a set of `spec.replicas` groups
//! `<set>-<i>` stamped from `spec.groupTemplate` (as `rbg up` expands a
//! set locally). The set's reconcile server-side applies each child
//! RoleBasedGroup (owned by the set, so deleting the set deletes them and
//! a template edit reaches every child, each then rolling out by its own
//! strategy), deletes children at or above `replicas`, and writes
//! `status.replicas`/`readyReplicas` (children whose Ready condition is
//! True). The children are ordinary groups: the group controller
//! reconciles them as any other.
//!
//! [`children`] is the pure part (what should exist); [`reconcile_set`]
//! the I/O. Only v1alpha2 is served: upstream's v1alpha1 set nests a
//! v1alpha1 group under `spec.template`, which the API server could not
//! convert to the stored version without a conversion webhook.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, CustomResource, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{Context, Error, MANAGER};
use crate::spec::v2::{GroupSpecV2, RoleBasedGroupResource};

/// Label on a child group with the name of its set.
pub const LABEL_SET: &str = "rolebasedgroupset.workloads.x-k8s.io/name";
/// Label on a child group with its index in the set.
pub const LABEL_SET_INDEX: &str = "rolebasedgroupset.workloads.x-k8s.io/index";

/// `spec` of a RoleBasedGroupSet (v1alpha2): `replicas` groups from one
/// template.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "workloads.x-k8s.io",
    version = "v1alpha2",
    kind = "RoleBasedGroupSet",
    namespaced,
    status = "GroupSetStatus",
    shortname = "rbgs",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas"
    ),
    printcolumn = r#"{"name":"DESIRED","type":"string","description":"desired replicas","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"READY","type":"string","description":"ready replicas","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GroupSetSpec {
    /// Groups to run (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// What each group looks like.
    pub group_template: GroupSetTemplate,
}

/// `spec.groupTemplate` of a RoleBasedGroupSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupSetTemplate {
    /// Labels of each group.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of each group.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The spec of each group.
    #[serde(default)]
    pub spec: GroupSpecV2,
}

/// `status` of a RoleBasedGroupSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupSetStatus {
    /// Groups the set has.
    #[serde(default)]
    pub replicas: u32,
    /// Groups whose Ready condition is True.
    #[serde(default)]
    pub ready_replicas: u32,
    /// The generation of the set this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The child groups `set` should have, as server-side apply bodies, in
/// index order.
pub fn children(set: &RoleBasedGroupSet) -> Vec<Value> {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_else(|| "default".into());
    let t = &set.spec.group_template;
    let owner = json!([{
        "apiVersion": RoleBasedGroupSet::api_version(&()),
        "kind": RoleBasedGroupSet::kind(&()),
        "name": name,
        "uid": set.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    (0..set.spec.replicas.unwrap_or(1))
        .map(|i| {
            let mut labels = t.labels.clone();
            labels.insert(LABEL_SET.into(), name.clone());
            labels.insert(LABEL_SET_INDEX.into(), i.to_string());
            json!({
                "apiVersion": RoleBasedGroupResource::api_version(&()),
                "kind": RoleBasedGroupResource::kind(&()),
                "metadata": {
                    "name": format!("{name}-{i}"),
                    "namespace": ns,
                    "labels": labels,
                    "annotations": t.annotations,
                    "ownerReferences": owner,
                },
                "spec": t.spec,
            })
        })
        .collect()
}

/// True when the group's Ready condition is True.
fn group_ready(g: &RoleBasedGroupResource) -> bool {
    let v = serde_json::to_value(&g.status).unwrap_or(Value::Null);
    v["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Reconciles one set: apply its children, delete extra ones, write the
/// status.
pub async fn reconcile_set(
    set: Arc<RoleBasedGroupSet>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_else(|| "default".into());
    let groups: Api<RoleBasedGroupResource> = Api::namespaced(ctx.client.clone(), &ns);
    let apply = PatchParams::apply(MANAGER).force();
    let want = children(&set);
    for child in &want {
        let child_name = child["metadata"]["name"].as_str().unwrap_or_default();
        groups
            .patch(child_name, &apply, &Patch::Apply(child))
            .await?;
    }
    let replicas = set.spec.replicas.unwrap_or(1);
    let have = groups
        .list(&ListParams::default().labels(&format!("{LABEL_SET}={name}")))
        .await?
        .items;
    let mut ready = 0u32;
    for g in &have {
        let index = g
            .labels()
            .get(LABEL_SET_INDEX)
            .and_then(|i| i.parse::<u32>().ok());
        match index {
            Some(i) if i < replicas => ready += u32::from(group_ready(g)),
            // Scaled down, or not one of ours by index: the set owns it by
            // label, so it goes.
            _ => {
                if g.metadata.deletion_timestamp.is_none() {
                    match groups.delete(&g.name_any(), &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }
    let status = GroupSetStatus {
        replicas,
        ready_replicas: ready,
        observed_generation: set.metadata.generation,
    };
    let sets: Api<RoleBasedGroupSet> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({
        "apiVersion": RoleBasedGroupSet::api_version(&()),
        "kind": RoleBasedGroupSet::kind(&()),
        "status": status,
    });
    sets.patch_status(&name, &apply, &Patch::Apply(&body))
        .await?;
    Ok(if ready == replicas {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(5))
    })
}

/// Requeues a failed set with the groups' backoff, counting the failure.
pub fn set_error_policy(set: Arc<RoleBasedGroupSet>, e: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(e.kind());
    tracing::warn!(set = %set.name_any(), error = %e, "reconciling a RoleBasedGroupSet failed");
    Action::requeue(super::backoff(e, 3))
}
