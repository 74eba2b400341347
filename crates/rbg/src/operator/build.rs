//! Pure builders of the Kubernetes objects a group becomes, and the
//! planner's view of the Pods that exist. No I/O: the reconciler fetches
//! and writes; these functions are table-tested on their own.
//!
//! - one Pod per Pod slot of an instance: `g-r-i` (leader or only Pod),
//!   `g-r-i-j` (workers), `g-r-i-<component>-<j>`; `hostname` and
//!   `subdomain: s-g-r` give each the DNS name `g-r-i.s-g-r.ns`;
//! - a headless Service `s-g-r` per role (`clusterIP: None`,
//!   `publishNotReadyAddresses: true`);
//! - a ConfigMap `<g>-rbg-config` with the discovery file, mounted at
//!   `/etc/rbg` in every container (`RBG_CONFIG=/etc/rbg/config.yaml`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapVolumeSource, EnvVar, Pod, PodAffinity, PodAffinityTerm, PodSpec,
    Service, ServicePort, ServiceSpec, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as KIntOrString;

use crate::discovery;
use crate::naming::{instance_host, instance_name, service_name};
use crate::planner::{Crash, Observed, ObservedInstance};
use crate::spec::{Group, IntOrString, PodSlot, RestartPolicy, Role, LABEL_GROUP, LABEL_ROLE};

/// Label with the instance index of a Pod.
pub const LABEL_INDEX: &str = "rolebasedgroup.workloads.x-k8s.io/index";
/// Label with the revision a Pod runs.
pub const LABEL_REVISION: &str = "rolebasedgroup.workloads.x-k8s.io/revision";
/// Label with the Pod's component (`leader`, `worker`, a component name).
pub const LABEL_COMPONENT: &str = "rolebasedgroup.workloads.x-k8s.io/component";
/// Annotation with the revision's shape (template without images).
pub const ANNOTATION_SHAPE: &str = "rolebasedgroup.workloads.x-k8s.io/shape";
/// Annotation with the container restarts already acted on.
pub const ANNOTATION_RESTARTS: &str = "rolebasedgroup.workloads.x-k8s.io/restarts-seen";
/// Where the discovery file is mounted in every container.
pub const CONFIG_DIR: &str = "/etc/rbg";

/// Name of the group's discovery ConfigMap.
pub fn config_map_name(group: &str) -> String {
    format!("{group}-rbg-config")
}

/// What the builders need about the owning RoleBasedGroup object.
#[derive(Clone, Debug)]
pub struct Owner {
    /// API version of the object.
    pub api_version: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

fn owner_refs(o: &Owner) -> Vec<OwnerReference> {
    vec![OwnerReference {
        api_version: o.api_version.clone(),
        kind: crate::spec::KIND.to_string(),
        name: o.name.clone(),
        uid: o.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]
}

fn base_labels(g: &Group, role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_GROUP.to_string(), g.name.clone()),
        (LABEL_ROLE.to_string(), role.to_string()),
    ])
}

