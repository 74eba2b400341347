//! The fake Kubernetes API the operator tests talk to through kube-rs's
//! mocked service (tower-test `mock::pair`, as in kube-rs's controller
//! examples): no API server can run here, so a small in-memory store
//! answers the requests the operator makes (Pods, Services, ConfigMaps,
//! CoordinatedPolicies, scaling adapters, the status subresource, Events,
//! ControllerRevisions and the leader Lease, the last two with
//! `resourceVersion` checks), and a "kubelet" helper marks Pods running
//! and ready between passes. Shared by several test binaries, each of
//! which uses a part of it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

/// What the fake API server holds.
#[derive(Default)]
pub struct Fake {
    /// `pods` of the fake.
    pub pods: BTreeMap<String, Value>,
    /// `services` of the fake.
    pub services: BTreeMap<String, Value>,
    /// `config_maps` of the fake.
    pub config_maps: BTreeMap<String, Value>,
    /// `policy` of the fake.
    pub policy: Option<Value>,
    /// `status` of the fake.
    pub status: Option<Value>,
    /// `events` of the fake.
    pub events: Vec<String>,
    /// `created` of the fake.
    pub created: Vec<String>,
    /// `deleted` of the fake.
    pub deleted: Vec<String>,
    /// `patched` of the fake.
    pub patched: Vec<String>,
    /// `unexpected` of the fake.
    pub unexpected: Vec<String>,
    /// `uid` of the fake.
    pub uid: u64,
    /// Leases by name.
    pub leases: BTreeMap<String, Value>,
    /// ControllerRevisions by name.
    pub revisions: BTreeMap<String, Value>,
    /// Requests refused with 409 Conflict (stale resourceVersion, exists).
    pub conflicts: Vec<String>,
    /// ControllerRevisions created, patched and deleted, in order
    /// (`create g-1a2b3c4d5e`).
    pub revision_log: Vec<String>,
    /// RoleBasedGroups (children of sets) by name.
    pub groups: BTreeMap<String, Value>,
    /// RoleBasedGroups replaced (PUT), in order.
    pub replaced: Vec<String>,
    /// RoleBasedGroups server-side applied, in order.
    pub applied: Vec<String>,
    /// The last status written on a RoleBasedGroupSet.
    pub set_status: Option<Value>,
    /// How many of the next PUTs to refuse with 409 Conflict, as if
    /// another client had written first.
    pub refuse_puts: u32,
    /// Watch requests received (held open).
    pub watches: u64,
    /// The last resourceVersion handed out.
    pub rv: u64,
}

pub fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// Merges `patch` into `base` the way the reconciler's patches need:
/// maps key by key, containers by name.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if k == "containers" {
                    let list = b.entry(k.clone()).or_insert(json!([]));
                    for c in v.as_array().cloned().unwrap_or_default() {
                        let name = c["name"].clone();
                        if let Some(t) = list
                            .as_array_mut()
                            .and_then(|l| l.iter_mut().find(|x| x["name"] == name))
                        {
                            merge(t, &c);
                        }
                    }
                } else {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn labels_match(pod: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        pod["metadata"]["labels"][k].as_str() == Some(v)
    })
}

/// Kinds [`Fake::versioned`] keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lease,
    Revision,
}

