//! `rbg operator`'s reconcile against kube-rs's mocked API service
//! (tower-test `mock::pair`, as in kube-rs's controller examples). No API
//! server runs here: a small in-memory fake answers the requests the
//! reconciler makes (Pods, Services, ConfigMaps, CoordinatedPolicies,
//! scaling adapters, the status subresource, Events) and a "kubelet"
//! helper marks Pods running and ready between passes. The tests assert
//! on what ended up in the fake: which Pods exist, their images, uids,
//! labels and env, and the status written.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rbg::operator::{self, Context, Error};
use rbg::spec::v2::{GroupSpecV2, RoleBasedGroupResource};
use serde_json::{json, Value};
use support::{fake_client, Fake};

fn group(spec: &str, generation: i64) -> Arc<RoleBasedGroupResource> {
    let spec: GroupSpecV2 = serde_yaml::from_str(spec).expect("spec");
    let mut g = RoleBasedGroupResource::new("g", spec);
    g.metadata.namespace = Some("default".into());
    g.metadata.uid = Some("rbg-uid".into());
    g.metadata.generation = Some(generation);
    Arc::new(g)
}

fn spec(store_image: &str) -> String {
    format!(
        r#"
roles:
- name: master
  standalonePattern:
    template:
      spec:
        containers: [{{name: master, image: "kvpool:v1", command: [kvpool, master]}}]
- name: store
  replicas: 2
  dependencies: [master]
  servicePorts: [{{name: data, port: 7000}}]
  rolloutStrategy:
    rollingUpdate: {{type: InPlaceIfPossible, maxUnavailable: 1}}
  standalonePattern:
    template:
      spec:
        containers:
        - name: store
          image: "{store_image}"
          command: [kvpool, store]
          volumeMounts: [{{name: data, mountPath: /data}}]
        volumes: [{{name: data, emptyDir: {{medium: Memory}}}}]
"#
    )
}

async fn pass(g: &Arc<RoleBasedGroupResource>, ctx: &Arc<Context>) {
    operator::reconcile(g.clone(), ctx.clone())
        .await
        .expect("reconcile");
}

