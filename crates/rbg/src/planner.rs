//! The planner: pure decisions, no I/O and no clock.
//!
//! A runtime (the local process runtime, later a Kubernetes controller)
//! observes its instances, calls [`plan`] with the desired roles, the
//! observations and the current time, executes the returned [`Action`]s and
//! calls again on its next pass. Every rule of RBG.md §3 and §5 lives here so
//! it can be table-tested without processes:
//!
//! - dependency levels and cycle detection ([`levels`], which lives in the
//!   leaf [`crate::graph`] so spec validation can share it);
//! - dependency gating, re-checked on every pass: a role whose dependencies
//!   are not all fully ready gets no action at all (frozen);
//! - scaling (create missing indexes, delete indexes beyond `replicas`);
//! - rolling updates in decreasing index order within `maxUnavailable`,
//!   with `maxSurge` extra instances and `partition`; in place when only
//!   images changed and the role allows it, otherwise recreate;
//! - coordination of rollouts (`maxSkew` between updated fractions, slowest
//!   first) and of scaling (RBG.md §5 formula, `progression`);
//! - restart policies after a crash, with exponential backoff.
//!
//! Crash restarts are the one thing not gated by dependencies: on Kubernetes
//! the kubelet restarts a container whatever the controller thinks, and the
//! local runtime does the same.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::graph;
pub use crate::graph::{levels, GraphError};
use crate::revision;
use crate::spec::{
    CoordinationPolicy, Group, Progression, RestartPolicy, Role, UpdatePolicy, UpdateType,
};

/// Milliseconds on the runtime's monotonic clock; only differences matter.
pub type Millis = u64;

/// [`levels`] of `roles` by their declared dependencies.
pub fn role_levels(roles: &[Role]) -> Result<Vec<Vec<String>>, GraphError> {
    graph::levels_of(
        roles
            .iter()
            .map(|r| (r.name.as_str(), r.dependencies.as_slice())),
    )
}

/// Levels of a validated group (validation already rejected cycles).
pub fn group_levels(g: &Group) -> Vec<Vec<String>> {
    // Unreachable for a validated group; one flat level keeps callers simple.
    role_levels(&g.roles).unwrap_or_else(|_| vec![g.roles.iter().map(|r| r.name.clone()).collect()])
}

/// What the planner needs to know about one role's desired state.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredRole {
    /// Role name.
    pub name: String,
    /// Instances wanted.
    pub replicas: u32,
    /// Roles that must be fully ready before this one is touched.
    pub dependencies: Vec<String>,
    /// The revision instances move to.
    pub revision: String,
    /// The revision's shape (template without images).
    pub shape: String,
    /// The revision before the latest change, used to recreate a missing
    /// instance below the partition; `None` means use `revision`.
    pub current_revision: Option<String>,
    /// Rolling-update parameters.
    pub update: UpdatePolicy,
    /// What a crash triggers.
    pub restart_policy: RestartPolicy,
    /// `podManagementPolicy: OrderedReady`: instance `i` is created only
    /// once `0..i` are ready.
    pub ordered: bool,
    /// The role's own crash backoff (`restartPolicyConfig`), if any.
    pub backoff: Option<Backoff>,
}

impl DesiredRole {
    /// The desired state of a validated role.
    pub fn from_role(r: &Role) -> DesiredRole {
        DesiredRole {
            name: r.name.clone(),
            replicas: r.replicas,
            dependencies: r.dependencies.clone(),
            revision: revision::role_revision(r),
            shape: revision::role_shape(r),
            current_revision: None,
            update: r.update,
            restart_policy: r.restart_policy,
            ordered: r.ordered,
            backoff: r.restart_delays.map(|(base, max)| Backoff {
                base_ms: u64::from(base) * 1000,
                max_ms: u64::from(max) * 1000,
            }),
        }
    }
}

