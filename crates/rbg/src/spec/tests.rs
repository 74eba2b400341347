//! Loading and validation tables: every rule of RBG.md names the role and
//! the field it breaks.

use super::*;

const BASE: &str = r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: demo}
spec:
  roles:
  - name: master
    template:
      spec:
        containers: [{name: m, image: "kvpool:v1", command: [kvpool, master]}]
  - name: store
    replicas: 3
    dependencies: [master]
    rolloutStrategy:
      rollingUpdate: {type: InPlaceIfPossible, maxUnavailable: "50%", partition: 1}
    template:
      spec:
        containers: [{name: s, image: "kvpool:v1", command: [kvpool, store]}]
"#;

fn errors(text: &str) -> Vec<String> {
    match load(text) {
        Err(SpecError::Invalid(e)) => e,
        Err(e) => vec![e.to_string()],
        Ok(_) => vec![],
    }
}

#[test]
fn loads_base() {
    let l = load(BASE).expect("base loads");
    assert_eq!(l.group.roles.len(), 2);
    let s = &l.group.roles[1];
    assert_eq!(s.replicas, 3);
    assert_eq!(s.update.max_unavailable, Amount::Percent(50));
    assert_eq!(s.update.partition, Amount::Count(1));
    assert_eq!(l.group.roles[0].replicas, 1);
    assert!(l.unimplemented.is_empty(), "{:?}", l.unimplemented);
}

#[test]
fn parse_errors_name_the_path() {
    let bad = BASE.replace("replicas: 3", "replicas: three");
    let e = load(&bad).expect_err("bad replicas").to_string();
    assert!(e.contains("spec.roles[1].replicas"), "{e}");
    assert!(e.contains("line"), "{e}");
    let e = load("{{{").expect_err("not yaml").to_string();
    assert!(!e.is_empty());
    let e = load("").expect_err("empty").to_string();
    assert!(!e.is_empty());
}

#[test]
fn rule_violations_name_role_and_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "dependencies: [master]",
            "dependencies: [nope]",
            "role \"store\": dependencies: unknown role \"nope\"",
        ),
        (
            "- name: store",
            "- name: master",
            "role \"master\": duplicate role name",
        ),
        (
            "- name: store",
            "- name: Store",
            "\"Store\" is not a DNS label",
        ),
        (
            "maxUnavailable: \"50%\"",
            "maxUnavailable: 0, maxSurge: 0",
            "maxSurge and maxUnavailable are both 0",
        ),
        (
            "maxUnavailable: \"50%\"",
            "maxUnavailable: \"150%\"",
            "maxUnavailable: \"150%\" is not a percentage",
        ),
        (
            "metadata: {name: demo}",
            "metadata: {name: demo_x}",
            "metadata.name",
        ),
        (
            "kind: RoleBasedGroup",
            "kind: Deployment",
            "kind: \"Deployment\"",
        ),
    ];
    for (from, to, want) in cases {
        let errs = errors(&BASE.replace(from, to));
        assert!(
            errs.iter().any(|e| e.contains(want)),
            "{to}: want {want:?} in {errs:?}"
        );
    }
}

#[test]
fn cycle_is_named() {
    let text = BASE.replace(
        "  - name: master\n",
        "  - name: master\n    dependencies: [store]\n",
    );
    let errs = errors(&text);
    assert!(
        errs.iter().any(
            |e| e.contains("cycle") && e.contains("master -> store -> master")
                || e.contains("store -> master -> store")
        ),
        "{errs:?}"
    );
}

#[test]
fn template_and_ref_rules() {
    let both = BASE.replace(
        "  - name: master\n",
        "  - name: master\n    templateRef: {name: t}\n",
    );
    assert!(errors(&both)
        .iter()
        .any(|e| e.contains("template and templateRef are both set")));
    let neither = r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: demo}
spec:
  roles: [{name: a}]
"#;
    assert!(errors(neither)
        .iter()
        .any(|e| e.contains("role \"a\": neither template nor templateRef")));
}

