//! Role templates: resolving `templateRef` + `templatePatch` into one Pod
//! template, and the rules a resolved template must follow (volumes,
//! containers, env, mounts, readiness probes).

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::Value;

use super::amount::IntOrString;
use super::pod::{Container, PodSpec, PodTemplateSpec, Probe};
use super::types::RoleTemplate;
use super::v2::TemplateRefV2;
use crate::merge::strategic_merge;
use crate::naming::dns_problem;

/// Resolves a pattern's base template: its own `template`, or a
/// roleTemplate with the `templateRef.patch` strategically merged onto it.
/// `at` names the role in messages.
pub(super) fn resolve_template(
    at: &str,
    template: Option<&PodTemplateSpec>,
    template_ref: Option<&TemplateRefV2>,
    templates: &BTreeMap<&str, &RoleTemplate>,
    errs: &mut Vec<String>,
) -> Option<PodTemplateSpec> {
    match (template, template_ref) {
        (Some(_), Some(_)) => {
            errs.push(format!(
                "{at}: template and templateRef are both set; use one"
            ));
            None
        }
        (None, None) => {
            errs.push(format!("{at}: neither template nor templateRef is set"));
            None
        }
        (Some(t), None) => Some(t.clone()),
        (None, Some(r)) => {
            let Some(base) = templates.get(r.name.as_str()) else {
                errs.push(format!(
                    "{at}: templateRef.name {:?} is not in spec.roleTemplates",
                    r.name
                ));
                return None;
            };
            match &r.patch {
                None => Some(base.template.clone()),
                Some(patch) => patch_template(
                    at,
                    &format!("templatePatch on {:?}", r.name),
                    &base.template,
                    patch,
                    errs,
                ),
            }
        }
    }
}

/// `base` with a strategic-merge `patch` applied; `what` names the patch.
pub(super) fn patch_template(
    at: &str,
    what: &str,
    base: &PodTemplateSpec,
    patch: &Value,
    errs: &mut Vec<String>,
) -> Option<PodTemplateSpec> {
    let base_v = match serde_yaml::to_value(base) {
        Ok(v) => v,
        Err(e) => {
            errs.push(format!("{at}: {what}: {e}"));
            return None;
        }
    };
    let merged = strategic_merge(&base_v, patch);
    match serde_path_to_error::deserialize::<_, PodTemplateSpec>(merged) {
        Ok(t) => Some(t),
        Err(e) => {
            errs.push(format!(
                "{at}: {what} gives an invalid template at {}: {}",
                e.path(),
                e.inner()
            ));
            None
        }
    }
}

/// Checks a resolved template; `at` names the role in messages.
pub(super) fn validate_template(at: &str, t: &PodTemplateSpec, errs: &mut Vec<String>) {
    let spec = &t.spec;
    if spec.containers.is_empty() {
        errs.push(format!("{at}: template.spec.containers is empty"));
    }
    check_volumes(at, spec, errs);
    let volumes: BTreeSet<&str> = spec.volumes.iter().map(|v| v.name.as_str()).collect();
    let mut names = BTreeSet::new();
    for c in &spec.containers {
        let cat = format!("{at}: container {:?}", c.name);
        if let Some(p) = dns_problem(&format!("{at}: container"), &c.name) {
            errs.push(p);
        }
        if !names.insert(c.name.as_str()) {
            errs.push(format!("{cat} is declared twice"));
        }
        check_env(&cat, c, errs);
        check_mounts(&cat, c, &volumes, errs);
        if let Some(p) = &c.readiness_probe {
            check_probe(&cat, c, p, errs);
        }
    }
}

/// Volumes: unique DNS-label names; only the emptyDir media that exist.
fn check_volumes(at: &str, spec: &PodSpec, errs: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for v in &spec.volumes {
        if let Some(p) = dns_problem(&format!("{at}: volume"), &v.name) {
            errs.push(p);
        }
        if !seen.insert(v.name.as_str()) {
            errs.push(format!("{at}: volume {:?} is declared twice", v.name));
        }
        let sources = usize::from(v.empty_dir.is_some())
            + usize::from(v.config_map.is_some())
            + usize::from(v.secret.is_some());
        if sources > 1 {
            errs.push(format!(
                "{at}: volume {:?} has {sources} sources; use one",
                v.name
            ));
        }
        if let Some(ed) = &v.empty_dir {
            match ed.medium.as_deref() {
                None | Some("") | Some("Memory") => {}
                Some(m) => errs.push(format!(
                    "{at}: volume {:?}: emptyDir.medium {m:?} is not \"\" or \"Memory\"",
                    v.name
                )),
            }
        }
    }
}

