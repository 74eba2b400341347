//! One reconcile of one RoleBasedGroup: validate, make Services and the
//! discovery ConfigMap match (server-side apply), observe the Pods, plan,
//! carry out the plan, write the status. Every write is idempotent, so a
//! reconcile interrupted anywhere is finished by the next one.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::build::{self, Owner, LABEL_INDEX};
use super::{Context, Error, MANAGER};
use crate::planner::{self, Action as Step, Backoff, DesiredRole};
use crate::spec::v2::{
    CoordinatedPolicy, RoleBasedGroupResource, RoleBasedGroupScalingAdapter, SharedServiceSelection,
};
use crate::spec::{self, Group, ObjectMeta, RoleBasedGroupV2, LABEL_GROUP, LABEL_ROLE};
use crate::status::{self, RbgStatus};

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Reconciles one group (see the module docs), counting the reconcile and
/// its duration in the context's metrics.
pub async fn reconcile(g: Arc<RoleBasedGroupResource>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = std::time::Instant::now();
    let r = reconcile_once(g, ctx.clone()).await;
    ctx.metrics
        .reconciled(start.elapsed(), r.as_ref().err().map(Error::kind));
    r
}

async fn reconcile_once(
    g: Arc<RoleBasedGroupResource>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let name = g.name_any();
    let ns = g.namespace().unwrap_or_else(|| "default".into());
    let client = ctx.client.clone();

    let group = match load(&g, &ctx, &ns).await {
        Ok(group) => group,
        Err(e) => {
            if let Error::Invalid(m) = &e {
                event(&ctx, &g, EventType::Warning, "InvalidSpec", "Validate", m).await;
            }
            return Err(e);
        }
    };
    let owner = Owner {
        api_version: RoleBasedGroupResource::api_version(&()).into_owned(),
        name: name.clone(),
        uid: g.uid().unwrap_or_default(),
    };
    let apply = PatchParams::apply(MANAGER).force();
    // Before any Pod moves: the history names the template being rolled out.
    super::history::record(&client, &ns, &owner, &g.spec).await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = build::config_map(&group, &owner);
    cms.patch(&build::config_map_name(&name), &apply, &Patch::Apply(&cm))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    for r in &group.roles {
        let leader_only = g
            .spec
            .roles
            .iter()
            .find(|s| s.name == r.name)
            .and_then(|s| s.leader_worker_pattern.as_ref())
            .and_then(|l| l.shared_service_selection)
            == Some(SharedServiceSelection::LeaderOnly);
        let svc = build::service(&group, r, leader_only, &owner);
        let svc_name = svc.metadata.name.clone().unwrap_or_default();
        services
            .patch(&svc_name, &apply, &Patch::Apply(&svc))
            .await?;
    }

    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pods = pods_api
        .list(&ListParams::default().labels(&format!("{LABEL_GROUP}={name}")))
        .await?
        .items;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let observed = build::observe(&group, &pods, i64::try_from(now).unwrap_or(i64::MAX));
    let desired: Vec<DesiredRole> = group.roles.iter().map(DesiredRole::from_role).collect();
    let plan = planner::plan(planner::PlanInput {
        roles: &desired,
        coordination: &group.coordination,
        observed: &observed,
        // Crashes are reported at time 0 with no backoff: the kubelet has
        // already backed off before the restart count moved.
        now: u64::MAX / 2,
        backoff: Backoff {
            base_ms: 0,
            max_ms: 0,
        },
    });
    for step in &plan.actions {
        execute(&ctx, &g, &group, &desired, &pods_api, &pods, &owner, step).await?;
    }

    let waiting: Vec<(String, String)> = plan
        .waiting
        .iter()
        .filter_map(|w| match w {
            planner::Wait::Dependency { role, dependency } => {
                Some((role.clone(), dependency.clone()))
            }
            _ => None,
        })
        .collect();
    let restarting = observed
        .values()
        .flatten()
        .filter(|i| i.crash.is_some())
        .count();
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let mut st = status::compute(status::StatusInput {
        roles: &desired,
        observed: &observed,
        generation: g.metadata.generation.unwrap_or(0),
        waiting: &waiting,
        restarting: u32::try_from(restarting).unwrap_or(u32::MAX),
        previous: g.status.as_ref(),
        now: &stamp,
    });
    status::add_topology(&mut st, &group.placements, true, g.status.as_ref(), &stamp);
    write_status(&ctx, &name, &ns, &st).await?;
    if let Ok(mut m) = ctx.streaks.lock() {
        m.remove(&format!("{ns}/{name}"));
    }
    let ready = planner::group_ready(&desired, &observed);
    Ok(if plan.actions.is_empty() && ready && waiting.is_empty() {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(2))
    })
}

