//! Topology-aware placement (upstream's KEP-473): a role's
//! `instanceTopologyConstraint` and a CoordinatedPolicy rule's
//! `scheduling.topologyConstraint` are validated, reported as not
//! applicable by the local runtime, and become Pod affinity in the Pods
//! the operator builds and creates (through kube-rs's mocked API service,
//! `support::Fake`).

mod support;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm};
use rbg::operator::build::{self, Owner};
use rbg::spec::v2::{GroupSpecV2, RoleBasedGroupResource};
use rbg::spec::{self, Group, Placement};
use serde_json::json;

/// KEP-473's own example: prefill instances packed in a rack, prefill and
/// decode together in one block (one rack when capacity allows), the
/// router free.
const PD: &str = r#"
apiVersion: workloads.x-k8s.io/v1alpha2
kind: RoleBasedGroup
metadata: {name: infer}
spec:
  roles:
  - name: router
    standalonePattern:
      template: {spec: {containers: [{name: r, image: "router:v1"}]}}
  - name: prefill
    replicas: 2
    leaderWorkerPattern:
      size: 2
      template: {spec: {containers: [{name: p, image: "engine:v1"}]}}
    instanceTopologyConstraint:
      pack: {required: rack}
  - name: decode
    replicas: 2
    standalonePattern:
      template:
        spec:
          containers: [{name: d, image: "engine:v1"}]
          affinity:
            podAffinity:
              requiredDuringSchedulingIgnoredDuringExecution:
              - labelSelector: {matchLabels: {app: cache}}
                topologyKey: kubernetes.io/hostname
---
apiVersion: workloads.x-k8s.io/v1alpha2
kind: CoordinatedPolicy
metadata: {name: infer}
spec:
  policies:
  - name: pd-colocation
    roles: [prefill, decode]
    strategy:
      scheduling:
        topologyConstraint:
          pack: {required: block, preferred: rack}
"#;

fn load(text: &str) -> Result<Group, String> {
    spec::load(text).map(|l| l.group).map_err(|e| e.to_string())
}

fn invalid(text: &str) -> String {
    match load(text) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e,
    }
}

#[test]
fn both_attachment_points_become_placements() {
    let g = load(PD).expect("KEP-473's example validates");
    assert_eq!(
        g.placements,
        [
            Placement {
                name: "r-prefill".into(),
                roles: vec!["prefill".into()],
                per_instance: true,
                required: Some("rack".into()),
                preferred: None,
                topology_name: None,
            },
            Placement {
                name: "p-pd-colocation".into(),
                roles: vec!["prefill".into(), "decode".into()],
                per_instance: false,
                required: Some("block".into()),
                preferred: Some("rack".into()),
                topology_name: None,
            },
        ]
    );
}

/// The constraint's shape as upstream's admission checks it, level syntax,
/// and one topology rule per role.
#[test]
fn malformed_constraints_are_refused_with_their_path() {
    let role = |constraint: &str| {
        format!(
            "apiVersion: workloads.x-k8s.io/v1alpha2\nkind: RoleBasedGroup\nmetadata: {{name: g}}\nspec:\n  roles:\n  - name: a\n    instanceTopologyConstraint: {constraint}\n    standalonePattern: {{template: {{spec: {{containers: [{{name: c, image: x}}]}}}}}}\n"
        )
    };
    for empty in ["{}", "{topologyName: t}", "{pack: {}}"] {
        let e = invalid(&role(empty));
        assert!(
            e.contains(
                "role \"a\": instanceTopologyConstraint: pack.required or pack.preferred must be set"
            ),
            "{empty}: {e}"
        );
    }
    let e = invalid(&role("{pack: {required: \"rack zone\"}}"));
    assert!(
        e.contains("pack.required: \"rack zone\" is not a topology level"),
        "{e}"
    );
    let e = invalid(&role("{pack: {preferred: \"-rack\"}}"));
    assert!(e.contains("pack.preferred: \"-rack\""), "{e}");
    for level in [
        "rack",
        "BlockLayer",
        "topology.kubernetes.io/zone",
        "topology.rack",
    ] {
        let g = load(&role(&format!("{{pack: {{required: {level}}}}}"))).expect(level);
        assert_eq!(g.placements[0].required.as_deref(), Some(level));
    }

    let twice = PD.replace(
        "          pack: {required: block, preferred: rack}\n",
        "          pack: {required: block, preferred: rack}\n  - name: again\n    roles: [decode, router]\n    strategy: {scheduling: {topologyConstraint: {pack: {required: zone}}}}\n",
    );
    let e = invalid(&twice);
    assert!(
        e.contains("role \"decode\" is already in the topology constraint of"),
        "{e}"
    );
    let unknown = PD.replace("roles: [prefill, decode]", "roles: [prefill, decoder]");
    assert!(invalid(&unknown).contains("unknown role \"decoder\""));
}

