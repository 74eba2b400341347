//! Loading a file: one or more YAML documents (`---`) holding
//! RoleBasedGroups (v1alpha1 and v1alpha2), RoleBasedGroupSets,
//! CoordinatedPolicies, RoleBasedGroupScalingAdapters, engine runtime
//! profiles and the plain Kubernetes objects that accompany them.
//!
//! ConfigMaps and Secrets feed env and volumes, Services whose selector
//! picks a role become host names of that role; every other object is
//! reported once as ignored, never an error. Errors name the document
//! (`document 2 (RoleBasedGroup "demo", line 14)`) when the file has more
//! than one, and the field path and line inside it.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::convert;
use super::group::{Group, SpecError};
use super::pod::{Container, Volume};
use super::types::{Coordination, RoleBasedGroup, API_GROUP, KIND, LABEL_GROUP, LABEL_ROLE};
use super::v2::{RoleBasedGroupSetDoc, RoleBasedGroupV2};
use super::validate::{validate_v2, Context, EngineProfile};
use super::walk::{self, FieldReport, SpecAt};

/// One group of a file, validated, with what the file said about it.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The validated, resolved group.
    pub group: Group,
    /// The API version the group was written in.
    pub api_version: String,
    /// The fields of the group's document that rbg ignores, in whole or in
    /// part (for `load`, those of the file's other documents too).
    pub fields: Vec<FieldReport>,
    /// Every line to show the user: `fields` as text, then one note per
    /// thing other documents did to the group; callers print these.
    pub unimplemented: Vec<String>,
}

/// Every group of a file plus the notes about the file as a whole.
#[derive(Clone, Debug, Default)]
pub struct Bundle {
    /// The groups, in file order (a RoleBasedGroupSet adds several).
    pub groups: Vec<Loaded>,
    /// Objects ignored or not bound to any group, one line each.
    pub notes: Vec<String>,
    /// The fields rbg ignores in documents other than groups
    /// (CoordinatedPolicies, scaling adapters, profiles, sets), each path
    /// led by its document when the file has several.
    pub fields: Vec<FieldReport>,
}

impl Bundle {
    /// Every field report of the file: its groups' and its other documents'.
    pub fn all_fields(&self) -> impl Iterator<Item = &FieldReport> {
        self.groups
            .iter()
            .flat_map(|l| l.fields.iter())
            .chain(self.fields.iter())
    }

    /// The group called `name`.
    pub fn take(mut self, name: &str) -> Option<Loaded> {
        let i = self.groups.iter().position(|l| l.group.name == name)?;
        Some(self.groups.swap_remove(i))
    }
}

/// One YAML document of a file.
struct Doc {
    /// 1-based position in the file.
    index: usize,
    /// Line of the file the document starts on (1-based).
    line: usize,
    text: String,
    value: Value,
    api_version: String,
    kind: String,
    name: String,
}

impl Doc {
    /// How messages name the document: nothing in a one-document file.
    fn label(&self, many: bool) -> String {
        if !many {
            return String::new();
        }
        let what = if self.kind.is_empty() {
            "no kind".to_string()
        } else if self.name.is_empty() {
            self.kind.clone()
        } else {
            format!("{} {:?}", self.kind, self.name)
        };
        format!("document {} ({what}, line {}): ", self.index, self.line)
    }

    /// The API group of `apiVersion` (`""` for the core group).
    fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(g, _)| g)
    }
}

