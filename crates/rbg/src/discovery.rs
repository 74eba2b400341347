//! Names, addresses and what each container is told about the group
//! (RBG.md §2, §4, §6). Pure functions: the runtime supplies the facts
//! (addresses, paths) and writes the results.
//!
//! - Instance `i` of role `r` in group `g` is `g-r-i`, reachable as
//!   `g-r-i.s-g-r`; the role's service is `s-g-r`.
//! - Locally each instance owns `127.<group>.<role slot + 1>.<index + 1>`.
//!   Host names of the group found in env values, args and the discovery
//!   file are rewritten to those addresses (a service name to instance 0's).
//! - `$(VAR)` expands as Kubernetes does: `$$` is a literal `$`, an unknown
//!   `$(VAR)` stays as written; env values see the variables defined before
//!   them, command and args see them all.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

pub use crate::field_path::check_field_path;
use crate::field_path::subscript;
pub use crate::naming::{instance_host, instance_name, service_name};
use crate::spec::{Container, Group, Objects, Pattern, LABEL_GROUP, LABEL_ROLE};

/// Largest instance index the local address scheme can give an address.
pub const MAX_LOCAL_INDEX: u32 = 254;
/// Largest role slot the local address scheme can give an address.
pub const MAX_LOCAL_SLOT: u32 = 254;

/// The second octet of a group's addresses: a stable hash of its name in
/// 1..=254, so two groups on one machine rarely share a range and the
/// address never changes between runs.
pub fn group_octet(group: &str) -> u8 {
    // 1..=254 keeps clear of 127.0.x.x (127.0.0.1 and friends) and .255.
    (xxh3_64(group.as_bytes()) % 254) as u8 + 1
}

/// Loopback address of instance `index` of the role in `slot`, or `None`
/// past the scheme's limits.
pub fn local_address(group_octet: u8, slot: u32, index: u32) -> Option<Ipv4Addr> {
    if slot > MAX_LOCAL_SLOT || index > MAX_LOCAL_INDEX {
        return None;
    }
    Some(Ipv4Addr::new(
        127,
        group_octet,
        u8::try_from(slot + 1).ok()?,
        u8::try_from(index + 1).ok()?,
    ))
}

/// The facts about one instance that env, args and field refs draw on.
#[derive(Clone, Debug)]
pub struct InstanceFacts {
    /// Group name.
    pub group: String,
    /// Namespace.
    pub namespace: String,
    /// Role name.
    pub role: String,
    /// Instance index.
    pub index: u32,
    /// The instance's address (`status.podIP`).
    pub ip: Ipv4Addr,
    /// Labels: the template's plus the group and role labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations of the template.
    pub annotations: BTreeMap<String, String>,
    /// `spec.nodeName` (the machine's host name locally).
    pub node_name: String,
    /// Path of the discovery file (`RBG_CONFIG`).
    pub config_path: String,
    /// Host directory of each volume mount path, for path rewriting.
    pub mounts: Vec<(String, String)>,
    /// The Pod's suffix after `g-r-i` (`""`, `-1`, `-<component>-0`).
    pub pod_suffix: String,
    /// Variables the pattern injects (leader address, worker index, ...),
    /// before the container's own env; group host names are rewritten.
    pub pattern_env: Vec<(String, String)>,
    /// ConfigMaps and Secrets env entries can read.
    pub objects: Objects,
}

impl InstanceFacts {
    /// Pod name `g-r-i` (plus the Pod's suffix in a multi-Pod instance).
    pub fn name(&self) -> String {
        format!(
            "{}{}",
            instance_name(&self.group, &self.role, self.index),
            self.pod_suffix
        )
    }
}

