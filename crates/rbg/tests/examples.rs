//! The worked examples under deploy/ (both API versions, multi-document
//! files with Services, ConfigMaps, Secrets, CoordinatedPolicies, scaling
//! adapters and objects the local runtime ignores): every group validates,
//! each v1alpha1 file means the same group as its hand-written v1alpha2
//! twin and as its `rbg convert` output, and bad documents are named.

use std::path::{Path, PathBuf};

use rbg::spec::{self, load_all, SpecError};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    out.sort();
    out
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every RoleBasedGroup document of every example loads: 100% of them.
#[test]
fn every_example_group_validates() {
    let mut files = yaml_files(&deploy().join("examples/v1alpha1"));
    files.extend(yaml_files(&deploy().join("examples/v1alpha2")));
    files.extend(
        ["kvpool-cache.yaml", "pd-router.yaml"]
            .iter()
            .map(|f| deploy().join(f)),
    );
    let (mut groups, mut docs) = (0, 0);
    for f in &files {
        let text = read(f);
        let b = load_all(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(!b.groups.is_empty(), "{}: no group", f.display());
        groups += b.groups.len();
        docs += text
            .lines()
            .filter(|l| {
                matches!(
                    l.trim_end(),
                    "kind: RoleBasedGroup" | "kind: RoleBasedGroupSet"
                )
            })
            .count();
    }
    println!(
        "{} files, {docs} RoleBasedGroup/RoleBasedGroupSet documents, {groups} groups: all valid",
        files.len()
    );
    assert!(files.len() >= 12, "{} files", files.len());
    assert!(groups >= docs);
}

/// Each v1alpha1 example and its v1alpha2 twin are the same groups, with
/// the same revisions; so is the v1alpha1 file after `rbg convert`.
#[test]
fn v1alpha1_examples_mean_their_v1alpha2_twins() {
    let mut pairs = 0;
    for v1 in yaml_files(&deploy().join("examples/v1alpha1")) {
        let v2 = deploy()
            .join("examples/v1alpha2")
            .join(v1.file_name().expect("name"));
        let a = load_all(&read(&v1)).expect("v1alpha1 loads");
        let groups = |b: spec::Bundle| -> Vec<spec::Group> {
            b.groups.into_iter().map(|l| l.group).collect()
        };
        let converted = spec::convert::convert_file(&read(&v1)).expect("converts");
        assert!(!converted.contains("v1alpha1\nkind: RoleBasedGroup\n"));
        let c = load_all(&converted).expect("conversion loads");
        assert!(c.groups.iter().all(|l| l.api_version.ends_with("v1alpha2")));
        let a = groups(a);
        assert_eq!(
            a,
            groups(c),
            "{}: rbg convert changed the meaning",
            v1.display()
        );
        assert!(v2.is_file(), "{} has no v1alpha2 twin", v1.display());
        let b = groups(load_all(&read(&v2)).expect("v1alpha2 loads"));
        assert_eq!(a, b, "{} and its v1alpha2 twin differ", v1.display());
        for (x, y) in a.iter().zip(&b) {
            for (r, s) in x.roles.iter().zip(&y.roles) {
                assert_eq!(
                    rbg::revision::role_revision(r),
                    rbg::revision::role_revision(s)
                );
            }
        }
        pairs += 1;
    }
    assert!(pairs >= 5, "{pairs} pairs");
}

/// The patterns resolve to the Pods upstream creates.
#[test]
fn patterns_resolve_to_pods() {
    let b = load_all(&read(
        &deploy().join("examples/v1alpha2/leader-worker.yaml"),
    ))
    .expect("loads");
    let g = &b.groups[0].group;
    let engine = g.role("engine").expect("engine");
    let suffixes: Vec<&str> = engine.pods.iter().map(|p| p.suffix.as_str()).collect();
    assert_eq!(suffixes, ["", "-1", "-2"]);
    assert_eq!(engine.pattern, spec::Pattern::LeaderWorker { size: 3 });
    assert_eq!(engine.workload_kind, "LeaderWorkerSet");
    assert_eq!(
        engine.restart_policy,
        spec::RestartPolicy::RecreateRoleInstanceOnPodRestart
    );
    // Leader and worker patches went to the right Pods.
    assert_eq!(
        engine.pods[0].template.spec.containers[0].command[0],
        "python3"
    );
    assert_eq!(engine.pods[1].template.spec.containers[0].command[0], "sh");
    assert!(engine.pods[0].template.spec.containers[0]
        .readiness_probe
        .is_some());
    assert!(engine.pods[2].template.spec.containers[0]
        .readiness_probe
        .is_none());
    // The Service of the file names the role.
    assert_eq!(
        g.objects.services.get("engine-api").map(String::as_str),
        Some("engine")
    );

    let b = load_all(&read(
        &deploy().join("examples/v1alpha2/custom-components.yaml"),
    ))
    .expect("loads");
    let s = b.groups[0].group.role("serving").expect("serving").clone();
    let names: Vec<String> = s.pods.iter().map(|p| p.suffix.clone()).collect();
    assert_eq!(names, ["-scheduler-0", "-executor-0", "-executor-1"]);

    let b = load_all(&read(
        &deploy().join("examples/v1alpha2/rollout-and-scaling.yaml"),
    ))
    .expect("loads");
    let g = &b.groups[0].group;
    assert_eq!(g.namespace, "inference");
    assert_eq!(
        g.role("decode").expect("decode").replicas,
        3,
        "the adapter's replicas"
    );
    assert!(g.role("decode").expect("decode").update.paused);
    assert_eq!(
        g.role("cache").expect("cache").update.kind,
        spec::UpdateType::InPlaceOnly
    );
    assert!(b
        .notes
        .iter()
        .any(|n| n.contains("HorizontalPodAutoscaler") && n.contains("ignored")));

    let b = load_all(&read(
        &deploy().join("examples/v1alpha2/ordered-engine-runtime.yaml"),
    ))
    .expect("loads");
    let e = b.groups[0].group.role("engine").expect("engine").clone();
    assert!(e.ordered);
    assert_eq!(e.min_ready_seconds, 1);
    let c: Vec<&str> = e
        .template
        .spec
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(c, ["engine", "patio-runtime"]);
    assert!(e.template.spec.containers[1].args[0].contains("overridden"));
    assert!(e
        .template
        .spec
        .volumes
        .iter()
        .any(|v| v.name == "patio-shared"));
}

const MULTI: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: c}
data: {k: v}
---
apiVersion: workloads.x-k8s.io/v1alpha2
kind: RoleBasedGroup
metadata: {name: g}
spec:
  roles:
  - name: a
    replicas: 2
    standalonePattern:
      template: {spec: {containers: [{name: c, command: [x]}]}}