/// Parses and validates a file that holds exactly one group.
pub fn load(text: &str) -> Result<Loaded, SpecError> {
    let bundle = load_all(text)?;
    match bundle.groups.len() {
        1 => {
            let mut l = bundle.groups.into_iter().next().ok_or_else(no_group)?;
            l.unimplemented
                .extend(bundle.fields.iter().map(ToString::to_string));
            l.unimplemented.extend(bundle.notes);
            l.fields.extend(bundle.fields);
            Ok(l)
        }
        0 => Err(no_group()),
        n => Err(SpecError::Invalid(vec![format!(
            "the file holds {n} groups ({}); this command takes one",
            bundle
                .groups
                .iter()
                .map(|l| l.group.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        )])),
    }
}

fn no_group() -> SpecError {
    SpecError::Invalid(vec![
        "the file holds no RoleBasedGroup (kind: RoleBasedGroup or RoleBasedGroupSet)".into(),
    ])
}

/// Parses and validates every document of a file.
pub fn load_all(text: &str) -> Result<Bundle, SpecError> {
    let docs = split(text)?;
    let many = docs.len() > 1;
    let mut errs: Vec<SpecError> = Vec::new();
    let mut notes = Vec::new();
    let mut groups: Vec<GroupDoc> = Vec::new();
    let mut rules: Vec<(Option<String>, String, String, Vec<Coordination>)> = Vec::new();
    let mut adapters = Vec::new();
    let mut ctx = Context::default();
    let mut fields = Vec::new();
    for d in &docs {
        let at = d.label(many);
        let mut found = Found {
            groups: &mut groups,
            rules: &mut rules,
            adapters: &mut adapters,
            notes: &mut notes,
            fields: Vec::new(),
        };
        let r = classify(d, &at, &mut ctx, &mut found);
        fields.extend(found.fields.into_iter().map(|mut f| {
            f.path = format!("{at}{}", f.path);
            f
        }));
        if let Err(e) = r {
            errs.push(prefixed(&at, e));
        }
    }
    if !errs.is_empty() {
        return Err(join(errs));
    }
    let mut out = Bundle {
        groups: Vec::new(),
        notes,
        fields,
    };
    let mut used_rules = vec![false; rules.len()];
    let mut used_adapters = vec![false; adapters.len()];
    for (index, raw, fields, api_version) in &groups {
        let at = docs
            .iter()
            .find(|d| d.index == *index)
            .map(|d| d.label(many))
            .unwrap_or_default();
        let mut gctx = ctx.clone();
        for (i, (group, where_, ns, list)) in rules.iter().enumerate() {
            let ns_ok = ns.as_str() == raw.metadata.namespace.as_deref().unwrap_or("default");
            if group.as_deref() == Some(raw.metadata.name.as_str()) && ns_ok {
                used_rules[i] = true;
                for (j, c) in list.iter().enumerate() {
                    let name = if c.name.is_empty() {
                        format!("[{j}]")
                    } else {
                        format!("[{}]", c.name)
                    };
                    gctx.rules.push((format!("{where_}{name}"), c.clone()));
                }
            }
        }
        for (i, (group, where_, role, replicas)) in adapters.iter().enumerate() {
            if group == &raw.metadata.name {
                used_adapters[i] = true;
                gctx.adapters
                    .push((where_.clone(), role.clone(), *replicas));
            }
        }
        match validate_v2(raw, &gctx) {
            Ok((group, more)) => {
                let mut unimplemented: Vec<String> =
                    fields.iter().map(ToString::to_string).collect();
                unimplemented.extend(more);
                out.groups.push(Loaded {
                    group,
                    api_version: api_version.clone(),
                    fields: fields.clone(),
                    unimplemented,
                });
            }
            Err(e) => errs.push(prefixed(&at, e)),
        }
    }
    for (i, (group, where_, _, _)) in rules.iter().enumerate() {
        if !used_rules[i] {
            out.notes.push(format!(
                "{where_}: ignored: no RoleBasedGroup {:?} in the file (a CoordinatedPolicy applies to the group of its name, or of its label {LABEL_GROUP})",
                group.as_deref().unwrap_or("")
            ));
        }
    }
    for (i, (group, where_, _, _)) in adapters.iter().enumerate() {
        if !used_adapters[i] {
            out.notes.push(format!(
                "{where_}: ignored: no RoleBasedGroup {group:?} in the file"
            ));
        }
    }
    if !errs.is_empty() {
        return Err(join(errs));
    }
    Ok(out)
}

/// Kinds of the upstream API group rbg has no use for locally (the
/// controller's own intermediate objects): reported as ignored.
const UPSTREAM_KINDS: [&str; 4] = ["Instance", "InstanceSet", "RoleInstance", "RoleInstanceSet"];

type Rules = Vec<(Option<String>, String, String, Vec<Coordination>)>;

/// A group of the file: its document's index, the group in v1alpha2, the
/// fields its document sets that rbg ignores, its API version.
type GroupDoc = (usize, RoleBasedGroupV2, Vec<FieldReport>, String);

/// What the documents of a file contribute, filed by [`classify`].
struct Found<'a> {
    groups: &'a mut Vec<GroupDoc>,
    rules: &'a mut Rules,
    adapters: &'a mut Vec<(String, String, String, Option<u32>)>,
    notes: &'a mut Vec<String>,
    /// The ignored fields of the current document if it is not a group.
    fields: Vec<FieldReport>,
}

