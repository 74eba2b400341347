//! Reports of the fields a file sets that rbg does not act on, each with
//! its path (`spec.roles[store].replcias: unknown field, ignored`), so
//! nothing is silently ignored.
//!
//! Two sources feed them. Every level of the spec keeps the keys its type
//! does not model in an `extra` map, and the walkers here visit each of
//! them; [`read`] names the keys a typed deserialization skipped anyway
//! (through `serde_ignored`), so a type without an `extra` map cannot hide
//! one. Each key is then classified against what knows it: upstream's CRDs
//! ([`NOT_SUPPORTED`] lists the upstream fields rbg's types lack) and,
//! inside Pod templates and metadata, Kubernetes' own types (k8s-openapi),
//! so a misspelling is told apart from a real field rbg ignores.

use std::fmt;

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as K8sMeta;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::pod::{Container, KeyToPath, PodTemplateSpec, Volume};
use super::types::{
    Coordination, EngineRuntime, Extra, RoleBasedGroup, RoleSpec, RolloutStrategy,
    ScalingAdapterSwitch, ServicePort, TopologyConstraint, Workload,
};
use super::v2::{RoleBasedGroupV2, RoleSpecV2};

/// Fields of upstream's CRDs (release v0.8.0-alpha.5, shared/rbg-crds) that
/// rbg's types do not model: `(API version, path, why)`, paths with `[]` for
/// list entries; the version is the RoleBasedGroup's, or [`PROFILE`]. A key
/// of a file found here is "not supported by rbg"; any other key rbg does
/// not model is an unknown field. `tests/crd.rs` compares the list with the
/// upstream CRDs at every level, so it stays exact.
pub const NOT_SUPPORTED: &[(&str, &str, &str)] = &[
    (
        "v1alpha1",
        "spec.podGroupPolicy",
        "gang scheduling plugins are not supported",
    ),
    (
        "v1alpha1",
        "spec.roles[].servicePorts[].appProtocol",
        "a role's Service carries name, port, targetPort and protocol",
    ),
    (
        "v1alpha1",
        "spec.roles[].servicePorts[].nodePort",
        "a role's Service is headless",
    ),
    (
        "v1alpha2",
        "spec.roles[].servicePorts[].appProtocol",
        "a role's Service carries name, port, targetPort and protocol",
    ),
    (
        "v1alpha2",
        "spec.roles[].servicePorts[].nodePort",
        "a role's Service is headless",
    ),
    (
        PROFILE,
        "spec.initContainers",
        "only a profile's containers and volumes are added to the Pods",
    ),
    (
        PROFILE,
        "spec.updateStrategy",
        "a changed profile rolls out as part of each role's template",
    ),
];

/// The [`NOT_SUPPORTED`] key of (Cluster)EngineRuntimeProfiles, which have
/// no CRD in shared/rbg-crds: their fields come from upstream's
/// `api/workloads/v1alpha2/clusterengineruntimeprofile_types.go`.
pub const PROFILE: &str = "ClusterEngineRuntimeProfile";

/// Why a field a file sets has no effect, or only part of its effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldIssue {
    /// In neither rbg's nor upstream's schema (nor, inside Pod templates
    /// and metadata, Kubernetes'): a misspelling or a field of a newer API.
    /// `rbg validate --strict` fails on these, as `kubectl
    /// --validate=strict` does.
    Unknown,
    /// Upstream's API or Kubernetes has the field and rbg does not act on
    /// it; the text says why when there is more to say.
    NotSupported(String),
    /// rbg reads the field but implements only part of it; the text says
    /// what is missing.
    Partly(String),
}

/// One field of a file that rbg ignores, in whole or in part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldReport {
    /// Where the field is, for example `spec.roles[store].replcias`: list
    /// entries by their `name`, or by index when they have none.
    pub path: String,
    /// What is wrong with it.
    pub issue: FieldIssue,
    /// Only the local runtime ignores it: a Kubernetes field of a Pod
    /// template, which the operator passes to the cluster whole.
    pub local_only: bool,
}

impl FieldReport {
    /// Whether nothing knows the field (what `--strict` fails on).
    pub fn is_unknown(&self) -> bool {
        self.issue == FieldIssue::Unknown
    }
}