/// The local runtime runs every process on this host: both fields are
/// reported as not applicable there (not as unknown, so `--strict`
/// accepts them), and the operator does not report them.
#[test]
fn local_runtime_reports_them_as_not_applicable() {
    let bundle = spec::load_all(PD).expect("loads");
    let reports: Vec<String> = bundle
        .all_fields()
        .filter(|f| f.local_only)
        .map(|f| f.path.clone())
        .collect();
    assert!(
        reports
            .iter()
            .any(|p| p == "spec.roles[prefill].instanceTopologyConstraint"),
        "{reports:?}"
    );
    assert!(
        reports
            .iter()
            .any(|p| p.ends_with("strategy.scheduling.topologyConstraint")),
        "{reports:?}"
    );
    assert!(!bundle.all_fields().any(|f| f.is_unknown()));
    // A misspelt level key is still caught.
    let typo = PD.replace("pack: {required: rack}", "pack: {requird: rack}");
    let e = invalid(&typo);
    assert!(
        e.contains("pack.required or pack.preferred must be set"),
        "{e}"
    );
    let bundle = spec::load_all(&typo.replace(
        "pack: {requird: rack}",
        "pack: {requird: rack, required: rack}",
    ))
    .expect("loads");
    assert!(bundle
        .all_fields()
        .any(|f| f.is_unknown() && f.path.ends_with("instanceTopologyConstraint.pack.requird")));
}

fn pods(g: &Group, role: &str, index: u32) -> Vec<Pod> {
    let owner = Owner {
        api_version: "workloads.x-k8s.io/v1alpha2".into(),
        name: g.name.clone(),
        uid: "uid".into(),
    };
    let r = g.role(role).expect("role");
    r.pods
        .iter()
        .map(|slot| build::pod(g, r, index, slot, "rev", "shape", &owner).expect("pod"))
        .collect()
}

fn required(p: &Pod) -> Vec<PodAffinityTerm> {
    p.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .clone()
        })
        .unwrap_or_default()
}

fn selector(t: &PodAffinityTerm) -> String {
    serde_json::to_string(&t.label_selector).expect("json")
}

/// Every Pod of a prefill instance requires its instance's Pods in its
/// rack and its rule's Pods in its block, and prefers its rule's Pods in
/// its rack; decode keeps the user's own term; the router is free.
#[test]
fn operator_pods_carry_the_constraints_as_pod_affinity() {
    let g = load(PD).expect("loads");
    let prefill = pods(&g, "prefill", 1);
    assert_eq!(prefill.len(), 2, "leader and worker");
    for p in &prefill {
        let terms = required(p);
        assert_eq!(terms.len(), 2, "{terms:?}");
        assert_eq!(terms[0].topology_key, "rack");
        let s = selector(&terms[0]);
        for label in [
            "\"rolebasedgroup.workloads.x-k8s.io/role\":\"prefill\"",
            "\"rolebasedgroup.workloads.x-k8s.io/index\":\"1\"",
            "\"rolebasedgroup.workloads.x-k8s.io/name\":\"infer\"",
        ] {
            assert!(s.contains(label), "{label} in {s}");
        }
        assert_eq!(terms[1].topology_key, "block");
        let s = selector(&terms[1]);
        assert!(
            s.contains(r#""operator":"In","values":["prefill","decode"]"#),
            "{s}"
        );
        assert!(!s.contains("index"), "{s}");
        let preferred = p
            .spec
            .as_ref()
            .expect("spec")
            .affinity
            .as_ref()
            .expect("affinity");
        let preferred = preferred
            .pod_affinity
            .as_ref()
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .clone()
            })
            .expect("preferred");
        assert_eq!(preferred.len(), 1);
        assert_eq!(preferred[0].weight, 100);
        assert_eq!(preferred[0].pod_affinity_term.topology_key, "rack");
    }
    let decode = pods(&g, "decode", 0);
    let terms = required(&decode[0]);
    assert_eq!(terms.len(), 2, "the user's term and the rule's: {terms:?}");
    assert_eq!(terms[0].topology_key, "kubernetes.io/hostname");
    assert_eq!(terms[1].topology_key, "block");
    let router = pods(&g, "router", 0);
    assert!(router[0].spec.as_ref().expect("spec").affinity.is_none());
}

