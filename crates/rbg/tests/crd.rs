//! The CRDs generated from the Rust types (`rbg crd`) against the upstream
//! CRDs of release v0.8.0-alpha.5 (shared/rbg-crds), field by field for
//! the supported subset: every field of ours exists upstream with the same
//! type, its enum values are upstream's, and where both set a default they
//! agree; every role-level field upstream has is one of ours. Pod templates
//! and patches are open objects on our side (the API server keeps every
//! Pod field; rbg validates them itself), so the walk stops there.
//!
//! The deliberate differences are listed in `EXTENSIONS` and `MISSING`,
//! each with its reason; anything else is a failure naming the path.

use std::path::PathBuf;

use serde_json::Value;

/// Fields of ours upstream does not have (rbg extensions), by version.
const EXTENSIONS: &[(&str, &str, &str)] = &[
    (
        "v1alpha2",
        "spec.roles[].restartPolicy",
        "v1alpha1's restart policy kept for standalone roles (roles are open upstream)",
    ),
    (
        "v1alpha2",
        "spec.roles[].workload",
        "v1alpha1's workload kept for converted roles (roles are open upstream)",
    ),
    (
        "v1alpha2",
        "spec.roles[].instanceTopologyConstraint",
        "KEP-473's topology constraint, newer than the v0.8.0-alpha.5 CRDs",
    ),
    (
        "v1alpha2",
        "spec.policies[].strategy.scheduling",
        "KEP-473's cross-role topology constraint, as above",
    ),
    (
        "v1alpha1",
        "spec.coordination[].strategy.scheduling",
        "v1alpha2's cross-role topology constraint, accepted in v1alpha1 too (one struct)",
    ),
    (
        "v1alpha1",
        "spec.roles[].components[].labels",
        "v1alpha2's component labels, accepted in v1alpha1 too (one struct)",
    ),
    (
        "v1alpha1",
        "spec.roles[].components[].annotations",
        "as above",
    ),
    (
        "v1alpha1",
        "spec.roles[].scalingAdapter.labels",
        "v1alpha2's adapter labels, accepted in v1alpha1 too",
    ),
];

/// Upstream fields rbg does not offer, by version: the list `rbg validate`
/// reads to call such a field "not supported by rbg" rather than unknown,
/// so the comparison below keeps that list exact.
const MISSING: &[(&str, &str, &str)] = rbg::spec::NOT_SUPPORTED;

/// Paths where our type is wider than upstream's.
const WIDER: &[(&str, &str, &str)] = &[
    (
        "v1alpha1",
        "spec.coordination[].strategy.rollingUpdate.maxSkew",
        "int-or-string (v1alpha2's type); upstream v1alpha1 takes \"N%\" only",
    ),
    (
        "v1alpha1",
        "spec.coordination[].strategy.rollingUpdate.partition",
        "as above",
    ),
    (
        "v1alpha1",
        "spec.coordination[].strategy.rollingUpdate.maxUnavailable",
        "as above",
    ),
    (
        "v1alpha1",
        "spec.coordination[].strategy.scaling.maxSkew",
        "as above",
    ),
];

/// Enum values of ours upstream does not list.
const EXTRA_ENUM: &[(&str, &str)] = &[(
    "RecreateRBGOnPodRestart",
    "rbg's group restart policy (RBG.md)",
)];

fn upstream(file: &str) -> Value {
    let dir = std::env::var_os("RBG_CRDS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/rbg-crds")
        });
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} (set RBG_CRDS_DIR): {e}", path.display()));
    serde_yaml::from_str(&text).expect("upstream CRD parses")
}

fn version<'a>(crd: &'a Value, v: &str) -> &'a Value {
    crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|x| x["name"] == v))
        .unwrap_or_else(|| panic!("no version {v}"))
}

fn type_of(s: &Value) -> String {
    if s["x-kubernetes-int-or-string"] == true {
        return "int-or-string".into();
    }
    s["type"].as_str().unwrap_or("").to_string()
}

fn listed(list: &[(&str, &str, &str)], v: &str, path: &str) -> bool {
    list.iter().any(|(lv, p, _)| *lv == v && *p == path)
}