impl fmt::Display for FieldReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = &self.path;
        match &self.issue {
            FieldIssue::Unknown => write!(f, "{path}: unknown field, ignored"),
            FieldIssue::NotSupported(_) if self.local_only => write!(
                f,
                "{path}: not supported by the local runtime, ignored (the operator passes it to the cluster)"
            ),
            FieldIssue::NotSupported(why) if why.is_empty() => {
                write!(f, "{path}: not supported by rbg, ignored")
            }
            FieldIssue::NotSupported(why) => {
                write!(f, "{path}: not supported by rbg, ignored ({why})")
            }
            FieldIssue::Partly(what) => write!(f, "{path}: {what}"),
        }
    }
}

/// One step of a path inside a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Seg {
    /// A key of a mapping.
    Key(String),
    /// An entry of a list.
    Index(usize),
}

/// The steps of a `serde_ignored` path (wrappers such as `Some` add none).
fn segments(p: &serde_ignored::Path) -> Vec<Seg> {
    use serde_ignored::Path;
    let mut out = match p {
        Path::Root => return Vec::new(),
        Path::Seq { parent, .. }
        | Path::Map { parent, .. }
        | Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => segments(parent),
    };
    match p {
        Path::Seq { index, .. } => out.push(Seg::Index(*index)),
        Path::Map { key, .. } => out.push(Seg::Key(key.clone())),
        _ => {}
    }
    out
}

/// The paths of the keys a typed read skipped, from the root of what it read.
pub(super) type Skipped = Vec<Vec<Seg>>;

/// Deserializes `de` as `T` (errors carry their field path), also naming
/// every key `T` skipped, by its path from the root of `de`.
pub(super) fn read<'de, T, D>(de: D) -> Result<(T, Skipped), serde_path_to_error::Error<D::Error>>
where
    T: serde::Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    let mut skipped = Vec::new();
    let mut note = |p: serde_ignored::Path| skipped.push(segments(&p));
    let value = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(de, &mut note))?;
    Ok((value, skipped))
}

/// A position in a document: the path shown to the user and the same path
/// with `[]` for list entries, as [`NOT_SUPPORTED`] writes it.
#[derive(Clone, Debug)]
struct At {
    shown: String,
    schema: String,
}

impl At {
    fn new(shown: &str, schema: &str) -> At {
        At {
            shown: shown.to_string(),
            schema: schema.to_string(),
        }
    }

    fn key(&self, k: &str) -> At {
        let join = |p: &str| {
            if p.is_empty() {
                k.to_string()
            } else {
                format!("{p}.{k}")
            }
        };
        At {
            shown: join(&self.shown),
            schema: join(&self.schema),
        }
    }

    /// Entry `i` of a list, shown by `name` when it has one.
    fn item(&self, i: usize, name: &str) -> At {
        At {
            shown: if name.is_empty() {
                format!("{}[{i}]", self.shown)
            } else {
                format!("{}[{name}]", self.shown)
            },
            schema: format!("{}[]", self.schema),
        }
    }

    /// Follows `segs` through `doc` (the value at this position), naming
    /// list entries as [`At::item`] does.
    fn follow(&self, segs: &[Seg], doc: Option<&Value>) -> At {
        let mut at = self.clone();
        let mut cur = doc;
        for s in segs {
            match s {
                Seg::Key(k) => {
                    at = at.key(k);
                    cur = cur.and_then(|v| v.get(k.as_str()));
                }
                Seg::Index(i) => {
                    cur = cur.and_then(|v| v.get(*i));
                    let name = cur
                        .and_then(|v| v.get("name"))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    at = at.item(*i, name);
                }
            }
        }
        at
    }
}

/// Whether Kubernetes' type knows `key`; if so, the paths under it that
/// the type does not know. One key at a time, so a value the type cannot
/// read (a number where it wants a quantity string) hides nothing else.
type K8sCheck = fn(&str, &Value) -> Option<Vec<Vec<Seg>>>;

fn k8s<T: DeserializeOwned>(key: &str, value: &Value) -> Option<Vec<Vec<Seg>>> {
    let mut m = serde_yaml::Mapping::new();
    m.insert(Value::String(key.to_string()), value.clone());
    let mut skipped = Vec::new();
    let mut note = |p: serde_ignored::Path| skipped.push(segments(&p));
    // A missing required field or a value of another type fails the read;
    // the unknown keys met before that are all this needs.
    let _ = T::deserialize(serde_ignored::Deserializer::new(
        Value::Mapping(m),
        &mut note,
    ));
    if skipped.iter().any(|s| s.len() <= 1) {
        return None;
    }
    Some(
        skipped
            .into_iter()
            .map(|mut s| {
                s.remove(0);
                s
            })
            .collect(),
    )
}

