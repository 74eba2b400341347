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

/// `rbg rollout history|undo --cluster`: where the group lives.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// Work on the group on the cluster, through its ControllerRevisions
    /// (kubeconfig or in-cluster config), not the local state directory.
    #[arg(long)]
    pub cluster: bool,
    /// Namespace of the group on the cluster (default: the client's).
    #[arg(long)]
    pub namespace: Option<String>,
}

impl ClusterArgs {
    /// A client from the kubeconfig (or in-cluster config) and the
    /// namespace to use.
    pub async fn connect(&self) -> Result<(Client, String), Error> {
        let client = Client::try_default().await?;
        let ns = self
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        Ok((client, ns))
    }
}

/// One recorded revision of a group on the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Its revision number.
    pub revision: i64,
    /// The ControllerRevision's name.
    pub name: String,
    /// When it was created, as the API server wrote it.
    pub created: String,
    /// `role=image,image` for each role, from the recorded templates.
    pub images: Vec<String>,
}

/// The images of every role of a recorded `data`, `role=image[,image]`.
fn images(data: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(cs)) = m.get("containers") {
                    for c in cs {
                        if let Some(i) = c["image"].as_str() {
                            out.push(i.to_string());
                        }
                    }
                }
                for (k, c) in m {
                    if k != "containers" {
                        walk(c, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    data["spec"]["roles"]
        .as_array()
        .map(|roles| {
            roles
                .iter()
                .map(|r| {
                    let mut found = Vec::new();
                    walk(r, &mut found);
                    found.dedup();
                    format!("{}={}", r["name"].as_str().unwrap_or("?"), found.join(","))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The recorded revisions of `group` in `ns`, oldest first.
pub async fn entries(client: &Client, ns: &str, group: &str) -> Result<Vec<Entry>, Error> {
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    let mut out: Vec<Entry> = api
        .list(&ListParams::default().labels(&format!("{LABEL_GROUP}={group}")))
        .await?
        .items
        .into_iter()
        .map(|r| Entry {
            revision: r.revision,
            name: r.metadata.name.clone().unwrap_or_default(),
            created: r
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            images: r.data.as_ref().map(|d| images(&d.0)).unwrap_or_default(),
        })
        .collect();
    out.sort_by_key(|e| e.revision);
    Ok(out)
}

/// `entries` as the table `rbg rollout history --cluster` prints.
pub fn table(entries: &[Entry]) -> String {
    let mut out = format!(
        "{:<9} {:<22} {:<26} IMAGES\n",
        "REVISION", "NAME", "CREATED"
    );
    for e in entries {
        out.push_str(&format!(
            "{:<9} {:<22} {:<26} {}\n",
            e.revision,
            e.name,
            e.created,
            e.images.join(" ")
        ));
    }
    out
}

/// The spec that restores a recorded `data` over `current`: the recorded
/// roles and templates, each role keeping the replica count it has now
/// (a role the current spec lacks takes the default).
pub fn undo_spec(current: &GroupSpecV2, data: &Value) -> Result<GroupSpecV2, String> {
    let mut spec: GroupSpecV2 =
        serde_json::from_value(data["spec"].clone()).map_err(|e| format!("recorded spec: {e}"))?;
    for r in &mut spec.roles {
        r.replicas = current
            .roles
            .iter()
            .find(|c| c.name == r.name)
            .and_then(|c| c.replicas);
    }
    Ok(spec)
}

/// Puts `group` back to revision `to` (default: the one before the
/// newest) by replacing its spec, guarded by its resourceVersion; returns
/// the revision number restored. The operator then records the restored
/// template as the newest revision, as for any edit.
pub async fn undo(client: &Client, ns: &str, group: &str, to: Option<i64>) -> Result<i64, Error> {
    let list = entries(client, ns, group).await?;
    let target = match to {
        Some(n) => list.iter().find(|e| e.revision == n),
        None => list.iter().rev().nth(1),
    }
    .ok_or_else(|| {
        Error::Invalid(match to {
            Some(n) => format!("group {group:?} has no revision {n}"),
            None => format!("group {group:?} has no earlier revision"),
        })
    })?;
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    let data = revisions
        .get(&target.name)
        .await?
        .data
        .map(|d| d.0)
        .unwrap_or(Value::Null);
    let groups: Api<crate::spec::v2::RoleBasedGroupResource> = Api::namespaced(client.clone(), ns);
    let mut g = groups.get(group).await?;
    g.spec = undo_spec(&g.spec, &data).map_err(Error::Invalid)?;
    // replace carries the resourceVersion just read: an edit in between
    // makes this fail with a Conflict rather than be overwritten.
    groups.replace(group, &PostParams::default(), &g).await?;
    Ok(target.revision)
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
    fn undo_restores_templates_and_keeps_replicas() {
        let old = spec("roles: [{name: a, replicas: 1, standalonePattern: {template: {spec: {containers: [{name: c, image: 'x:1'}]}}}}, {name: gone, standalonePattern: {template: {spec: {containers: [{name: c, image: 'y:1'}]}}}}]");
        let now = spec("roles: [{name: a, replicas: 4, standalonePattern: {template: {spec: {containers: [{name: c, image: 'x:2'}]}}}}, {name: new, replicas: 2, standalonePattern: {template: {spec: {containers: [{name: c, image: 'z:1'}]}}}}]");
        let data = template_data(&old);
        let back = undo_spec(&now, &data).expect("undo");
        let names: Vec<&str> = back.roles.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "gone"], "the recorded roles");
        assert_eq!(back.roles[0].replicas, Some(4), "today's count");
        assert_eq!(back.roles[1].replicas, None, "not in today's spec: default");
        assert_eq!(
            hash(&template_data(&back)),
            hash(&data),
            "the recorded template"
        );
        assert_eq!(images(&data), ["a=x:1", "gone=y:1"]);
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