/// The group status says whether the constraints took effect: True on
/// the cluster, False (NotApplicable) locally, absent without topology.
#[test]
fn status_reports_topology_translated() {
    let g = load(PD).expect("loads");
    let mut st = spec::RbgStatus::default();
    rbg::status::add_topology(&mut st, &g.placements, true, None, "2026-01-01T00:00:00Z");
    let c = rbg::status::condition(&st, "TopologyTranslated").expect("condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "PodAffinity")
    );
    assert!(
        c.message
            .contains("r-prefill: required rack; p-pd-colocation: required block, preferred rack"),
        "{}",
        c.message
    );
    let mut local = spec::RbgStatus::default();
    rbg::status::add_topology(
        &mut local,
        &g.placements,
        false,
        Some(&st),
        "2026-01-02T00:00:00Z",
    );
    let c = rbg::status::condition(&local, "TopologyTranslated").expect("condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NotApplicable")
    );
    assert_eq!(
        c.last_transition_time, "2026-01-02T00:00:00Z",
        "status changed"
    );
    let mut again = spec::RbgStatus::default();
    rbg::status::add_topology(
        &mut again,
        &g.placements,
        false,
        Some(&local),
        "2026-01-03T00:00:00Z",
    );
    let c = rbg::status::condition(&again, "TopologyTranslated").expect("condition");
    assert_eq!(
        c.last_transition_time, "2026-01-02T00:00:00Z",
        "status held"
    );
    let mut none = spec::RbgStatus::default();
    rbg::status::add_topology(&mut none, &[], true, None, "now");
    assert!(rbg::status::condition(&none, "TopologyTranslated").is_none());
}

/// The operator's reconcile creates the Pods with the affinity (the
/// CoordinatedPolicy read from the API) and writes TopologyTranslated.
#[tokio::test]
async fn operator_creates_pods_with_the_affinity() {
    let (client, fake) = support::fake_client();
    let ctx = rbg::operator::Context::new(client);
    let doc: serde_yaml::Value =
        serde_yaml::from_str(PD.split("---").next().expect("group")).expect("yaml");
    let spec: GroupSpecV2 = serde_yaml::from_value(doc["spec"].clone()).expect("spec");
    let mut g = RoleBasedGroupResource::new("infer", spec);
    g.metadata.namespace = Some("default".into());
    g.metadata.uid = Some("rbg-uid".into());
    g.metadata.generation = Some(1);
    fake.lock().expect("fake").policy = Some(json!({
        "apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "CoordinatedPolicy",
        "metadata": {"name": "infer", "namespace": "default"},
        "spec": {"policies": [{"name": "pd-colocation", "roles": ["prefill", "decode"],
                               "strategy": {"scheduling": {"topologyConstraint":
                                   {"pack": {"required": "block", "preferred": "rack"}}}}}]}}));
    rbg::operator::reconcile(Arc::new(g), ctx)
        .await
        .expect("reconcile");
    let f = fake.lock().expect("fake");
    assert!(f.unexpected.is_empty(), "{:?}", f.unexpected);
    let affinity = |pod: &str| f.pods[pod]["spec"]["affinity"]["podAffinity"].clone();
    let worker = affinity("infer-prefill-1-1");
    let required = &worker["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(required[0]["topologyKey"], "rack");
    assert_eq!(
        required[0]["labelSelector"]["matchLabels"]["rolebasedgroup.workloads.x-k8s.io/index"],
        "1"
    );
    assert_eq!(required[1]["topologyKey"], "block");
    assert_eq!(
        required[1]["labelSelector"]["matchExpressions"][0]["values"],
        json!(["prefill", "decode"])
    );
    assert_eq!(
        worker["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"],
        "rack"
    );
    let decode = affinity("infer-decode-0");
    assert_eq!(
        decode["requiredDuringSchedulingIgnoredDuringExecution"][1]["topologyKey"],
        "block"
    );
    assert!(f.pods["infer-router-0"]["spec"]["affinity"].is_null());
    let status = f.status.clone().expect("status");
    let translated = status["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "TopologyTranslated")
        .cloned()
        .expect("TopologyTranslated");
    assert_eq!(translated["status"], "True");
    assert_eq!(translated["reason"], "PodAffinity");
}
