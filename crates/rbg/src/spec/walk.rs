//! Reports of what a file contains that rbg keeps but does not act on:
//! every level of the spec keeps unknown keys in an `extra` map, and these
//! walkers name each of them with its path (`spec.roles[store].template.
//! spec.containers[store].resources: not implemented, ignored`), so nothing
//! is silently ignored. One walker per API version, sharing the Pod part.

use super::pod::PodTemplateSpec;
use super::types::{Extra, RoleBasedGroup, RoleSpec, RollingUpdate, RolloutStrategy, ServicePort};
use super::v2::{RoleBasedGroupV2, RoleSpecV2};

/// Names every field of `raw` that this crate keeps but does not act on.
pub fn unimplemented(raw: &RoleBasedGroup) -> Vec<String> {
    let mut out = Vec::new();
    extras(&mut out, "", &raw.extra);
    extras(&mut out, "metadata", &raw.metadata.extra);
    let spec = &raw.spec;
    extras(&mut out, "spec", &spec.extra);
    for r in &spec.roles {
        let at = format!("spec.roles[{}]", r.name);
        extras(&mut out, &at, &r.extra);
        if let Some(w) = &r.workload {
            extras(&mut out, &format!("{at}.workload"), &w.extra);
            if !matches!(
                w.kind.as_str(),
                "" | "StatefulSet" | "Deployment" | "LeaderWorkerSet" | "InstanceSet"
            ) {
                out.push(format!(
                    "{at}.workload.kind: {:?} is run like a StatefulSet by the local runtime",
                    w.kind
                ));
            }
        }
        role_common(&mut out, &at, r.rollout_strategy.as_ref(), &r.service_ports);
        v1_role(&mut out, &at, r);
        if let Some(t) = &r.template_ref {
            extras(&mut out, &format!("{at}.templateRef"), &t.extra);
        }
        if let Some(t) = &r.template {
            template_extras(&mut out, &format!("{at}.template"), t);
        }
    }
    for t in &spec.role_templates {
        let at = format!("spec.roleTemplates[{}]", t.name);
        extras(&mut out, &at, &t.extra);
        template_extras(&mut out, &format!("{at}.template"), &t.template);
    }
    for c in &spec.coordination {
        let at = format!("spec.coordination[{}]", c.name);
        extras(&mut out, &at, &c.extra);
        extras(&mut out, &format!("{at}.strategy"), &c.strategy.extra);
        if let Some(u) = &c.strategy.rolling_update {
            extras(&mut out, &format!("{at}.strategy.rollingUpdate"), &u.extra);
        }
        if let Some(s) = &c.strategy.scaling {
            extras(&mut out, &format!("{at}.strategy.scaling"), &s.extra);
        }
    }
    out
}

/// The v1alpha1-only parts of a role: leaderWorkerSet and components.
fn v1_role(out: &mut Vec<String>, at: &str, r: &RoleSpec) {
    if let Some(l) = &r.leader_worker_set {
        extras(out, &format!("{at}.leaderWorkerSet"), &l.extra);
    }
    for c in &r.components {
        let cat = format!("{at}.components[{}]", c.name);
        extras(out, &cat, &c.extra);
        template_extras(out, &format!("{cat}.template"), &c.template);
    }
    engine(out, at, &r.engine_runtimes);
}

fn engine(out: &mut Vec<String>, at: &str, list: &[super::types::EngineRuntime]) {
    for e in list {
        let eat = format!("{at}.engineRuntimes[{}]", e.profile_name);
        extras(out, &eat, &e.extra);
        if !e.inject_containers.is_empty() {
            out.push(format!(
                "{eat}.injectContainers: not implemented (profile containers are added, nothing is injected into existing ones)"
            ));
        }
    }
}

/// Rollout strategy and service ports, the same in both versions.
fn role_common(
    out: &mut Vec<String>,
    at: &str,
    s: Option<&RolloutStrategy>,
    ports: &[ServicePort],
) {
    if let Some(s) = s {
        extras(out, &format!("{at}.rolloutStrategy"), &s.extra);
        if let Some(u) = &s.rolling_update {
            rolling(out, &format!("{at}.rolloutStrategy.rollingUpdate"), u);
        }
    }
    for p in ports {
        extras(out, &format!("{at}.servicePorts[{}]", p.name), &p.extra);
    }
}

fn rolling(out: &mut Vec<String>, at: &str, u: &RollingUpdate) {
    extras(out, at, &u.extra);
    if u.in_place_update_strategy.is_some() {
        out.push(format!(
            "{at}.inPlaceUpdateStrategy.gracePeriodSeconds: not implemented (images are swapped at once)"
        ));
    }
}

/// Names every field of a v1alpha2 group that rbg keeps but does not act on.
pub fn unimplemented_v2(raw: &RoleBasedGroupV2) -> Vec<String> {
    let mut out = Vec::new();
    extras(&mut out, "", &raw.extra);
    extras(&mut out, "metadata", &raw.metadata.extra);
    extras(&mut out, "spec", &raw.spec.extra);
    for r in &raw.spec.roles {
        role_v2(&mut out, r);
    }
    for t in &raw.spec.role_templates {
        let at = format!("spec.roleTemplates[{}]", t.name);
        extras(&mut out, &at, &t.extra);
        template_extras(&mut out, &format!("{at}.template"), &t.template);
    }
    out
}