/// Collects the reports of one document.
struct Walk {
    /// The API version the document is read in, as [`NOT_SUPPORTED`] keys it.
    version: &'static str,
    out: Vec<FieldReport>,
}

impl Walk {
    fn new(version: &'static str) -> Walk {
        Walk {
            version,
            out: Vec::new(),
        }
    }

    fn push(&mut self, at: &At, issue: FieldIssue, local_only: bool) {
        self.out.push(FieldReport {
            path: at.shown.clone(),
            issue,
            local_only,
        });
    }

    /// A field of rbg's own objects: upstream's (and not rbg's) or nobody's.
    fn classify(&mut self, at: &At) {
        let known = NOT_SUPPORTED
            .iter()
            .find(|(v, p, _)| *v == self.version && *p == at.schema);
        let issue = match known {
            Some((_, _, why)) => FieldIssue::NotSupported((*why).to_string()),
            None => FieldIssue::Unknown,
        };
        self.push(at, issue, false);
    }

    /// The unmodelled keys of one of rbg's own objects.
    fn rbg(&mut self, at: &At, extra: &Extra) {
        for k in extra.keys() {
            self.classify(&at.key(k));
        }
    }

    /// Keys a typed read dropped, under `at` (whose value is `doc`).
    fn dropped(&mut self, at: &At, skipped: &[Vec<Seg>], doc: Option<&Value>) {
        for s in skipped {
            self.classify(&at.follow(s, doc));
        }
    }

    /// The unmodelled keys of Kubernetes metadata: Kubernetes' own fields
    /// (uid, resourceVersion, ownerReferences, ...) are left alone, as
    /// metadata is free-form where Kubernetes allows it.
    fn meta(&mut self, at: &At, extra: &Extra) {
        self.k8s_keys(at, extra, k8s::<K8sMeta>, None);
    }

    /// The unmodelled keys of a part of a Pod template: a Kubernetes field
    /// the local runtime ignores, or nobody's.
    fn pod(&mut self, at: &At, extra: &Extra, check: K8sCheck) {
        self.k8s_keys(
            at,
            extra,
            check,
            Some(FieldIssue::NotSupported(String::new())),
        );
    }

    /// Classifies `extra` with `check`; `known` is the report for a key
    /// Kubernetes knows (none for metadata).
    fn k8s_keys(&mut self, at: &At, extra: &Extra, check: K8sCheck, known: Option<FieldIssue>) {
        for (k, v) in extra {
            let kat = at.key(k);
            match check(k, v) {
                None => self.push(&kat, FieldIssue::Unknown, false),
                Some(inner) => {
                    if let Some(issue) = &known {
                        self.push(&kat, issue.clone(), true);
                    }
                    for s in inner {
                        let a = kat.follow(&s, Some(v));
                        self.push(&a, FieldIssue::Unknown, false);
                    }
                }
            }
        }
    }

    fn coordination(&mut self, at: &At, c: &Coordination) {
        self.rbg(at, &c.extra);
        let sat = at.key("strategy");
        self.rbg(&sat, &c.strategy.extra);
        if let Some(u) = &c.strategy.rolling_update {
            self.rbg(&sat.key("rollingUpdate"), &u.extra);
        }
        if let Some(s) = &c.strategy.scaling {
            self.rbg(&sat.key("scaling"), &s.extra);
        }
        if let Some(s) = &c.strategy.scheduling {
            let at = sat.key("scheduling");
            self.rbg(&at, &s.extra);
            if let Some(t) = &s.topology_constraint {
                self.topology(&at.key("topologyConstraint"), t);
            }
        }
    }

    /// A topology constraint: the cluster scheduler's business, so the
    /// local runtime, which runs every process on this host, reports it.
    fn topology(&mut self, at: &At, t: &TopologyConstraint) {
        self.push(at, FieldIssue::NotSupported(String::new()), true);
        self.rbg(at, &t.extra);
        if let Some(p) = &t.pack {
            self.rbg(&at.key("pack"), &p.extra);
        }
    }

