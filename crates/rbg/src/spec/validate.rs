//! Validation: every rule of RBG.md checked on a v1alpha2 group (v1alpha1
//! groups arrive converted, see [`super::convert`]), resolving each role's
//! pattern into the Pods of an instance. Problems are collected rather than
//! returned at the first, so a user fixes a file in one round; each message
//! names the role and field.

use std::collections::{BTreeMap, BTreeSet};

use super::amount::{Amount, IntOrString};
use super::convert;
use super::group::{
    CoordinationPolicy, Group, Objects, Pattern, Placement, PodSlot, Role, RolloutCoordination,
    ScalingCoordination, SpecError, UpdatePolicy,
};
use super::pod::{Container, PodTemplateSpec, Volume};
use super::template::{patch_template, resolve_template, validate_template};
use super::types::{
    CoordinatedRollingUpdate, CoordinatedScaling, Coordination, RestartPolicy, RoleBasedGroup,
    RoleTemplate, RolloutStrategy, ServicePort, TopologyConstraint, UpdateType,
    ANNOTATION_WORKLOAD, API_V1ALPHA2, KIND,
};
use super::v2::{
    GroupSpecV2, PodManagementPolicy, RestartPolicyConfig, RoleBasedGroupV2, RoleSpecV2,
};
use crate::naming::{dns_problem, is_label_key};

/// Problems found so far, in the order they were found.
type Errors = Vec<String>;

/// A ClusterEngineRuntimeProfile of the file: containers and volumes added
/// to the Pods of roles that name it in `engineRuntimes`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineProfile {
    /// Containers appended to each Pod.
    pub containers: Vec<Container>,
    /// Volumes appended to each Pod.
    pub volumes: Vec<Volume>,
}

/// What the other documents of a file contribute to one group.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// Coordination rules bound to the group, each with where it was written.
    pub rules: Vec<(String, Coordination)>,
    /// Scaling adapters aimed at the group: (where, role, replicas).
    pub adapters: Vec<(String, String, Option<u32>)>,
    /// Engine runtime profiles by name.
    pub profiles: BTreeMap<String, EngineProfile>,
    /// ConfigMaps, Secrets, Services.
    pub objects: Objects,
}

/// Checks a v1alpha1 group (through its v1alpha2 conversion).
pub fn validate(raw: &RoleBasedGroup) -> Result<Group, SpecError> {
    let (v2, rules) = convert::to_v1alpha2(raw);
    let ctx = Context {
        rules: rules
            .into_iter()
            .enumerate()
            .map(|(i, c)| (coordination_at(i, &c.name, "coordination"), c))
            .collect(),
        ..Context::default()
    };
    validate_v2(&v2, &ctx).map(|(g, _)| g)
}

fn coordination_at(i: usize, name: &str, list: &str) -> String {
    if name.is_empty() {
        format!("{list}[{i}]")
    } else {
        format!("{list} {name:?}")
    }
}