/// The group with its CoordinatedPolicy (same name) and scaling adapters.
async fn load(g: &RoleBasedGroupResource, ctx: &Context, ns: &str) -> Result<Group, Error> {
    let name = g.name_any();
    let policies: Api<CoordinatedPolicy> = Api::namespaced(ctx.client.clone(), ns);
    let rules = policies
        .get_opt(&name)
        .await?
        .map(|p| p.spec.policies)
        .unwrap_or_default();
    let adapters: Api<RoleBasedGroupScalingAdapter> = Api::namespaced(ctx.client.clone(), ns);
    let adapters = adapters.list(&ListParams::default()).await?.items;
    let sctx = spec::Context {
        rules: rules
            .into_iter()
            .map(|c| {
                (
                    format!("CoordinatedPolicy {name:?} policies[{}]", c.name),
                    c,
                )
            })
            .collect(),
        adapters: adapters
            .iter()
            .filter(|a| a.spec.scale_target_ref.name == name)
            .map(|a| {
                (
                    format!("RoleBasedGroupScalingAdapter {:?}", a.name_any()),
                    a.spec.scale_target_ref.role.clone(),
                    a.spec.replicas,
                )
            })
            .collect(),
        ..spec::Context::default()
    };
    let raw = RoleBasedGroupV2 {
        api_version: spec::API_V1ALPHA2.into(),
        kind: spec::KIND.into(),
        metadata: ObjectMeta {
            name: name.clone(),
            namespace: Some(ns.to_string()),
            ..ObjectMeta::default()
        },
        spec: g.spec.clone(),
        status: None,
        extra: Default::default(),
    };
    warn_ignored(g, ctx, &raw);
    spec::validate_v2(&raw, &sctx)
        .map(|(group, _)| group)
        .map_err(|e| Error::Invalid(e.to_string()))
}

/// Logs, once per generation, each field of the group rbg ignores: unknown
/// fields never fail a reconcile (the API server kept them, so the object
/// is valid to Kubernetes). Pod template fields Kubernetes knows are passed
/// to the cluster whole, so only the local runtime ignores those.
fn warn_ignored(g: &RoleBasedGroupResource, ctx: &Context, raw: &RoleBasedGroupV2) {
    let generation = g.metadata.generation.unwrap_or(0);
    let key = super::key(g);
    let fresh = ctx
        .warned
        .lock()
        .map(|mut m| m.insert(key.clone(), generation) != Some(generation))
        .unwrap_or(true);
    if !fresh {
        return;
    }
    for f in ignored_reports(raw) {
        tracing::warn!(group = %key, generation, "{f}");
    }
}

/// The reports [`warn_ignored`] logs: every ignored field but those only
/// the local runtime ignores.
pub fn ignored_reports(raw: &RoleBasedGroupV2) -> Vec<spec::FieldReport> {
    spec::ignored_fields_v2(raw, spec::SpecAt::Group)
        .into_iter()
        .filter(|f| !f.local_only)
        .collect()
}

/// The Pods of instance `index` of `role` among `pods`.
fn instance_pods<'a>(pods: &'a [Pod], role: &str, index: u32) -> Vec<&'a Pod> {
    pods.iter()
        .filter(|p| {
            let l = p.metadata.labels.clone().unwrap_or_default();
            l.get(LABEL_ROLE).map(String::as_str) == Some(role)
                && l.get(LABEL_INDEX).and_then(|i| i.parse::<u32>().ok()) == Some(index)
        })
        .collect()
}