/// The Pod of slot `slot` of instance `index` of `role` at `revision`.
pub fn pod(
    g: &Group,
    role: &Role,
    index: u32,
    slot: &PodSlot,
    revision: &str,
    shape: &str,
    owner: &Owner,
) -> Result<Pod, String> {
    // Our template keeps every field it does not model, so the round trip
    // through JSON gives the user's whole Pod template to the cluster.
    let json = serde_json::to_value(&slot.template).map_err(|e| e.to_string())?;
    let t: k8s_openapi::api::core::v1::PodTemplateSpec =
        serde_json::from_value(json).map_err(|e| format!("role {:?}: template: {e}", role.name))?;
    let mut meta = t.metadata.unwrap_or_default();
    let mut spec: PodSpec = t.spec.unwrap_or_default();
    let name = format!(
        "{}{}",
        instance_name(&g.name, &role.name, index),
        slot.suffix
    );
    let mut labels = meta.labels.take().unwrap_or_default();
    labels.extend(base_labels(g, &role.name));
    labels.insert(LABEL_INDEX.into(), index.to_string());
    labels.insert(LABEL_REVISION.into(), revision.to_string());
    if !slot.component.is_empty() {
        labels.insert(LABEL_COMPONENT.into(), slot.component.clone());
    }
    let mut annotations = meta.annotations.take().unwrap_or_default();
    annotations.insert(ANNOTATION_SHAPE.into(), shape.to_string());
    annotations.insert(ANNOTATION_RESTARTS.into(), "0".into());
    let svc = service_name(&g.name, &role.name);
    spec.hostname = Some(name.clone());
    spec.subdomain = Some(svc);
    // The same variables the local runtime injects, plus the pattern's.
    let mut env = vec![
        ("GROUP_NAME", g.name.clone()),
        ("ROLE_NAME", role.name.clone()),
        ("ROLE_INDEX", index.to_string()),
        ("RBG_GROUP_NAME", g.name.clone()),
        ("RBG_ROLE_NAME", role.name.clone()),
        ("RBG_ROLE_INDEX", index.to_string()),
        ("RBG_CONFIG", format!("{CONFIG_DIR}/config.yaml")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect::<Vec<_>>();
    let pos = role
        .pods
        .iter()
        .position(|p| p.suffix == slot.suffix)
        .unwrap_or(0);
    env.extend(discovery::pattern_env(g, &role.name, index, pos));
    for c in &mut spec.containers {
        let mine = c.env.take().unwrap_or_default();
        let mut all: Vec<EnvVar> = env
            .iter()
            .filter(|(k, _)| !mine.iter().any(|e| &e.name == k))
            .map(|(k, v)| EnvVar {
                name: k.clone(),
                value: Some(v.clone()),
                value_from: None,
            })
            .collect();
        all.extend(mine);
        c.env = Some(all);
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: "rbg-config".into(),
                mount_path: CONFIG_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
    }
    add_topology_affinity(g, &role.name, index, &mut spec);
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "rbg-config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(&g.name),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    });
    meta.name = Some(name);
    meta.namespace = Some(g.namespace.clone());
    meta.labels = Some(labels);
    meta.annotations = Some(annotations);
    meta.owner_references = Some(owner_refs(owner));
    Ok(Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    })
}

/// The group's topology constraints covering `role` as Pod affinity for
/// Kubernetes' default scheduler, a level being a node-label key: every
/// Pod of a placement group (one instance, or every Pod of a rule's roles)
/// must (`required`) or should (`preferred`, weight 100) share that label's
/// value with the group's other Pods. The first Pod of a group goes
/// anywhere (the scheduler lets a Pod that matches its own term start a
/// group) and the rest follow it: the placement is Pod by Pod, not atomic,
/// so a domain too small for the group leaves its last Pods pending. The
/// user's own affinity terms are kept.
fn add_topology_affinity(g: &Group, role: &str, index: u32, spec: &mut PodSpec) {
    let mut required = Vec::new();
    let mut preferred = Vec::new();
    for p in g
        .placements
        .iter()
        .filter(|p| p.roles.iter().any(|r| r == role))
    {
        let mut labels = BTreeMap::from([(LABEL_GROUP.to_string(), g.name.clone())]);
        let mut expressions = None;
        if p.per_instance {
            labels.insert(LABEL_ROLE.into(), role.to_string());
            labels.insert(LABEL_INDEX.into(), index.to_string());
        } else {
            expressions = Some(vec![LabelSelectorRequirement {
                key: LABEL_ROLE.into(),
                operator: "In".into(),
                values: Some(p.roles.clone()),
            }]);
        }
        let term = |level: &String| PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: expressions.clone(),
            }),
            topology_key: level.clone(),
            ..PodAffinityTerm::default()
        };
        required.extend(p.required.iter().map(term));
        preferred.extend(p.preferred.iter().map(|l| WeightedPodAffinityTerm {
            weight: 100,
            pod_affinity_term: term(l),
        }));
    }
    if required.is_empty() && preferred.is_empty() {
        return;
    }
    let affinity = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .pod_affinity
        .get_or_insert_with(PodAffinity::default);
    if !required.is_empty() {
        affinity
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .extend(required);
    }
    if !preferred.is_empty() {
        affinity
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .extend(preferred);
    }
}