/// Checks a v1alpha2 group with what the rest of its file contributes;
/// returns the group and notes on what was applied or left out.
pub fn validate_v2(
    raw: &RoleBasedGroupV2,
    ctx: &Context,
) -> Result<(Group, Vec<String>), SpecError> {
    let mut errs = Errors::new();
    let mut notes = Vec::new();
    if raw.api_version != API_V1ALPHA2 && raw.api_version != super::types::API_VERSION {
        errs.push(format!(
            "apiVersion: {:?} is not {API_V1ALPHA2:?}",
            raw.api_version
        ));
    }
    if raw.kind != KIND {
        errs.push(format!("kind: {:?} is not {KIND:?}", raw.kind));
    }
    if let Some(p) = dns_problem("metadata.name", &raw.metadata.name) {
        errs.push(p);
    }
    let spec = normalized(&raw.spec, &mut notes);
    if spec.roles.is_empty() {
        errs.push("spec.roles: a group needs at least one role".to_string());
    }
    let templates = role_templates(&spec, &mut errs);
    let names = role_names(&raw.metadata.name, &spec, &mut errs);
    let mut roles: Vec<Role> = spec
        .roles
        .iter()
        .map(|r| role(r, &names, &templates, ctx, &mut errs, &mut notes))
        .collect();
    for (at, role_name, replicas) in &ctx.adapters {
        match roles.iter_mut().find(|r| &r.name == role_name) {
            None => errs.push(format!(
                "{at}: scaleTargetRef.role: unknown role {role_name:?}"
            )),
            Some(r) => {
                let enabled = spec
                    .roles
                    .iter()
                    .find(|s| &s.name == role_name)
                    .and_then(|s| s.scaling_adapter.as_ref())
                    .is_some_and(|a| a.enable);
                match (enabled, replicas) {
                    (false, _) => notes.push(format!(
                        "{at}: ignored: role {role_name:?} does not set scalingAdapter.enable"
                    )),
                    (true, None) => {}
                    (true, Some(n)) => {
                        notes.push(format!(
                            "{at}: role {role_name:?} replicas {} -> {n} (scaling adapter)",
                            r.replicas
                        ));
                        r.replicas = *n;
                    }
                }
            }
        }
    }
    // Cycles only make sense to report once every dependency is known.
    if errs.is_empty() {
        if let Err(e) = crate::graph::levels_of(
            roles
                .iter()
                .map(|r| (r.name.as_str(), r.dependencies.as_slice())),
        ) {
            errs.push(e.to_string());
        }
    }
    let coordination = coordination(&ctx.rules, &roles, &mut errs);
    let placements = placements(&spec, &ctx.rules, &coordination, &mut errs);
    if !errs.is_empty() {
        return Err(SpecError::Invalid(errs));
    }
    Ok((
        Group {
            name: raw.metadata.name.clone(),
            namespace: raw
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_string()),
            roles,
            coordination,
            placements,
            objects: ctx.objects.clone(),
        },
        notes,
    ))
}

/// The spec with roles written the v1alpha1 way converted.
fn normalized(spec: &GroupSpecV2, notes: &mut Vec<String>) -> GroupSpecV2 {
    let mut spec = spec.clone();
    for r in &mut spec.roles {
        if let Some(c) = convert::v1_shaped_role(r) {
            notes.push(format!(
                "spec.roles[{}]: written the v1alpha1 way; read as its v1alpha2 conversion",
                r.name
            ));
            *r = c;
        }
    }
    spec
}

/// `spec.roleTemplates` by name; names must be unique DNS labels.
fn role_templates<'a>(
    spec: &'a GroupSpecV2,
    errs: &mut Errors,
) -> BTreeMap<&'a str, &'a RoleTemplate> {
    let mut templates = BTreeMap::new();
    for t in &spec.role_templates {
        if let Some(p) = dns_problem("spec.roleTemplates", &t.name) {
            errs.push(p);
        }
        if templates.insert(t.name.as_str(), t).is_some() {
            errs.push(format!(
                "spec.roleTemplates: {:?} is declared twice",
                t.name
            ));
        }
    }
    templates
}

/// The set of role names; each must be a unique DNS label whose derived
/// service name is one too.
fn role_names<'a>(group: &str, spec: &'a GroupSpecV2, errs: &mut Errors) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    for r in &spec.roles {
        if let Some(p) = dns_problem("spec.roles", &r.name) {
            errs.push(p);
        } else {
            // Kubernetes names the service s-<group>-<role>: it must be a label too.
            let svc = crate::naming::service_name(group, &r.name);
            if svc.len() > 63 {
                errs.push(format!(
                    "role {:?}: service name {svc:?} is longer than 63 characters",
                    r.name
                ));
            }
        }
        if !names.insert(r.name.as_str()) {
            errs.push(format!("role {:?}: duplicate role name", r.name));
        }
    }
    names
}