/// Files one document under what it is; errors are the document's.
fn classify(d: &Doc, at: &str, ctx: &mut Context, found: &mut Found) -> Result<(), SpecError> {
    let Found {
        groups,
        rules,
        adapters,
        notes,
        fields,
    } = found;
    if d.kind.is_empty() || d.api_version.is_empty() {
        return Err(SpecError::Invalid(vec![
            "apiVersion and kind are required in every document".into(),
        ]));
    }
    let version = d.api_version.rsplit('/').next().unwrap_or("");
    let ours = d.group() == API_GROUP;
    if ours && !matches!(version, "v1alpha1" | "v1alpha2") {
        return Err(SpecError::Invalid(vec![format!(
            "apiVersion: {:?}: {API_GROUP} is read in v1alpha1 and v1alpha2",
            d.api_version
        )]));
    }
    match (ours, d.kind.as_str()) {
        (true, KIND) => {
            let (raw, unimplemented) = if version == "v1alpha1" {
                let (v1, skipped): (RoleBasedGroup, _) = typed(d)?;
                let mut u = dropped("v1alpha1", &skipped, d);
                u.extend(walk::ignored_fields(&v1, SpecAt::Group));
                let (v2, list) = convert::to_v1alpha2(&v1);
                if !list.is_empty() {
                    let meta = convert::policy_meta(&v1.metadata);
                    rules.push((
                        Some(meta.name),
                        format!("{at}spec.coordination"),
                        meta.namespace.unwrap_or_else(|| "default".into()),
                        list,
                    ));
                }
                (v2, u)
            } else {
                let (v2, skipped): (RoleBasedGroupV2, _) = typed(d)?;
                let mut u = dropped("v1alpha2", &skipped, d);
                u.extend(walk::ignored_fields_v2(&v2, SpecAt::Group));
                (v2, u)
            };
            groups.push((d.index, raw, unimplemented, d.api_version.clone()));
        }
        (true, "RoleBasedGroupSet") => {
            let (set, skipped): (RoleBasedGroupSetDoc, _) = typed(d)?;
            fields.extend(dropped(version_key(version), &skipped, d));
            fields.extend(walk::metadata_fields(&set.metadata.extra));
            for (raw, u) in expand_set(&set, version)? {
                groups.push((d.index, raw, u, d.api_version.clone()));
            }
        }
        (true, "CoordinatedPolicy") => {
            #[derive(serde::Deserialize)]
            struct Doc {
                metadata: super::types::ObjectMeta,
                spec: super::v2::CoordinatedPolicySpec,
            }
            let (p, skipped): (Doc, _) = typed(d)?;
            fields.extend(dropped("v1alpha2", &skipped, d));
            fields.extend(walk::metadata_fields(&p.metadata.extra));
            fields.extend(walk::policy_fields(&p.spec.policies));
            let group = p
                .metadata
                .labels
                .get(LABEL_GROUP)
                .cloned()
                .unwrap_or_else(|| p.metadata.name.clone());
            if p.spec.policies.is_empty() {
                return Err(SpecError::Invalid(vec![
                    "spec.policies: a CoordinatedPolicy needs at least one rule".into(),
                ]));
            }
            rules.push((
                Some(group),
                format!("{at}CoordinatedPolicy {:?} policies", p.metadata.name),
                p.metadata.namespace.unwrap_or_else(|| "default".into()),
                p.spec.policies,
            ));
        }
        (true, "RoleBasedGroupScalingAdapter") => {
            #[derive(serde::Deserialize)]
            struct Doc {
                metadata: super::types::ObjectMeta,
                spec: super::v2::ScalingAdapterSpec,
            }
            let (a, skipped): (Doc, _) = typed(d)?;
            fields.extend(dropped("v1alpha2", &skipped, d));
            fields.extend(walk::metadata_fields(&a.metadata.extra));
            adapters.push((
                a.spec.scale_target_ref.name.clone(),
                format!("{at}RoleBasedGroupScalingAdapter {:?}", a.metadata.name),
                a.spec.scale_target_ref.role.clone(),
                a.spec.replicas,
            ));
        }
        (true, "ClusterEngineRuntimeProfile" | "EngineRuntimeProfile") => {
            #[derive(serde::Deserialize)]
            struct Spec {
                #[serde(default)]
                containers: Vec<Container>,
                #[serde(default)]
                volumes: Vec<Volume>,
            }
            #[derive(serde::Deserialize)]
            struct Doc {
                metadata: super::types::ObjectMeta,
                spec: Spec,
            }
            let (p, skipped): (Doc, _) = typed(d)?;
            fields.extend(dropped(walk::PROFILE, &skipped, d));
            fields.extend(walk::metadata_fields(&p.metadata.extra));
            fields.extend(walk::profile_fields(&p.spec.containers, &p.spec.volumes));
            ctx.profiles.insert(
                p.metadata.name,
                EngineProfile {
                    containers: p.spec.containers,
                    volumes: p.spec.volumes,
                },
            );
        }
        (false, "ConfigMap") if d.api_version == "v1" => {
            let data = string_map(&d.value, "data");
            let mut all = data;
            for (k, v) in string_map(&d.value, "binaryData") {
                all.entry(k).or_insert_with(|| decode(&v));
            }
            ctx.objects.config_maps.insert(d.name.clone(), all);
        }
        (false, "Secret") if d.api_version == "v1" => {
            let mut all: BTreeMap<String, String> = string_map(&d.value, "data")
                .into_iter()
                .map(|(k, v)| (k, decode(&v)))
                .collect();
            all.extend(string_map(&d.value, "stringData"));
            ctx.objects.secrets.insert(d.name.clone(), all);
        }
        (false, "Service") if d.api_version == "v1" => {
            let selector = string_map(d.value.get("spec").unwrap_or(&Value::Null), "selector");
            match selector.get(LABEL_ROLE) {
                Some(role) => {
                    ctx.objects.services.insert(d.name.clone(), role.clone());
                }
                None => notes.push(format!(
                    "{at}Service {:?}: its selector picks no role (label {LABEL_ROLE}); ignored locally",
                    d.name
                )),
            }
        }
        (true, k) if !UPSTREAM_KINDS.contains(&k) => {
            return Err(SpecError::Invalid(vec![format!(
                "kind: {k:?} is not a kind of {API_GROUP} (RoleBasedGroup, RoleBasedGroupSet, CoordinatedPolicy, RoleBasedGroupScalingAdapter, ...)"
            )]))
        }
        _ => notes.push(format!(
            "{at}{} {:?} ({}) has no meaning for the local runtime; ignored",
            d.kind, d.name, d.api_version
        )),
    }
    Ok(())
}