/// Dependencies gate creation: the stores come only once the master is
/// ready; Services, the discovery ConfigMap, env and owner references are
/// there; the status reaches Ready with roleStatuses.
#[tokio::test]
async fn creates_in_dependency_order_and_reports_status() {
    let (client, fake) = fake_client();
    let ctx = Context::new(client);
    let g = group(&spec("kvpool:v1"), 3);
    pass(&g, &ctx).await;
    {
        let f = fake.lock().expect("fake");
        assert_eq!(f.created, ["g-master-0"]);
        assert!(f.services.contains_key("s-g-master") && f.services.contains_key("s-g-store"));
        assert_eq!(f.services["s-g-store"]["spec"]["clusterIP"], "None");
        assert_eq!(
            f.services["s-g-store"]["spec"]["publishNotReadyAddresses"],
            true
        );
        let cm = f.config_maps["g-rbg-config"]["data"]["config.yaml"]
            .as_str()
            .unwrap_or("");
        assert!(
            cm.contains("g-store-1.s-g-store.default.svc.cluster.local"),
            "{cm}"
        );
        let st = f.status.clone().expect("status");
        assert_eq!(st["observedGeneration"], 3);
        assert_eq!(st["conditions"][0]["type"], "Ready");
        assert_eq!(st["conditions"][0]["status"], "False");
        assert!(f.unexpected.is_empty(), "{:?}", f.unexpected);
    }
    pass(&g, &ctx).await;
    assert_eq!(
        fake.lock().expect("fake").created.len(),
        1,
        "store waits for master"
    );
    fake.lock().expect("fake").kubelet();
    pass(&g, &ctx).await;
    {
        let f = fake.lock().expect("fake");
        assert_eq!(f.created, ["g-master-0", "g-store-0", "g-store-1"]);
        let pod = &f.pods["g-store-1"];
        assert_eq!(pod["spec"]["hostname"], "g-store-1");
        assert_eq!(pod["spec"]["subdomain"], "s-g-store");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "rbg-uid");
        let env = pod["spec"]["containers"][0]["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let get = |k: &str| {
            env.iter()
                .find(|e| e["name"] == k)
                .map(|e| e["value"].clone())
        };
        assert_eq!(get("ROLE_INDEX"), Some(json!("1")));
        assert_eq!(get("RBG_CONFIG"), Some(json!("/etc/rbg/config.yaml")));
        assert!(pod["spec"]["volumes"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["configMap"]["name"] == "g-rbg-config")));
        assert!(
            f.events.iter().any(|e| e == "InstanceCreated"),
            "{:?}",
            f.events
        );
    }
    fake.lock().expect("fake").kubelet();
    pass(&g, &ctx).await;
    let f = fake.lock().expect("fake");
    let st = f.status.clone().expect("status");
    assert_eq!(st["conditions"][0]["status"], "True", "{st}");
    assert_eq!(
        st["roleStatuses"][1],
        json!({"name": "store", "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2})
    );
    assert!(f.deleted.is_empty());
    assert!(f.unexpected.is_empty(), "{:?}", f.unexpected);
}

async fn ready_group(spec_text: &str) -> (Arc<Context>, Arc<Mutex<Fake>>) {
    let (client, fake) = fake_client();
    let ctx = Context::new(client);
    let g = group(spec_text, 1);
    for _ in 0..4 {
        pass(&g, &ctx).await;
        fake.lock().expect("fake").kubelet();
    }
    (ctx, fake)
}

/// An image-only change patches the running Pods (same uid: the Pod and
/// its memory-backed emptyDir stay), one at a time in decreasing index
/// order, each only once the kubelet reports the previous one restarted.
#[tokio::test]
async fn image_change_patches_pods_in_place_one_at_a_time() {
    let (ctx, fake) = ready_group(&spec("kvpool:v1")).await;
    let uids: BTreeMap<String, Value> = {
        let f = fake.lock().expect("fake");
        f.pods
            .iter()
            .map(|(k, p)| (k.clone(), p["metadata"]["uid"].clone()))
            .collect()
    };
    let old_rev = fake
        .lock()
        .expect("fake")
        .label("g-store-0", "rolebasedgroup.workloads.x-k8s.io/revision");
    let g = group(&spec("kvpool:v2"), 2);
    pass(&g, &ctx).await;
    {
        let f = fake.lock().expect("fake");
        assert_eq!(
            f.patched,
            ["g-store-1"],
            "highest index first, one at a time"
        );
        assert_eq!(f.image("g-store-1"), "kvpool:v2");
        assert_eq!(f.image("g-store-0"), "kvpool:v1");
        assert_ne!(
            f.label("g-store-1", "rolebasedgroup.workloads.x-k8s.io/revision"),
            old_rev
        );
    }
    // The kubelet has not restarted the container yet: nothing more moves.
    pass(&g, &ctx).await;
    assert_eq!(fake.lock().expect("fake").patched.len(), 1);
    fake.lock().expect("fake").kubelet();
    pass(&g, &ctx).await;
    fake.lock().expect("fake").kubelet();
    pass(&g, &ctx).await;
    let f = fake.lock().expect("fake");
    assert_eq!(f.patched, ["g-store-1", "g-store-0"]);
    assert_eq!(f.image("g-store-0"), "kvpool:v2");
    assert!(
        f.deleted.is_empty(),
        "in place means no Pod is deleted: {:?}",
        f.deleted
    );
    for (k, p) in &f.pods {
        assert_eq!(p["metadata"]["uid"], uids[k], "{k} was replaced");
    }
    assert!(f.events.iter().any(|e| e == "InPlaceUpdate"));
    assert_eq!(
        f.status.clone().expect("status")["roleStatuses"][1]["updatedReplicas"],
        2
    );
}

/// A CoordinatedPolicy of the group's name holds prefill and decode within
/// maxSkew at every pass of a rollout that needs recreating Pods.
#[tokio::test]
async fn coordinated_rollout_respects_the_policy() {
    let spec_of = |image: &str| {
        format!(
            r#"
roles:
- name: prefill
  replicas: 4
  rolloutStrategy: {{rollingUpdate: {{type: Recreate, maxUnavailable: 4}}}}
  standalonePattern: {{template: {{spec: {{containers: [{{name: e, image: "{image}", command: [x]}}]}}}}}}
- name: decode
  replicas: 2
  rolloutStrategy: {{rollingUpdate: {{type: Recreate, maxUnavailable: 2}}}}
  standalonePattern: {{template: {{spec: {{containers: [{{name: e, image: "{image}", command: [x]}}]}}}}}}
"#
        )
    };
    let (ctx, fake) = ready_group(&spec_of("e:v1")).await;
    fake.lock().expect("fake").policy = Some(json!({
        "apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "CoordinatedPolicy",
        "metadata": {"name": "g", "namespace": "default"},
        "spec": {"policies": [{"name": "pd", "roles": ["prefill", "decode"],
                               "strategy": {"rollingUpdate": {"maxSkew": "25%"}}}]}}));
    let g = group(&spec_of("e:v2"), 2);
    let frac = |f: &Fake, role: &str, n: f64| {
        let done = f
            .pods
            .values()
            .filter(|p| p["metadata"]["labels"]["rolebasedgroup.workloads.x-k8s.io/role"] == role)
            .filter(|p| p["spec"]["containers"][0]["image"] == "e:v2")
            .count();
        done as f64 / n
    };
    let mut worst: f64 = 0.0;
    for _ in 0..20 {
        pass(&g, &ctx).await;
        let mut f = fake.lock().expect("fake");
        worst = worst.max((frac(&f, "prefill", 4.0) - frac(&f, "decode", 2.0)).abs());
        f.kubelet();
    }
    let f = fake.lock().expect("fake");
    assert_eq!(frac(&f, "prefill", 4.0), 1.0);
    assert_eq!(frac(&f, "decode", 2.0), 1.0);
    assert!(worst <= 0.25 + 1e-9, "skew {worst}");
    assert!(worst > 0.0, "the rollout moved in steps");
    assert!(!f.deleted.is_empty(), "Recreate deletes Pods");
}

/// A leader-worker instance is a leader and its workers with the LWS
/// variables; a container restart recreates every Pod of that instance.
#[tokio::test]
async fn leader_worker_pods_and_recreate_on_restart() {
    let text = r#"
roles:
- name: e
  replicas: 2
  leaderWorkerPattern:
    size: 2
    sharedServiceSelection: LeaderOnly
    template: {spec: {containers: [{name: c, image: "e:v1", command: [x]}]}}
"#;
    let (ctx, fake) = ready_group(text).await;
    {
        let f = fake.lock().expect("fake");
        let names: Vec<&String> = f.pods.keys().collect();
        assert_eq!(names, ["g-e-0", "g-e-0-1", "g-e-1", "g-e-1-1"]);
        let env = f.pods["g-e-0-1"]["spec"]["containers"][0]["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let get = |k: &str| {
            env.iter()
                .find(|e| e["name"] == k)
                .map(|e| e["value"].clone())
        };
        assert_eq!(
            get("LWS_LEADER_ADDRESS"),
            Some(json!("g-e-0.s-g-e.default"))
        );
        assert_eq!(get("LWS_WORKER_INDEX"), Some(json!("1")));
        assert_eq!(get("LWS_GROUP_SIZE"), Some(json!("2")));
        assert_eq!(
            f.services["s-g-e"]["spec"]["selector"]["rolebasedgroup.workloads.x-k8s.io/component"],
            "leader"
        );
    }
    fake.lock()
        .expect("fake")
        .pods
        .get_mut("g-e-0-1")
        .expect("worker")["status"]["containerStatuses"][0]["restartCount"] = json!(1);
    let g = group(text, 1);
    pass(&g, &ctx).await;
    let f = fake.lock().expect("fake");
    let mut deleted = f.deleted.clone();
    deleted.sort();
    assert_eq!(
        deleted,
        ["g-e-0", "g-e-0-1"],
        "the whole instance, and only it"
    );
}

/// An invalid group fails with a Warning event and a long requeue; API
/// failures back off exponentially; failures are counted by kind.
#[tokio::test]
async fn invalid_spec_fails_with_event_and_backoff() {
    let (client, fake) = fake_client();
    let ctx = Context::new(client);
    let bad = spec("kvpool:v1").replace("dependencies: [master]", "dependencies: [nope]");
    let g = group(&bad, 1);
    let err = operator::reconcile(g.clone(), ctx.clone())
        .await
        .expect_err("invalid");
    assert!(
        matches!(err, Error::Invalid(ref m) if m.contains("unknown role \"nope\"")),
        "{err}"
    );
    assert!(fake
        .lock()
        .expect("fake")
        .events
        .iter()
        .any(|e| e == "InvalidSpec"));
    assert!(fake.lock().expect("fake").pods.is_empty());
    let _ = operator::error_policy(g, &err, ctx.clone());
    assert_eq!(ctx.failures_of("invalid"), 1);
    let build = Error::Build("x".into());
    let secs = |n| operator::backoff(&build, n).as_secs();
    assert_eq!((secs(1), secs(2), secs(4), secs(30)), (1, 2, 8, 300));
    assert_eq!(operator::backoff(&err, 1).as_secs(), 300);
}

/// Rollout history: the first reconcile records revision 1 as a
/// ControllerRevision owned by the group; a replica change records
/// nothing; an image change records revision 2; going back to the first
/// template renumbers its ControllerRevision to 3 instead of copying it.
#[tokio::test]
async fn template_changes_are_recorded_as_controller_revisions() {
    let (client, fake) = fake_client();
    let ctx = Context::new(client);
    pass(&group(&spec("kvpool:v1"), 1), &ctx).await;
    let first = {
        let f = fake.lock().expect("fake");
        assert_eq!(f.revisions.len(), 1, "{:?}", f.revision_log);
        let (name, cr) = f.revisions.iter().next().expect("revision");
        assert!(name.starts_with("g-"), "{name}");
        assert_eq!(cr["revision"], 1);
        assert_eq!(cr["metadata"]["ownerReferences"][0]["uid"], "rbg-uid");
        assert_eq!(
            cr["metadata"]["labels"]["rolebasedgroup.workloads.x-k8s.io/name"],
            "g"
        );
        let roles = &cr["data"]["spec"]["roles"];
        assert_eq!(roles[1]["name"], "store");
        assert!(roles[1].get("replicas").is_none(), "{roles}");
        assert_eq!(
            roles[1]["standalonePattern"]["template"]["spec"]["containers"][0]["image"],
            "kvpool:v1"
        );
        name.clone()
    };
    let scaled = spec("kvpool:v1").replace("replicas: 2", "replicas: 3");
    pass(&group(&scaled, 2), &ctx).await;
    assert_eq!(
        fake.lock().expect("fake").revisions.len(),
        1,
        "scaling is no revision"
    );
    pass(&group(&spec("kvpool:v2"), 3), &ctx).await;
    {
        let f = fake.lock().expect("fake");
        assert_eq!(f.revisions.len(), 2);
        let newest = f
            .revisions
            .values()
            .find(|r| r["revision"] == 2)
            .expect("revision 2");
        assert_eq!(
            newest["data"]["spec"]["roles"][1]["standalonePattern"]["template"]["spec"]
                ["containers"][0]["image"],
            "kvpool:v2"
        );
    }
    pass(&group(&spec("kvpool:v1"), 4), &ctx).await;
    let f = fake.lock().expect("fake");
    assert_eq!(f.revisions.len(), 2, "{:?}", f.revision_log);
    assert_eq!(f.revisions[&first]["revision"], 3);
    assert_eq!(f.revision_log.len(), 3, "{:?}", f.revision_log);
    assert!(
        f.revision_log[2].starts_with("patch "),
        "{:?}",
        f.revision_log
    );
    assert!(f.unexpected.is_empty(), "{:?}", f.unexpected);
}

/// Beyond the history limit (10) the oldest ControllerRevisions go.
#[tokio::test]
async fn history_is_pruned_at_the_limit() {
    let (client, fake) = fake_client();
    let ctx = Context::new(client);
    for i in 1..=12 {
        pass(&group(&spec(&format!("kvpool:v{i}")), i), &ctx).await;
    }
    let f = fake.lock().expect("fake");
    let mut numbers: Vec<i64> = f
        .revisions
        .values()
        .filter_map(|r| r["revision"].as_i64())
        .collect();
    numbers.sort();
    assert_eq!(numbers, (3..=12).collect::<Vec<_>>());
    assert_eq!(
        f.revision_log
            .iter()
            .filter(|l| l.starts_with("delete "))
            .count(),
        2
    );
}

/// `rbg rollout history|undo --cluster`: the history lists the recorded
/// revisions with their images; undo (to the previous revision by
/// default) replaces the group's spec with the recorded templates and
/// today's replica counts, guarded by its resourceVersion; the next
/// reconcile renumbers the restored revision as the newest.
#[tokio::test]
async fn rollout_undo_on_the_cluster() {
    use rbg::operator::history;
    let (client, fake) = fake_client();
    let ctx = Context::new(client.clone());
    pass(&group(&spec("kvpool:v1"), 1), &ctx).await;
    let scaled_v2 = spec("kvpool:v2").replace("replicas: 2", "replicas: 5");
    pass(&group(&scaled_v2, 2), &ctx).await;
    // The group as the API server holds it now.
    let mut now = serde_json::to_value(group(&scaled_v2, 2).as_ref()).expect("json");
    now["metadata"]["resourceVersion"] = json!("7");
    fake.lock().expect("fake").groups.insert("g".into(), now);

    let entries = history::entries(&client, "default", "g")
        .await
        .expect("history");
    let numbers: Vec<i64> = entries.iter().map(|e| e.revision).collect();
    assert_eq!(numbers, [1, 2]);
    assert_eq!(entries[0].images, ["master=kvpool:v1", "store=kvpool:v1"]);
    let table = history::table(&entries);
    assert!(
        table
            .lines()
            .nth(2)
            .is_some_and(|l| l.starts_with("2 ") && l.contains("store=kvpool:v2")),
        "{table}"
    );

    let restored = history::undo(&client, "default", "g", None)
        .await
        .expect("undo");
    assert_eq!(restored, 1);
    let g: RoleBasedGroupResource = {
        let f = fake.lock().expect("fake");
        assert_eq!(f.replaced, ["g"]);
        serde_json::from_value(f.groups["g"].clone()).expect("group")
    };
    assert_eq!(g.spec.roles[1].replicas, Some(5), "today's replicas kept");
    let image = serde_json::to_value(&g.spec.roles[1]).expect("json")["standalonePattern"]
        ["template"]["spec"]["containers"][0]["image"]
        .clone();
    assert_eq!(image, "kvpool:v1");
    // The operator sees the edit: revision 1's template is now number 3.
    pass(&Arc::new(g), &ctx).await;
    let numbers: Vec<i64> = history::entries(&client, "default", "g")
        .await
        .expect("history")
        .iter()
        .map(|e| e.revision)
        .collect();
    assert_eq!(numbers, [2, 3]);
    // A revision that does not exist is an error, not a guess.
    let err = history::undo(&client, "default", "g", Some(9))
        .await
        .expect_err("no revision 9");
    assert!(err.to_string().contains("no revision 9"), "{err}");
}