/// The variables a Pod of a multi-Pod instance gets, as upstream sets them:
/// `LWS_LEADER_ADDRESS` (`g-r-i.s-g-r.ns`), `LWS_GROUP_SIZE`,
/// `LWS_WORKER_INDEX` for leader-worker roles; `RBG_COMPONENT_NAME` and
/// `RBG_COMPONENT_INDEX` for custom components.
pub fn pattern_env(group: &Group, role: &str, index: u32, pod: usize) -> Vec<(String, String)> {
    let Some(r) = group.role(role) else {
        return Vec::new();
    };
    let Some(slot) = r.pods.get(pod) else {
        return Vec::new();
    };
    match r.pattern {
        Pattern::Standalone => Vec::new(),
        Pattern::LeaderWorker { size } => vec![
            (
                "LWS_LEADER_ADDRESS".into(),
                format!(
                    "{}.{}",
                    instance_host(&group.name, role, index),
                    group.namespace
                ),
            ),
            ("LWS_GROUP_SIZE".into(), size.to_string()),
            ("LWS_WORKER_INDEX".into(), slot.ordinal.to_string()),
        ],
        Pattern::CustomComponents => vec![
            ("RBG_COMPONENT_NAME".into(), slot.component.clone()),
            ("RBG_COMPONENT_INDEX".into(), slot.ordinal.to_string()),
        ],
    }
}

/// Labels every instance of `role` carries (template labels plus RBG's).
pub fn instance_labels(group: &Group, role: &str) -> BTreeMap<String, String> {
    let mut labels = group
        .role(role)
        .and_then(|r| r.template.metadata.as_ref())
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(LABEL_GROUP.to_string(), group.name.clone());
    labels.insert(LABEL_ROLE.to_string(), role.to_string());
    labels
}

fn format_map(m: &BTreeMap<String, String>) -> String {
    // The Downward API's file format: one key="value" per line.
    m.iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a field path for an instance (see [`check_field_path`]).
pub fn resolve_field(path: &str, f: &InstanceFacts) -> Result<String, String> {
    Ok(match path {
        "metadata.name" => f.name(),
        "metadata.namespace" => f.namespace.clone(),
        "metadata.uid" => format!("{}-{}", f.namespace, f.name()),
        "metadata.labels" => format_map(&f.labels),
        "metadata.annotations" => format_map(&f.annotations),
        "status.podIP" | "status.podIPs" => f.ip.to_string(),
        "status.hostIP" | "status.hostIPs" => "127.0.0.1".to_string(),
        "spec.nodeName" => f.node_name.clone(),
        "spec.serviceAccountName" => "default".to_string(),
        _ => {
            if let Some(k) = subscript(path, "metadata.labels") {
                f.labels.get(k).cloned().unwrap_or_default()
            } else if let Some(k) = subscript(path, "metadata.annotations") {
                f.annotations.get(k).cloned().unwrap_or_default()
            } else {
                return Err(format!("fieldRef.fieldPath {path:?} is not supported"));
            }
        }
    })
}

/// Expands `$(VAR)` references the way Kubernetes does.
pub fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut lit = 0; // start of the pending literal run
    while i < b.len() {
        if b[i] != b'$' || i + 1 >= b.len() {
            i += 1;
            continue;
        }
        match b[i + 1] {
            b'$' => {
                out.push_str(&s[lit..i]);
                out.push('$');
                i += 2;
                lit = i;
            }
            b'(' => match s[i + 2..].find(')') {
                Some(end) => {
                    let name = &s[i + 2..i + 2 + end];
                    let next = i + 2 + end + 1;
                    out.push_str(&s[lit..i]);
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => out.push_str(&s[i..next]),
                    }
                    i = next;
                    lit = i;
                }
                None => i += 1,
            },
            _ => i += 1,
        }
    }
    out.push_str(&s[lit..]);
    out
}