/// One role validated, with its Pods resolved (defaulted when broken: the
/// errors already say why, and the group is rejected).
fn role(
    r: &RoleSpecV2,
    names: &BTreeSet<&str>,
    templates: &BTreeMap<&str, &RoleTemplate>,
    ctx: &Context,
    errs: &mut Errors,
    notes: &mut Vec<String>,
) -> Role {
    let at = format!("role {:?}", r.name);
    for d in &r.dependencies {
        if !names.contains(d.as_str()) {
            errs.push(format!("{at}: dependencies: unknown role {d:?}"));
        }
    }
    if r.extra.contains_key("templatePatch") {
        errs.push(format!(
            "{at}: templatePatch is only allowed together with templateRef"
        ));
    }
    let update = update_policy(&at, r.rollout_strategy.as_ref(), errs);
    check_service_ports(&at, &r.service_ports, errs);
    let (pattern, mut pods, restart_policy, delays) = pods(&at, r, templates, errs);
    let workload_kind = workload_kind(r, pattern);
    for p in &mut pods {
        add_role_metadata(&mut p.template, r);
        inject_engine_runtimes(&at, &mut p.template, r, ctx, notes);
        validate_template(&pod_at(&at, p), &p.template, errs);
    }
    let template = pods.first().map(|p| p.template.clone()).unwrap_or_default();
    Role {
        name: r.name.clone(),
        replicas: r.replicas.unwrap_or(1),
        dependencies: r.dependencies.clone(),
        restart_policy,
        update,
        service_ports: r.service_ports.clone(),
        template,
        pods,
        pattern,
        workload_kind,
        min_ready_seconds: r.min_ready_seconds.unwrap_or(0),
        ordered: r.pod_management_policy == Some(PodManagementPolicy::OrderedReady),
        restart_delays: delays,
    }
}

/// How messages name one Pod of a role: the role alone for the first.
fn pod_at(at: &str, p: &PodSlot) -> String {
    match p.component.as_str() {
        "" | "leader" if p.ordinal == 0 => at.to_string(),
        "worker" => format!("{at} worker template"),
        c => format!("{at} component {c:?}"),
    }
}

/// The workload kind: the v1alpha2 annotation, the `workload` extension,
/// or the pattern's (StatefulSet, LeaderWorkerSet, InstanceSet).
fn workload_kind(r: &RoleSpecV2, pattern: Pattern) -> String {
    if let Some(a) = r.annotations.get(ANNOTATION_WORKLOAD) {
        if let Some(kind) = a.rsplit('/').next().filter(|k| !k.is_empty()) {
            return kind.to_string();
        }
    }
    r.workload
        .as_ref()
        .map(|w| w.kind.clone())
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| {
            match pattern {
                Pattern::Standalone => "StatefulSet",
                Pattern::LeaderWorker { .. } => "LeaderWorkerSet",
                Pattern::CustomComponents => "InstanceSet",
            }
            .to_string()
        })
}

type Resolved = (Pattern, Vec<PodSlot>, RestartPolicy, Option<(u32, u32)>);

