//! Rollout history on the cluster: each distinct template of a group is
//! recorded as an `apps/v1` ControllerRevision owned by the group, as a
//! StatefulSet records its own. `data` is `{"spec": ...}`: the group's spec
//! with every role's `replicas` removed (scaling is not a revision, as
//! locally), so an earlier revision can be re-applied over the current
//! replica counts. Revision numbers only grow: going back to an earlier
//! template reuses its ControllerRevision and gives it the next number.
//! Beyond [`HISTORY_LIMIT`] the lowest-numbered ones are deleted.
//!
//! [`plan`] decides from the revisions listed (pure, table-tested);
//! [`record`] lists, creates, renumbers and prunes.

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64;

use super::build::Owner;
use super::Error;
use crate::spec::v2::GroupSpecV2;
use crate::spec::LABEL_GROUP;

/// How many ControllerRevisions of a group are kept.
pub const HISTORY_LIMIT: usize = 10;
/// Label on a ControllerRevision with the hash of its data.
pub const LABEL_HASH: &str = "rolebasedgroup.workloads.x-k8s.io/revision-hash";

/// Sorts every map of `v` by key, so equal data hash equally whatever
/// order the user wrote keys in.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for k in keys {
                out.insert(k.clone(), sorted(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        v => v.clone(),
    }
}

/// The data a ControllerRevision of `spec` holds: `{"spec": spec}` with
/// every role's `replicas` removed.
pub fn template_data(spec: &GroupSpecV2) -> Value {
    let mut spec = spec.clone();
    for r in &mut spec.roles {
        r.replicas = None;
    }
    let v = serde_json::to_value(&spec).unwrap_or(Value::Null);
    sorted(&json!({ "spec": v }))
}

/// The hash naming a revision of `data` (10 hex digits, stable across runs
/// and machines: xxh3-64 of the key-sorted JSON).
pub fn hash(data: &Value) -> String {
    let text = serde_json::to_string(&sorted(data)).unwrap_or_default();
    format!("{:010x}", xxh3_64(text.as_bytes()) >> 24)
}

/// The name of `group`'s ControllerRevision with `hash`.
pub fn revision_name(group: &str, hash: &str) -> String {
    format!("{group}-{hash}")
}

/// The ControllerRevision number `revision` of `owner`'s group in `ns`.
pub fn controller_revision(
    owner: &Owner,
    ns: &str,
    data: &Value,
    revision: i64,
) -> ControllerRevision {
    let h = hash(data);
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(&owner.name, &h)),
            namespace: Some(ns.to_string()),
            labels: Some(
                [
                    (LABEL_GROUP.to_string(), owner.name.clone()),
                    (LABEL_HASH.to_string(), h),
                ]
                .into(),
            ),
            owner_references: Some(vec![OwnerReference {
                api_version: owner.api_version.clone(),
                kind: crate::spec::KIND.to_string(),
                name: owner.name.clone(),
                uid: owner.uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data.clone())),
        revision,
    }
}

/// One change to a group's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Record the current template as revision `revision`.
    Create {
        /// Its revision number.
        revision: i64,
    },
    /// The current template was recorded before: renumber `name`.
    Renumber {
        /// The ControllerRevision.
        name: String,
        /// Its new number.
        revision: i64,
    },
    /// Prune `name`, beyond the history limit.
    Delete {
        /// The ControllerRevision.
        name: String,
    },
}

/// The steps that make `existing` (name, revision number) record
/// `current` (the name of the current template's revision) as the newest,
/// keeping at most `limit` revisions.
pub fn plan(existing: &[(String, i64)], current: &str, limit: usize) -> Vec<Step> {
    let max = existing.iter().map(|(_, r)| *r).max().unwrap_or(0);
    let mut steps = Vec::new();
    let mut kept: Vec<(String, i64)> = existing.to_vec();
    match existing.iter().find(|(n, _)| n == current) {
        Some((_, r)) if *r == max => {}
        Some(_) => {
            steps.push(Step::Renumber {
                name: current.to_string(),
                revision: max + 1,
            });
            kept.retain(|(n, _)| n != current);
            kept.push((current.to_string(), max + 1));
        }
        None => {
            steps.push(Step::Create { revision: max + 1 });
            kept.push((current.to_string(), max + 1));
        }
    }
    kept.sort_by_key(|(_, r)| *r);
    let extra = kept.len().saturating_sub(limit.max(1));
    for (name, _) in kept.into_iter().take(extra) {
        steps.push(Step::Delete { name });
    }
    steps
}