/// An unhandled container exit of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crash {
    /// When the exit was seen.
    pub at: Millis,
    /// Consecutive crashes without a healthy run in between (1 for the first).
    pub streak: u32,
}

/// What a runtime observed about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedInstance {
    /// Instance index.
    pub index: u32,
    /// Revision it runs (or is being moved to).
    pub revision: String,
    /// Shape of that revision.
    pub shape: String,
    /// Readiness probe passing (or running, without a probe).
    pub ready: bool,
    /// Its processes are started and alive ("scheduled").
    pub running: bool,
    /// Container restarts so far.
    pub restarts: u32,
    /// Set while a container exit waits for the planner's decision.
    pub crash: Option<Crash>,
    /// An earlier action is still being carried out (e.g. stopping); the
    /// planner leaves the instance alone.
    pub busy: bool,
}

/// Observations of every role, by role name.
pub type Observed = BTreeMap<String, Vec<ObservedInstance>>;

/// Exponential backoff for crash restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first restart.
    pub base_ms: Millis,
    /// Upper bound of the delay.
    pub max_ms: Millis,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base_ms: 1_000,
            max_ms: 60_000,
        }
    }
}

impl Backoff {
    /// The delay before restarting after the `streak`-th consecutive crash.
    pub fn delay(&self, streak: u32) -> Millis {
        let shift = streak.saturating_sub(1).min(32);
        self.base_ms.saturating_mul(1u64 << shift).min(self.max_ms)
    }
}

/// One decision for a runtime to carry out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Start a new instance at `revision`.
    Create {
        /// Role name.
        role: String,
        /// Instance index.
        index: u32,
        /// Revision to run.
        revision: String,
    },
    /// Stop the instance and delete its volumes.
    Delete {
        /// Role name.
        role: String,
        /// Instance index.
        index: u32,
    },
    /// Restart the instance's containers at `revision`, keeping its
    /// identity, address and volumes.
    RestartInPlace {
        /// Role name.
        role: String,
        /// Instance index.
        index: u32,
        /// Revision to run.
        revision: String,
    },
    /// Delete the instance and create it again at `revision`.
    Recreate {
        /// Role name.
        role: String,
        /// Instance index.
        index: u32,
        /// Revision to run.
        revision: String,
    },
    /// Stop every instance (reverse dependency order) and delete them; the
    /// following passes create the group again in dependency order.
    RecreateGroup {
        /// What triggered it, for the user.
        reason: String,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Create {
                role,
                index,
                revision,
            } => write!(f, "create {role}-{index} at {revision}"),
            Action::Delete { role, index } => write!(f, "delete {role}-{index}"),
            Action::RestartInPlace {
                role,
                index,
                revision,
            } => write!(f, "restart {role}-{index} in place at {revision}"),
            Action::Recreate {
                role,
                index,
                revision,
            } => write!(f, "recreate {role}-{index} at {revision}"),
            Action::RecreateGroup { reason } => write!(f, "recreate the group: {reason}"),
        }
    }
}

/// Why a role did not move on this pass (for progress output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The role is frozen until `dependency` has all replicas ready.
    Dependency {
        /// The frozen role.
        role: String,
        /// The first dependency not fully ready.
        dependency: String,
    },
    /// A crashed instance waits for its backoff to end at `until`.
    Backoff {
        /// Role name.
        role: String,
        /// Instance index.
        index: u32,
        /// When it will be restarted.
        until: Millis,
    },
    /// An `InPlaceOnly` role's instance needs more than an image change;
    /// it stays at its revision until the spec goes back to one that can
    /// be reached in place.
    InPlaceImpossible {
        /// Role name.
        role: String,
        /// Instance index.
        index: u32,
    },
    /// The role's rollout is paused (`rollingUpdate.paused`).
    Paused {
        /// Role name.
        role: String,
    },
}

/// The result of one planning pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Actions to carry out now, in order.
    pub actions: Vec<Action>,
    /// Roles and instances that are waiting, and on what.
    pub waiting: Vec<Wait>,
}