/// The groups of a RoleBasedGroupSet: `<set>-<i>` for `i` in `0..replicas`.
fn expand_set(
    set: &RoleBasedGroupSetDoc,
    version: &str,
) -> Result<Vec<(RoleBasedGroupV2, Vec<FieldReport>)>, SpecError> {
    let mut out = Vec::new();
    for i in 0..set.spec.replicas.unwrap_or(1) {
        let mut meta = set.metadata.clone();
        meta.name = format!("{}-{i}", set.metadata.name);
        meta.labels = set.spec.group_template.labels.clone();
        meta.annotations = set.spec.group_template.annotations.clone();
        meta.extra.clear();
        let mut doc = serde_yaml::Mapping::new();
        doc.insert("apiVersion".into(), set.api_version.clone().into());
        doc.insert("kind".into(), KIND.into());
        doc.insert(
            "metadata".into(),
            serde_yaml::to_value(&meta).map_err(|e| parse_err("metadata", &e.to_string()))?,
        );
        doc.insert("spec".into(), set.spec.group_template.spec.clone());
        let doc = Value::Mapping(doc);
        let path = |e: serde_path_to_error::Error<serde_yaml::Error>| {
            parse_err(
                &format!("spec.groupTemplate.{}", e.path()),
                &e.into_inner().to_string(),
            )
        };
        let at = SpecAt::SetTemplate;
        if version == "v1alpha1" {
            let (v1, skipped): (RoleBasedGroup, _) = walk::read(doc.clone()).map_err(path)?;
            let mut u = walk::dropped_fields("v1alpha1", at, &skipped, &doc);
            u.extend(walk::ignored_fields(&v1, at));
            out.push((convert::to_v1alpha2(&v1).0, u));
        } else {
            let (v2, skipped): (RoleBasedGroupV2, _) = walk::read(doc.clone()).map_err(path)?;
            let mut u = walk::dropped_fields("v1alpha2", at, &skipped, &doc);
            u.extend(walk::ignored_fields_v2(&v2, at));
            out.push((v2, u));
        }
    }
    Ok(out)
}

fn parse_err(path: &str, message: &str) -> SpecError {
    SpecError::Parse {
        path: path.to_string(),
        message: message.to_string(),
    }
}

/// Decodes base64 Secret/binary data; text that is not base64 is kept.
fn decode(v: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(v.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| v.to_string())
}