fn status_is(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Records `spec` as the newest revision of `owner`'s group in `ns` and
/// prunes the oldest; returns the current revision's name. Every step is
/// idempotent: a reconcile interrupted between them is finished by the
/// next.
pub async fn record(
    client: &Client,
    ns: &str,
    owner: &Owner,
    spec: &GroupSpecV2,
) -> Result<String, Error> {
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    let listed = api
        .list(&ListParams::default().labels(&format!("{LABEL_GROUP}={}", owner.name)))
        .await?
        .items;
    let existing: Vec<(String, i64)> = listed
        .iter()
        .filter_map(|r| Some((r.metadata.name.clone()?, r.revision)))
        .collect();
    let data = template_data(spec);
    let current = revision_name(&owner.name, &hash(&data));
    for step in plan(&existing, &current, HISTORY_LIMIT) {
        match step {
            Step::Create { revision } => {
                let cr = controller_revision(owner, ns, &data, revision);
                match api.create(&PostParams::default(), &cr).await {
                    Ok(_) => {}
                    Err(e) if status_is(&e, 409) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Step::Renumber { name, revision } => {
                let patch = json!({ "revision": revision });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Step::Delete { name } => match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if status_is(&e, 404) => {}
                Err(e) => return Err(e.into()),
            },
        }
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ControllerRevisions as listed: (name, revision number).
    type Listed = Vec<(String, i64)>;

    fn revs(list: &[(&str, i64)]) -> Listed {
        list.iter().map(|(n, r)| (n.to_string(), *r)).collect()
    }

    #[test]
    fn plans() {
        let create = |revision| Step::Create { revision };
        let renumber = |name: &str, revision| Step::Renumber {
            name: name.into(),
            revision,
        };
        let delete = |name: &str| Step::Delete { name: name.into() };
        // (existing, current, limit, steps)
        let table: Vec<(Listed, &str, usize, Vec<Step>)> = vec![
            (revs(&[]), "g-a", 10, vec![create(1)]),
            (revs(&[("g-a", 1)]), "g-a", 10, vec![]),
            (revs(&[("g-a", 1)]), "g-b", 10, vec![create(2)]),
            // Back to an earlier template: renumbered, not duplicated.
            (
                revs(&[("g-a", 1), ("g-b", 2)]),
                "g-a",
                10,
                vec![renumber("g-a", 3)],
            ),
            // Over the limit: the lowest numbers go.
            (
                revs(&[("g-a", 1), ("g-b", 2), ("g-c", 3)]),
                "g-d",
                2,
                vec![create(4), delete("g-a"), delete("g-b")],
            ),
            // The renumbered current one is never pruned.
            (
                revs(&[("g-a", 1), ("g-b", 2), ("g-c", 3)]),
                "g-a",
                2,
                vec![renumber("g-a", 4), delete("g-b")],
            ),
            // A limit of 0 still keeps the current revision.
            (
                revs(&[("g-a", 1)]),
                "g-b",
                0,
                vec![create(2), delete("g-a")],
            ),
        ];
        for (existing, current, limit, want) in table {
            assert_eq!(
                plan(&existing, current, limit),
                want,
                "{existing:?} {current} {limit}"
            );
        }
    }

    fn spec(text: &str) -> GroupSpecV2 {
        serde_yaml::from_str(text).expect("spec")
    }

    #[test]
    fn replicas_are_not_a_revision_but_images_are() {
        let a = spec("roles: [{name: r, replicas: 1, standalonePattern: {template: {spec: {containers: [{name: c, image: 'x:1'}]}}}}]");
        let b = spec("roles: [{name: r, replicas: 5, standalonePattern: {template: {spec: {containers: [{name: c, image: 'x:1'}]}}}}]");
        let c = spec("roles: [{name: r, replicas: 5, standalonePattern: {template: {spec: {containers: [{name: c, image: 'x:2'}]}}}}]");
        let h = |s: &GroupSpecV2| hash(&template_data(s));
        assert_eq!(h(&a), h(&b));
        assert_ne!(h(&b), h(&c));
        assert_eq!(h(&a).len(), 10);
        assert!(template_data(&b)["spec"]["roles"][0]
            .get("replicas")
            .is_none());
    }

    #[test]
    fn builder_names_labels_and_owns() {
        let owner = Owner {
            api_version: "workloads.x-k8s.io/v1alpha2".into(),
            name: "g".into(),
            uid: "u".into(),
        };
        let data = json!({"spec": {"roles": []}});
        let cr = controller_revision(&owner, "ns", &data, 3);
        let h = hash(&data);
        assert_eq!(cr.metadata.name.as_deref(), Some(format!("g-{h}").as_str()));
        assert_eq!(cr.revision, 3);
        let labels = cr.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(LABEL_GROUP).map(String::as_str), Some("g"));
        assert_eq!(labels.get(LABEL_HASH), Some(&h));
        let o = &cr.metadata.owner_references.clone().unwrap_or_default()[0];
        assert_eq!((o.uid.as_str(), o.controller), ("u", Some(true)));
        assert_eq!(cr.data.map(|d| d.0), Some(data));
    }
}