impl Fake {
    /// Answers one request.
    pub fn handle(&mut self, method: &str, uri: &http::Uri, body: &[u8]) -> (StatusCode, Value) {
        let path = uri.path();
        let query = uri.query().unwrap_or("");
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
        let last = seg.last().copied().unwrap_or("");
        let ok = |v: Value| (StatusCode::OK, v);
        let selector = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("labelSelector="))
            .map(|s| {
                s.replace("%2F", "/")
                    .replace("%3D", "=")
                    .replace("%2C", ",")
            })
            .unwrap_or_default();
        if path.contains("/rolebasedgroupsets/") && method == "PATCH" && path.ends_with("/status") {
            self.set_status = Some(body["status"].clone());
            return ok(
                json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroupSet",
                             "metadata": {"name": seg[seg.len() - 2], "namespace": "default"},
                             "spec": {"groupTemplate": {"spec": {"roles": []}}},
                             "status": body["status"]}),
            );
        }
        // Exactly the rolebasedgroups resource (not the scaling adapters
        // or sets, whose names start alike), not its status subresource.
        if seg.contains(&"rolebasedgroups") && !path.ends_with("/status") {
            match method {
                "GET" if last == "rolebasedgroups" => {
                    let items: Vec<Value> = self
                        .groups
                        .values()
                        .filter(|g| labels_match(g, &selector))
                        .cloned()
                        .collect();
                    return ok(json!({"apiVersion": "workloads.x-k8s.io/v1alpha2",
                                     "kind": "RoleBasedGroupList",
                                     "metadata": {"resourceVersion": "1"}, "items": items}));
                }
                // Server-side apply: create, or replace the fields applied.
                "PATCH" => {
                    let g = match self.groups.get_mut(last) {
                        Some(g) => {
                            g["metadata"]["labels"] = body["metadata"]["labels"].clone();
                            g["spec"] = body["spec"].clone();
                            g.clone()
                        }
                        None => {
                            self.uid += 1;
                            let mut g = body.clone();
                            g["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
                            self.groups.insert(last.to_string(), g.clone());
                            g
                        }
                    };
                    self.applied.push(last.to_string());
                    return ok(g);
                }
                "GET" => {
                    return self.groups.get(last).cloned().map_or_else(not_found, ok);
                }
                // Replace, refused with 409 on a stale resourceVersion.
                "PUT" => {
                    let Some(old) = self.groups.get(last) else {
                        return not_found();
                    };
                    if body["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                        self.conflicts.push(format!("PUT {last}"));
                        return (
                            StatusCode::CONFLICT,
                            json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                   "status": "Failure", "reason": "Conflict", "code": 409}),
                        );
                    }
                    self.rv += 1;
                    let mut g = body.clone();
                    g["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                    self.groups.insert(last.to_string(), g.clone());
                    self.replaced.push(last.to_string());
                    return ok(g);
                }
                "DELETE" => {
                    return match self.groups.remove(last) {
                        Some(g) => {
                            self.deleted.push(format!("rolebasedgroup/{last}"));
                            ok(g)
                        }
                        None => not_found(),
                    };
                }
                _ => {}
            }
        }
        if path.contains("/leases") {
            return self.versioned(Kind::Lease, method, last, body);
        }
        if path.contains("/controllerrevisions") {
            if method == "GET" && last == "controllerrevisions" {
                let items: Vec<Value> = self
                    .revisions
                    .values()
                    .filter(|r| labels_match(r, &selector))
                    .cloned()
                    .collect();
                return ok(
                    json!({"apiVersion": "apps/v1", "kind": "ControllerRevisionList",
                                 "metadata": {"resourceVersion": "1"}, "items": items}),
                );
            }
            return self.versioned(Kind::Revision, method, last, body);
        }
        match (method, path) {
            ("GET", p) if p.contains("/coordinatedpolicies/") => {
                self.policy.clone().map_or_else(not_found, ok)
            }
            ("GET", p) if p.ends_with("/rolebasedgroupscalingadapters") => ok(json!({
                "apiVersion": "workloads.x-k8s.io/v1alpha2",
                "kind": "RoleBasedGroupScalingAdapterList",
                "metadata": {"resourceVersion": "1"}, "items": []})),
            ("PATCH", p) if p.contains("/configmaps/") => {
                self.config_maps.insert(last.to_string(), body.clone());
                ok(body)
            }
            ("PATCH", p) if p.contains("/services/") => {
                self.services.insert(last.to_string(), body.clone());
                ok(body)
            }
            ("GET", p) if p.ends_with("/pods") => {
                let items: Vec<Value> = self
                    .pods
                    .values()
                    .filter(|p| labels_match(p, &selector))
                    .cloned()
                    .collect();
                ok(json!({"apiVersion": "v1", "kind": "PodList",
                          "metadata": {"resourceVersion": "1"}, "items": items}))
            }
            ("POST", p) if p.ends_with("/pods") => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                if self.pods.contains_key(&name) {
                    return (
                        StatusCode::CONFLICT,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Failure", "reason": "AlreadyExists", "code": 409}),
                    );
                }
                let mut pod = body;
                self.uid += 1;
                pod["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
                pod["status"] = json!({"phase": "Pending"});
                self.created.push(name.clone());
                self.pods.insert(name, pod.clone());
                (StatusCode::CREATED, pod)
            }
            ("DELETE", p) if p.contains("/pods/") => match self.pods.remove(last) {
                Some(pod) => {
                    self.deleted.push(last.to_string());
                    ok(pod)
                }
                None => not_found(),
            },
            ("PATCH", p) if p.contains("/pods/") => match self.pods.get_mut(last) {
                Some(pod) => {
                    merge(pod, &body);
                    self.patched.push(last.to_string());
                    ok(pod.clone())
                }
                None => not_found(),
            },
            ("PATCH", p) if p.ends_with("/status") => {
                self.status = Some(body["status"].clone());
                ok(
                    json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
                          "metadata": {"name": seg[seg.len() - 2], "namespace": "default"},
                          "spec": {"roles": []}, "status": body["status"]}),
                )
            }
            (_, p) if p.contains("/events") => {
                self.events
                    .push(body["reason"].as_str().unwrap_or("").to_string());
                (StatusCode::CREATED, body)
            }
            _ => {
                self.unexpected.push(format!("{method} {uri}"));
                not_found()
            }
        }
    }

    /// GET, POST, PUT (with optimistic concurrency: a stale
    /// `metadata.resourceVersion` is a 409), merge PATCH and DELETE of
    /// one object of a kind kept by name.
    fn versioned(
        &mut self,
        kind: Kind,
        method: &str,
        last: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let conflict = |why: &str| {
            (
                StatusCode::CONFLICT,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "reason": "Conflict", "code": 409, "message": why}),
            )
        };
        self.rv += 1;
        let rv = self.rv.to_string();
        let map = match kind {
            Kind::Lease => &mut self.leases,
            Kind::Revision => &mut self.revisions,
        };
        match method {
            "GET" => map
                .get(last)
                .cloned()
                .map_or_else(not_found, |v| (StatusCode::OK, v)),
            "POST" => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                if map.contains_key(&name) {
                    self.conflicts.push(format!("POST {name}"));
                    return conflict("already exists");
                }
                let mut v = body;
                v["metadata"]["resourceVersion"] = json!(rv);
                map.insert(name.clone(), v.clone());
                if kind == Kind::Revision {
                    self.revision_log.push(format!("create {name}"));
                }
                (StatusCode::CREATED, v)
            }
            "PUT" => {
                let Some(old) = map.get(last) else {
                    return not_found();
                };
                if self.refuse_puts > 0 {
                    // Another client wrote between this writer's read and
                    // its write.
                    self.refuse_puts -= 1;
                    self.conflicts.push(format!("PUT {last}"));
                    return conflict("the object has been modified");
                }
                if body["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                    self.conflicts.push(format!("PUT {last}"));
                    return conflict("the object has been modified");
                }
                let mut v = body;
                v["metadata"]["resourceVersion"] = json!(rv);
                map.insert(last.to_string(), v.clone());
                (StatusCode::OK, v)
            }
            "PATCH" => {
                let Some(old) = map.get_mut(last) else {
                    return not_found();
                };
                merge(old, &body);
                old["metadata"]["resourceVersion"] = json!(rv);
                let v = old.clone();
                if kind == Kind::Revision {
                    self.revision_log.push(format!("patch {last}"));
                }
                (StatusCode::OK, v)
            }
            "DELETE" => match map.remove(last) {
                Some(v) => {
                    if kind == Kind::Revision {
                        self.revision_log.push(format!("delete {last}"));
                    }
                    (StatusCode::OK, v)
                }
                None => not_found(),
            },
            _ => {
                self.unexpected.push(format!("{method} {last}"));
                not_found()
            }
        }
    }

    /// Marks every Pod running and ready on the images its spec names
    /// (the kubelet restarting containers after an in-place patch).
    pub fn kubelet(&mut self) {
        for pod in self.pods.values_mut() {
            let restarts: BTreeMap<String, i64> = pod["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap_or("").to_string(),
                        c["restartCount"].as_i64().unwrap_or(0),
                    )
                })
                .collect();
            let statuses: Vec<Value> = pod["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    let name = c["name"].as_str().unwrap_or("");
                    json!({"name": name, "image": c["image"].clone(), "imageID": "",
                           "ready": true, "started": true,
                           "restartCount": restarts.get(name).copied().unwrap_or(0)})
                })
                .collect();
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True",
                                "lastTransitionTime": "2024-01-01T00:00:00Z"}],
                "containerStatuses": statuses,
            });
        }
    }

    /// The image of the first container of `pod`.
    pub fn image(&self, pod: &str) -> String {
        self.pods[pod]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// Label `k` of `pod`.
    pub fn label(&self, pod: &str, k: &str) -> String {
        self.pods[pod]["metadata"]["labels"][k]
            .as_str()
            .unwrap_or("")
            .to_string()
    }
}

/// A client whose requests the fake answers, on a background task.
pub fn fake_client() -> (Client, Arc<Mutex<Fake>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let fake = Arc::new(Mutex::new(Fake::default()));
    let f = fake.clone();
    tokio::spawn(async move {
        // Watch requests are held open, never answered: a watcher then
        // waits quietly instead of re-listing in a loop (which would keep
        // a paused-time test from ever advancing).
        let mut open_watches = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            if req.uri().query().is_some_and(|q| q.contains("watch=true")) {
                f.lock().expect("fake").watches += 1;
                open_watches.push(send);
                continue;
            }
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let (code, v) =
                f.lock()
                    .expect("fake")
                    .handle(parts.method.as_str(), &parts.uri, &bytes);
            let resp = Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&v).unwrap_or_default()))
                .expect("response");
            send.send_response(resp);
        }
    });
    (Client::new(svc, "default"), fake)
}