fn role_v2(out: &mut Vec<String>, r: &RoleSpecV2) {
    let at = format!("spec.roles[{}]", r.name);
    // v1alpha1-shaped fields are converted, not ignored (see convert.rs).
    for (k, _) in r.extra.iter().filter(|(k, _)| {
        !matches!(
            k.as_str(),
            "template" | "templateRef" | "templatePatch" | "leaderWorkerSet" | "components"
        )
    }) {
        out.push(format!("{at}.{k}: not implemented, ignored"));
    }
    role_common(out, &at, r.rollout_strategy.as_ref(), &r.service_ports);
    engine(out, &at, &r.engine_runtimes);
    if let Some(p) = &r.standalone_pattern {
        let pat = format!("{at}.standalonePattern");
        extras(out, &pat, &p.extra);
        if let Some(t) = &p.template {
            template_extras(out, &format!("{pat}.template"), t);
        }
        if let Some(t) = &p.template_ref {
            extras(out, &format!("{pat}.templateRef"), &t.extra);
        }
    }
    if let Some(p) = &r.leader_worker_pattern {
        let pat = format!("{at}.leaderWorkerPattern");
        extras(out, &pat, &p.extra);
        if let Some(t) = &p.template {
            template_extras(out, &format!("{pat}.template"), t);
        }
        if let Some(t) = &p.template_ref {
            extras(out, &format!("{pat}.templateRef"), &t.extra);
        }
    }
    if let Some(p) = &r.custom_components_pattern {
        let pat = format!("{at}.customComponentsPattern");
        extras(out, &pat, &p.extra);
        for c in &p.components {
            let cat = format!("{pat}.components[{}]", c.name);
            extras(out, &cat, &c.extra);
            template_extras(out, &format!("{cat}.template"), &c.template);
        }
    }
}

fn extras(out: &mut Vec<String>, at: &str, extra: &Extra) {
    for k in extra.keys() {
        if at.is_empty() {
            out.push(format!("{k}: not implemented, ignored"));
        } else {
            out.push(format!("{at}.{k}: not implemented, ignored"));
        }
    }
}

fn template_extras(out: &mut Vec<String>, at: &str, t: &PodTemplateSpec) {
    extras(out, at, &t.extra);
    if let Some(m) = &t.metadata {
        extras(out, &format!("{at}.metadata"), &m.extra);
    }
    extras(out, &format!("{at}.spec"), &t.spec.extra);
    for v in &t.spec.volumes {
        let vat = format!("{at}.spec.volumes[{}]", v.name);
        extras(out, &vat, &v.extra);
        for (what, o) in [("configMap", &v.config_map), ("secret", &v.secret)] {
            if let Some(o) = o {
                extras(out, &format!("{vat}.{what}"), &o.extra);
            }
        }
        if let Some(e) = &v.empty_dir {
            extras(out, &format!("{vat}.emptyDir"), &e.extra);
            if e.size_limit.is_some() {
                out.push(format!("{vat}.emptyDir.sizeLimit: not enforced locally"));
            }
        }
    }
    for c in &t.spec.containers {
        let cat = format!("{at}.spec.containers[{}]", c.name);
        extras(out, &cat, &c.extra);
        for (i, e) in c.env_from.iter().enumerate() {
            extras(out, &format!("{cat}.envFrom[{i}]"), &e.extra);
        }
        for e in &c.env {
            extras(out, &format!("{cat}.env[{}]", e.name), &e.extra);
            if let Some(src) = &e.value_from {
                extras(out, &format!("{cat}.env[{}].valueFrom", e.name), &src.extra);
                for (what, k) in [
                    ("configMapKeyRef", &src.config_map_key_ref),
                    ("secretKeyRef", &src.secret_key_ref),
                ] {
                    if let Some(k) = k {
                        extras(
                            out,
                            &format!("{cat}.env[{}].valueFrom.{what}", e.name),
                            &k.extra,
                        );
                    }
                }
                if let Some(f) = &src.field_ref {
                    extras(
                        out,
                        &format!("{cat}.env[{}].valueFrom.fieldRef", e.name),
                        &f.extra,
                    );
                }
            }
        }
        for p in &c.ports {
            extras(out, &format!("{cat}.ports[{}]", p.container_port), &p.extra);
        }
        for m in &c.volume_mounts {
            extras(
                out,
                &format!("{cat}.volumeMounts[{}]", m.mount_path),
                &m.extra,
            );
        }
        if let Some(p) = &c.readiness_probe {
            let pat = format!("{cat}.readinessProbe");
            extras(out, &pat, &p.extra);
            if let Some(t) = &p.tcp_socket {
                extras(out, &format!("{pat}.tcpSocket"), &t.extra);
            }
            if let Some(h) = &p.http_get {
                extras(out, &format!("{pat}.httpGet"), &h.extra);
            }
            if let Some(x) = &p.exec {
                extras(out, &format!("{pat}.exec"), &x.extra);
            }
        }
    }
}