/// The headless Service `s-g-r` of a role.
pub fn service(g: &Group, role: &Role, leader_only: bool, owner: &Owner) -> Service {
    let mut selector = base_labels(g, &role.name);
    if leader_only {
        selector.insert(LABEL_COMPONENT.into(), "leader".into());
    }
    let ports: Vec<ServicePort> = role
        .service_ports
        .iter()
        .map(|p| ServicePort {
            name: Some(p.name.clone()),
            port: i32::from(p.port),
            protocol: p.protocol.clone(),
            target_port: p.target_port.as_ref().map(|t| match t {
                IntOrString::Int(n) => KIntOrString::Int(i32::try_from(*n).unwrap_or(0)),
                IntOrString::String(s) => KIntOrString::String(s.clone()),
            }),
            ..ServicePort::default()
        })
        .collect();
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(&g.name, &role.name)),
            namespace: Some(g.namespace.clone()),
            labels: Some(base_labels(g, &role.name)),
            owner_references: Some(owner_refs(owner)),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector),
            ports: if ports.is_empty() { None } else { Some(ports) },
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The discovery ConfigMap: instance addresses are their DNS names.
pub fn config_map(g: &Group, owner: &Owner) -> ConfigMap {
    let file = discovery::discovery_file(g, &|r, i| {
        format!(
            "{}.{}.svc.cluster.local",
            instance_host(&g.name, r, i),
            g.namespace
        )
    });
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map_name(&g.name)),
            namespace: Some(g.namespace.clone()),
            labels: Some(BTreeMap::from([(LABEL_GROUP.to_string(), g.name.clone())])),
            owner_references: Some(owner_refs(owner)),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "config.yaml".to_string(),
            serde_yaml::to_string(&file).unwrap_or_default(),
        )])),
        ..ConfigMap::default()
    }
}

/// True when the Pod's Ready condition is True and has been for
/// `min_ready_secs` by `now_secs` (Unix seconds).
fn pod_available(p: &Pod, min_ready_secs: u32, now_secs: i64) -> bool {
    let Some(c) = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
    else {
        return false;
    };
    if c.status != "True" {
        return false;
    }
    if min_ready_secs == 0 {
        return true;
    }
    c.last_transition_time
        .as_ref()
        .is_some_and(|t| now_secs - t.0.as_second() >= i64::from(min_ready_secs))
}

/// True while the kubelet has not yet restarted a container onto the image
/// its spec names (an in-place update in flight).
fn image_pending(p: &Pod) -> bool {
    let Some(spec) = &p.spec else { return false };
    let statuses = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    spec.containers.iter().any(|c| {
        let want = c.image.clone().unwrap_or_default();
        statuses
            .iter()
            .find(|s| s.name == c.name)
            // Runtimes report normalized names (docker.io/library/x:v1).
            .is_some_and(|s| s.image != want && !s.image.ends_with(&format!("/{want}")))
    })
}

fn restarts(p: &Pod) -> u32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| {
            cs.iter()
                .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
                .sum()
        })
}

/// The planner's view of the group's Pods: one instance per (role,
/// index), ready when all of its Pods are available, busy while any is
/// terminating or mid in-place update. A container restart of a role whose
/// policy recreates instances is reported as a crash.
pub fn observe(g: &Group, pods: &[Pod], now_secs: i64) -> Observed {
    let mut by: BTreeMap<(String, u32), Vec<&Pod>> = BTreeMap::new();
    for p in pods {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let (Some(role), Some(index)) = (
            labels.get(LABEL_ROLE),
            labels.get(LABEL_INDEX).and_then(|i| i.parse::<u32>().ok()),
        ) else {
            continue;
        };
        by.entry((role.clone(), index)).or_default().push(p);
    }
    let mut out = Observed::new();
    for ((role, index), list) in by {
        let r = g.role(&role);
        let want = r.map_or(1, |r| r.pods.len());
        let min_ready = r.map_or(0, |r| r.min_ready_seconds);
        // The leader (no worker/component suffix) carries the revision.
        let leader = list
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&instance_name(&g.name, &role, index)))
            .or(list.first())
            .copied();
        let Some(leader) = leader else { continue };
        let label = |k: &str| {
            leader
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k).cloned())
                .unwrap_or_default()
        };
        let annotation = |p: &Pod, k: &str| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k).cloned())
                .unwrap_or_default()
        };
        let busy = list
            .iter()
            .any(|p| p.metadata.deletion_timestamp.is_some() || image_pending(p));
        let total: u32 = list.iter().map(|p| restarts(p)).sum();
        let seen: u32 = list
            .iter()
            .map(|p| {
                annotation(p, ANNOTATION_RESTARTS)
                    .parse::<u32>()
                    .unwrap_or(0)
            })
            .sum();
        let recreates = r.is_some_and(|r| r.restart_policy != RestartPolicy::None);
        out.entry(role.clone()).or_default().push(ObservedInstance {
            index,
            revision: label(LABEL_REVISION),
            shape: annotation(leader, ANNOTATION_SHAPE),
            ready: list.len() == want && list.iter().all(|p| pod_available(p, min_ready, now_secs)),
            running: list
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")),
            restarts: total,
            // The kubelet restarts containers itself; only a policy that
            // recreates the instance (or the group) needs the planner.
            crash: (recreates && total > seen).then_some(Crash { at: 0, streak: 1 }),
            busy,
        });
    }
    out
}
