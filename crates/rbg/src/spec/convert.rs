//! v1alpha1 -> v1alpha2 conversion, the one path by which a v1alpha1 group
//! gets its meaning: a v1alpha1 file is converted and then validated as
//! v1alpha2, so a v1alpha1 file and its conversion are the same group by
//! construction (tests check it on pairs written by hand, too).
//!
//! - `template` / `templateRef` + `templatePatch` -> `standalonePattern`
//!   (or the base of `leaderWorkerPattern`);
//! - `leaderWorkerSet` (or `workload.kind: LeaderWorkerSet`) ->
//!   `leaderWorkerPattern` with `patchLeaderTemplate`/`patchWorkerTemplate`;
//! - `components` -> `customComponentsPattern`;
//! - `workload` -> the `rbg.workloads.x-k8s.io/role-workload-type` annotation;
//! - `rollingUpdate.type: Recreate` -> `RecreatePod`;
//! - `restartPolicy` -> the pattern's `restartPolicy` (kept on the role for
//!   standalone roles, an rbg extension);
//! - `spec.coordination` -> a CoordinatedPolicy named after the group, with
//!   bare-number `maxSkew`s written as the percentages v1alpha1 meant.

use super::amount::IntOrString;
use super::types::{
    Coordination, ObjectMeta, RoleBasedGroup, RoleSpec, RolloutStrategy, UpdateType,
    ANNOTATION_WORKLOAD, API_V1ALPHA2,
};
use super::v2::{
    CustomComponentsPattern, GroupSpecV2, LeaderWorkerPattern, RoleBasedGroupV2, RoleSpecV2,
    StandalonePattern, TemplateRefV2,
};

/// A v1alpha1 group as v1alpha2: the group and its coordination rules
/// (the rules of a CoordinatedPolicy of the group's name).
pub fn to_v1alpha2(g: &RoleBasedGroup) -> (RoleBasedGroupV2, Vec<Coordination>) {
    let spec = GroupSpecV2 {
        roles: g.spec.roles.iter().map(role_to_v2).collect(),
        role_templates: g.spec.role_templates.clone(),
        extra: g.spec.extra.clone(),
    };
    let v2 = RoleBasedGroupV2 {
        api_version: API_V1ALPHA2.to_string(),
        kind: g.kind.clone(),
        metadata: g.metadata.clone(),
        spec,
        status: None,
        extra: g.extra.clone(),
    };
    let rules = g
        .spec
        .coordination
        .iter()
        .cloned()
        .map(|mut c| {
            // v1alpha1 allows only "N%"; rbg read a bare N as N%.
            let pct = |v: &mut Option<IntOrString>| {
                if let Some(IntOrString::Int(n)) = v {
                    *v = Some(IntOrString::String(format!("{n}%")));
                }
            };
            if let Some(u) = c.strategy.rolling_update.as_mut() {
                pct(&mut u.max_skew);
            }
            if let Some(s) = c.strategy.scaling.as_mut() {
                pct(&mut s.max_skew);
            }
            c
        })
        .collect();
    (v2, rules)
}

/// The metadata of the CoordinatedPolicy a v1alpha1 group's coordination
/// becomes: same name and namespace as the group.
pub fn policy_meta(g: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: g.name.clone(),
        namespace: g.namespace.clone(),
        ..ObjectMeta::default()
    }
}

/// One v1alpha1 role as v1alpha2.
pub fn role_to_v2(r: &RoleSpec) -> RoleSpecV2 {
    let kind = r.workload.as_ref().map(|w| w.kind.as_str()).unwrap_or("");
    let mut annotations = r.annotations.clone();
    if let Some(w) = &r.workload {
        if !w.kind.is_empty() {
            let api = if w.api_version.is_empty() {
                "apps/v1"
            } else {
                w.api_version.as_str()
            };
            annotations
                .entry(ANNOTATION_WORKLOAD.to_string())
                .or_insert_with(|| format!("{api}/{}", w.kind));
        }
    }
    let template_ref = r.template_ref.as_ref().map(|t| TemplateRefV2 {
        name: t.name.clone(),
        patch: r.template_patch.clone(),
        extra: t.extra.clone(),
    });
    // A patch without a templateRef is an error v1alpha2 cannot express;
    // keep it where validation will name it.
    let mut extra = r.extra.clone();
    if r.template_ref.is_none() {
        if let Some(p) = &r.template_patch {
            extra.insert("templatePatch".to_string(), p.clone());
        }
    }
    let mut out = RoleSpecV2 {
        name: r.name.clone(),
        replicas: r.replicas,
        dependencies: r.dependencies.clone(),
        labels: r.labels.clone(),
        annotations,
        engine_runtimes: r.engine_runtimes.clone(),
        service_ports: r.service_ports.clone(),
        min_ready_seconds: r.min_ready_seconds,
        rollout_strategy: r.rollout_strategy.clone().map(rollout_to_v2),
        scaling_adapter: r.scaling_adapter.clone(),
        extra,
        ..RoleSpecV2::default()
    };
    if r.leader_worker_set.is_some() || kind == "LeaderWorkerSet" {
        let lws = r.leader_worker_set.clone().unwrap_or_default();
        out.leader_worker_pattern = Some(LeaderWorkerPattern {
            size: lws.size,
            template: r.template.clone(),
            template_ref,
            leader_template_patch: lws.patch_leader_template,
            worker_template_patch: lws.patch_worker_template,
            restart_policy: r.restart_policy,
            extra: lws.extra,
            ..LeaderWorkerPattern::default()
        });
    } else if !r.components.is_empty() {
        out.custom_components_pattern = Some(CustomComponentsPattern {
            components: r.components.clone(),
            restart_policy: r.restart_policy,
            ..CustomComponentsPattern::default()
        });
        if r.template.is_some() || template_ref.is_some() {
            // Validation names this: components and a template exclude
            // each other.
            out.standalone_pattern = Some(StandalonePattern {
                template: r.template.clone(),
                template_ref,
                extra: Default::default(),
            });
        }
    } else {
        out.restart_policy = r.restart_policy;
        // Always a standalone pattern, so a role with neither template
        // nor templateRef is named for that, in v1alpha1's words.
        out.standalone_pattern = Some(StandalonePattern {
            template: r.template.clone(),
            template_ref,
            extra: Default::default(),
        });
    }
    out
}