    fn workload(&mut self, at: &At, w: Option<&Workload>) {
        let Some(w) = w else { return };
        let wat = at.key("workload");
        self.rbg(&wat, &w.extra);
        if !matches!(
            w.kind.as_str(),
            "" | "StatefulSet" | "Deployment" | "LeaderWorkerSet" | "InstanceSet"
        ) {
            self.push(
                &wat.key("kind"),
                FieldIssue::Partly(format!(
                    "{:?} is run like a StatefulSet by the local runtime",
                    w.kind
                )),
                false,
            );
        }
    }

    /// The parts of a role both API versions share.
    fn role_common(
        &mut self,
        at: &At,
        rollout: Option<&RolloutStrategy>,
        ports: &[ServicePort],
        engines: &[EngineRuntime],
        adapter: Option<&ScalingAdapterSwitch>,
    ) {
        if let Some(s) = rollout {
            let sat = at.key("rolloutStrategy");
            self.rbg(&sat, &s.extra);
            if let Some(u) = &s.rolling_update {
                let uat = sat.key("rollingUpdate");
                self.rbg(&uat, &u.extra);
                if let Some(p) = &u.in_place_update_strategy {
                    let pat = uat.key("inPlaceUpdateStrategy");
                    self.rbg(&pat, &p.extra);
                    if p.grace_period_seconds.is_some() {
                        self.push(
                            &pat.key("gracePeriodSeconds"),
                            FieldIssue::Partly(
                                "not implemented (images are swapped at once)".into(),
                            ),
                            false,
                        );
                    }
                }
            }
        }
        for (i, p) in ports.iter().enumerate() {
            self.rbg(&at.key("servicePorts").item(i, &p.name), &p.extra);
        }
        for (i, e) in engines.iter().enumerate() {
            let eat = at.key("engineRuntimes").item(i, "");
            self.rbg(&eat, &e.extra);
            if !e.inject_containers.is_empty() {
                self.push(
                    &eat.key("injectContainers"),
                    FieldIssue::Partly(
                        "not implemented (profile containers are added, nothing is injected into existing ones)"
                            .into(),
                    ),
                    false,
                );
            }
            for (j, c) in e.containers.iter().enumerate() {
                self.profile_override(&eat.key("containers").item(j, &c.name), c);
            }
        }
        if let Some(a) = adapter {
            self.rbg(&at.key("scalingAdapter"), &a.extra);
        }
    }

    /// A container of `engineRuntimes[].containers`: only its command and
    /// args override the profile's container of that name.
    fn profile_override(&mut self, at: &At, c: &Container) {
        let Ok(Value::Mapping(m)) = serde_yaml::to_value(c) else {
            return;
        };
        for (k, v) in &m {
            let Some(k) = k.as_str() else { continue };
            if matches!(k, "name" | "command" | "args") {
                continue;
            }
            let kat = at.key(k);
            match k8s::<k8s::Container>(k, v) {
                None => self.push(&kat, FieldIssue::Unknown, false),
                Some(_) => self.push(
                    &kat,
                    FieldIssue::Partly(
                        "ignored: only command and args of a profile's container are overridden"
                            .into(),
                    ),
                    false,
                ),
            }
        }
    }

    /// A v1alpha1 role (also a v1alpha2 role written the v1alpha1 way).
    fn role_v1(&mut self, at: &At, r: &RoleSpec) {
        self.rbg(at, &r.extra);
        self.workload(at, r.workload.as_ref());
        self.role_common(
            at,
            r.rollout_strategy.as_ref(),
            &r.service_ports,
            &r.engine_runtimes,
            r.scaling_adapter.as_ref(),
        );
        if let Some(l) = &r.leader_worker_set {
            self.rbg(&at.key("leaderWorkerSet"), &l.extra);
        }
        for (j, c) in r.components.iter().enumerate() {
            let cat = at.key("components").item(j, &c.name);
            self.rbg(&cat, &c.extra);
            self.template(&cat.key("template"), &c.template);
        }
        if let Some(t) = &r.template_ref {
            self.rbg(&at.key("templateRef"), &t.extra);
        }
        if let Some(t) = &r.template {
            self.template(&at.key("template"), t);
        }
    }

