//! `rollingUpdate.type`: every value upstream's API stores loads, means
//! what upstream means (in place or recreate, checked through the
//! planner), and is written back the way upstream's v1alpha2 writes it;
//! upstream's own update-strategy examples validate.
//!
//! Where the values come from (sgl-project/rbg at v0.8.0-alpha.5): the
//! CRDs declare the field a plain string (shared/rbg-crds);
//! `api/workloads/v1alpha2/rolebasedgroup_types.go` names `RecreatePod`,
//! `InPlaceIfPossible` and `InPlaceOnly`; `api/workloads/v1alpha1/
//! constant.go` names `Recreate` and `InPlaceIfPossible`, which
//! `rolebasedgroup_conversion.go` copies into v1alpha2 as they are; and
//! `pkg/reconciler/roleinstanceset_reconciler.go` reads `""` as
//! `InPlaceIfPossible`.

use std::path::{Path, PathBuf};

use rbg::planner::{self, Action, Backoff, DesiredRole, ObservedInstance, PlanInput};
use rbg::spec::{self, FieldIssue, UpdateType};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/upstream")
        .join(name)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A one-role group of `api` whose role has `rollingUpdate.type: written`
/// (`None`: no type at all) and runs `image`.
fn group(api: &str, written: Option<&str>, image: &str) -> String {
    let ty = written.map_or(String::new(), |w| format!("\n        type: {w}"));
    let (pattern, indent) = if api.ends_with("v1alpha1") {
        ("", "    ")
    } else {
        ("    standalonePattern:\n", "      ")
    };
    format!(
        "apiVersion: {api}\nkind: RoleBasedGroup\nmetadata: {{name: g}}\nspec:\n  roles:\n  - name: store\n    replicas: 1\n    rolloutStrategy:\n      rollingUpdate:{ty}\n        maxUnavailable: 1\n{pattern}{indent}template:\n{indent}  spec:\n{indent}    containers: [{{name: s, image: \"{image}\", command: [kvpool, store]}}]\n"
    )
}

/// What the planner does with instance 0 of `store`, running the group
/// `before`, when the file becomes `after`.
fn step(before: &spec::Loaded, after: &spec::Loaded) -> Vec<Action> {
    let old = DesiredRole::from_role(&before.group.roles[0]);
    let new = DesiredRole::from_role(&after.group.roles[0]);
    let observed = planner::Observed::from([(
        "store".to_string(),
        vec![ObservedInstance {
            index: 0,
            revision: old.revision.clone(),
            shape: old.shape.clone(),
            ready: true,
            running: true,
            restarts: 0,
            crash: None,
            busy: false,
        }],
    )]);
    planner::plan(PlanInput {
        roles: std::slice::from_ref(&new),
        coordination: &[],
        observed: &observed,
        now: 0,
        backoff: Backoff::default(),
    })
    .actions
}

/// One row per value upstream stores, in each API version that writes it:
/// the value loads as the right type, and an image change is rolled out
/// in place or by recreating the instance accordingly.
#[test]
fn every_upstream_update_type_loads_and_plans() {
    const V1: &str = spec::API_VERSION;
    const V2: &str = spec::API_V1ALPHA2;
    // (API version, value written, type read, image change goes in place)
    let rows: &[(&str, Option<&str>, UpdateType, bool)] = &[
        (
            V2,
            Some("InPlaceIfPossible"),
            UpdateType::InPlaceIfPossible,
            true,
        ),
        (V2, Some("RecreatePod"), UpdateType::Recreate, false),
        (V2, Some("InPlaceOnly"), UpdateType::InPlaceOnly, true),
        (V2, Some("\"\""), UpdateType::InPlaceIfPossible, true),
        (V2, None, UpdateType::InPlaceIfPossible, true),
        (
            V1,
            Some("InPlaceIfPossible"),
            UpdateType::InPlaceIfPossible,
            true,
        ),
        (V1, Some("Recreate"), UpdateType::Recreate, false),
        (V1, Some("\"\""), UpdateType::InPlaceIfPossible, true),
        // Upstream's conversion carries a v1alpha2 value into v1alpha1.
        (V1, Some("RecreatePod"), UpdateType::Recreate, false),
        (V1, Some("InPlaceOnly"), UpdateType::InPlaceOnly, true),
    ];
    for (api, written, kind, in_place) in rows {
        let at = format!("{api} type {written:?}");
        let before =
            spec::load(&group(api, *written, "kvpool:v1")).unwrap_or_else(|e| panic!("{at}: {e}"));
        assert_eq!(before.group.roles[0].update.kind, *kind, "{at}");
        assert!(before.fields.is_empty(), "{at}: {:?}", before.fields);
        let after = spec::load(&group(api, *written, "kvpool:v2")).expect("loads");
        let revision = DesiredRole::from_role(&after.group.roles[0]).revision;
        let want = if *in_place {
            Action::RestartInPlace {
                role: "store".into(),
                index: 0,
                revision,
            }
        } else {
            Action::Recreate {
                role: "store".into(),
                index: 0,
                revision,
            }
        };
        assert_eq!(step(&before, &after), vec![want], "{at}");
    }
}