/// The Pods of one instance, from whichever pattern the role uses.
fn pods(
    at: &str,
    r: &RoleSpecV2,
    templates: &BTreeMap<&str, &RoleTemplate>,
    errs: &mut Errors,
) -> Resolved {
    let patterns = usize::from(r.standalone_pattern.is_some())
        + usize::from(r.leader_worker_pattern.is_some())
        + usize::from(r.custom_components_pattern.is_some());
    if patterns != 1 {
        errs.push(if patterns == 0 {
            format!("{at}: needs one of standalonePattern, leaderWorkerPattern, customComponentsPattern")
        } else {
            format!("{at}: sets {patterns} of standalonePattern, leaderWorkerPattern, customComponentsPattern; use one")
        });
    }
    let slot = |suffix: String, component: &str, ordinal: u32, template: PodTemplateSpec| PodSlot {
        suffix,
        component: component.to_string(),
        ordinal,
        template,
    };
    if let Some(lw) = &r.leader_worker_pattern {
        let size = lw.size.unwrap_or(1);
        if size == 0 {
            errs.push(format!("{at}: leaderWorkerPattern.size must be at least 1"));
        }
        let base = resolve_template(
            at,
            lw.template.as_ref(),
            lw.template_ref.as_ref(),
            templates,
            errs,
        )
        .unwrap_or_default();
        let patched = |p: &Option<serde_yaml::Value>, what: &str, errs: &mut Errors| match p {
            None => base.clone(),
            Some(p) => patch_template(at, what, &base, p, errs).unwrap_or_default(),
        };
        let leader = patched(&lw.leader_template_patch, "leaderTemplatePatch", errs);
        let worker = patched(&lw.worker_template_patch, "workerTemplatePatch", errs);
        let mut pods = vec![slot(String::new(), "leader", 0, leader)];
        for j in 1..size.max(1) {
            pods.push(slot(format!("-{j}"), "worker", j, worker.clone()));
        }
        let (policy, delays) = restart(lw.restart_policy, lw.restart_policy_config.as_ref());
        return (
            Pattern::LeaderWorker { size: size.max(1) },
            pods,
            policy,
            delays,
        );
    }
    if let Some(cc) = &r.custom_components_pattern {
        let mut pods = Vec::new();
        let mut seen = BTreeSet::new();
        if cc.components.is_empty() {
            errs.push(format!("{at}: customComponentsPattern.components is empty"));
        }
        for c in &cc.components {
            if let Some(p) = dns_problem(&format!("{at}: component"), &c.name) {
                errs.push(p);
            }
            if !seen.insert(c.name.as_str()) {
                errs.push(format!("{at}: component {:?} is declared twice", c.name));
            }
            let mut t = c.template.clone();
            let meta = t.metadata.get_or_insert_with(Default::default);
            for (k, v) in &c.labels {
                meta.labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
            for (k, v) in &c.annotations {
                meta.annotations
                    .entry(k.clone())
                    .or_insert_with(|| v.clone());
            }
            for j in 0..c.size.unwrap_or(1) {
                pods.push(slot(format!("-{}-{j}", c.name), &c.name, j, t.clone()));
            }
        }
        if pods.is_empty() && !cc.components.is_empty() {
            errs.push(format!("{at}: every component has size 0"));
        }
        let (policy, delays) = restart(cc.restart_policy, cc.restart_policy_config.as_ref());
        return (Pattern::CustomComponents, pods, policy, delays);
    }
    let t = match &r.standalone_pattern {
        Some(sp) => resolve_template(
            at,
            sp.template.as_ref(),
            sp.template_ref.as_ref(),
            templates,
            errs,
        ),
        None => None,
    };
    (
        Pattern::Standalone,
        vec![slot(String::new(), "", 0, t.unwrap_or_default())],
        r.restart_policy.unwrap_or_default(),
        None,
    )
}

/// A multi-Pod pattern's restart policy (`restartPolicyConfig.type` over
/// the deprecated `restartPolicy`, default RecreateRoleInstanceOnPodRestart)
/// and its delays when the config gives any.
fn restart(
    policy: Option<RestartPolicy>,
    config: Option<&RestartPolicyConfig>,
) -> (RestartPolicy, Option<(u32, u32)>) {
    let kind = config
        .and_then(|c| c.kind)
        .or(policy)
        .unwrap_or(RestartPolicy::RecreateRoleInstanceOnPodRestart);
    let delays = config
        .filter(|c| c.base_delay_seconds.is_some() || c.max_delay_seconds.is_some())
        .map(|c| {
            let base = c.base_delay_seconds.unwrap_or(30);
            (base, c.max_delay_seconds.unwrap_or(600).max(base))
        });
    (kind, delays)
}

/// Role labels and annotations onto a Pod template (the template's win).
fn add_role_metadata(t: &mut PodTemplateSpec, r: &RoleSpecV2) {
    if r.labels.is_empty() && r.annotations.is_empty() {
        return;
    }
    let meta = t.metadata.get_or_insert_with(Default::default);
    for (k, v) in &r.labels {
        meta.labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    for (k, v) in &r.annotations {
        if k != ANNOTATION_WORKLOAD {
            meta.annotations
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
    }
}

/// Adds the containers and volumes of each named engine runtime profile
/// found in the file; a profile that is not there is noted once.
fn inject_engine_runtimes(
    at: &str,
    t: &mut PodTemplateSpec,
    r: &RoleSpecV2,
    ctx: &Context,
    notes: &mut Vec<String>,
) {
    for e in &r.engine_runtimes {
        let Some(p) = ctx.profiles.get(&e.profile_name) else {
            let n = format!(
                "{at}: engineRuntimes[{}]: no ClusterEngineRuntimeProfile of that name in the file; nothing injected",
                e.profile_name
            );
            if !notes.contains(&n) {
                notes.push(n);
            }
            continue;
        };
        for c in &p.containers {
            if t.spec.containers.iter().any(|x| x.name == c.name) {
                continue;
            }
            let mut c = c.clone();
            // Only command and args may be overridden, as upstream says.
            if let Some(o) = e.containers.iter().find(|o| o.name == c.name) {
                if !o.command.is_empty() {
                    c.command = o.command.clone();
                }
                if !o.args.is_empty() {
                    c.args = o.args.clone();
                }
            }
            t.spec.containers.push(c);
        }
        for v in &p.volumes {
            if !t.spec.volumes.iter().any(|x| x.name == v.name) {
                t.spec.volumes.push(v.clone());
            }
        }
    }
}

/// `rolloutStrategy` parsed into counts, with the defaults of
/// [`UpdatePolicy::default`] for what is absent or broken.
fn update_policy(at: &str, strategy: Option<&RolloutStrategy>, errs: &mut Errors) -> UpdatePolicy {
    let ru = strategy
        .and_then(|s| s.rolling_update.clone())
        .unwrap_or_default();
    if let Some(k) = strategy.and_then(|s| s.kind.as_deref()) {
        if k != "RollingUpdate" {
            errs.push(format!(
                "{at}: rolloutStrategy.type {k:?} is not \"RollingUpdate\""
            ));
        }
    }
    let field = |f: &str| format!("{at}: rolloutStrategy.rollingUpdate.{f}");
    let d = UpdatePolicy::default();
    let kind = match ru.kind.as_deref().map(|k| (k, UpdateType::parse(k))) {
        None => UpdateType::default(),
        Some((_, Some(kind))) => kind,
        Some((k, None)) => {
            errs.push(format!(
                "{}: {k:?} is not an update type: {}",
                field("type"),
                UpdateType::ACCEPTED
            ));
            UpdateType::default()
        }
    };
    let update = UpdatePolicy {
        kind,
        paused: ru.paused.unwrap_or(false),
        max_unavailable: amount(
            errs,
            &field("maxUnavailable"),
            ru.max_unavailable.as_ref(),
            d.max_unavailable,
        ),
        max_surge: amount(errs, &field("maxSurge"), ru.max_surge.as_ref(), d.max_surge),
        partition: amount(
            errs,
            &field("partition"),
            ru.partition.as_ref(),
            d.partition,
        ),
    };
    if update.max_unavailable.is_zero() && update.max_surge.is_zero() {
        errs.push(format!(
            "{at}: rolloutStrategy.rollingUpdate: maxSurge and maxUnavailable are both 0, so no instance could ever be updated"
        ));
    }
    update
}

/// Service ports need a name (the discovery file's key), unique per role.
fn check_service_ports(at: &str, ports: &[ServicePort], errs: &mut Errors) {
    let mut port_names = BTreeSet::new();
    for p in ports {
        if p.name.is_empty() {
            errs.push(format!(
                "{at}: servicePorts entry for port {} has no name",
                p.port
            ));
        } else if !port_names.insert(p.name.as_str()) {
            errs.push(format!("{at}: servicePorts {:?} is declared twice", p.name));
        }
    }
}

/// Every coordination rule validated; a role may be in at most one
/// rolling-update and one scaling coordination.
fn coordination(
    rules: &[(String, Coordination)],
    roles: &[Role],
    errs: &mut Errors,
) -> Vec<CoordinationPolicy> {
    let names: BTreeSet<&str> = roles.iter().map(|r| r.name.as_str()).collect();
    let mut in_rollout = BTreeMap::new();
    let mut in_scaling = BTreeMap::new();
    let mut out = Vec::new();
    for (i, (at, c)) in rules.iter().enumerate() {
        check_coordinated_roles(at, &c.roles, &names, errs);
        // An absolute maxSkew counts instances of the largest role.
        let largest = roles
            .iter()
            .filter(|r| c.roles.contains(&r.name))
            .map(|r| r.replicas)
            .max()
            .unwrap_or(1)
            .max(1);
        let rolling_update = c
            .strategy
            .rolling_update
            .as_ref()
            .map(|u| rollout_coordination(at, u, largest, errs));
        let scaling = c
            .strategy
            .scaling
            .as_ref()
            .map(|s| scaling_coordination(at, s, largest, errs));
        for r in &c.roles {
            if rolling_update.is_some() {
                if let Some(prev) = in_rollout.insert(r.clone(), at.clone()) {
                    errs.push(format!(
                        "{at}: role {r:?} is already in the rolling-update coordination {prev}"
                    ));
                }
            }
            if scaling.is_some() {
                if let Some(prev) = in_scaling.insert(r.clone(), at.clone()) {
                    errs.push(format!(
                        "{at}: role {r:?} is already in the scaling coordination {prev}"
                    ));
                }
            }
        }
        out.push(CoordinationPolicy {
            name: if c.name.is_empty() {
                format!("coordination-{i}")
            } else {
                c.name.clone()
            },
            roles: c.roles.clone(),
            rolling_update,
            scaling,
        });
    }
    out
}

/// The topology constraints of the roles and of the coordination rules. A
/// role is in at most one rule's: a Pod belongs to one placement group, and
/// a second rule over it could only be honoured by dropping one of them.
fn placements(
    spec: &GroupSpecV2,
    rules: &[(String, Coordination)],
    validated: &[CoordinationPolicy],
    errs: &mut Errors,
) -> Vec<Placement> {
    let mut out = Vec::new();
    for r in &spec.roles {
        if let Some(t) = &r.instance_topology_constraint {
            let at = format!("role {:?}: instanceTopologyConstraint", r.name);
            out.extend(placement(
                &at,
                format!("r-{}", r.name),
                &[&r.name],
                true,
                t,
                errs,
            ));
        }
    }
    let mut placed = BTreeMap::new();
    for ((at, c), policy) in rules.iter().zip(validated) {
        let Some(t) = c
            .strategy
            .scheduling
            .as_ref()
            .and_then(|s| s.topology_constraint.as_ref())
        else {
            continue;
        };
        for r in &c.roles {
            if let Some(prev) = placed.insert(r.as_str(), at.as_str()) {
                errs.push(format!(
                    "{at}: role {r:?} is already in the topology constraint of {prev}"
                ));
            }
        }
        let name = format!("p-{}", policy.name);
        let at = format!("{at}: strategy.scheduling.topologyConstraint");
        let roles: Vec<&String> = c.roles.iter().collect();
        out.extend(placement(&at, name, &roles, false, t, errs));
    }
    out
}

/// One topology constraint: at least one level, each a label key (what
/// every scheduler's level names fit: Volcano tier names, Koordinator
/// layers, node-label keys).
fn placement(
    at: &str,
    name: String,
    roles: &[&String],
    per_instance: bool,
    t: &TopologyConstraint,
    errs: &mut Errors,
) -> Option<Placement> {
    let pack = t.pack.as_ref();
    let required = pack.and_then(|p| p.required.clone());
    let preferred = pack.and_then(|p| p.preferred.clone());
    if required.is_none() && preferred.is_none() {
        errs.push(format!("{at}: pack.required or pack.preferred must be set"));
        return None;
    }
    let mut ok = true;
    for (field, level) in [("required", &required), ("preferred", &preferred)] {
        if let Some(l) = level.as_deref().filter(|l| !is_label_key(l)) {
            errs.push(format!(
                "{at}: pack.{field}: {l:?} is not a topology level (a label key such as \"rack\" or \"topology.kubernetes.io/zone\")"
            ));
            ok = false;
        }
    }
    ok.then(|| Placement {
        name,
        roles: roles.iter().map(|r| (*r).clone()).collect(),
        per_instance,
        required,
        preferred,
        topology_name: t.topology_name.clone(),
    })
}

/// A coordination lists known roles, each once.
fn check_coordinated_roles(at: &str, roles: &[String], names: &BTreeSet<&str>, errs: &mut Errors) {
    if roles.is_empty() {
        errs.push(format!("{at}: roles is empty"));
    }
    let mut seen = BTreeSet::new();
    for r in roles {
        if !names.contains(r.as_str()) {
            errs.push(format!("{at}: roles: unknown role {r:?}"));
        }
        if !seen.insert(r.as_str()) {
            errs.push(format!("{at}: roles: {r:?} is listed twice"));
        }
    }
}

/// `strategy.rollingUpdate` of a coordination.
fn rollout_coordination(
    at: &str,
    u: &CoordinatedRollingUpdate,
    largest: u32,
    errs: &mut Errors,
) -> RolloutCoordination {
    // The defaults only stand in for a broken value; the group is rejected.
    let d = UpdatePolicy::default();
    RolloutCoordination {
        max_skew: skew(
            errs,
            &format!("{at}: strategy.rollingUpdate.maxSkew"),
            u.max_skew.as_ref(),
            largest,
        ),
        partition: u.partition.as_ref().map(|p| {
            amount(
                errs,
                &format!("{at}: strategy.rollingUpdate.partition"),
                Some(p),
                d.partition,
            )
        }),
        max_unavailable: u.max_unavailable.as_ref().map(|p| {
            amount(
                errs,
                &format!("{at}: strategy.rollingUpdate.maxUnavailable"),
                Some(p),
                d.max_unavailable,
            )
        }),
    }
}

/// `strategy.scaling` of a coordination.
fn scaling_coordination(
    at: &str,
    s: &CoordinatedScaling,
    largest: u32,
    errs: &mut Errors,
) -> ScalingCoordination {
    ScalingCoordination {
        max_skew: skew(
            errs,
            &format!("{at}: strategy.scaling.maxSkew"),
            s.max_skew.as_ref(),
            largest,
        ),
        progression: s.progression.unwrap_or_default(),
    }
}

fn amount(errs: &mut Errors, field: &str, v: Option<&IntOrString>, default: Amount) -> Amount {
    match v {
        None => default,
        Some(v) => match Amount::parse(v) {
            Ok(a) => a,
            Err(e) => {
                errs.push(format!("{field}: {e}"));
                default
            }
        },
    }
}

/// `maxSkew` as a fraction: a percentage, or a number of instances of
/// the largest coordinated role (`largest`).
fn skew(errs: &mut Errors, field: &str, v: Option<&IntOrString>, largest: u32) -> f64 {
    match v {
        None => 1.0,
        Some(v) => match Amount::parse(v) {
            Ok(Amount::Percent(p)) => f64::from(p) / 100.0,
            Ok(Amount::Count(n)) => (f64::from(n) / f64::from(largest)).min(1.0),
            Err(e) => {
                errs.push(format!("{field}: {e}"));
                1.0
            }
        },
    }
}
