//! Fields rbg ignores are reported by path and classified: unknown (in
//! nobody's schema), not supported by rbg (upstream's or Kubernetes'), or
//! partly implemented. The completeness test adds an unknown key to every
//! mapping of files that use every field rbg models (tests/fixtures/
//! fields) and expects exactly that key reported, at that path: a type or
//! walker that drops keys silently fails it.

use std::path::Path;

use rbg::spec::{self, FieldIssue, FieldReport};
use serde_yaml::Value;

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fields")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Maps whose keys are the user's own (labels, patches, data): no key of
/// theirs is unknown.
const FREE_FORM: &[&str] = &[
    "labels",
    "annotations",
    "patch",
    "templatePatch",
    "leaderTemplatePatch",
    "workerTemplatePatch",
    "patchLeaderTemplate",
    "patchWorkerTemplate",
    "data",
    "stringData",
];

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// The path of every mapping of `v` outside free-form maps.
fn mappings(v: &Value, path: &[Step], out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Mapping(m) => {
            out.push(path.to_vec());
            for (k, c) in m {
                let Some(k) = k.as_str() else { continue };
                if FREE_FORM.contains(&k) {
                    continue;
                }
                let mut p = path.to_vec();
                p.push(Step::Key(k.to_string()));
                mappings(c, &p, out);
            }
        }
        Value::Sequence(s) => {
            for (i, c) in s.iter().enumerate() {
                let mut p = path.to_vec();
                p.push(Step::Index(i));
                mappings(c, &p, out);
            }
        }
        _ => {}
    }
}

/// The mapping at `path` in `v`.
fn at<'a>(v: &'a mut Value, path: &[Step]) -> &'a mut serde_yaml::Mapping {
    let mut cur = v;
    for s in path {
        cur = match s {
            Step::Key(k) => cur.get_mut(k.as_str()).expect("key"),
            Step::Index(i) => cur.get_mut(*i).expect("index"),
        };
    }
    cur.as_mapping_mut().expect("a mapping")
}

/// How rbg shows `path` of `v`: list entries by `name`, else by index.
fn shown(v: &Value, path: &[Step]) -> String {
    let mut out = String::new();
    let mut cur = Some(v);
    for s in path {
        match s {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
                cur = cur.and_then(|c| c.get(k.as_str()));
            }
            Step::Index(i) => {
                cur = cur.and_then(|c| c.get(*i));
                match cur.and_then(|c| c.get("name")).and_then(Value::as_str) {
                    Some(n) if !n.is_empty() => out.push_str(&format!("[{n}]")),
                    _ => out.push_str(&format!("[{i}]")),
                }
            }
        }
    }
    out
}

fn documents(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|d| serde_yaml::from_str(d).expect("a document"))
        .collect()
}