/// A value upstream does not define is an error naming the field and the
/// values that are accepted, in both versions.
#[test]
fn an_unknown_update_type_is_an_error_naming_the_accepted_values() {
    for api in [spec::API_VERSION, spec::API_V1ALPHA2] {
        let e = spec::load(&group(api, Some("RecreatPod"), "kvpool:v1"))
            .expect_err("a misspelt type")
            .to_string();
        assert!(
            e.contains("rolloutStrategy.rollingUpdate.type: \"RecreatPod\" is not an update type"),
            "{api}: {e}"
        );
        for v in [
            "InPlaceIfPossible",
            "RecreatePod",
            "Recreate",
            "InPlaceOnly",
        ] {
            assert!(e.contains(v), "{api}: {v}: {e}");
        }
    }
}

/// An object the API server stored with any string (the CRD declares a
/// plain string) still deserializes, so the operator's watcher never fails
/// on it; validation names the value instead.
#[test]
fn the_operator_reads_any_stored_update_type() {
    let obj = serde_json::json!({
        "apiVersion": spec::API_V1ALPHA2,
        "kind": "RoleBasedGroup",
        "metadata": {"name": "g", "namespace": "default"},
        "spec": {"roles": [{
            "name": "store",
            "rolloutStrategy": {"rollingUpdate": {"type": "Sometimes"}},
            "standalonePattern": {"template": {"spec": {"containers": [
                {"name": "s", "image": "kvpool:v1", "command": ["kvpool"]}
            ]}}}
        }]}
    });
    let g: spec::v2::RoleBasedGroupResource =
        serde_json::from_value(obj).expect("any string deserializes");
    let raw = spec::RoleBasedGroupV2 {
        api_version: spec::API_V1ALPHA2.into(),
        kind: spec::KIND.into(),
        metadata: spec::ObjectMeta {
            name: "g".into(),
            ..spec::ObjectMeta::default()
        },
        spec: g.spec,
        status: None,
        extra: Default::default(),
    };
    let e = spec::validate_v2(&raw, &spec::Context::default())
        .expect_err("validation names it")
        .to_string();
    assert!(e.contains("\"Sometimes\" is not an update type"), "{e}");
}

/// Written back as upstream's v1alpha2 writes it: `RecreatePod` stays, and
/// `rbg convert` turns v1alpha1's `Recreate` into `RecreatePod` (upstream's
/// v1alpha2 controllers recreate only on that value).
#[test]
fn update_types_are_written_as_upstream_writes_them() {
    let v2 = group(spec::API_V1ALPHA2, Some("RecreatePod"), "kvpool:v1");
    let raw: spec::RoleBasedGroupV2 = serde_yaml::from_str(&v2).expect("parses");
    let back = serde_yaml::to_string(&raw).expect("serializes");
    assert!(back.contains("type: RecreatePod"), "{back}");

    let v1 = group(spec::API_VERSION, Some("Recreate"), "kvpool:v1");
    let converted = spec::convert::convert_file(&v1).expect("converts");
    assert!(converted.contains("type: RecreatePod"), "{converted}");
    assert!(!converted.contains("type: Recreate\n"), "{converted}");
    let l = spec::load(&converted).expect("the conversion loads");
    assert_eq!(l.group.roles[0].update.kind, UpdateType::Recreate);

    for kind in [
        UpdateType::InPlaceIfPossible,
        UpdateType::Recreate,
        UpdateType::InPlaceOnly,
    ] {
        assert_eq!(UpdateType::parse(kind.as_str()), Some(kind));
    }
}

/// Upstream's update-strategy examples (copied under tests/fixtures/upstream)
/// validate, each role with the type it names and its rolling-update knobs.
#[test]
fn upstream_update_strategy_examples_validate() {
    let l = spec::load(&read(&fixture("rolling-update.yaml"))).expect("rolling-update.yaml");
    let kinds: Vec<(&str, UpdateType)> = l
        .group
        .roles
        .iter()
        .map(|r| (r.name.as_str(), r.update.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("prefill", UpdateType::InPlaceIfPossible),
            ("decode", UpdateType::InPlaceOnly),
            ("router", UpdateType::Recreate),
        ]
    );
    let router = &l.group.roles[2];
    assert_eq!(router.update.max_surge, spec::Amount::Count(1));
    // The one thing rbg ignores there: the in-place grace period.
    let paths: Vec<(&str, &FieldIssue)> = l
        .fields
        .iter()
        .map(|f| (f.path.as_str(), &f.issue))
        .collect();
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert_eq!(
        paths[0].0,
        "spec.roles[prefill].rolloutStrategy.rollingUpdate.inPlaceUpdateStrategy.gracePeriodSeconds"
    );
    assert!(matches!(paths[0].1, FieldIssue::Partly(_)));

    let l = spec::load(&read(&fixture("rolling-update-with-partition.yaml")))
        .expect("rolling-update-with-partition.yaml");
    assert_eq!(l.group.roles[0].update.partition, spec::Amount::Count(2));
    assert!(l.group.roles[1].update.paused);
    assert!(l.fields.is_empty(), "{:?}", l.fields);
}
