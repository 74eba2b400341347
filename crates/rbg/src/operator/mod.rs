//! `rbg operator`: the Kubernetes controller for RoleBasedGroups, in the
//! controller-rs style. The same spec, validation and planner as the local
//! runtime (one planner, two executors): [`reconcile`] loads the object
//! into a [`crate::spec::Group`], observes its Pods, asks
//! [`crate::planner::plan`] what to do and does it with the API server
//! (create/delete Pods, patch container images in place, Services and the
//! discovery ConfigMap by server-side apply), then writes the status by
//! server-side apply under one field manager and records Events.
//! [`error_policy`] requeues with exponential backoff and counts failures
//! by kind.
//!
//! `build` holds the pure object builders and the observation of Pods;
//! `reconcile` the I/O. CRDs come from the Rust types ([`crd_yaml`]).

pub mod build;
mod reconcile;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt};

pub use reconcile::{ignored_reports, reconcile};

use crate::spec::v2::{CoordinatedPolicy, RoleBasedGroupResource, RoleBasedGroupScalingAdapter};
use crate::spec::RoleBasedGroupV1Resource;

/// The field manager of every server-side apply the operator does.
pub const MANAGER: &str = "rbg-operator";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not validate; fixed by editing it, not by retrying.
    #[error("invalid group: {0}")]
    Invalid(String),
    /// The API server refused or could not be reached.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An object could not be built from the template.
    #[error("building objects: {0}")]
    Build(String),
}

impl Error {
    /// A stable name of the error kind, for the failure counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "invalid",
            Error::Kube(_) => "kube",
            Error::Build(_) => "build",
        }
    }
}

/// Shared state of the controller.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes Events on groups.
    pub recorder: Recorder,
    /// Reconcile failures by error kind (what `/metrics` would export).
    pub failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Consecutive failures per group (`ns/name`), for the backoff.
    pub streaks: Mutex<BTreeMap<String, u32>>,
    /// The generation of each group (`ns/name`) whose ignored fields were
    /// last logged: reconciles repeat every few seconds, the warnings only
    /// when the object changes.
    pub warned: Mutex<BTreeMap<String, i64>>,
}

impl Context {
    /// A context around `client`.
    pub fn new(client: Client) -> Arc<Context> {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            failures: Mutex::new(BTreeMap::new()),
            streaks: Mutex::new(BTreeMap::new()),
            warned: Mutex::new(BTreeMap::new()),
        })
    }

    /// Failures counted so far of `kind`.
    pub fn failures_of(&self, kind: &str) -> u64 {
        self.failures
            .lock()
            .map(|m| m.get(kind).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// A group's `ns/name`, the key of the per-group maps in [`Context`].
pub(crate) fn key(g: &RoleBasedGroupResource) -> String {
    format!(
        "{}/{}",
        g.metadata.namespace.as_deref().unwrap_or("default"),
        g.metadata.name.as_deref().unwrap_or("")
    )
}

/// Requeues a failed group after 1 s doubling per consecutive failure up
/// to 5 minutes (an invalid group waits the longest: only an edit fixes
/// it, and the edit triggers a reconcile anyway), counting the failure.
pub fn error_policy(g: Arc<RoleBasedGroupResource>, e: &Error, ctx: Arc<Context>) -> Action {
    if let Ok(mut m) = ctx.failures.lock() {
        *m.entry(e.kind()).or_default() += 1;
    }
    let streak = ctx
        .streaks
        .lock()
        .map(|mut m| {
            let s = m.entry(key(&g)).or_default();
            *s = s.saturating_add(1);
            *s
        })
        .unwrap_or(1);
    tracing::warn!(group = %key(&g), error = %e, streak, "reconcile failed");
    Action::requeue(backoff(e, streak))
}

/// The requeue delay after the `streak`-th consecutive failure.
pub fn backoff(e: &Error, streak: u32) -> Duration {
    if matches!(e, Error::Invalid(_)) {
        return Duration::from_secs(300);
    }
    let secs = 1u64 << streak.saturating_sub(1).min(9);
    Duration::from_secs(secs.min(300))
}

/// Every CRD of the operator, as YAML documents (`rbg crd`).
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for (i, crd) in crds().iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_yaml::to_string(crd)?);
    }
    Ok(out)
}

/// The CRDs generated from the Rust types: RoleBasedGroup (v1alpha1 and
/// v1alpha2, v1alpha2 stored), CoordinatedPolicy and
/// RoleBasedGroupScalingAdapter (v1alpha2).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let rbg = kube::core::crd::merge_crds(
        vec![
            RoleBasedGroupV1Resource::crd(),
            RoleBasedGroupResource::crd(),
        ],
        "v1alpha2",
    );
    let mut out = Vec::new();
    // merge_crds only fails on CRDs of different kinds or groups, which
    // these are not; a failure would be a bug here, reported as a missing
    // CRD rather than a panic.
    if let Ok(c) = rbg {
        out.push(c);
    }
    out.push(CoordinatedPolicy::crd());
    out.push(RoleBasedGroupScalingAdapter::crd());
    out.into_iter().map(upstream_shaped).collect()
}

/// Brings a generated CRD closer to the upstream one: no defaults for
/// empty values (schemars adds `default: ''` for every `#[serde(default)]`
/// string, which upstream does not have), Kubernetes' `int32` format for
/// counts, and open roles (upstream keeps unknown role fields, so roles
/// written the v1alpha1 way survive in a v1alpha2 object).
fn upstream_shaped(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Ok(mut v) = serde_json::to_value(&crd) else {
        return crd;
    };
    fn walk(v: &mut serde_json::Value, key: &str) {
        if let serde_json::Value::Object(m) = v {
            let empty = m.get("default").is_some_and(|d| {
                d.as_str() == Some("")
                    || d.as_array().is_some_and(Vec::is_empty)
                    || d.as_object().is_some_and(serde_json::Map::is_empty)
            });
            if empty {
                m.remove("default");
            }
            if m.get("format").and_then(|f| f.as_str()) == Some("uint32") {
                m.insert("format".into(), "int32".into());
            }
            if key == "roles" && m.get("type").and_then(|t| t.as_str()) == Some("array") {
                m.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
                m.insert("minItems".into(), 1.into());
            }
            for (k, c) in m.iter_mut() {
                walk(c, k);
            }
        } else if let serde_json::Value::Array(a) = v {
            for c in a {
                walk(c, key);
            }
        }
    }
    walk(&mut v, "");
    serde_json::from_value(v).unwrap_or(crd)
}

/// Runs the controller until SIGTERM/SIGINT.
pub async fn run(namespace: Option<String>) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let client = Client::try_default().await.map_err(|e| {
        anyhow::anyhow!("no Kubernetes API to talk to (in-cluster config or a kubeconfig): {e}")
    })?;
    let (groups, pods): (Api<RoleBasedGroupResource>, Api<Pod>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // Fail early with a clear message when the CRD is not installed.
    groups
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(|e| anyhow::anyhow!("listing RoleBasedGroups (is the CRD installed? `rbg crd | kubectl apply -f -`): {e}"))?;
    let ctx = Context::new(client);
    tracing::info!(
        namespace = namespace.as_deref().unwrap_or("*"),
        "rbg operator started"
    );
    Controller::new(groups, watcher::Config::default().any_semantic())
        .owns(
            pods,
            watcher::Config::default().labels(crate::spec::LABEL_GROUP),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            match r {
                Ok((o, _)) => tracing::debug!(group = %o.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
    Ok(())
}