struct Walk<'a> {
    version: &'a str,
    problems: Vec<String>,
    compared: usize,
}

impl Walk<'_> {
    fn walk(&mut self, ours: &Value, theirs: &Value, path: &str) {
        self.compared += 1;
        if std::env::var_os("CRD_TRACE").is_some() {
            eprintln!("{path}");
        }
        let (a, b) = (type_of(ours), type_of(theirs));
        if a != b && !listed(WIDER, self.version, path) {
            self.problems
                .push(format!("{path}: type {a:?} upstream {b:?}"));
        }
        if let (Some(ea), Some(eb)) = (ours["enum"].as_array(), theirs["enum"].as_array()) {
            for v in ea {
                let extra = EXTRA_ENUM.iter().any(|(x, _)| v == x);
                if !eb.contains(v) && !extra {
                    self.problems
                        .push(format!("{path}: enum value {v} not upstream"));
                }
            }
        }
        if let (Some(da), Some(db)) = (ours.get("default"), theirs.get("default")) {
            if da != db {
                self.problems
                    .push(format!("{path}: default {da} upstream {db}"));
            }
        }
        let open = ours["x-kubernetes-preserve-unknown-fields"] == true
            && ours.get("properties").is_none()
            && ours.get("items").is_none();
        if open {
            return; // a Pod template or patch: the API server keeps it whole.
        }
        if let Some(props) = ours["properties"].as_object() {
            for (k, c) in props {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match theirs["properties"].get(k) {
                    Some(t) => self.walk(c, t, &p),
                    None if listed(EXTENSIONS, self.version, &p) => {}
                    None => self.problems.push(format!("{p}: not upstream")),
                }
            }
            if let Some(tp) = theirs["properties"].as_object() {
                // Upstream fields we lack, at every level a user writes.
                for k in tp.keys() {
                    let p = format!("{path}.{k}");
                    if !path.starts_with("status")
                        && !props.contains_key(k)
                        && !listed(MISSING, self.version, &p)
                    {
                        self.problems
                            .push(format!("{p}: upstream field missing in ours"));
                    }
                }
            }
        }
        if ours.get("items").is_some() {
            self.walk(&ours["items"], &theirs["items"], &format!("{path}[]"));
        }
        if ours["additionalProperties"].is_object() {
            self.walk(
                &ours["additionalProperties"],
                &theirs["additionalProperties"],
                &format!("{path}{{}}"),
            );
        }
    }
}

fn ours() -> Vec<Value> {
    rbg::operator::crds()
        .iter()
        .map(|c| serde_json::to_value(c).expect("crd json"))
        .collect()
}

fn compare(ours: &Value, theirs: &Value, v: &str) -> usize {
    let mut w = Walk {
        version: v,
        problems: Vec::new(),
        compared: 0,
    };
    let a = &version(ours, v)["schema"]["openAPIV3Schema"];
    let b = &version(theirs, v)["schema"]["openAPIV3Schema"];
    for part in ["spec", "status"] {
        if a["properties"].get(part).is_some() {
            w.walk(&a["properties"][part], &b["properties"][part], part);
        }
    }
    assert!(w.problems.is_empty(), "{v}:\n  {}", w.problems.join("\n  "));
    w.compared
}

#[test]
fn rolebasedgroup_matches_upstream_field_by_field() {
    let ours = ours();
    let theirs = upstream("workloads.x-k8s.io_rolebasedgroups.yaml");
    let rbg = &ours[0];
    assert_eq!(rbg["metadata"]["name"], theirs["metadata"]["name"]);
    assert_eq!(
        rbg["spec"]["names"]["shortNames"],
        theirs["spec"]["names"]["shortNames"]
    );
    assert_eq!(rbg["spec"]["scope"], "Namespaced");
    let v2 = compare(rbg, &theirs, "v1alpha2");
    let v1 = compare(rbg, &theirs, "v1alpha1");
    println!("RoleBasedGroup: {v2} v1alpha2 and {v1} v1alpha1 schema nodes match upstream");
    assert!(v2 > 60 && v1 > 60, "{v2} {v1}");
    // Served, stored and deprecated like upstream; status subresource.
    for v in ["v1alpha1", "v1alpha2"] {
        let (a, b) = (version(rbg, v), version(&theirs, v));
        assert_eq!(a["served"], b["served"], "{v} served");
        assert_eq!(a["storage"], b["storage"], "{v} storage");
        assert_eq!(
            a["deprecated"].as_bool().unwrap_or(false),
            b["deprecated"].as_bool().unwrap_or(false),
            "{v}"
        );
        assert!(
            a["subresources"]["status"].is_object(),
            "{v} status subresource"
        );
        assert_eq!(
            a["additionalPrinterColumns"], b["additionalPrinterColumns"],
            "{v} columns"
        );
    }
}