async fn delete_pods(api: &Api<Pod>, pods: &[&Pod]) -> Result<(), Error> {
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match api.delete(&p.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Carries out one planner action against the API server.
#[allow(clippy::too_many_arguments)]
async fn execute(
    ctx: &Context,
    g: &RoleBasedGroupResource,
    group: &Group,
    desired: &[DesiredRole],
    api: &Api<Pod>,
    pods: &[Pod],
    owner: &Owner,
    step: &Step,
) -> Result<(), Error> {
    match step {
        Step::Create {
            role,
            index,
            revision,
        } => {
            let (Some(r), Some(d)) = (group.role(role), desired.iter().find(|d| &d.name == role))
            else {
                return Ok(());
            };
            for slot in &r.pods {
                let pod = build::pod(group, r, *index, slot, revision, &d.shape, owner)
                    .map_err(Error::Build)?;
                match api.create(&PostParams::default(), &pod).await {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 409) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let note = format!("created {}-{role}-{index} at {revision}", group.name);
            event(
                ctx,
                g,
                EventType::Normal,
                "InstanceCreated",
                "Create",
                &note,
            )
            .await;
        }
        Step::Delete { role, index } => {
            delete_pods(api, &instance_pods(pods, role, *index)).await?;
            let note = format!("deleted {}-{role}-{index}", group.name);
            event(
                ctx,
                g,
                EventType::Normal,
                "InstanceDeleted",
                "Delete",
                &note,
            )
            .await;
        }
        Step::Recreate {
            role,
            index,
            revision,
        } => {
            // The next pass creates it again at the desired revision.
            delete_pods(api, &instance_pods(pods, role, *index)).await?;
            let note = format!("recreating {}-{role}-{index} at {revision}", group.name);
            event(
                ctx,
                g,
                EventType::Normal,
                "InstanceRecreated",
                "Recreate",
                &note,
            )
            .await;
        }
        Step::RestartInPlace {
            role,
            index,
            revision,
        } => {
            let (Some(r), Some(d)) = (group.role(role), desired.iter().find(|d| &d.name == role))
            else {
                return Ok(());
            };
            let base = crate::naming::instance_name(&group.name, role, *index);
            for p in instance_pods(pods, role, *index) {
                let pname = p.name_any();
                let suffix = pname.strip_prefix(&base).unwrap_or("");
                let Some(slot) = r.pods.iter().find(|s| s.suffix == suffix) else {
                    continue;
                };
                // Only images change: the kubelet restarts those containers
                // and the Pod keeps its IP, node and emptyDir volumes.
                let containers: Vec<serde_json::Value> = slot
                    .template
                    .spec
                    .containers
                    .iter()
                    .map(|c| json!({"name": c.name, "image": c.image}))
                    .collect();
                let patch = json!({
                    "metadata": {
                        "labels": {build::LABEL_REVISION: revision},
                        "annotations": {
                            build::ANNOTATION_SHAPE: d.shape,
                            build::ANNOTATION_RESTARTS: restarts_after_patch(p, &slot.template.spec.containers).to_string(),
                        },
                    },
                    "spec": {"containers": containers},
                });
                api.patch(&pname, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await?;
            }
            let note = format!(
                "updating {}-{role}-{index} in place to {revision}",
                group.name
            );
            event(ctx, g, EventType::Normal, "InPlaceUpdate", "Update", &note).await;
        }
        Step::RecreateGroup { reason } => {
            let all: Vec<&Pod> = pods.iter().collect();
            delete_pods(api, &all).await?;
            event(
                ctx,
                g,
                EventType::Warning,
                "GroupRecreated",
                "Recreate",
                reason,
            )
            .await;
        }
    }
    Ok(())
}

/// The container restarts of `p` once the kubelet has applied an in-place
/// patch to `containers`: those it has now, plus one for each container
/// whose image changes (the kubelet restarts exactly those). Recorded as
/// already seen, so that under a restart policy that recreates instances
/// the update's own restarts are not taken for crashes. Never below what
/// the Pod already records: a patch repeated before the kubelet acted
/// (a reconcile retried after a partial failure) changes no image, and
/// must not forget the restarts the first one announced.
fn restarts_after_patch(p: &Pod, containers: &[spec::Container]) -> u32 {
    let statuses = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    let now: u32 = statuses
        .iter()
        .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
        .sum();
    let running = p
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[]);
    let changing = containers
        .iter()
        .filter(|c| {
            running
                .iter()
                .find(|r| r.name == c.name)
                .is_some_and(|r| r.image != c.image)
        })
        .count();
    let recorded = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(build::ANNOTATION_RESTARTS))
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0);
    now.saturating_add(u32::try_from(changing).unwrap_or(u32::MAX))
        .max(recorded)
}

/// Writes the status subresource by server-side apply.
async fn write_status(ctx: &Context, name: &str, ns: &str, st: &RbgStatus) -> Result<(), Error> {
    let api: Api<RoleBasedGroupResource> = Api::namespaced(ctx.client.clone(), ns);
    let body = json!({
        "apiVersion": RoleBasedGroupResource::api_version(&()),
        "kind": spec::KIND,
        "status": st,
    });
    api.patch_status(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Publishes an Event on the group; a failure to publish is logged, never
/// fails the reconcile.
async fn event(
    ctx: &Context,
    g: &RoleBasedGroupResource,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &g.object_ref(&())).await {
        tracing::debug!(error = %e, "publishing an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(image: &str, restarts: i32, seen: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "g-e-0", "annotations": {build::ANNOTATION_RESTARTS: seen}},
            "spec": {"containers": [{"name": "c", "image": image}, {"name": "side", "image": "s:1"}]},
            "status": {"containerStatuses": [
                {"name": "c", "image": image, "imageID": "", "ready": true, "restartCount": restarts},
                {"name": "side", "image": "s:1", "imageID": "", "ready": true, "restartCount": 1}]},
        }))
        .expect("pod")
    }

    fn containers(image: &str) -> Vec<spec::Container> {
        serde_json::from_value(
            json!([{"name": "c", "image": image}, {"name": "side", "image": "s:1"}]),
        )
        .expect("containers")
    }

    #[test]
    fn restarts_announced_by_an_in_place_patch() {
        // 2 + 1 restarts now; one image changes: the kubelet makes it 4.
        assert_eq!(
            restarts_after_patch(&pod("e:v1", 2, "3"), &containers("e:v2")),
            4
        );
        // The same patch again before the kubelet acted: still 4.
        assert_eq!(
            restarts_after_patch(&pod("e:v2", 2, "4"), &containers("e:v2")),
            4
        );
        // Nothing changes: what the Pod has.
        assert_eq!(
            restarts_after_patch(&pod("e:v1", 2, "3"), &containers("e:v1")),
            3
        );
    }
}