---
apiVersion: workloads.x-k8s.io/v1alpha2
kind: CoordinatedPolicy
metadata: {name: g}
spec:
  policies:
  - name: p
    roles: [a]
    strategy: {rollingUpdate: {maxSkew: 1}}
";

fn errors(text: &str) -> Vec<String> {
    match load_all(text) {
        Err(SpecError::Invalid(e)) => e,
        Err(e) => vec![e.to_string()],
        Ok(_) => vec![],
    }
}

/// Errors name the document (index, kind, name, line) and the field path.
#[test]
fn bad_documents_are_named() {
    assert!(errors(MULTI).is_empty(), "{:?}", errors(MULTI));
    let e = errors(&MULTI.replace("replicas: 2", "replicas: two"));
    assert!(
        e.iter()
            .any(|m| m.contains("document 2 (RoleBasedGroup \"g\", line 6)")
                && m.contains("spec.roles[0].replicas")
                && m.contains("line 12")),
        "{e:?}"
    );
    let e = errors(&MULTI.replace("roles: [a]", "roles: [a, nope]"));
    assert!(
        e.iter()
            .any(|m| m.contains("document 3 (CoordinatedPolicy \"g\"")
                && m.contains("policies[p]")
                && m.contains("unknown role \"nope\"")),
        "{e:?}"
    );
    let e = errors(&MULTI.replace("data: {k: v}", "data: {k: v"));
    assert!(e.iter().any(|m| m.contains("document 1")), "{e:?}");
    let e = errors(&MULTI.replace("kind: CoordinatedPolicy", "kind: CoordinatedPolcy"));
    assert!(
        e.iter()
            .any(|m| m.contains("\"CoordinatedPolcy\" is not a kind")),
        "{e:?}"
    );
    let e = errors(&MULTI.replace("apiVersion: v1\nkind: ConfigMap", "kind: ConfigMap"));
    assert!(
        e.iter()
            .any(|m| m.contains("document 1") && m.contains("apiVersion")),
        "{e:?}"
    );
    // A policy for a group that is not in the file is a note, not an error.
    let b = load_all(&MULTI.replace(
        "kind: CoordinatedPolicy\nmetadata: {name: g}",
        "kind: CoordinatedPolicy\nmetadata: {name: other}",
    ))
    .expect("loads");
    assert!(
        b.notes
            .iter()
            .any(|n| n.contains("no RoleBasedGroup \"other\"")),
        "{:?}",
        b.notes
    );
    // A bare-number maxSkew in v1alpha2 counts instances of the largest role.
    let b = load_all(MULTI).expect("loads");
    let c = &b.groups[0].group.coordination[0];
    assert_eq!(c.rolling_update.expect("rolling").max_skew, 0.5);
}
