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
//! [`run`] adds what a cluster needs around the controller: leader
//! election on a Lease ([`leader`]), so several replicas can run and one
//! reconciles, and the `/metrics`, `/healthz`, `/readyz` port
//! ([`metrics`]).

pub mod build;
pub mod groupset;
pub mod history;
pub mod leader;
pub mod metrics;
mod reconcile;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt};

pub use metrics::Metrics;
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
    /// Reconciles, their durations and failures by kind (`/metrics`).
    pub metrics: Arc<Metrics>,
    /// Consecutive failures per group (`ns/name`), for the backoff.
    pub streaks: Mutex<BTreeMap<String, u32>>,
    /// The generation of each group (`ns/name`) whose ignored fields were
    /// last logged: reconciles repeat every few seconds, the warnings only
    /// when the object changes.
    pub warned: Mutex<BTreeMap<String, i64>>,
}

impl Context {
    /// A context around `client`, with fresh metrics.
    pub fn new(client: Client) -> Arc<Context> {
        Context::with_metrics(client, Arc::new(Metrics::new()))
    }

    /// A context around `client` counting into `metrics`.
    pub fn with_metrics(client: Client, metrics: Arc<Metrics>) -> Arc<Context> {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            streaks: Mutex::new(BTreeMap::new()),
            warned: Mutex::new(BTreeMap::new()),
        })
    }

    /// Failures counted so far of `kind`.
    pub fn failures_of(&self, kind: &'static str) -> u64 {
        self.metrics.failures_of(kind)
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
    ctx.metrics.failed(e.kind());
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
/// v1alpha2, v1alpha2 stored), CoordinatedPolicy,
/// RoleBasedGroupScalingAdapter and RoleBasedGroupSet (v1alpha2).
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
    out.push(groupset::RoleBasedGroupSet::crd());
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

/// Flags of `rbg operator`.
#[derive(clap::Args, Clone, Debug)]
pub struct Options {
    /// Only watch this namespace (default: all).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` listen.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Compete for the leader Lease and reconcile only while holding it
    /// (`false`: reconcile at once; then run exactly one replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease (default: the client's namespace, in
    /// a cluster the operator's own).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, default_value = leader::LEASE_NAME)]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: `$HOSTNAME-<pid>`).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// Runs the operator until SIGTERM/SIGINT: the HTTP port, the leader
/// election and, while leading, the controller. Returns an error when the
/// Lease is lost, so the process exits non-zero and its Deployment starts
/// it afresh as a candidate (a deposed leader must not write, and
/// restarting is the one way to drop every in-memory decision at once).
pub async fn run(opts: Options) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let client = Client::try_default().await.map_err(|e| {
        anyhow::anyhow!("no Kubernetes API to talk to (in-cluster config or a kubeconfig): {e}")
    })?;
    let groups: Api<RoleBasedGroupResource> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Fail early with a clear message when the CRD is not installed.
    groups
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(|e| anyhow::anyhow!("listing RoleBasedGroups (is the CRD installed? `rbg crd | kubectl apply -f -`): {e}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received: stopping");
        let _ = stop_tx.send(true);
    });
    let listener = tokio::net::TcpListener::bind(opts.metrics_addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-addr {}: {e}", opts.metrics_addr))?;
    tracing::info!(addr = %opts.metrics_addr, "serving /metrics, /healthz, /readyz");
    operate(client, &opts, Arc::new(Metrics::new()), listener, stop_rx).await
}

/// Everything [`run`] does once it has a client, a listener and a stop
/// signal (`stop` turning true): the HTTP port, the leader election and,
/// while leading, the controllers. Tests drive it with a mocked client.
pub async fn operate(
    client: Client,
    opts: &Options,
    metrics: Arc<Metrics>,
    listener: tokio::net::TcpListener,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let http = tokio::spawn(metrics::serve(
        listener,
        metrics.clone(),
        stopped(stop.clone()),
    ));
    tracing::info!(
        namespace = opts.namespace.as_deref().unwrap_or("*"),
        leader_elect = opts.leader_elect,
        "rbg operator started"
    );
    let result = if opts.leader_elect {
        let lease_ns = opts
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let me = opts.identity.clone().unwrap_or_else(|| {
            format!(
                "{}-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "rbg-operator".into()),
                std::process::id()
            )
        });
        let elector = Arc::new(leader::Elector::new(
            Api::<Lease>::namespaced(client.clone(), &lease_ns),
            &opts.lease_name,
            &me,
        ));
        tracing::info!(lease = %format!("{lease_ns}/{}", opts.lease_name), identity = %me, "campaigning for the leader Lease");
        lead(client, opts, elector, metrics.clone(), stop).await
    } else {
        metrics.set_leader(true);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut stop = stop;
        tokio::spawn(async move {
            let _ = stop.wait_for(|s| *s).await;
            let _ = tx.send(());
        });
        control(client, opts, metrics.clone(), rx).await;
        Ok(())
    };
    // The port stops with the stop signal; after a lost Lease it goes
    // down with the process.
    http.abort();
    result
}

/// Waits until `store` has had its first full list; false if its writer
/// is gone. Polls once a second: kube-runtime's readiness signal wakes
/// only the last task that waited on it, and the controller waits on it
/// too, so a lone waiter here could sleep forever.
async fn synced<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(1), store.wait_until_ready()).await {
            Ok(r) => return r.is_ok(),
            Err(_) => continue,
        }
    }
}

