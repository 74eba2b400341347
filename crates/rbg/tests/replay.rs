//! Replays recorded sequences of watch events (`tests/fixtures/replay/`)
//! through `rbg operator`'s reconcile against kube-rs's mocked API (the
//! fake in `support/`), checking after every step the actions taken: Pods
//! created, deleted and patched in place, Events, the status written and
//! the Pods as they then are, and how many ControllerRevisions record
//! the group's history. The fixture's header says how a recording
//! reads; the harness applies each event to the fake's objects the way the
//! API server would have (ADDED/MODIFIED groups become the object to
//! reconcile, MODIFIED Pods are merged onto the stored Pod, DELETED Pods
//! removed) and runs one reconcile per step, as the controller runs one
//! for a burst of events on one group.

mod support;

use std::path::PathBuf;
use std::sync::Arc;

use rbg::operator::{self, Context};
use rbg::spec::v2::RoleBasedGroupResource;
use serde_json::Value;
use support::{fake_client, merge};

/// `expected` is contained in `actual`: maps key by key, arrays element by
/// element (an expected array may be shorter), scalars equal.
fn contains(actual: &Value, expected: &Value, at: &str) -> Result<(), String> {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (k, v) in e {
                let got = a.get(k).unwrap_or(&Value::Null);
                contains(got, v, &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(e)) => {
            for (i, v) in e.iter().enumerate() {
                let got = a.get(i).unwrap_or(&Value::Null);
                contains(got, v, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        (a, e) if a == e => Ok(()),
        (a, e) => Err(format!("{at}: expected {e}, found {a}")),
    }
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

async fn replay(file: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/replay")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("fixture");
    let rec: Value = serde_yaml::from_str(&text).expect("fixture yaml");
    let (client, fake) = fake_client();
    let ctx = Context::new(client);
    let mut group: Option<Arc<RoleBasedGroupResource>> = None;
    let steps = rec["steps"].as_array().cloned().unwrap_or_default();
    assert!(!steps.is_empty(), "{file}: no steps");
    for (i, step) in steps.iter().enumerate() {
        let note = step["note"].as_str().unwrap_or("");
        let here = format!("{file} step {} ({note})", i + 1);
        let (c0, d0, p0, e0) = {
            let f = fake.lock().expect("fake");
            (
                f.created.len(),
                f.deleted.len(),
                f.patched.len(),
                f.events.len(),
            )
        };
        for ev in step["events"].as_array().cloned().unwrap_or_default() {
            let obj = &ev["object"];
            let kind = obj["kind"].as_str().unwrap_or("");
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            match (ev["type"].as_str().unwrap_or(""), kind) {
                ("ADDED" | "MODIFIED", "RoleBasedGroup") => {
                    let g: RoleBasedGroupResource =
                        serde_json::from_value(obj.clone()).expect("group");
                    group = Some(Arc::new(g));
                }
                ("MODIFIED", "Pod") => {
                    let mut f = fake.lock().expect("fake");
                    let pod = f.pods.get_mut(&name).unwrap_or_else(|| {
                        panic!("{here}: MODIFIED Pod {name} the operator never created")
                    });
                    let mut change = obj.clone();
                    if let Some(m) = change.as_object_mut() {
                        m.remove("kind");
                    }
                    merge(pod, &change);
                }
                ("DELETED", "Pod") => {
                    let gone = fake.lock().expect("fake").pods.remove(&name);
                    assert!(gone.is_some(), "{here}: DELETED Pod {name} did not exist");
                }
                (t, k) => panic!("{here}: no replay for a {t} {k}"),
            }
        }
        let g = group
            .clone()
            .unwrap_or_else(|| panic!("{here}: no group yet"));
        operator::reconcile(g, ctx.clone())
            .await
            .unwrap_or_else(|e| panic!("{here}: reconcile: {e}"));

        let f = fake.lock().expect("fake");
        let exp = &step["expect"];
        let check = |what: &str, all: &[String], from: usize| {
            let got = all[from..].to_vec();
            let want = names(&exp[what]);
            assert_eq!(got, want, "{here}: Pods {what}");
        };
        check("created", &f.created, c0);
        check("deleted", &f.deleted, d0);
        check("patched", &f.patched, p0);
        let events = &f.events[e0..];
        for e in names(&exp["events"]) {
            assert!(events.contains(&e), "{here}: no {e} Event in {events:?}");
        }
        if !exp["status"].is_null() {
            let st = f.status.clone().unwrap_or(Value::Null);
            contains(&st, &exp["status"], "status")
                .unwrap_or_else(|m| panic!("{here}: {m}\nstatus: {st:#}"));
        }
        if let Some(pods) = exp["pods"].as_object() {
            for (name, want) in pods {
                let got = f
                    .pods
                    .get(name)
                    .unwrap_or_else(|| panic!("{here}: no Pod {name}"));
                contains(got, want, name).unwrap_or_else(|m| panic!("{here}: {m}"));
            }
        }
        if let Some(n) = exp["revisions"].as_u64() {
            let numbers: Vec<i64> = f
                .revisions
                .values()
                .filter_map(|r| r["revision"].as_i64())
                .collect();
            assert_eq!(
                numbers.len() as u64,
                n,
                "{here}: ControllerRevisions {numbers:?}"
            );
        }
        assert!(f.unexpected.is_empty(), "{here}: {:?}", f.unexpected);
    }
}

/// Create, image patch (in place), a Pod deleted, a node drained: see the
/// fixture's header for the story and the actions expected at each step.
#[tokio::test]
async fn store_rollout_and_drain() {
    replay("store-rollout-and-drain.yaml").await;
}

/// An in-place update of a leader-worker instance under
/// RecreateRoleInstanceOnPodRestart: the restarts it causes are not
/// crashes; a later crash still recreates the instance.
#[tokio::test]
async fn leader_worker_in_place() {
    replay("leader-worker-in-place.yaml").await;
}
