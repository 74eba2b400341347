//! Loading: YAML text to the raw object (with the path of a bad field), to a
//! validated [`Group`], plus the list of fields present but not implemented
//! so callers can warn instead of silently ignoring them.

use super::group::{Group, SpecError};
use super::types::{Extra, PodTemplateSpec, RoleBasedGroup};
use super::validate::validate;

/// A loaded group plus what the file contained that is not implemented.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The object as written.
    pub raw: RoleBasedGroup,
    /// The validated, resolved group.
    pub group: Group,
    /// One line per field present in the file that is not implemented
    /// (`path: note`); callers print these as warnings.
    pub unimplemented: Vec<String>,
}

/// Parses and validates a group from YAML text.
pub fn load(text: &str) -> Result<Loaded, SpecError> {
    let raw = parse(text)?;
    let group = validate(&raw)?;
    let unimplemented = unimplemented(&raw);
    Ok(Loaded {
        raw,
        group,
        unimplemented,
    })
}

/// Parses YAML text into the object, with the path of any bad field.
pub fn parse(text: &str) -> Result<RoleBasedGroup, SpecError> {
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        SpecError::Parse {
            path,
            message: e.into_inner().to_string(),
        }
    })
}

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
            if !matches!(w.kind.as_str(), "" | "StatefulSet" | "Deployment") {
                out.push(format!(
                    "{at}.workload.kind: {:?} is run like a StatefulSet by the local runtime",
                    w.kind
                ));
            }
        }
        if let Some(s) = &r.rollout_strategy {
            extras(&mut out, &format!("{at}.rolloutStrategy"), &s.extra);
            if let Some(u) = &s.rolling_update {
                extras(
                    &mut out,
                    &format!("{at}.rolloutStrategy.rollingUpdate"),
                    &u.extra,
                );
            }
        }
        for p in &r.service_ports {
            extras(
                &mut out,
                &format!("{at}.servicePorts[{}]", p.name),
                &p.extra,
            );
        }
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
        for e in &c.env {
            extras(out, &format!("{cat}.env[{}]", e.name), &e.extra);
            if let Some(src) = &e.value_from {
                extras(out, &format!("{cat}.env[{}].valueFrom", e.name), &src.extra);
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