fn join(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml::to_string(d).expect("yaml"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn reports(text: &str) -> Vec<FieldReport> {
    let b = spec::load_all(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    b.all_fields().cloned().collect()
}

/// Adds `zzUnknown` to every mapping of every rbg document of `file` and
/// checks it is the one unknown field reported, at its path. Returns how
/// many mappings were tried.
fn every_mapping_reports_an_added_key(file: &str) -> usize {
    let text = fixture(file);
    let base = reports(&text);
    assert!(
        base.iter().all(|f| !f.is_unknown()),
        "{file}: {:?}",
        base.iter().filter(|f| f.is_unknown()).collect::<Vec<_>>()
    );
    let docs = documents(&text);
    let mut tried = 0;
    for (d, doc) in docs.iter().enumerate() {
        if matches!(
            doc.get("kind").and_then(Value::as_str),
            Some("ConfigMap" | "Secret")
        ) {
            continue;
        }
        let mut paths = Vec::new();
        mappings(doc, &[], &mut paths);
        for path in paths {
            let mut changed = docs.clone();
            at(&mut changed[d], &path).insert("zzUnknown".into(), 1.into());
            let mut want = shown(doc, &path);
            want.push_str(if want.is_empty() {
                "zzUnknown"
            } else {
                ".zzUnknown"
            });
            let got: Vec<FieldReport> = reports(&join(&changed))
                .into_iter()
                .filter(|f| f.path.contains("zzUnknown"))
                .collect();
            assert_eq!(got.len(), 1, "{file}: {want}: {got:?}");
            let f = &got[0];
            // Documents other than the group are named in front.
            let path_ok = f.path == want || f.path.ends_with(&format!("): {want}"));
            assert!(path_ok, "{file}: want {want}, got {}", f.path);
            assert!(f.is_unknown(), "{file}: {f}");
            tried += 1;
        }
    }
    tried
}

#[test]
fn an_unknown_key_anywhere_in_a_v1alpha2_file_is_reported_at_its_path() {
    let n = every_mapping_reports_an_added_key("v1alpha2.yaml");
    assert!(n >= 60, "{n} mappings");
}

#[test]
fn an_unknown_key_anywhere_in_a_v1alpha1_file_is_reported_at_its_path() {
    let n = every_mapping_reports_an_added_key("v1alpha1.yaml");
    assert!(n >= 25, "{n} mappings");
}

#[test]
fn an_unknown_key_anywhere_in_a_group_set_is_reported_at_its_path() {
    let n = every_mapping_reports_an_added_key("set.yaml");
    assert!(n >= 8, "{n} mappings");
}

const ROLE: &str = "standalonePattern: {template: {spec: {containers: [{name: c, command: [x]}]}}}";

fn v2_group(role_extra: &str) -> String {
    format!(
        "apiVersion: workloads.x-k8s.io/v1alpha2\nkind: RoleBasedGroup\nmetadata: {{name: g}}\nspec:\n  roles:\n  - name: a\n    {ROLE}\n{role_extra}"
    )
}

fn issues(text: &str) -> Vec<(String, FieldIssue)> {
    reports(text)
        .into_iter()
        .map(|f| (f.path, f.issue))
        .collect()
}

/// Upstream fields rbg lacks are "not supported", with the reason.
#[test]
fn upstream_fields_rbg_lacks_are_not_supported() {
    let text = v2_group("").replace(
        "    standalonePattern",
        "    servicePorts: [{name: http, port: 80, appProtocol: http, nodePort: 30000}]\n    standalonePattern",
    );
    assert_eq!(
        issues(&text),
        vec![
            (
                "spec.roles[a].servicePorts[http].appProtocol".into(),
                FieldIssue::NotSupported(
                    "a role's Service carries name, port, targetPort and protocol".into()
                )
            ),
            (
                "spec.roles[a].servicePorts[http].nodePort".into(),
                FieldIssue::NotSupported("a role's Service is headless".into())
            ),
        ]
    );
}

/// An object exported from a cluster (`kubectl get -o yaml`) carries
/// Kubernetes' metadata and a status: none of it is reported.
#[test]
fn kubernetes_metadata_and_status_are_left_alone() {
    let text = v2_group("status: {conditions: []}\n").replace(
        "metadata: {name: g}",
        "metadata:\n  name: g\n  uid: 3f1c\n  resourceVersion: \"42\"\n  generation: 3\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\n  managedFields: [{manager: kubectl, operation: Apply}]\n  finalizers: [x]\n  ownerReferences: [{apiVersion: v1, kind: X, name: o, uid: u}]",
    );
    assert_eq!(issues(&text), vec![]);
    let text = text.replace("generation: 3", "generatoin: 3");
    assert_eq!(
        issues(&text),
        vec![("metadata.generatoin".into(), FieldIssue::Unknown)]
    );
}

/// Inside a Pod template, a Kubernetes field is one only the local runtime
/// ignores; a misspelt one, or a misspelt key inside a real one, is
/// unknown. The operator (which passes templates to the cluster) reports
/// only the unknown ones.
#[test]
fn pod_fields_are_checked_against_kubernetes() {
    let text = v2_group("").replace(
        "{name: c, command: [x]}",
        "{name: c, command: [x], imagePullPolicy: Always, imagePullPolicyy: Always, resources: {limits: {cpu: 1}, requestz: {cpu: 1}}, securityContext: {privileged: true}}",
    );
    let local = "the operator passes it to the cluster";
    let got: Vec<String> = reports(&text).iter().map(ToString::to_string).collect();
    let at = "spec.roles[a].standalonePattern.template.spec.containers[c]";
    assert_eq!(
        got,
        vec![
            format!("{at}.imagePullPolicy: not supported by the local runtime, ignored ({local})"),
            format!("{at}.imagePullPolicyy: unknown field, ignored"),
            format!("{at}.resources: not supported by the local runtime, ignored ({local})"),
            format!("{at}.resources.requestz: unknown field, ignored"),
            format!("{at}.securityContext: not supported by the local runtime, ignored ({local})"),
        ]
    );

    let raw: spec::RoleBasedGroupV2 = serde_yaml::from_str(&text).expect("parses");
    let operator: Vec<String> = rbg::operator::ignored_reports(&raw)
        .iter()
        .map(|f| f.path.clone())
        .collect();
    assert_eq!(
        operator,
        vec![
            format!("{at}.imagePullPolicyy"),
            format!("{at}.resources.requestz"),
        ]
    );
}

/// v1alpha1 fields next to a v1alpha2 pattern are named as such; a role
/// written wholly the v1alpha1 way is read (and checked) as v1alpha1.
#[test]
fn v1alpha1_fields_in_a_v1alpha2_group() {
    let text = v2_group("    leaderWorkerSet: {size: 2}\n");
    assert_eq!(
        issues(&text),
        vec![(
            "spec.roles[a].leaderWorkerSet".into(),
            FieldIssue::NotSupported("a v1alpha1 field, ignored next to a v1alpha2 pattern".into())
        )]
    );
    let text = v2_group("").replace(
        ROLE,
        "template: {spec: {containers: [{name: c, command: [x], comand: [y]}]}}",
    );
    assert_eq!(
        issues(&text),
        vec![(
            "spec.roles[a].template.spec.containers[c].comand".into(),
            FieldIssue::Unknown
        )]
    );
}

/// Documents other than groups: each report is led by its document.
#[test]
fn other_documents_are_named_in_front() {
    let text = format!(
        "{}---\napiVersion: workloads.x-k8s.io/v1alpha2\nkind: ClusterEngineRuntimeProfile\nmetadata: {{name: p}}\nspec:\n  updateStrategy: RollingUpdate\n  initContainers: [{{name: i}}]\n  containers: [{{name: s, command: [x], imagePullPolcy: Always}}]\n",
        v2_group("")
    );
    let at = "document 2 (ClusterEngineRuntimeProfile \"p\", line 9): ";
    assert_eq!(
        issues(&text),
        vec![
            (
                format!("{at}spec.updateStrategy"),
                FieldIssue::NotSupported(
                    "a changed profile rolls out as part of each role's template".into()
                )
            ),
            (
                format!("{at}spec.initContainers"),
                FieldIssue::NotSupported(
                    "only a profile's containers and volumes are added to the Pods".into()
                )
            ),
            (
                format!("{at}spec.containers[s].imagePullPolcy"),
                FieldIssue::Unknown
            ),
        ]
    );
}