/// Resolves on SIGTERM (what the kubelet sends) or SIGINT.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Resolves once `rx` says stop.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Campaigns until leading (or stopped), then runs the controller while a
/// background task keeps renewing; returns an error once the Lease is lost.
async fn lead(
    client: Client,
    opts: &Options,
    elector: Arc<leader::Elector>,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    metrics.set_leader(false);
    let clock = leader::Clock::start();
    loop {
        let round = tokio::time::timeout(leader::RENEW_EVERY, elector.round(clock.now_us()));
        match round.await {
            Ok(Ok(leader::Outcome::Leading)) => break,
            Ok(Ok(leader::Outcome::Following { holder })) => {
                // A standby is ready: it serves probes and waits its turn.
                metrics.set_ready(true);
                tracing::debug!(holder = holder.as_deref().unwrap_or("?"), "standing by");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "reading the leader Lease"),
            Err(_) => tracing::warn!("reading the leader Lease timed out"),
        }
        tokio::select! {
            _ = tokio::time::sleep(leader::RENEW_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
    tracing::info!(identity = elector.identity(), "leading: reconciling");
    metrics.set_leader(true);
    metrics.set_ready(false);
    let (lost_tx, mut lost_rx) = tokio::sync::watch::channel(false);
    let renewer = {
        let elector = elector.clone();
        tokio::spawn(async move {
            keep_renewing(&elector, &clock).await;
            let _ = lost_tx.send(true);
        })
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let why = {
        let mut stop = stop.clone();
        let mut lost = lost_rx.clone();
        tokio::spawn(async move {
            let lost_it = tokio::select! {
                _ = stop.wait_for(|s| *s) => false,
                _ = lost.wait_for(|l| *l) => true,
            };
            let _ = tx.send(());
            lost_it
        })
    };
    control(client, opts, metrics.clone(), rx).await;
    renewer.abort();
    metrics.set_leader(false);
    // The controllers stop only when `why` has fired; if they ever ended
    // on their own, `why` is still waiting: treat that as fatal too.
    let lost_it = match tokio::time::timeout(Duration::from_secs(1), why).await {
        Ok(fired) => fired.unwrap_or(true) || *lost_rx.borrow_and_update(),
        Err(_) => anyhow::bail!("the controllers stopped on their own"),
    };
    if lost_it {
        anyhow::bail!(
            "lost the leader Lease; exiting so that this replica restarts as a candidate"
        );
    }
    // Stopping on a signal: hand the Lease over at once.
    if let Err(e) = elector.release().await {
        tracing::warn!(error = %e, "releasing the leader Lease");
    }
    Ok(())
}

/// Renews every [`leader::RENEW_EVERY`], retrying every
/// [`leader::RETRY_EVERY`] after a failure; returns once another replica
/// holds the Lease or no renewal has succeeded for
/// [`leader::RENEW_DEADLINE`].
async fn keep_renewing(elector: &leader::Elector, clock: &leader::Clock) {
    let mut last_ok = tokio::time::Instant::now();
    let mut wait = leader::RENEW_EVERY;
    loop {
        tokio::time::sleep(wait).await;
        let left = leader::RENEW_DEADLINE.saturating_sub(last_ok.elapsed());
        if left.is_zero() {
            tracing::warn!("no renewal of the leader Lease within the deadline");
            return;
        }
        wait = leader::RETRY_EVERY;
        match tokio::time::timeout(left, elector.round(clock.now_us())).await {
            Ok(Ok(leader::Outcome::Leading)) => {
                last_ok = tokio::time::Instant::now();
                wait = leader::RENEW_EVERY;
            }
            Ok(Ok(o)) if o.deposes(elector.identity()) => {
                tracing::warn!(outcome = ?o, "the leader Lease was taken over");
                return;
            }
            Ok(Ok(_)) => tracing::warn!("renewing the leader Lease: conflict, reading it again"),
            Ok(Err(e)) => tracing::warn!(error = %e, "renewing the leader Lease"),
            Err(_) => tracing::warn!("renewing the leader Lease timed out"),
        }
    }
}

/// Runs the controllers (groups, and sets of groups) until `stop` fires,
/// marking `metrics` ready once their caches have had a first full list.
async fn control(
    client: Client,
    opts: &Options,
    metrics: Arc<Metrics>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    fn api<K>(client: &Client, ns: &Option<String>) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let ns = &opts.namespace;
    let ctx = Context::with_metrics(client.clone(), metrics.clone());
    let groups = Controller::new(
        api::<RoleBasedGroupResource>(&client, ns),
        watcher::Config::default().any_semantic(),
    )
    .owns(
        api::<Pod>(&client, ns),
        watcher::Config::default().labels(crate::spec::LABEL_GROUP),
    );
    // A cluster whose CRDs predate RoleBasedGroupSets still gets groups
    // reconciled: the set controller runs only where its CRD is installed.
    let sets_api = api::<groupset::RoleBasedGroupSet>(&client, ns);
    let sets = match sets_api
        .list(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Some(
            Controller::new(sets_api, watcher::Config::default().any_semantic()).owns(
                api::<RoleBasedGroupResource>(&client, ns),
                watcher::Config::default().labels(groupset::LABEL_SET),
            ),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "RoleBasedGroupSets are not reconciled (is their CRD installed? `rbg crd | kubectl apply -f -`)");
            None
        }
    };
    let (group_store, set_store) = (groups.store(), sets.as_ref().map(Controller::store));
    let ready = tokio::spawn(async move {
        if !synced(&group_store).await {
            return;
        }
        if let Some(s) = set_store {
            if !synced(&s).await {
                return;
            }
        }
        metrics.set_ready(true);
    });
    // One stop for both: a shared future that each controller awaits.
    let stop = futures::FutureExt::shared(async move {
        let _ = stop.await;
    });
    let groups = groups
        .graceful_shutdown_on(stop.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|r| async move {
            match r {
                Ok((o, _)) => tracing::debug!(group = %o.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        });
    let sets = async move {
        let Some(sets) = sets else { return };
        sets.graceful_shutdown_on(stop)
            .run(groupset::reconcile_set, groupset::set_error_policy, ctx)
            .for_each(|r| async move {
                match r {
                    Ok((o, _)) => tracing::debug!(set = %o.name, "reconciled"),
                    Err(e) => tracing::debug!(error = %e, "set reconcile error"),
                }
            })
            .await;
    };
    futures::future::join(groups, sets).await;
    ready.abort();
}