    fn role_v2(&mut self, at: &At, r: &RoleSpecV2) {
        if super::convert::v1_shaped_role(r).is_some() {
            // Read the way validation reads it: as a v1alpha1 role.
            let as_v1 = serde_yaml::to_value(r).ok().and_then(|v| {
                let doc = v.clone();
                read::<RoleSpec, _>(v)
                    .ok()
                    .map(|(role, skipped)| (role, skipped, doc))
            });
            if let Some((role, skipped, doc)) = as_v1 {
                let version = std::mem::replace(&mut self.version, "v1alpha1");
                self.dropped(at, &skipped, Some(&doc));
                self.role_v1(at, &role);
                self.version = version;
                return;
            }
        }
        let has_pattern = r.standalone_pattern.is_some()
            || r.leader_worker_pattern.is_some()
            || r.custom_components_pattern.is_some();
        for k in r.extra.keys() {
            let kat = at.key(k);
            if has_pattern && super::convert::V1_ROLE_KEYS.contains(&k.as_str()) {
                self.push(
                    &kat,
                    FieldIssue::NotSupported(
                        "a v1alpha1 field, ignored next to a v1alpha2 pattern".into(),
                    ),
                    false,
                );
            } else {
                self.classify(&kat);
            }
        }
        self.workload(at, r.workload.as_ref());
        if let Some(t) = &r.instance_topology_constraint {
            self.topology(&at.key("instanceTopologyConstraint"), t);
        }
        self.role_common(
            at,
            r.rollout_strategy.as_ref(),
            &r.service_ports,
            &r.engine_runtimes,
            r.scaling_adapter.as_ref(),
        );
        if let Some(p) = &r.standalone_pattern {
            let pat = at.key("standalonePattern");
            self.rbg(&pat, &p.extra);
            if let Some(t) = &p.template {
                self.template(&pat.key("template"), t);
            }
            if let Some(t) = &p.template_ref {
                self.rbg(&pat.key("templateRef"), &t.extra);
            }
        }
        if let Some(p) = &r.leader_worker_pattern {
            let pat = at.key("leaderWorkerPattern");
            self.rbg(&pat, &p.extra);
            if let Some(t) = &p.template {
                self.template(&pat.key("template"), t);
            }
            if let Some(t) = &p.template_ref {
                self.rbg(&pat.key("templateRef"), &t.extra);
            }
            if let Some(c) = &p.restart_policy_config {
                self.rbg(&pat.key("restartPolicyConfig"), &c.extra);
            }
        }
        if let Some(p) = &r.custom_components_pattern {
            let pat = at.key("customComponentsPattern");
            self.rbg(&pat, &p.extra);
            for (j, c) in p.components.iter().enumerate() {
                let cat = pat.key("components").item(j, &c.name);
                self.rbg(&cat, &c.extra);
                self.template(&cat.key("template"), &c.template);
            }
            if let Some(c) = &p.restart_policy_config {
                self.rbg(&pat.key("restartPolicyConfig"), &c.extra);
            }
        }
    }

    /// A Pod template: Kubernetes' fields, checked against k8s-openapi.
    fn template(&mut self, at: &At, t: &PodTemplateSpec) {
        self.pod(at, &t.extra, k8s::<k8s::PodTemplateSpec>);
        if let Some(m) = &t.metadata {
            self.meta(&at.key("metadata"), &m.extra);
        }
        let sat = at.key("spec");
        self.pod(&sat, &t.spec.extra, k8s::<k8s::PodSpec>);
        for (i, v) in t.spec.volumes.iter().enumerate() {
            self.volume(&sat.key("volumes").item(i, &v.name), v);
        }
        for (i, c) in t.spec.containers.iter().enumerate() {
            self.container(&sat.key("containers").item(i, &c.name), c);
        }
    }

    fn volume(&mut self, vat: &At, v: &Volume) {
        self.pod(vat, &v.extra, k8s::<k8s::Volume>);
        if let Some(o) = &v.config_map {
            let oat = vat.key("configMap");
            self.pod(&oat, &o.extra, k8s::<k8s::ConfigMapVolumeSource>);
            self.key_paths(&oat, &o.items);
        }
        if let Some(o) = &v.secret {
            let oat = vat.key("secret");
            self.pod(&oat, &o.extra, k8s::<k8s::SecretVolumeSource>);
            self.key_paths(&oat, &o.items);
        }
        if let Some(e) = &v.empty_dir {
            let eat = vat.key("emptyDir");
            self.pod(&eat, &e.extra, k8s::<k8s::EmptyDirVolumeSource>);
            if e.size_limit.is_some() {
                self.push(
                    &eat.key("sizeLimit"),
                    FieldIssue::Partly("not enforced by the local runtime".into()),
                    true,
                );
            }
        }
    }