#[test]
fn policy_and_adapter_match_upstream() {
    let ours = ours();
    let find = |kind: &str| {
        ours.iter()
            .find(|c| c["spec"]["names"]["kind"] == kind)
            .unwrap_or_else(|| panic!("no CRD for {kind}"))
    };
    let n = compare(
        find("CoordinatedPolicy"),
        &upstream("workloads.x-k8s.io_coordinatedpolicies.yaml"),
        "v1alpha2",
    );
    assert!(n >= 10, "{n}");
    let adapter = find("RoleBasedGroupScalingAdapter");
    let theirs = upstream("workloads.x-k8s.io_rolebasedgroupscalingadapters.yaml");
    compare(adapter, &theirs, "v1alpha2");
    assert_eq!(
        version(adapter, "v1alpha2")["subresources"]["scale"]["specReplicasPath"],
        version(&theirs, "v1alpha2")["subresources"]["scale"]["specReplicasPath"]
    );
}

/// The comparison itself can fail: a renamed field is caught.
#[test]
fn the_comparison_notices_a_difference() {
    let mut ours = ours()[0].clone();
    let theirs = upstream("workloads.x-k8s.io_rolebasedgroups.yaml");
    let roles = &mut ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["roles"]["items"]["properties"];
    let deps = roles["dependencies"].take();
    roles["dependencys"] = deps;
    let r = std::panic::catch_unwind(|| compare(&ours, &theirs, "v1alpha2"));
    assert!(r.is_err());
}

/// deploy/operator/crds.yaml is what `rbg crd` prints today.
#[test]
fn shipped_crds_are_current() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator/crds.yaml");
    let shipped = std::fs::read_to_string(&path).expect("deploy/operator/crds.yaml");
    let now = rbg::operator::crd_yaml().expect("crd yaml");
    assert!(
        shipped == now,
        "deploy/operator/crds.yaml is stale: regenerate it with `rbg crd > deploy/operator/crds.yaml`"
    );
}

/// Every entry of rbg's list of unsupported upstream fields is an upstream
/// field (so "not supported by rbg" is never said of a misspelling) that
/// rbg's own CRD lacks.
#[test]
fn not_supported_fields_are_upstream_fields_rbg_lacks() {
    fn find<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
        let mut cur = schema;
        for part in path.split('.') {
            let (key, items) = match part.strip_suffix("[]") {
                Some(k) => (k, true),
                None => (part, false),
            };
            cur = cur["properties"].get(key)?;
            if items {
                cur = cur.get("items")?;
            }
        }
        Some(cur)
    }
    let ours = ours();
    let theirs = upstream("workloads.x-k8s.io_rolebasedgroups.yaml");
    let mut checked = 0;
    for (v, path, why) in rbg::spec::NOT_SUPPORTED {
        assert!(!why.is_empty(), "{v} {path}: say why");
        if !matches!(*v, "v1alpha1" | "v1alpha2") {
            continue; // profiles: no CRD in shared/rbg-crds
        }
        let up = &version(&theirs, v)["schema"]["openAPIV3Schema"];
        assert!(
            find(up, path).is_some(),
            "{v} {path}: not an upstream field"
        );
        let mine = &version(&ours[0], v)["schema"]["openAPIV3Schema"];
        assert!(find(mine, path).is_none(), "{v} {path}: rbg has it");
        checked += 1;
    }
    assert!(checked >= 5, "{checked}");
}
