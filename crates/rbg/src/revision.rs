//! Revision hashes of role templates.
//!
//! A revision names a Pod template: the same template gives the same name in
//! every run and on every machine, because the hash is taken over a canonical
//! serialization (map keys sorted, absent and empty fields omitted) with a
//! fixed hash function (xxh3-64). Replica counts are not part of a template,
//! so scaling never changes a revision. The *shape* is the revision of the
//! template with every container image blanked: two revisions with the same
//! shape differ only in images, which is what allows an in-place update.

use serde_yaml::Value;
use xxhash_rust::xxh3::xxh3_64;

use crate::spec::{PodTemplateSpec, Role};

/// Writes `v` with map keys sorted, so equal values give equal bytes.
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push('~'),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => {
            // Debug quoting escapes separators, so "a,b" cannot collide with
            // two strings.
            out.push_str(&format!("{s:?}"));
        }
        Value::Sequence(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        Value::Mapping(m) => {
            let mut entries: Vec<(String, &Value)> = m
                .iter()
                .map(|(k, v)| {
                    let mut ks = String::new();
                    canonical(k, &mut ks);
                    (ks, v)
                })
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Value::Tagged(t) => {
            out.push_str(&t.tag.to_string());
            out.push(' ');
            canonical(&t.value, out);
        }
    }
}

/// The revision name of a template (10 hex digits).
pub fn revision(t: &PodTemplateSpec) -> String {
    // Serializing plain data structs into a Value cannot fail; fall back to
    // the Debug form rather than panic if a future field makes it fail.
    let mut s = String::new();
    match serde_yaml::to_value(t) {
        Ok(v) => canonical(&v, &mut s),
        Err(_) => s = format!("{t:?}"),
    }
    format!("{:010x}", xxh3_64(s.as_bytes()) >> 24)
}

/// The revision of `t` with container images blanked.
pub fn shape(t: &PodTemplateSpec) -> String {
    let mut t = t.clone();
    for c in &mut t.spec.containers {
        c.image = None;
    }
    revision(&t)
}

/// The revision of a role's instance template: that of its one Pod for a
/// standalone role (so revisions recorded before multi-Pod patterns keep
/// their names), else of every Pod with its name suffix.
pub fn role_revision(r: &Role) -> String {
    match r.pods.as_slice() {
        [only] if only.suffix.is_empty() => revision(&only.template),
        pods => {
            let mut t = PodTemplateSpec::default();
            // Pack the Pods into one template value: the suffixes as
            // annotations keep Pods apart, the containers keep order.
            for p in pods {
                let mut c = p.template.clone();
                let meta = c.metadata.get_or_insert_with(Default::default);
                meta.annotations
                    .insert("rbg.pod-suffix".into(), p.suffix.clone());
                let v = serde_yaml::to_value(&c).unwrap_or_default();
                t.extra.insert(p.suffix.clone(), v);
            }
            revision(&t)
        }
    }
}

/// The revision of a role's instance template with every image blanked.
pub fn role_shape(r: &Role) -> String {
    let mut r = r.clone();
    for p in &mut r.pods {
        for c in &mut p.template.spec.containers {
            c.image = None;
        }
    }
    if let [only] = r.pods.as_slice() {
        if only.suffix.is_empty() {
            return shape(&only.template);
        }
    }
    role_revision(&r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> PodTemplateSpec {
        serde_yaml::from_str(text).expect("template")
    }

    #[test]
    fn stable_and_order_insensitive() {
        let a = t("spec: {containers: [{name: a, image: x, env: [{name: K, value: v}]}]}\nmetadata: {labels: {p: '1', q: '2'}}");
        let b = t("metadata: {labels: {q: '2', p: '1'}}\nspec: {containers: [{env: [{value: v, name: K}], image: x, name: a}]}");
        assert_eq!(revision(&a), revision(&b));
        assert_eq!(revision(&a).len(), 10);
        // Pinned: a change here renames every revision users have recorded
        // (history entries, `rbg status` output, operator annotations).
        assert_eq!(revision(&a), "e4c5a501a7");
    }

    #[test]
    fn empty_fields_do_not_count() {
        let a = t("spec: {containers: [{name: a, image: x}]}");
        let b = t("spec: {containers: [{name: a, image: x, args: [], env: []}]}");
        assert_eq!(revision(&a), revision(&b));
    }

    #[test]
    fn shape_ignores_images_only() {
        let a = t("spec: {containers: [{name: a, image: 'x:v1', args: [p]}]}");
        let b = t("spec: {containers: [{name: a, image: 'x:v2', args: [p]}]}");
        let c = t("spec: {containers: [{name: a, image: 'x:v2', args: [q]}]}");
        assert_ne!(revision(&a), revision(&b));
        assert_eq!(shape(&a), shape(&b));
        assert_ne!(shape(&b), shape(&c));
    }
}