#[test]
fn template_ref_with_patch() {
    let text = r#"
apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: pd}
spec:
  roleTemplates:
  - name: engine
    template:
      spec:
        containers:
        - name: main
          image: engine:v1
          command: [serve]
          env: [{name: MODE, value: any}, {name: TP, value: "1"}]
  roles:
  - name: prefill
    templateRef: {name: engine}
    templatePatch:
      spec:
        containers:
        - name: main
          env: [{name: MODE, value: prefill}]
  - name: decode
    templateRef: {name: engine}
"#;
    let l = load(text).expect("loads");
    let p = &l.group.roles[0].template.spec.containers[0];
    assert_eq!(p.image.as_deref(), Some("engine:v1"));
    let env: Vec<(&str, &str)> = p
        .env
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(env, vec![("MODE", "prefill"), ("TP", "1")]);
    let d = &l.group.roles[1].template.spec.containers[0];
    assert_eq!(d.env[0].value.as_deref(), Some("any"));
}

#[test]
fn unknown_fields_are_reported_by_path() {
    let text = BASE
        .replace(
            "spec:\n  roles:\n",
            "spec:\n  podGroupPolicy: {kubeScheduling: {}}\n  roles:\n",
        )
        .replace("replicas: 3", "replicas: 3\n    replcias: 4")
        .replace(
            "command: [kvpool, store]}",
            "command: [kvpool, store], resources: {limits: {cpu: 1}}, imagePullPolicyy: Always}",
        );
    let l = load(&text).expect("loads");
    let got: Vec<(&str, &FieldIssue, bool)> = l
        .fields
        .iter()
        .map(|f| (f.path.as_str(), &f.issue, f.local_only))
        .collect();
    let gang = FieldIssue::NotSupported("gang scheduling plugins are not supported".into());
    let pod = FieldIssue::NotSupported(String::new());
    assert_eq!(
        got,
        vec![
            ("spec.podGroupPolicy", &gang, false),
            ("spec.roles[store].replcias", &FieldIssue::Unknown, false),
            (
                "spec.roles[store].template.spec.containers[s].imagePullPolicyy",
                &FieldIssue::Unknown,
                false
            ),
            (
                "spec.roles[store].template.spec.containers[s].resources",
                &pod,
                true
            ),
        ]
    );
    // Callers print these lines.
    assert_eq!(
        l.unimplemented[1],
        "spec.roles[store].replcias: unknown field, ignored"
    );
}

#[test]
fn amounts() {
    assert_eq!(
        Amount::parse(&IntOrString::String("10%".into())),
        Ok(Amount::Percent(10))
    );
    assert_eq!(Amount::parse(&IntOrString::Int(3)), Ok(Amount::Count(3)));
    assert!(Amount::parse(&IntOrString::Int(-1)).is_err());
    assert!(Amount::parse(&IntOrString::String("x%".into())).is_err());
    assert_eq!(Amount::Percent(25).of(10, false), 2);
    assert_eq!(Amount::Percent(25).of(10, true), 3);
}

#[test]
fn every_update_type_upstream_accepts_loads() {
    for (written, kind) in [
        ("InPlaceIfPossible", UpdateType::InPlaceIfPossible),
        ("InPlaceOnly", UpdateType::InPlaceOnly),
        ("RecreatePod", UpdateType::Recreate),
        // What upstream's defaulting webhook rewrites.
        ("Recreate", UpdateType::Recreate),
        ("\"\"", UpdateType::InPlaceIfPossible),
    ] {
        let text = BASE.replace("type: InPlaceIfPossible", &format!("type: {written}"));
        let l = load(&text).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert_eq!(l.group.roles[1].update.kind, kind, "{written}");
    }
    let e = errors(&BASE.replace("type: InPlaceIfPossible", "type: Sometimes"));
    assert!(e.iter().any(|e| e.contains("Sometimes")), "{e:?}");
}