/// Everything one planning pass looks at.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    /// Desired roles, in spec order.
    pub roles: &'a [DesiredRole],
    /// Coordination entries of the group.
    pub coordination: &'a [CoordinationPolicy],
    /// What the runtime observed.
    pub observed: &'a Observed,
    /// Current time.
    pub now: Millis,
    /// Crash restart backoff.
    pub backoff: Backoff,
}

/// Small tolerance so that e.g. 0.1 × 200 floors to 20, not 19.
const EPS: f64 = 1e-9;

fn instances<'a>(o: &'a Observed, role: &str) -> &'a [ObservedInstance] {
    o.get(role).map(Vec::as_slice).unwrap_or(&[])
}

/// Instances with index below `replicas` for which `pred` holds.
fn count_where(r: &DesiredRole, o: &Observed, pred: impl Fn(&ObservedInstance) -> bool) -> u32 {
    let n = instances(o, &r.name)
        .iter()
        .filter(|i| i.index < r.replicas && pred(i))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The roles of `c` that have replicas, in `roles` order.
fn members<'a>(
    c: &'a CoordinationPolicy,
    roles: &'a [DesiredRole],
) -> impl Iterator<Item = &'a DesiredRole> {
    roles
        .iter()
        .filter(|r| c.roles.iter().any(|n| n == &r.name) && r.replicas > 0)
}

/// Ready instances with index below `replicas`.
pub fn ready_count(r: &DesiredRole, o: &Observed) -> u32 {
    count_where(r, o, |i| i.ready && !i.busy)
}

/// True when every replica of the role is ready (RBG.md §3).
pub fn role_ready(r: &DesiredRole, o: &Observed) -> bool {
    ready_count(r, o) == r.replicas
}

/// True when every role has all replicas ready.
pub fn group_ready(roles: &[DesiredRole], o: &Observed) -> bool {
    roles.iter().all(|r| role_ready(r, o))
}

/// Instances with index below `replicas` at the desired revision.
pub fn updated_count(r: &DesiredRole, o: &Observed) -> u32 {
    count_where(r, o, |i| i.revision == r.revision)
}

/// Instances with index below `replicas` at the desired revision and ready.
pub fn updated_ready_count(r: &DesiredRole, o: &Observed) -> u32 {
    count_where(r, o, |i| i.revision == r.revision && i.ready && !i.busy)
}

/// The rolling-update parameters of a role after coordination overrides.
fn effective_update(r: &DesiredRole, coordination: &[CoordinationPolicy]) -> UpdatePolicy {
    let mut u = r.update;
    for c in coordination {
        if let Some(ru) = &c.rolling_update {
            if c.roles.iter().any(|n| n == &r.name) {
                if let Some(p) = ru.partition {
                    u.partition = p;
                }
                if let Some(m) = ru.max_unavailable {
                    u.max_unavailable = m;
                }
            }
        }
    }
    u
}

/// `(partition, maxUnavailable, maxSurge)` as instance counts for `replicas`.
fn resolved(u: &UpdatePolicy, replicas: u32) -> (u32, u32, u32) {
    let partition = u.partition_of(replicas);
    let mut unavailable = u.max_unavailable_of(replicas);
    let surge = u.max_surge_of(replicas).min(replicas - partition);
    if unavailable == 0 && surge == 0 {
        // Percentages can round both to 0 for small roles; Kubernetes then
        // allows one unavailable so the update can proceed.
        unavailable = 1;
    }
    (partition, unavailable, surge)
}