    fn key_paths(&mut self, at: &At, items: &[KeyToPath]) {
        for (i, k) in items.iter().enumerate() {
            self.pod(
                &at.key("items").item(i, ""),
                &k.extra,
                k8s::<k8s::KeyToPath>,
            );
        }
    }

    fn container(&mut self, at: &At, c: &Container) {
        self.pod(at, &c.extra, k8s::<k8s::Container>);
        for (i, e) in c.env_from.iter().enumerate() {
            let eat = at.key("envFrom").item(i, "");
            self.pod(&eat, &e.extra, k8s::<k8s::EnvFromSource>);
            if let Some(r) = &e.config_map_ref {
                self.pod(
                    &eat.key("configMapRef"),
                    &r.extra,
                    k8s::<k8s::ConfigMapEnvSource>,
                );
            }
            if let Some(r) = &e.secret_ref {
                self.pod(&eat.key("secretRef"), &r.extra, k8s::<k8s::SecretEnvSource>);
            }
        }
        for (i, e) in c.env.iter().enumerate() {
            let eat = at.key("env").item(i, &e.name);
            self.pod(&eat, &e.extra, k8s::<k8s::EnvVar>);
            if let Some(src) = &e.value_from {
                let sat = eat.key("valueFrom");
                self.pod(&sat, &src.extra, k8s::<k8s::EnvVarSource>);
                if let Some(k) = &src.config_map_key_ref {
                    self.pod(
                        &sat.key("configMapKeyRef"),
                        &k.extra,
                        k8s::<k8s::ConfigMapKeySelector>,
                    );
                }
                if let Some(k) = &src.secret_key_ref {
                    self.pod(
                        &sat.key("secretKeyRef"),
                        &k.extra,
                        k8s::<k8s::SecretKeySelector>,
                    );
                }
                if let Some(f) = &src.field_ref {
                    self.pod(
                        &sat.key("fieldRef"),
                        &f.extra,
                        k8s::<k8s::ObjectFieldSelector>,
                    );
                }
            }
        }
        for (i, p) in c.ports.iter().enumerate() {
            let name = p.name.as_deref().unwrap_or("");
            self.pod(
                &at.key("ports").item(i, name),
                &p.extra,
                k8s::<k8s::ContainerPort>,
            );
        }
        for (i, m) in c.volume_mounts.iter().enumerate() {
            self.pod(
                &at.key("volumeMounts").item(i, &m.name),
                &m.extra,
                k8s::<k8s::VolumeMount>,
            );
        }
        if let Some(p) = &c.readiness_probe {
            let pat = at.key("readinessProbe");
            self.pod(&pat, &p.extra, k8s::<k8s::Probe>);
            if let Some(t) = &p.tcp_socket {
                self.pod(&pat.key("tcpSocket"), &t.extra, k8s::<k8s::TCPSocketAction>);
            }
            if let Some(h) = &p.http_get {
                let hat = pat.key("httpGet");
                self.pod(&hat, &h.extra, k8s::<k8s::HTTPGetAction>);
                for (i, x) in h.http_headers.iter().enumerate() {
                    self.pod(
                        &hat.key("httpHeaders").item(i, &x.name),
                        &x.extra,
                        k8s::<k8s::HTTPHeader>,
                    );
                }
            }
            if let Some(x) = &p.exec {
                self.pod(&pat.key("exec"), &x.extra, k8s::<k8s::ExecAction>);
            }
        }
    }
}

/// Where a group's `spec` is in its document: `spec` for a group,
/// `spec.groupTemplate.spec` for the groups of a RoleBasedGroupSet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecAt {
    /// A RoleBasedGroup document.
    #[default]
    Group,
    /// The group template of a RoleBasedGroupSet document.
    SetTemplate,
}

impl SpecAt {
    fn at(self) -> At {
        match self {
            SpecAt::Group => At::new("spec", "spec"),
            SpecAt::SetTemplate => At::new("spec.groupTemplate.spec", "spec"),
        }
    }
}

