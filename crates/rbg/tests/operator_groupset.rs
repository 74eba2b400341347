//! RoleBasedGroupSets reconciled against kube-rs's mocked API (the fake
//! in `support/`): a set server-side applies its child groups `<set>-<i>`
//! (owned by the set, labelled with it), follows template edits, deletes
//! children when scaled down and reports how many children are Ready.

mod support;

use std::sync::Arc;

use kube::CustomResourceExt;
use rbg::operator::groupset::{self, GroupSetSpec, RoleBasedGroupSet};
use rbg::operator::Context;
use serde_json::json;
use support::fake_client;

fn set(replicas: u32, image: &str, generation: i64) -> Arc<RoleBasedGroupSet> {
    let spec: GroupSetSpec = serde_yaml::from_str(&format!(
        r#"
replicas: {replicas}
groupTemplate:
  labels: {{team: infer}}
  spec:
    roles:
    - name: engine
      standalonePattern:
        template: {{spec: {{containers: [{{name: e, image: "{image}"}}]}}}}
"#
    ))
    .expect("set spec");
    let mut s = RoleBasedGroupSet::new("s", spec);
    s.metadata.namespace = Some("default".into());
    s.metadata.uid = Some("set-uid".into());
    s.metadata.generation = Some(generation);
    Arc::new(s)
}

/// Two children applied with the template's labels, the set's labels and
/// owner reference; one Ready child counted; scaled to one with a new
/// image, the second child is deleted and the first gets the image.
#[tokio::test]
async fn set_applies_scales_and_reports_children() {
    let (client, fake) = fake_client();
    let ctx = Context::new(client);
    groupset::reconcile_set(set(2, "e:v1", 1), ctx.clone())
        .await
        .expect("reconcile");
    {
        let f = fake.lock().expect("fake");
        assert_eq!(f.applied, ["s-0", "s-1"]);
        let g = &f.groups["s-1"];
        assert_eq!(g["kind"], "RoleBasedGroup");
        assert_eq!(g["apiVersion"], "workloads.x-k8s.io/v1alpha2");
        assert_eq!(g["metadata"]["labels"]["team"], "infer");
        assert_eq!(
            g["metadata"]["labels"]["rolebasedgroupset.workloads.x-k8s.io/name"],
            "s"
        );
        assert_eq!(
            g["metadata"]["labels"]["rolebasedgroupset.workloads.x-k8s.io/index"],
            "1"
        );
        assert_eq!(g["metadata"]["ownerReferences"][0]["uid"], "set-uid");
        assert_eq!(
            g["metadata"]["ownerReferences"][0]["kind"],
            "RoleBasedGroupSet"
        );
        assert_eq!(
            g["spec"]["roles"][0]["standalonePattern"]["template"]["spec"]["containers"][0]
                ["image"],
            "e:v1"
        );
        assert_eq!(
            f.set_status.clone().expect("status"),
            json!({"replicas": 2, "readyReplicas": 0, "observedGeneration": 1})
        );
        assert!(f.unexpected.is_empty(), "{:?}", f.unexpected);
    }
    // The group controller has made s-0 Ready.
    fake.lock()
        .expect("fake")
        .groups
        .get_mut("s-0")
        .expect("s-0")["status"] = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "AllRolesReady",
                              "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]});
    groupset::reconcile_set(set(2, "e:v1", 1), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        fake.lock()
            .expect("fake")
            .set_status
            .clone()
            .expect("status")["readyReplicas"],
        1
    );
    // Scale down to 1 with a new image: s-1 goes, s-0 gets the image.
    groupset::reconcile_set(set(1, "e:v2", 2), ctx.clone())
        .await
        .expect("reconcile");
    let f = fake.lock().expect("fake");
    assert_eq!(f.deleted, ["rolebasedgroup/s-1"]);
    assert_eq!(f.groups.keys().collect::<Vec<_>>(), ["s-0"]);
    assert_eq!(
        f.groups["s-0"]["spec"]["roles"][0]["standalonePattern"]["template"]["spec"]["containers"]
            [0]["image"],
        "e:v2"
    );
    assert_eq!(
        f.set_status.clone().expect("status"),
        json!({"replicas": 1, "readyReplicas": 1, "observedGeneration": 2})
    );
}

/// The CRD is upstream's v1alpha2 set: names, scope, scale subresource
/// and printer columns as `shared/rbg-crds` has them.
#[test]
fn set_crd_matches_upstream_outline() {
    let ours = serde_json::to_value(RoleBasedGroupSet::crd()).expect("crd");
    // Where tests/crd.rs finds upstream's CRDs.
    let dir = std::env::var_os("RBG_CRDS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/rbg-crds")
        });
    let path = dir.join("workloads.x-k8s.io_rolebasedgroupsets.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} (set RBG_CRDS_DIR): {e}", path.display()));
    let theirs: serde_json::Value = serde_yaml::from_str(&text).expect("upstream crd");
    assert_eq!(ours["metadata"]["name"], theirs["metadata"]["name"]);
    assert_eq!(
        ours["spec"]["names"]["shortNames"],
        theirs["spec"]["names"]["shortNames"]
    );
    assert_eq!(ours["spec"]["scope"], theirs["spec"]["scope"]);
    let v2 = |crd: &serde_json::Value| {
        crd["spec"]["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == "v1alpha2").cloned())
            .expect("v1alpha2")
    };
    let (a, b) = (v2(&ours), v2(&theirs));
    assert_eq!(a["subresources"], b["subresources"]);
    assert_eq!(a["additionalPrinterColumns"], b["additionalPrinterColumns"]);
    let spec = &a["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert!(spec["groupTemplate"]["properties"]["spec"]["properties"]["roles"].is_object());
    assert!(spec["replicas"].is_object());
}