/// v1alpha1's `rollingUpdate.type: Recreate` written as v1alpha2's
/// `RecreatePod`: upstream's conversion copies the string, but its v1alpha2
/// controllers recreate only on `RecreatePod` and update anything else in
/// place, so the copy would change what the role does.
fn rollout_to_v2(mut s: RolloutStrategy) -> RolloutStrategy {
    if let Some(u) = s.rolling_update.as_mut() {
        if u.kind.as_deref() == Some("Recreate") {
            u.kind = Some(UpdateType::Recreate.as_str().to_string());
        }
    }
    s
}

/// Keys that mark a role inside a v1alpha2 object as written the
/// v1alpha1 way (upstream keeps unknown role fields, so such objects exist
/// on clusters that were upgraded without a conversion webhook).
pub(super) const V1_ROLE_KEYS: [&str; 5] = [
    "template",
    "templateRef",
    "templatePatch",
    "leaderWorkerSet",
    "components",
];

/// A v1alpha2 role with no pattern but v1alpha1 fields, converted; `None`
/// when the role is a plain v1alpha2 role.
pub fn v1_shaped_role(r: &RoleSpecV2) -> Option<RoleSpecV2> {
    let has_pattern = r.standalone_pattern.is_some()
        || r.leader_worker_pattern.is_some()
        || r.custom_components_pattern.is_some();
    if has_pattern || !V1_ROLE_KEYS.iter().any(|k| r.extra.contains_key(*k)) {
        return None;
    }
    let v = serde_yaml::to_value(r).ok()?;
    let v1: RoleSpec = serde_yaml::from_value(v).ok()?;
    Some(role_to_v2(&v1))
}

/// A whole file with every v1alpha1 RoleBasedGroup (and RoleBasedGroupSet)
/// written in v1alpha2, v1alpha1 `spec.coordination` as a CoordinatedPolicy
/// document right after its group; other documents are kept as they are.
pub fn convert_file(text: &str) -> Result<String, super::SpecError> {
    use serde_yaml::Value;
    let mut out = Vec::new();
    let err = |e: serde_yaml::Error| super::SpecError::Parse {
        path: ".".into(),
        message: e.to_string(),
    };
    for v in super::load::documents(text)? {
        let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let (api, kind) = (field("apiVersion"), field("kind"));
        if api != super::types::API_VERSION {
            out.push(v);
            continue;
        }
        match kind.as_str() {
            "RoleBasedGroup" => {
                let g: RoleBasedGroup = serde_yaml::from_value(v).map_err(err)?;
                let (v2, rules) = to_v1alpha2(&g);
                out.push(serde_yaml::to_value(&v2).map_err(err)?);
                if !rules.is_empty() {
                    let p = serde_json::json!({
                        "apiVersion": API_V1ALPHA2,
                        "kind": "CoordinatedPolicy",
                        "metadata": policy_meta(&g.metadata),
                        "spec": {"policies": rules},
                    });
                    out.push(serde_yaml::to_value(&p).map_err(err)?);
                }
            }
            "RoleBasedGroupSet" => {
                let mut v = v;
                let spec = v
                    .get("spec")
                    .and_then(|s| s.get("groupTemplate"))
                    .and_then(|t| t.get("spec"))
                    .cloned()
                    .unwrap_or_default();
                let g: super::types::GroupSpec = serde_yaml::from_value(spec).map_err(err)?;
                let wrapped = RoleBasedGroup {
                    api_version: super::types::API_VERSION.into(),
                    kind: "RoleBasedGroup".into(),
                    metadata: ObjectMeta::default(),
                    spec: g,
                    status: None,
                    extra: Default::default(),
                };
                let (v2, _) = to_v1alpha2(&wrapped);
                if let Some(t) = v
                    .get_mut("spec")
                    .and_then(|s| s.get_mut("groupTemplate"))
                    .and_then(Value::as_mapping_mut)
                {
                    t.insert("spec".into(), serde_yaml::to_value(&v2.spec).map_err(err)?);
                }
                if let Some(m) = v.as_mapping_mut() {
                    m.insert("apiVersion".into(), API_V1ALPHA2.into());
                }
                out.push(v);
            }
            _ => {
                let mut v = v;
                if kind == "RoleBasedGroupScalingAdapter" {
                    if let Some(m) = v.as_mapping_mut() {
                        m.insert("apiVersion".into(), API_V1ALPHA2.into());
                    }
                }
                out.push(v);
            }
        }
    }
    let mut text = String::new();
    for (i, v) in out.iter().enumerate() {
        if i > 0 {
            text.push_str("---\n");
        }
        text.push_str(&serde_yaml::to_string(v).map_err(err)?);
    }
    Ok(text)
}