/// The count a coordinated role may reach: `(slowest + maxSkew) × replicas`
/// instances, rounded `up` or down, at most `replicas`. A role that is
/// itself the slowest (`done` at that fraction, and `may_step`) may still
/// go one past `done`: when maxSkew is finer than one of its instances,
/// nothing would move otherwise.
fn skew_cap(
    slowest: f64,
    max_skew: f64,
    replicas: u32,
    done: u32,
    may_step: bool,
    up: bool,
) -> u32 {
    let n = f64::from(replicas);
    let exact = (slowest + max_skew) * n;
    let mut cap = if up {
        (exact - EPS).ceil().max(0.0) as u32
    } else {
        (exact + EPS).floor() as u32
    };
    if cap <= done && may_step && (f64::from(done) / n - slowest).abs() < EPS {
        cap = done + 1;
    }
    cap.min(replicas)
}

/// How many of each coordinated role's instances (index < replicas) may be
/// at the new revision after this pass; roles absent are not capped.
fn rollout_caps(
    roles: &[DesiredRole],
    coordination: &[CoordinationPolicy],
    o: &Observed,
) -> BTreeMap<String, u32> {
    let mut caps = BTreeMap::new();
    for c in coordination {
        let Some(ru) = &c.rolling_update else {
            continue;
        };
        let members: Vec<&DesiredRole> = members(c, roles).collect();
        // Progress of the slowest unfinished role, counted on ready updated
        // instances so that an update in flight does not let others run ahead.
        let mut min_f: Option<f64> = None;
        for r in &members {
            let partition = effective_update(r, coordination).partition_of(r.replicas);
            let goal = r.replicas - partition;
            let ready = updated_ready_count(r, o);
            if ready < goal {
                let f = f64::from(ready) / f64::from(r.replicas);
                min_f = Some(min_f.map_or(f, |m: f64| m.min(f)));
            }
        }
        let Some(min_f) = min_f else { continue };
        for r in &members {
            let updated = updated_count(r, o);
            // Only a role with no update in flight is at the slowest
            // fraction in a way that lets it take its one step.
            let settled = updated == updated_ready_count(r, o);
            let cap = skew_cap(min_f, ru.max_skew, r.replicas, updated, settled, false);
            caps.insert(r.name.clone(), cap);
        }
    }
    caps
}

/// How many instances (index < replicas) of each scaling-coordinated role
/// may exist after this pass; roles absent are not capped.
fn scaling_caps(
    roles: &[DesiredRole],
    coordination: &[CoordinationPolicy],
    o: &Observed,
) -> BTreeMap<String, u32> {
    let mut caps = BTreeMap::new();
    for c in coordination {
        let Some(sc) = &c.scaling else { continue };
        let members: Vec<&DesiredRole> = members(c, roles).collect();
        let progress = |r: &DesiredRole| -> u32 {
            count_where(r, o, |i| {
                !i.busy
                    && match sc.progression {
                        Progression::OrderScheduled => i.running || i.ready,
                        Progression::OrderReady => i.ready,
                    }
            })
        };
        let min_p = members
            .iter()
            .map(|r| f64::from(progress(r)) / f64::from(r.replicas))
            .fold(1.0f64, f64::min);
        for r in &members {
            let cap = skew_cap(min_p, sc.max_skew, r.replicas, progress(r), true, true);
            caps.insert(r.name.clone(), cap);
        }
    }
    caps
}