/// Every field of a v1alpha1 group that rbg ignores in whole or in part.
pub fn ignored_fields(raw: &RoleBasedGroup, spec_at: SpecAt) -> Vec<FieldReport> {
    let mut w = Walk::new("v1alpha1");
    let root = At::new("", "");
    if spec_at == SpecAt::Group {
        w.rbg(&root, &raw.extra);
        w.meta(&root.key("metadata"), &raw.metadata.extra);
    }
    let spec = spec_at.at();
    w.rbg(&spec, &raw.spec.extra);
    for (i, r) in raw.spec.roles.iter().enumerate() {
        w.role_v1(&spec.key("roles").item(i, &r.name), r);
    }
    for (i, t) in raw.spec.role_templates.iter().enumerate() {
        let at = spec.key("roleTemplates").item(i, &t.name);
        w.rbg(&at, &t.extra);
        w.template(&at.key("template"), &t.template);
    }
    for (i, c) in raw.spec.coordination.iter().enumerate() {
        w.coordination(&spec.key("coordination").item(i, &c.name), c);
    }
    w.out
}

/// Every field of a v1alpha2 group that rbg ignores in whole or in part.
pub fn ignored_fields_v2(raw: &RoleBasedGroupV2, spec_at: SpecAt) -> Vec<FieldReport> {
    let mut w = Walk::new("v1alpha2");
    let root = At::new("", "");
    if spec_at == SpecAt::Group {
        w.rbg(&root, &raw.extra);
        w.meta(&root.key("metadata"), &raw.metadata.extra);
    }
    let spec = spec_at.at();
    w.rbg(&spec, &raw.spec.extra);
    for (i, r) in raw.spec.roles.iter().enumerate() {
        w.role_v2(&spec.key("roles").item(i, &r.name), r);
    }
    for (i, t) in raw.spec.role_templates.iter().enumerate() {
        let at = spec.key("roleTemplates").item(i, &t.name);
        w.rbg(&at, &t.extra);
        w.template(&at.key("template"), &t.template);
    }
    w.out
}

/// The keys a typed read of a document dropped (see [`read`]), as
/// reports; `doc` is what was read, for the names of list entries. The
/// document's `apiVersion`, `kind` and `status` are never reported: types
/// that have no use for them leave them out. For [`SpecAt::SetTemplate`],
/// `doc` is the group made from the template, whose `spec` is the
/// template's.
pub(super) fn dropped_fields(
    version: &'static str,
    spec_at: SpecAt,
    skipped: &[Vec<Seg>],
    doc: &Value,
) -> Vec<FieldReport> {
    let mut w = Walk::new(version);
    for s in skipped {
        match (s.first(), spec_at) {
            (Some(Seg::Key(k)), _)
                if s.len() == 1 && matches!(k.as_str(), "apiVersion" | "kind" | "status") => {}
            (Some(Seg::Key(k)), SpecAt::SetTemplate) if k == "spec" => {
                w.dropped(&spec_at.at(), &[s[1..].to_vec()], doc.get("spec"));
            }
            _ => w.dropped(&At::new("", ""), std::slice::from_ref(s), Some(doc)),
        }
    }
    w.out
}

/// The containers and volumes of an engine runtime profile, which rbg
/// adds to the Pods of the roles that name it.
pub(super) fn profile_fields(containers: &[Container], volumes: &[Volume]) -> Vec<FieldReport> {
    let mut w = Walk::new(PROFILE);
    let spec = At::new("spec", "spec");
    for (i, c) in containers.iter().enumerate() {
        w.container(&spec.key("containers").item(i, &c.name), c);
    }
    for (i, v) in volumes.iter().enumerate() {
        w.volume(&spec.key("volumes").item(i, &v.name), v);
    }
    w.out
}

/// The unmodelled keys of a document's `metadata` (Kubernetes' own fields
/// are left alone).
pub(super) fn metadata_fields(extra: &Extra) -> Vec<FieldReport> {
    let mut w = Walk::new("");
    w.meta(&At::new("metadata", "metadata"), extra);
    w.out
}

/// The rules of a CoordinatedPolicy (`spec.policies`).
pub(super) fn policy_fields(list: &[Coordination]) -> Vec<FieldReport> {
    let mut w = Walk::new("v1alpha2");
    let at = At::new("spec.policies", "spec.policies");
    for (i, c) in list.iter().enumerate() {
        w.coordination(&at.item(i, &c.name), c);
    }
    w.out
}
