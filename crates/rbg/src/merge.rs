//! Strategic merge of a `templatePatch` onto a role template, as
//! `kubectl patch --type strategic` does for Pod templates.
//!
//! Maps merge key by key, recursively; a `null` value deletes the key. Lists
//! that Kubernetes declares with a patch merge key are merged element by
//! element on that key (containers, initContainers and volumes by `name`, env
//! by `name`, ports by `containerPort`, volumeMounts by `mountPath`); an
//! element `{<key>: x, $patch: delete}` removes the matching element. Every
//! other list is replaced whole. Pure: no I/O.

use serde_yaml::{Mapping, Value};

/// The patch merge key Kubernetes uses for the list stored under `field`,
/// or `None` when such a list is replaced whole.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => Some("name"),
        "hostAliases" => Some("ip"),
        "ports" => Some("containerPort"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        _ => None,
    }
}

/// Returns `base` with `patch` applied by strategic merge.
pub fn strategic_merge(base: &Value, patch: &Value) -> Value {
    merge_value(None, base, patch)
}

fn merge_value(field: Option<&str>, base: &Value, patch: &Value) -> Value {
    match (base, patch) {
        (Value::Mapping(b), Value::Mapping(p)) => Value::Mapping(merge_map(b, p)),
        (Value::Sequence(b), Value::Sequence(p)) => match field.and_then(merge_key) {
            Some(key) => Value::Sequence(merge_list(key, b, p)),
            None => Value::Sequence(strip_directives(p)),
        },
        (_, p) => p.clone(),
    }
}

fn merge_map(base: &Mapping, patch: &Mapping) -> Mapping {
    let mut out = base.clone();
    for (k, pv) in patch {
        if pv.is_null() {
            out.remove(k);
            continue;
        }
        let field = k.as_str();
        let merged = match base.get(k) {
            Some(bv) => merge_value(field, bv, pv),
            None => match pv {
                Value::Sequence(items) => Value::Sequence(strip_directives(items)),
                other => other.clone(),
            },
        };
        out.insert(k.clone(), merged);
    }
    out
}

fn is_delete(item: &Value) -> bool {
    item.get("$patch").and_then(Value::as_str) == Some("delete")
}

/// Patch list items that are directives only make sense against a base.
fn strip_directives(items: &[Value]) -> Vec<Value> {
    items.iter().filter(|v| !is_delete(v)).cloned().collect()
}

fn merge_list(key: &str, base: &[Value], patch: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = base.to_vec();
    for item in patch {
        let Some(id) = item.get(key) else {
            // An element without the merge key cannot be matched: append it,
            // as the API server would (and let validation complain).
            out.push(item.clone());
            continue;
        };
        let pos = out.iter().position(|b| b.get(key) == Some(id));
        match (pos, is_delete(item)) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => out[i] = merge_value(None, &out[i], item),
            (None, false) => out.push(item.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn y(s: &str) -> Value {
        serde_yaml::from_str(s).expect("test yaml")
    }

    #[test]
    fn containers_and_env_merge_by_name() {
        let base = y(r#"
spec:
  containers:
  - name: a
    image: a:v1
    args: [x, y]
    env: [{name: K, value: "1"}, {name: L, value: "2"}]
  - name: b
    image: b:v1
"#);
        let patch = y(r#"
spec:
  containers:
  - name: a
    image: a:v2
    args: [z]
    env: [{name: L, value: "3"}, {name: M, value: "4"}]
  - name: c
    image: c:v1
"#);
        let want = y(r#"
spec:
  containers:
  - name: a
    image: a:v2
    args: [z]
    env: [{name: K, value: "1"}, {name: L, value: "3"}, {name: M, value: "4"}]
  - name: b
    image: b:v1
  - name: c
    image: c:v1
"#);
        assert_eq!(strategic_merge(&base, &patch), want);
    }

    #[test]
    fn null_deletes_and_patch_delete_removes() {
        let base = y(r#"
metadata: {labels: {a: "1", b: "2"}}
spec:
  containers: [{name: a, image: x}, {name: b, image: y}]
"#);
        let patch = y(r#"
metadata: {labels: {a: null, c: "3"}}
spec:
  containers: [{name: b, $patch: delete}]
"#);
        let want = y(r#"
metadata: {labels: {b: "2", c: "3"}}
spec:
  containers: [{name: a, image: x}]
"#);
        assert_eq!(strategic_merge(&base, &patch), want);
    }

    #[test]
    fn unkeyed_lists_are_replaced() {
        let base = y("spec: {containers: [{name: a, command: [x, y]}]}");
        let patch = y("spec: {containers: [{name: a, command: [z]}]}");
        let want = y("spec: {containers: [{name: a, command: [z]}]}");
        assert_eq!(strategic_merge(&base, &patch), want);
    }
}