/// One planning pass: the actions that move the observed state towards the
/// desired one without breaking any rule. Calling it again after the actions
/// took effect continues the work; it is idempotent for unchanged input.
pub fn plan(input: PlanInput<'_>) -> Plan {
    let PlanInput {
        roles,
        coordination,
        observed,
        now,
        backoff,
    } = input;
    let mut out = Plan::default();
    let mut handled: BTreeSet<(String, u32)> = BTreeSet::new();

    // Crashes first: they are not gated by dependencies (see module docs).
    for r in roles {
        for i in instances(observed, &r.name) {
            let Some(c) = i.crash else { continue };
            // Instances being scaled away are deleted by plan_role instead.
            if i.busy || i.index >= r.replicas {
                continue;
            }
            handled.insert((r.name.clone(), i.index));
            let until =
                c.at.saturating_add(r.backoff.unwrap_or(backoff).delay(c.streak));
            if now < until {
                out.waiting.push(Wait::Backoff {
                    role: r.name.clone(),
                    index: i.index,
                    until,
                });
                continue;
            }
            match r.restart_policy {
                RestartPolicy::RecreateRBGOnPodRestart => {
                    return Plan {
                        actions: vec![Action::RecreateGroup {
                            reason: format!(
                                "instance {}-{} of role {:?} restarted and the role has restartPolicy RecreateRBGOnPodRestart",
                                r.name, i.index, r.name
                            ),
                        }],
                        waiting: Vec::new(),
                    };
                }
                RestartPolicy::RecreateRoleInstanceOnPodRestart => {
                    out.actions.push(Action::Recreate {
                        role: r.name.clone(),
                        index: i.index,
                        revision: i.revision.clone(),
                    })
                }
                RestartPolicy::None => out.actions.push(Action::RestartInPlace {
                    role: r.name.clone(),
                    index: i.index,
                    revision: i.revision.clone(),
                }),
            }
        }
    }

    let rollout_caps = rollout_caps(roles, coordination, observed);
    let scaling_caps = scaling_caps(roles, coordination, observed);
    let by_name: BTreeMap<&str, &DesiredRole> =
        roles.iter().map(|r| (r.name.as_str(), r)).collect();

    for r in roles {
        if let Some(dep) = r.dependencies.iter().find(|d| {
            by_name
                .get(d.as_str())
                .is_some_and(|dr| !role_ready(dr, observed))
        }) {
            out.waiting.push(Wait::Dependency {
                role: r.name.clone(),
                dependency: dep.clone(),
            });
            continue;
        }
        plan_role(
            r,
            coordination,
            observed,
            rollout_caps.get(&r.name).copied(),
            scaling_caps.get(&r.name).copied(),
            &handled,
            &mut out,
        );
    }
    out
}