fn is_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Replaces whole-word occurrences of each `(from, to)` pair; at each
/// position the first pair in `pairs` order that matches wins. `before_ok`
/// sees the character before a match (`None` at the start), `after_ok` the
/// text after it.
fn replace_words(
    s: &str,
    pairs: &[(&str, &str)],
    before_ok: impl Fn(Option<char>) -> bool,
    after_ok: impl Fn(&str) -> bool,
) -> String {
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    'outer: while i < s.len() {
        if before_ok(s[..i].chars().next_back()) {
            for (from, to) in pairs {
                if s[i..].starts_with(from) && after_ok(&s[i + from.len()..]) {
                    out.push_str(to);
                    i += from.len();
                    continue 'outer;
                }
            }
        }
        let Some(c) = s[i..].chars().next() else {
            break;
        };
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Replaces whole-word occurrences of each `(from, to)` pair, longest
/// `from` first; a word boundary is any character outside `[A-Za-z0-9_-]`,
/// and a `.` followed by such a character (so `a.b` is not `a`).
pub fn rewrite_hosts(s: &str, hosts: &[(String, String)]) -> String {
    let mut pairs: Vec<(&str, &str)> = hosts
        .iter()
        .filter(|(f, _)| !f.is_empty())
        .map(|(f, t)| (f.as_str(), t.as_str()))
        .collect();
    pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
    replace_words(
        s,
        &pairs,
        |prev| prev.is_none_or(|c| !is_host_char(c) && c != '.'),
        |rest| {
            let mut it = rest.chars();
            match it.next() {
                None => true,
                Some('.') => it.next().is_none_or(|c| !is_host_char(c)),
                Some(c) => !is_host_char(c),
            }
        },
    )
}

/// Replaces a container path under a volume mount with the host directory:
/// `/data` and `/data/x` but not `/database`.
pub fn rewrite_paths(s: &str, mounts: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = mounts.iter().collect();
    sorted.sort_by_key(|m| std::cmp::Reverse(m.0.len()));
    let pairs: Vec<(&str, &str)> = sorted
        .into_iter()
        .map(|(f, t)| (f.trim_end_matches('/'), t.as_str()))
        .filter(|(f, _)| !f.is_empty())
        .collect();
    replace_words(
        s,
        &pairs,
        |prev| prev.is_none_or(|c| !(c.is_ascii_alphanumeric() || "-_./".contains(c))),
        |rest| {
            rest.chars()
                .next()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
        },
    )
}

/// Every host name of the group that resolves locally, with its address:
/// `g-r-i.s-g-r` and, for the other Pods of a multi-Pod instance,
/// `g-r-i<suffix>.s-g-r` (each also with `.ns`, `.ns.svc`,
/// `.ns.svc.cluster.local`); `s-g-r` and the Services of the file that
/// select the role (instance 0's leader address). `address(role, index,
/// pod)` gives addresses.
pub fn host_table(
    group: &Group,
    address: &dyn Fn(&str, u32, usize) -> Option<Ipv4Addr>,
) -> Vec<(String, String)> {
    let ns = &group.namespace;
    let suffixes = [
        String::new(),
        format!(".{ns}"),
        format!(".{ns}.svc"),
        format!(".{ns}.svc.cluster.local"),
    ];
    let mut out = Vec::new();
    for r in &group.roles {
        let svc = service_name(&group.name, &r.name);
        for i in 0..r.replicas.max(1) {
            for (p, slot) in r.pods.iter().enumerate() {
                let Some(ip) = address(&r.name, i, p) else {
                    continue;
                };
                let host = format!(
                    "{}{}.{svc}",
                    instance_name(&group.name, &r.name, i),
                    slot.suffix
                );
                for s in &suffixes {
                    out.push((format!("{host}{s}"), ip.to_string()));
                }
                if i == 0 && p == 0 {
                    for s in &suffixes {
                        out.push((format!("{svc}{s}"), ip.to_string()));
                    }
                    for (name, role) in &group.objects.services {
                        if role == &r.name {
                            for s in &suffixes {
                                out.push((format!("{name}{s}"), ip.to_string()));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The command line and environment of one container, ready to exec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// `command` followed by `args`, expanded and rewritten (the image map
    /// is applied later by the runtime).
    pub command: Vec<String>,
    /// Whether the container set `command` (otherwise the image's
    /// entrypoint comes first).
    pub has_command: bool,
    /// Environment, in order: injected variables then the container's.
    pub env: Vec<(String, String)>,
    /// Working directory, rewritten.
    pub working_dir: Option<String>,
}

/// Builds the environment and command line of container `c` of an instance.
pub fn launch(
    c: &Container,
    f: &InstanceFacts,
    hosts: &[(String, String)],
) -> Result<Launch, String> {
    let index = f.index.to_string();
    let mut env: Vec<(String, String)> = vec![
        ("GROUP_NAME".into(), f.group.clone()),
        ("ROLE_NAME".into(), f.role.clone()),
        ("ROLE_INDEX".into(), index.clone()),
        ("RBG_GROUP_NAME".into(), f.group.clone()),
        ("RBG_ROLE_NAME".into(), f.role.clone()),
        ("RBG_ROLE_INDEX".into(), index),
        ("RBG_CONFIG".into(), f.config_path.clone()),
    ];
    for (k, v) in &f.pattern_env {
        env.push((k.clone(), rewrite_hosts(v, hosts)));
    }
    // envFrom first: the container's own env entries override it.
    for src in &c.env_from {
        let prefix = src.prefix.clone().unwrap_or_default();
        let (what, r, data) = match (&src.config_map_ref, &src.secret_ref) {
            (Some(r), _) => ("ConfigMap", r, f.objects.config_maps.get(&r.name)),
            (None, Some(r)) => ("Secret", r, f.objects.secrets.get(&r.name)),
            (None, None) => continue,
        };
        match data {
            Some(data) => {
                for (k, v) in data {
                    let name = format!("{prefix}{k}");
                    env.retain(|(x, _)| x != &name);
                    env.push((name, v.clone()));
                }
            }
            None if r.optional == Some(true) => {}
            None => {
                return Err(format!(
                    "container {:?}: envFrom: {what} {:?} is not in the file",
                    c.name, r.name
                ))
            }
        }
    }
    for e in &c.env {
        let value = if let Some(v) = &e.value {
            let known = env.clone();
            let lookup = move |n: &str| {
                known
                    .iter()
                    .rev()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.clone())
            };
            expand(v, &lookup)
        } else if let Some(fr) = e.value_from.as_ref().and_then(|s| s.field_ref.as_ref()) {
            resolve_field(&fr.field_path, f)
                .map_err(|m| format!("container {:?}: env {:?}: {m}", c.name, e.name))?
        } else if let Some(src) = &e.value_from {
            let (what, k, data) = match (&src.config_map_key_ref, &src.secret_key_ref) {
                (Some(k), _) => ("ConfigMap", k, &f.objects.config_maps),
                (None, Some(k)) => ("Secret", k, &f.objects.secrets),
                (None, None) => {
                    // resourceFieldRef, fileKeyRef: reported at load time.
                    return Err(format!(
                        "container {:?}: env {:?}: only fieldRef, configMapKeyRef and secretKeyRef are supported",
                        c.name, e.name
                    ));
                }
            };
            match data.get(&k.name).and_then(|d| d.get(&k.key)) {
                Some(v) => v.clone(),
                // Kubernetes leaves an optional variable unset.
                None if k.optional == Some(true) => continue,
                None => {
                    return Err(format!(
                        "container {:?}: env {:?}: {what} {:?} has no key {:?} in the file",
                        c.name, e.name, k.name, k.key
                    ))
                }
            }
        } else {
            String::new()
        };
        let value = rewrite_paths(&rewrite_hosts(&value, hosts), &f.mounts);
        env.retain(|(k, _)| k != &e.name);
        env.push((e.name.clone(), value));
    }
    let lookup = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let command: Vec<String> = c
        .command
        .iter()
        .chain(c.args.iter())
        .map(|a| rewrite_paths(&rewrite_hosts(&expand(a, &lookup), hosts), &f.mounts))
        .collect();
    let working_dir = c.working_dir.as_ref().map(|w| rewrite_paths(w, &f.mounts));
    Ok(Launch {
        command,
        has_command: !c.command.is_empty(),
        env,
        working_dir,
    })
}

/// The discovery file (RBG.md §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiscoveryFile {
    /// The group as a whole.
    pub group: GroupInfo,
    /// Each role by name.
    pub roles: BTreeMap<String, RoleInfo>,
}

/// `group:` of the discovery file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupInfo {
    /// Group name.
    pub name: String,
    /// Role names, in spec order.
    pub roles: Vec<String>,
    /// Number of roles.
    pub size: usize,
}

/// One role of the discovery file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleInfo {
    /// Replicas wanted.
    pub size: u32,
    /// Every wanted instance, by index.
    pub instances: Vec<InstanceInfo>,
}

/// One instance of the discovery file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceInfo {
    /// Its address (an IP locally, `g-r-i.s-g-r` on Kubernetes).
    pub address: String,
    /// Named ports: named container ports, then `servicePorts` over them.
    pub ports: BTreeMap<String, u16>,
}

/// The discovery file of `group`; `address(role, index)` gives each
/// instance's address as a string.
pub fn discovery_file(group: &Group, address: &dyn Fn(&str, u32) -> String) -> DiscoveryFile {
    let mut roles = BTreeMap::new();
    for r in &group.roles {
        let mut ports = BTreeMap::new();
        for c in &r.template.spec.containers {
            for p in &c.ports {
                if let Some(n) = &p.name {
                    ports.entry(n.clone()).or_insert(p.container_port);
                }
            }
        }
        for p in &r.service_ports {
            ports.insert(p.name.clone(), p.port);
        }
        let instances = (0..r.replicas)
            .map(|i| InstanceInfo {
                address: address(&r.name, i),
                ports: ports.clone(),
            })
            .collect();
        roles.insert(
            r.name.clone(),
            RoleInfo {
                size: r.replicas,
                instances,
            },
        );
    }
    DiscoveryFile {
        group: GroupInfo {
            name: group.name.clone(),
            roles: group.roles.iter().map(|r| r.name.clone()).collect(),
            size: group.roles.len(),
        },
        roles,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    }

    #[test]
    fn expansion_follows_kubernetes() {
        let e = env(&[("A", "x"), ("B", "y")]);
        let cases = [
            ("$(A)", "x"),
            ("pre-$(A)-$(B)", "pre-x-y"),
            ("$$(A)", "$(A)"),
            ("$(C)", "$(C)"),
            ("$A", "$A"),
            ("$", "$"),
            ("$(A", "$(A"),
            ("a$$b", "a$b"),
            ("ünï$(A)cøde", "ünïxcøde"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &e), want, "{input}");
        }
    }

    #[test]
    fn hosts_rewrite_on_word_boundaries() {
        let hosts = vec![
            ("g-m-0.s-g-m".to_string(), "127.1.1.1".to_string()),
            ("s-g-m".to_string(), "127.1.1.1".to_string()),
            (
                "g-m-0.s-g-m.default.svc.cluster.local".to_string(),
                "127.1.1.1".to_string(),
            ),
        ];
        let cases = [
            ("g-m-0.s-g-m:50051", "127.1.1.1:50051"),
            ("--master=s-g-m:1", "--master=127.1.1.1:1"),
            (
                "http://g-m-0.s-g-m.default.svc.cluster.local/x",
                "http://127.1.1.1/x",
            ),
            ("xs-g-m", "xs-g-m"),
            ("s-g-mm", "s-g-mm"),
            ("s-g-m.other", "s-g-m.other"),
            ("s-g-m.", "127.1.1.1."),
        ];
        for (input, want) in cases {
            assert_eq!(rewrite_hosts(input, &hosts), want, "{input}");
        }
    }

    #[test]
    fn paths_rewrite_under_mounts_only() {
        let m = vec![("/data".to_string(), "/tmp/x/data".to_string())];
        assert_eq!(rewrite_paths("/data", &m), "/tmp/x/data");
        assert_eq!(
            rewrite_paths("--dir=/data/seg", &m),
            "--dir=/tmp/x/data/seg"
        );
        assert_eq!(rewrite_paths("/database", &m), "/database");
        assert_eq!(rewrite_paths("/x/data", &m), "/x/data");
    }

    #[test]
    fn field_paths() {
        assert!(check_field_path("status.podIP").is_ok());
        assert!(check_field_path("metadata.labels['a/b']").is_ok());
        assert!(check_field_path("spec.containers").is_err());
        let f = InstanceFacts {
            group: "g".into(),
            namespace: "default".into(),
            role: "r".into(),
            index: 2,
            ip: Ipv4Addr::new(127, 9, 1, 3),
            labels: [("a/b".to_string(), "v".to_string())].into_iter().collect(),
            annotations: BTreeMap::new(),
            node_name: "n".into(),
            config_path: "/c".into(),
            mounts: vec![],
            pod_suffix: String::new(),
            pattern_env: vec![],
            objects: Objects::default(),
        };
        assert_eq!(
            resolve_field("status.podIP", &f).as_deref(),
            Ok("127.9.1.3")
        );
        assert_eq!(resolve_field("metadata.name", &f).as_deref(), Ok("g-r-2"));
        assert_eq!(
            resolve_field("metadata.labels['a/b']", &f).as_deref(),
            Ok("v")
        );
    }

    #[test]
    fn addresses() {
        let g = group_octet("demo");
        assert!((1..=254).contains(&g));
        assert_eq!(g, group_octet("demo"));
        assert_eq!(local_address(g, 0, 0), Some(Ipv4Addr::new(127, g, 1, 1)));
        assert_eq!(local_address(g, 0, 255), None);
    }
}
