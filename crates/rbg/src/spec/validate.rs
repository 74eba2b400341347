//! Validation: every rule of RBG.md checked on the raw object, one function
//! per concern. Problems are collected rather than returned at the first, so
//! a user fixes a file in one round; each message names the role and field.

use std::collections::{BTreeMap, BTreeSet};

use super::amount::{Amount, IntOrString};
use super::group::{
    CoordinationPolicy, Group, Role, RolloutCoordination, ScalingCoordination, SpecError,
    UpdatePolicy,
};
use super::template::{resolve_template, validate_template};
use super::types::{
    CoordinatedRollingUpdate, CoordinatedScaling, Coordination, GroupSpec, RoleBasedGroup,
    RoleSpec, RoleTemplate, RolloutStrategy, ServicePort, API_VERSION, KIND,
};
use crate::naming::dns_problem;

/// Problems found so far, in the order they were found.
type Errors = Vec<String>;

/// Checks every rule of RBG.md and resolves templates.
pub fn validate(raw: &RoleBasedGroup) -> Result<Group, SpecError> {
    let mut errs = Errors::new();
    check_object(raw, &mut errs);
    let spec = &raw.spec;
    let templates = role_templates(spec, &mut errs);
    let names = role_names(raw, &mut errs);
    let roles: Vec<Role> = spec
        .roles
        .iter()
        .map(|r| role(r, &names, &templates, &mut errs))
        .collect();
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
    let coordination = coordination(&spec.coordination, &names, &mut errs);
    if !errs.is_empty() {
        return Err(SpecError::Invalid(errs));
    }
    Ok(Group {
        name: raw.metadata.name.clone(),
        namespace: raw
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string()),
        roles,
        coordination,
    })
}

/// apiVersion, kind, the group's name, and that it has roles at all.
fn check_object(raw: &RoleBasedGroup, errs: &mut Errors) {
    if raw.api_version != API_VERSION {
        errs.push(format!(
            "apiVersion: {:?} is not {API_VERSION:?}",
            raw.api_version
        ));
    }
    if raw.kind != KIND {
        errs.push(format!("kind: {:?} is not {KIND:?}", raw.kind));
    }
    if let Some(p) = dns_problem("metadata.name", &raw.metadata.name) {
        errs.push(p);
    }
    if raw.spec.roles.is_empty() {
        errs.push("spec.roles: a group needs at least one role".to_string());
    }
}

/// `spec.roleTemplates` by name; names must be unique DNS labels.
fn role_templates<'a>(
    spec: &'a GroupSpec,
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
fn role_names<'a>(raw: &'a RoleBasedGroup, errs: &mut Errors) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    for r in &raw.spec.roles {
        if let Some(p) = dns_problem("spec.roles", &r.name) {
            errs.push(p);
        } else {
            // Kubernetes names the service s-<group>-<role>: it must be a label too.
            let svc = crate::naming::service_name(&raw.metadata.name, &r.name);
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

/// One role validated, with its template resolved (defaulted when broken:
/// the errors already say why, and the group is rejected).
fn role(
    r: &RoleSpec,
    names: &BTreeSet<&str>,
    templates: &BTreeMap<&str, &RoleTemplate>,
    errs: &mut Errors,
) -> Role {
    let at = format!("role {:?}", r.name);
    for d in &r.dependencies {
        if !names.contains(d.as_str()) {
            errs.push(format!("{at}: dependencies: unknown role {d:?}"));
        }
    }
    let update = update_policy(&at, r.rollout_strategy.as_ref(), errs);
    check_service_ports(&at, &r.service_ports, errs);
    let workload_kind = r
        .workload
        .as_ref()
        .map(|w| w.kind.clone())
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| "StatefulSet".to_string());
    let template = resolve_template(r, templates, errs);
    if let Some(t) = &template {
        validate_template(&at, t, errs);
    }
    Role {
        name: r.name.clone(),
        replicas: r.replicas.unwrap_or(1),
        dependencies: r.dependencies.clone(),
        restart_policy: r.restart_policy.unwrap_or_default(),
        update,
        service_ports: r.service_ports.clone(),
        template: template.unwrap_or_default(),
        workload_kind,
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
    let update = UpdatePolicy {
        kind: ru.kind.unwrap_or_default(),
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

/// Every `spec.coordination` entry validated; a role may be in at most one
/// rolling-update and one scaling coordination.
fn coordination(
    entries: &[Coordination],
    names: &BTreeSet<&str>,
    errs: &mut Errors,
) -> Vec<CoordinationPolicy> {
    let mut in_rollout = BTreeMap::new();
    let mut in_scaling = BTreeMap::new();
    let mut out = Vec::new();
    for (i, c) in entries.iter().enumerate() {
        let at = if c.name.is_empty() {
            format!("coordination[{i}]")
        } else {
            format!("coordination {:?}", c.name)
        };
        check_coordinated_roles(&at, &c.roles, names, errs);
        let rolling_update = c
            .strategy
            .rolling_update
            .as_ref()
            .map(|u| rollout_coordination(&at, u, errs));
        let scaling = c
            .strategy
            .scaling
            .as_ref()
            .map(|s| scaling_coordination(&at, s, errs));
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
    errs: &mut Errors,
) -> RolloutCoordination {
    // The defaults only stand in for a broken value; the group is rejected.
    let d = UpdatePolicy::default();
    RolloutCoordination {
        max_skew: skew(
            errs,
            &format!("{at}: strategy.rollingUpdate.maxSkew"),
            u.max_skew.as_ref(),
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
    errs: &mut Errors,
) -> ScalingCoordination {
    ScalingCoordination {
        max_skew: skew(
            errs,
            &format!("{at}: strategy.scaling.maxSkew"),
            s.max_skew.as_ref(),
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

fn skew(errs: &mut Errors, field: &str, v: Option<&IntOrString>) -> f64 {
    match v {
        None => 1.0,
        // A bare number means percentage points: a count of instances would
        // mean different fractions for roles of different sizes.
        Some(IntOrString::Int(n)) if (0..=100).contains(n) => *n as f64 / 100.0,
        Some(v) => match Amount::parse(v) {
            Ok(Amount::Percent(p)) => f64::from(p) / 100.0,
            Ok(Amount::Count(_)) | Err(_) => {
                errs.push(format!("{field}: {v} is not a percentage like \"10%\""));
                1.0
            }
        },
    }
}