/// Scaling and rolling update of one unfrozen role.
fn plan_role(
    r: &DesiredRole,
    coordination: &[CoordinationPolicy],
    observed: &Observed,
    rollout_cap: Option<u32>,
    scaling_cap: Option<u32>,
    handled: &BTreeSet<(String, u32)>,
    out: &mut Plan,
) {
    let insts = instances(observed, &r.name);
    let by_index: BTreeMap<u32, &ObservedInstance> = insts.iter().map(|i| (i.index, i)).collect();
    let u = effective_update(r, coordination);
    let (partition, max_unavailable, max_surge) = resolved(&u, r.replicas);
    let is_handled = |i: u32| handled.contains(&(r.name.clone(), i));

    // Rollout state: an instance in [partition, replicas) is pending until it
    // runs the desired revision and is ready.
    let pending = (partition..r.replicas)
        .filter(|ix| {
            by_index
                .get(ix)
                .is_none_or(|i| i.revision != r.revision || !i.ready || i.busy)
        })
        .count();
    let outdated = (partition..r.replicas)
        .filter(|ix| by_index.get(ix).is_some_and(|i| i.revision != r.revision))
        .count();
    // Surge instances exist while old ones remain, and stay until the
    // updated ones are all ready (so availability never dips at the end).
    let surge = if u.paused {
        0
    } else if outdated > 0 || (pending > 0 && insts.iter().any(|i| i.index >= r.replicas)) {
        max_surge
    } else {
        0
    };

    // Scale down, and surge instances no longer wanted or at a stale revision.
    for i in insts.iter().rev() {
        if i.busy || is_handled(i.index) || i.index < r.replicas {
            continue;
        }
        if i.index >= r.replicas + surge || i.revision != r.revision {
            out.actions.push(Action::Delete {
                role: r.name.clone(),
                index: i.index,
            });
        }
    }

    // Scale up (capped by scaling coordination), then surge instances.
    let existing =
        u32::try_from(insts.iter().filter(|i| i.index < r.replicas).count()).unwrap_or(u32::MAX);
    let mut may_create = scaling_cap.map_or(u32::MAX, |c| c.saturating_sub(existing));
    // Instances created now at the new revision count as updated: on
    // Kubernetes a recreated instance is deleted first and created on a
    // later pass, and must not make room for another one under maxSkew.
    let mut created_updated = 0u32;
    for ix in 0..r.replicas {
        if r.ordered && (0..ix).any(|lower| by_index.get(&lower).is_none_or(|i| !i.ready || i.busy))
        {
            // OrderedReady: nothing past the first instance not yet ready.
            break;
        }
        if by_index.contains_key(&ix) || may_create == 0 {
            continue;
        }
        may_create -= 1;
        let revision = match &r.current_revision {
            Some(cur) if ix < partition => cur.clone(),
            _ => r.revision.clone(),
        };
        if revision == r.revision {
            created_updated += 1;
        }
        out.actions.push(Action::Create {
            role: r.name.clone(),
            index: ix,
            revision,
        });
    }
    for ix in r.replicas..r.replicas + surge {
        if !by_index.contains_key(&ix) {
            out.actions.push(Action::Create {
                role: r.name.clone(),
                index: ix,
                revision: r.revision.clone(),
            });
        }
    }

    if outdated == 0 {
        return;
    }
    if u.paused {
        out.waiting.push(Wait::Paused {
            role: r.name.clone(),
        });
        return;
    }
    // Rolling update. Availability counts every ready instance, surge ones
    // included, against the floor replicas - maxUnavailable.
    let ready_now = i64::try_from(
        insts
            .iter()
            .filter(|i| i.ready && !i.busy && i.index < r.replicas + surge)
            .count(),
    )
    .unwrap_or(i64::MAX);
    let floor = i64::from(r.replicas) - i64::from(max_unavailable);
    let mut budget = ready_now - floor;
    let mut updated = updated_count(r, observed) + created_updated;
    for ix in (partition..r.replicas).rev() {
        let Some(i) = by_index.get(&ix) else { continue };
        if i.revision == r.revision {
            continue;
        }
        if i.busy || is_handled(ix) {
            // Strict order: a busy outdated instance blocks lower indexes.
            break;
        }
        if rollout_cap.is_some_and(|cap| updated >= cap) {
            break;
        }
        if u.kind == UpdateType::InPlaceOnly && i.shape != r.shape {
            out.waiting.push(Wait::InPlaceImpossible {
                role: r.name.clone(),
                index: ix,
            });
            break;
        }
        if i.ready {
            if budget <= 0 {
                break;
            }
            budget -= 1;
        }
        updated += 1;
        let in_place = u.kind != UpdateType::Recreate && i.shape == r.shape;
        out.actions.push(if in_place {
            Action::RestartInPlace {
                role: r.name.clone(),
                index: ix,
                revision: r.revision.clone(),
            }
        } else {
            Action::Recreate {
                role: r.name.clone(),
                index: ix,
                revision: r.revision.clone(),
            }
        });
    }
}

/// The maximum difference of updated fractions between roles of a
/// coordination, counting `ready_only` instances or all switched ones.
pub fn coordination_skew(
    c: &CoordinationPolicy,
    roles: &[DesiredRole],
    o: &Observed,
    ready_only: bool,
) -> f64 {
    let fracs: Vec<f64> = members(c, roles)
        .map(|r| {
            let k = if ready_only {
                updated_ready_count(r, o)
            } else {
                updated_count(r, o)
            };
            f64::from(k) / f64::from(r.replicas)
        })
        .collect();
    let max = fracs.iter().copied().fold(f64::MIN, f64::max);
    let min = fracs.iter().copied().fold(f64::MAX, f64::min);
    if fracs.is_empty() {
        0.0
    } else {
        max - min
    }
}