/// Env entries: named, unique, one source each, field refs we can resolve.
fn check_env(cat: &str, c: &Container, errs: &mut Vec<String>) {
    let mut env_seen = BTreeSet::new();
    for e in &c.env {
        if e.name.is_empty() {
            errs.push(format!("{cat}: env entry without a name"));
        }
        if !env_seen.insert(e.name.as_str()) {
            // Kubernetes keeps the last one; say so rather than guess.
            errs.push(format!("{cat}: env {:?} is set twice", e.name));
        }
        match (&e.value, &e.value_from) {
            (Some(_), Some(_)) => errs.push(format!(
                "{cat}: env {:?} has both value and valueFrom",
                e.name
            )),
            (_, Some(src)) => {
                let sources = usize::from(src.field_ref.is_some())
                    + usize::from(src.config_map_key_ref.is_some())
                    + usize::from(src.secret_key_ref.is_some());
                if sources > 1 {
                    errs.push(format!(
                        "{cat}: env {:?}: valueFrom has {sources} sources; use one",
                        e.name
                    ));
                }
                if let Some(f) = &src.field_ref {
                    if let Err(m) = crate::field_path::check_field_path(&f.field_path) {
                        errs.push(format!("{cat}: env {:?}: {m}", e.name));
                    }
                }
                for (what, k) in [
                    ("configMapKeyRef", &src.config_map_key_ref),
                    ("secretKeyRef", &src.secret_key_ref),
                ] {
                    if let Some(k) = k {
                        if k.name.is_empty() || k.key.is_empty() {
                            errs.push(format!(
                                "{cat}: env {:?}: valueFrom.{what} needs name and key",
                                e.name
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// Mounts name a volume of the template and an absolute path (the path is
/// what gets rewritten to the host directory).
fn check_mounts(cat: &str, c: &Container, volumes: &BTreeSet<&str>, errs: &mut Vec<String>) {
    for m in &c.volume_mounts {
        if !volumes.contains(m.name.as_str()) {
            errs.push(format!(
                "{cat}: volumeMount {:?} names no volume of the template",
                m.name
            ));
        }
        if !m.mount_path.starts_with('/') {
            errs.push(format!(
                "{cat}: volumeMount {:?}: mountPath {:?} is not absolute",
                m.name, m.mount_path
            ));
        }
    }
}

/// A readiness probe has one handler the local runtime can run.
fn check_probe(cat: &str, c: &Container, p: &Probe, errs: &mut Vec<String>) {
    let handlers = usize::from(p.tcp_socket.is_some())
        + usize::from(p.http_get.is_some())
        + usize::from(p.exec.is_some());
    if handlers != 1 {
        errs.push(format!(
            "{cat}: readinessProbe needs exactly one of tcpSocket, httpGet, exec (has {handlers})"
        ));
    }
    let port = p
        .tcp_socket
        .as_ref()
        .map(|t| &t.port)
        .or(p.http_get.as_ref().map(|h| &h.port));
    if let Some(port) = port {
        if let Err(m) = resolve_port(c, port) {
            errs.push(format!("{cat}: readinessProbe: {m}"));
        }
    }
    if let Some(h) = &p.http_get {
        if let Some(s) = &h.scheme {
            if !s.eq_ignore_ascii_case("http") {
                errs.push(format!(
                    "{cat}: readinessProbe.httpGet.scheme {s:?} is not implemented (only HTTP)"
                ));
            }
        }
    }
    if let Some(x) = &p.exec {
        if x.command.is_empty() {
            errs.push(format!("{cat}: readinessProbe.exec.command is empty"));
        }
    }
    if p.period_seconds == Some(0) {
        errs.push(format!(
            "{cat}: readinessProbe.periodSeconds must be at least 1"
        ));
    }
}

/// The port number a probe port (number or container port name) stands for.
pub fn resolve_port(c: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port {n} is not between 1 and 65535")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("port {name:?} names no port of the container"))
        }
    }
}
