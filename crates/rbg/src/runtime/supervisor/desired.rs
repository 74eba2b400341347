//! The desired state side of the supervisor: installing a spec (slots,
//! revisions, history, the discovery file), answering control requests
//! (apply, undo, status, history) and what the planner observes.

use std::collections::BTreeMap;

use super::instance::Instance;
use super::{check_local_limits, io_err, unix_ms, RuntimeError, Supervisor};
use crate::discovery;
use crate::planner::{self, DesiredRole, ObservedInstance};
use crate::runtime::control::{Request, Response};
use crate::runtime::state::{GroupStatus, HistoryEntry, InstanceStatus, RoleStatus};
use crate::spec::{self, Group};

impl Supervisor {
    /// Makes `group` the desired state; records history when a revision
    /// changed. Returns the `role: old -> new` changes.
    pub(super) fn install(
        &mut self,
        group: Group,
        text: &str,
        cause: &str,
    ) -> Result<Vec<String>, RuntimeError> {
        let mut changed = Vec::new();
        let mut desired = Vec::new();
        for r in &group.roles {
            // A role holds one slot per Pod of an instance; one that grows
            // past its slots moves to fresh ones at the end.
            let need = u32::try_from(r.pods.len()).unwrap_or(u32::MAX).max(1);
            if self.slot_sizes.get(&r.name).is_none_or(|have| *have < need) {
                let next = self
                    .slots
                    .iter()
                    .map(|(n, s)| s + self.slot_sizes.get(n).copied().unwrap_or(1))
                    .max()
                    .unwrap_or(0);
                self.slots.insert(r.name.clone(), next);
                self.slot_sizes.insert(r.name.clone(), need);
            }
            let mut d = DesiredRole::from_role(r);
            self.templates
                .insert((r.name.clone(), d.revision.clone()), r.pods.clone());
            match self.desired.iter().find(|o| o.name == r.name) {
                Some(old) if old.revision != d.revision => {
                    changed.push(format!("{}: {} -> {}", r.name, old.revision, d.revision));
                    self.current_revision
                        .insert(r.name.clone(), old.revision.clone());
                }
                Some(_) => {}
                None => changed.push(format!("{}: new at {}", r.name, d.revision)),
            }
            d.current_revision = self.current_revision.get(&r.name).cloned();
            desired.push(d);
        }
        for old in &self.desired {
            if group.role(&old.name).is_none() {
                changed.push(format!("{}: removed", old.name));
            }
        }
        self.levels = planner::group_levels(&group);
        self.group = group;
        self.desired = desired;
        self.hosts = discovery::host_table(&self.group, &|role, index, pod| {
            self.pod_address(role, index, pod)
        });
        self.write_discovery()?;
        if !changed.is_empty() || self.history.is_empty() {
            let number = self.history.last().map_or(1, |h| h.number + 1);
            let entry = HistoryEntry {
                number,
                applied_at: unix_ms() / 1000,
                revisions: self
                    .desired
                    .iter()
                    .map(|d| (d.name.clone(), d.revision.clone()))
                    .collect(),
                cause: cause.to_string(),
            };
            let path = self.dir.history().join(format!("{number}.yaml"));
            std::fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))?;
            self.history.push(entry);
            self.history_specs.insert(number, text.to_string());
        }
        Ok(changed)
    }

    pub(super) fn write_discovery(&self) -> Result<(), RuntimeError> {
        let addr = |role: &str, index: u32| {
            self.address(role, index)
                .map_or_else(String::new, |a| a.to_string())
        };
        let file = discovery::discovery_file(&self.group, &addr);
        let text = serde_yaml::to_string(&file).unwrap_or_default();
        let path = self.dir.config();
        let tmp = path.with_extension("yaml.tmp");
        std::fs::write(&tmp, text).map_err(io_err("writing the discovery file"))?;
        std::fs::rename(&tmp, &path).map_err(io_err("writing the discovery file"))
    }

    pub(super) fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Status => Response::Status {
                status: self.status(),
            },
            Request::History => Response::History {
                entries: self.history.clone(),
            },
            Request::Apply { spec, images } => {
                if let Some(m) = images {
                    self.opts.images = m;
                }
                self.apply(&spec, "apply")
            }
            Request::Undo { to } => {
                let target = match to {
                    Some(n) => Some(n),
                    None => self
                        .history
                        .len()
                        .checked_sub(2)
                        .and_then(|i| self.history.get(i))
                        .map(|h| h.number),
                };
                let Some(n) = target else {
                    return Response::Error {
                        message: "there is no earlier revision to go back to".into(),
                    };
                };
                let Some(text) = self.history_specs.get(&n).cloned() else {
                    return Response::Error {
                        message: format!("history has no entry {n}"),
                    };
                };
                self.apply(&text, &format!("undo to {n}"))
            }
            Request::Down => Response::Stopped,
        }
    }

    pub(super) fn apply(&mut self, text: &str, cause: &str) -> Response {
        // A file may hold several groups: this supervisor takes its own.
        let loaded = match super::load_group(text, Some(&self.group.name)) {
            Ok(l) => l,
            Err(e) => {
                return Response::Error {
                    message: format!("{e} (this is group {:?})", self.group.name),
                }
            }
        };
        if let Some(m) = self.in_place_only_violation(&loaded.group) {
            return Response::Error { message: m };
        }
        if let Err(m) = check_local_limits(&loaded.group) {
            return Response::Error { message: m };
        }
        self.api_version = loaded.api_version.clone();
        match self.install(loaded.group, text, cause) {
            Ok(changed) => {
                for c in &changed {
                    self.say(&format!("{cause}: {c}"));
                }
                Response::Applied {
                    generation: self.history.last().map_or(0, |h| h.number),
                    changed,
                    unimplemented: loaded.unimplemented,
                }
            }
            Err(e) => Response::Error {
                message: e.to_string(),
            },
        }
    }

    /// An `InPlaceOnly` role whose new template differs from the current
    /// one in more than images is refused, as upstream's webhook refuses it.
    fn in_place_only_violation(&self, g: &Group) -> Option<String> {
        for r in &g.roles {
            if r.update.kind != spec::UpdateType::InPlaceOnly {
                continue;
            }
            let Some(old) = self.desired.iter().find(|d| d.name == r.name) else {
                continue;
            };
            let new = DesiredRole::from_role(r);
            if new.revision != old.revision && new.shape != old.shape {
                return Some(format!(
                    "role {:?}: rolloutStrategy.rollingUpdate.type is InPlaceOnly and the change is not only container images; refused",
                    r.name
                ));
            }
        }
        None
    }

    pub(super) fn status(&self) -> GroupStatus {
        let observed = self.observed();
        let mut roles = Vec::new();
        for d in &self.desired {
            let waiting = self
                .waiting_for(&d.name)
                .map(|dep| format!("waiting for {dep}"));
            roles.push(RoleStatus {
                name: d.name.clone(),
                level: self.level_of(&d.name),
                replicas: d.replicas,
                ready_replicas: planner::ready_count(d, &observed),
                updated_replicas: planner::updated_count(d, &observed),
                revision: d.revision.clone(),
                waiting,
            });
        }
        let order: BTreeMap<&str, usize> = self
            .group
            .roles
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name.as_str(), i))
            .collect();
        let mut insts: Vec<&Instance> = self.instances.values().collect();
        insts.sort_by_key(|i| {
            (
                order.get(i.role.as_str()).copied().unwrap_or(usize::MAX),
                i.index,
            )
        });
        let instances = insts
            .into_iter()
            .map(|i| InstanceStatus {
                role: i.role.clone(),
                name: i.name.clone(),
                index: i.index,
                address: i.ip.to_string(),
                ready: i.ready(),
                revision: i.revision.clone(),
                restarts: i.restarts,
                age_secs: i.created.elapsed().as_secs(),
                state: i.state().to_string(),
                volumes: i
                    .pods
                    .iter()
                    .enumerate()
                    .flat_map(|(p, pod)| {
                        pod.volumes.iter().map(move |(k, v)| {
                            let key = if p == 0 {
                                k.clone()
                            } else {
                                format!("{}/{k}", pod.name)
                            };
                            (key, v.display().to_string())
                        })
                    })
                    .collect(),
                pids: i
                    .ctrs
                    .iter()
                    .map(|c| (c.key.clone(), if c.alive() { c.pid } else { 0 }))
                    .collect(),
                pods: i
                    .pods
                    .iter()
                    .map(|p| (p.name.clone(), p.ip.to_string()))
                    .collect(),
                started_ms: i.started_ms,
                ready_since_ms: if i.ready() { i.ready_since_ms } else { None },
            })
            .collect();
        GroupStatus {
            name: self.group.name.clone(),
            ready: planner::group_ready(&self.desired, &observed),
            generation: self.history.last().map_or(0, |h| h.number),
            roles,
            instances,
            group_restarts: self.group_restarts,
            namespace: self.group.namespace.clone(),
            api_version: self.api_version.clone(),
            upstream: self.rbg_status.clone(),
        }
    }

    pub(super) fn observed(&self) -> planner::Observed {
        let mut o = planner::Observed::new();
        let now = unix_ms();
        for i in self.instances.values() {
            // minReadySeconds: ready counts once it has lasted that long.
            let min_ready = self
                .group
                .role(&i.role)
                .map_or(0, |r| u64::from(r.min_ready_seconds) * 1000);
            let available = i.ready()
                && i.ready_since_ms
                    .is_some_and(|t| now.saturating_sub(t) >= min_ready);
            o.entry(i.role.clone()).or_default().push(ObservedInstance {
                index: i.index,
                revision: i.revision.clone(),
                shape: i.shape.clone(),
                ready: available,
                running: i.running(),
                restarts: i.restarts,
                crash: if i.pending.is_none() { i.crash } else { None },
                busy: i.pending.is_some(),
            });
        }
        o
    }
}