/// `key:` of a map as strings (numbers and booleans written as text).
fn string_map(v: &Value, key: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(Value::Mapping(m)) = v.get(key) {
        for (k, v) in m {
            let (Some(k), Some(v)) = (scalar(k), scalar(v)) else {
                continue;
            };
            out.insert(k, v);
        }
    }
    out
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The keys a typed read of document `d` dropped, as reports.
fn dropped(version: &'static str, skipped: &walk::Skipped, d: &Doc) -> Vec<FieldReport> {
    walk::dropped_fields(version, SpecAt::Group, skipped, &d.value)
}

/// The [`walk::NOT_SUPPORTED`] key of a RoleBasedGroupSet of `version`.
fn version_key(version: &str) -> &'static str {
    if version == "v1alpha1" {
        "v1alpha1"
    } else {
        "v1alpha2"
    }
}

/// Parses a document as `T` from its own text, so errors carry the field
/// path and a line number (made relative to the whole file); also returns
/// the keys `T` dropped (see [`walk::read`]).
fn typed<T: DeserializeOwned>(d: &Doc) -> Result<(T, walk::Skipped), SpecError> {
    let de = serde_yaml::Deserializer::from_str(&d.text);
    walk::read(de).map_err(|e| {
        let path = e.path().to_string();
        SpecError::Parse {
            path,
            message: shift_lines(&e.into_inner().to_string(), d.line - 1),
        }
    })
}

/// Adds `by` to every "line N" in a serde_yaml message.
fn shift_lines(msg: &str, by: usize) -> String {
    if by == 0 {
        return msg.to_string();
    }
    let mut out = String::new();
    let mut rest = msg;
    while let Some(i) = rest.find("line ") {
        out.push_str(&rest[..i + 5]);
        rest = &rest[i + 5..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        match rest[..digits].parse::<usize>() {
            Ok(n) => out.push_str(&(n + by).to_string()),
            Err(_) => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// The documents of a file as values, in order (empty ones skipped).
pub(super) fn documents(text: &str) -> Result<Vec<Value>, SpecError> {
    Ok(split(text)?.into_iter().map(|d| d.value).collect())
}

/// Splits a file into documents at `---` lines, skipping empty ones.
fn split(text: &str) -> Result<Vec<Doc>, SpecError> {
    let mut chunks: Vec<(usize, String)> = vec![(1, String::new())];
    for (n, line) in text.lines().enumerate() {
        let is_marker = line.starts_with("---")
            && line[3..]
                .chars()
                .next()
                .is_none_or(|c| c.is_whitespace() || c == '#');
        if is_marker {
            // The marker line itself belongs to the new document so that
            // its line numbers stay those of the file (minus the offset).
            chunks.push((n + 2, String::new()));
            continue;
        }
        if line == "..." {
            continue;
        }
        if let Some((_, c)) = chunks.last_mut() {
            c.push_str(line);
            c.push('\n');
        }
    }
    let mut docs = Vec::new();
    for (line, text) in chunks {
        let value: Value = serde_yaml::from_str(&text).map_err(|e| SpecError::Parse {
            path: format!("document {} (line {line})", docs.len() + 1),
            message: shift_lines(&e.to_string(), line - 1),
        })?;
        if value.is_null() {
            continue;
        }
        let s = |k: &str| {
            value
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        docs.push(Doc {
            index: docs.len() + 1,
            line,
            api_version: s("apiVersion"),
            kind: s("kind"),
            name,
            text,
            value,
        });
    }
    if docs.is_empty() {
        return Err(SpecError::Invalid(
            vec!["the file holds no document".into()],
        ));
    }
    Ok(docs)
}

/// `e` with the document label in front of its path or messages.
fn prefixed(at: &str, e: SpecError) -> SpecError {
    match e {
        SpecError::Parse { path, message } => SpecError::Parse {
            path: format!("{at}{path}"),
            message,
        },
        SpecError::Invalid(list) => {
            SpecError::Invalid(list.into_iter().map(|m| format!("{at}{m}")).collect())
        }
    }
}

/// One error out of several; a single error keeps its shape.
fn join(mut errs: Vec<SpecError>) -> SpecError {
    if errs.len() == 1 {
        return errs.remove(0);
    }
    SpecError::Invalid(
        errs.into_iter()
            .flat_map(|e| match e {
                SpecError::Invalid(list) => list,
                parse => vec![parse.to_string()],
            })
            .collect(),
    )
}
