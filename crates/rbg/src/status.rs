//! The group status the way upstream reports it: `observedGeneration`,
//! `conditions` (`Ready`, `Progressing`, `RollingUpdateInProgress`,
//! `RestartInProgress`) and `roleStatuses`. One pure function computes it
//! from the planner's view, so `rbg status -o yaml` and the operator's
//! status subresource say the same thing. The shape itself ([`RbgStatus`])
//! is defined in `spec`, with the custom resources that carry it.

use crate::planner::{self, DesiredRole, Observed};
use crate::spec::Placement;

// The shape is defined with the custom resources in `spec` (their CRD derive
// needs it, and `spec` must not depend on this module); re-exported so
// callers keep reading the status from one place.
pub use crate::spec::{Condition, RbgStatus, RoleStatusEntry};

/// What the status is computed from.
pub struct StatusInput<'a> {
    /// Desired roles.
    pub roles: &'a [DesiredRole],
    /// What the runtime observed.
    pub observed: &'a Observed,
    /// Spec generation.
    pub generation: i64,
    /// Roles frozen on a dependency: `(role, dependency)`.
    pub waiting: &'a [(String, String)],
    /// Instances restarting after a crash (restart policy at work).
    pub restarting: u32,
    /// The status reported last time (keeps transition times).
    pub previous: Option<&'a RbgStatus>,
    /// Now, RFC 3339.
    pub now: &'a str,
}

/// Computes the upstream-shaped status.
pub fn compute(input: StatusInput<'_>) -> RbgStatus {
    let StatusInput {
        roles,
        observed,
        generation,
        waiting,
        restarting,
        previous,
        now,
    } = input;
    let role_statuses: Vec<RoleStatusEntry> = roles
        .iter()
        .map(|r| RoleStatusEntry {
            name: r.name.clone(),
            replicas: r.replicas,
            ready_replicas: planner::ready_count(r, observed),
            updated_replicas: planner::updated_count(r, observed),
        })
        .collect();
    let not_ready: Vec<String> = role_statuses
        .iter()
        .filter(|s| s.ready_replicas < s.replicas)
        .map(|s| format!("{} {}/{}", s.name, s.ready_replicas, s.replicas))
        .collect();
    let rolling: Vec<String> = roles
        .iter()
        .filter(|r| {
            observed
                .get(&r.name)
                .is_some_and(|l| l.iter().any(|i| i.revision != r.revision))
        })
        .map(|r| r.name.clone())
        .collect();
    let ready = not_ready.is_empty();
    let mut conditions = Vec::new();
    let mut add = |kind: &str, on: bool, reason: &str, message: String| {
        conditions.push(Condition {
            kind: kind.to_string(),
            status: if on { "True" } else { "False" }.to_string(),
            reason: reason.to_string(),
            message,
            last_transition_time: now.to_string(),
            observed_generation: Some(generation),
        });
    };
    if ready {
        add(
            "Ready",
            true,
            "AllRolesReady",
            "every role has all replicas ready".into(),
        );
    } else {
        add(
            "Ready",
            false,
            "RolesNotReady",
            format!("not ready: {}", not_ready.join(", ")),
        );
    }
    let progressing = !ready || !rolling.is_empty();
    let mut detail = not_ready.clone();
    detail.extend(waiting.iter().map(|(r, d)| format!("{r} waits for {d}")));
    add(
        "Progressing",
        progressing,
        if progressing {
            "Reconciling"
        } else {
            "Reconciled"
        },
        if progressing {
            detail.join(", ")
        } else {
            "the group matches its spec".into()
        },
    );
    add(
        "RollingUpdateInProgress",
        !rolling.is_empty(),
        if rolling.is_empty() {
            "RollingUpdateComplete"
        } else {
            "RollingUpdate"
        },
        if rolling.is_empty() {
            "every instance runs its role's revision".into()
        } else {
            format!("updating {}", rolling.join(", "))
        },
    );
    add(
        "RestartInProgress",
        restarting > 0,
        if restarting > 0 {
            "Restarting"
        } else {
            "NoRestart"
        },
        format!("{restarting} instance(s) restarting"),
    );
    let mut status = RbgStatus {
        observed_generation: Some(generation),
        conditions,
        role_statuses,
    };
    keep_transition_times(&mut status, previous);
    status
}

/// A condition keeps its previous transition time while its status holds.
fn keep_transition_times(status: &mut RbgStatus, previous: Option<&RbgStatus>) {
    let Some(previous) = previous else { return };
    for c in &mut status.conditions {
        if let Some(p) = previous
            .conditions
            .iter()
            .find(|p| p.kind == c.kind && p.status == c.status)
        {
            c.last_transition_time = p.last_transition_time.clone();
        }
    }
}

/// Adds upstream's `TopologyTranslated` condition when the group has
/// topology constraints (and only then, as upstream does): True where
/// `translated` (the operator's Pod affinity), False with `NotApplicable`
/// for the local runtime, whose processes all run on one host.
pub fn add_topology(
    status: &mut RbgStatus,
    placements: &[Placement],
    translated: bool,
    previous: Option<&RbgStatus>,
    now: &str,
) {
    if placements.is_empty() {
        return;
    }
    let levels: Vec<String> = placements
        .iter()
        .map(|p| {
            let mut l = Vec::new();
            l.extend(p.required.iter().map(|r| format!("required {r}")));
            l.extend(p.preferred.iter().map(|r| format!("preferred {r}")));
            format!("{}: {}", p.name, l.join(", "))
        })
        .collect();
    let (reason, message) = if translated {
        (
            "PodAffinity",
            format!(
                "{}; as Pod affinity on node-label keys for the default scheduler",
                levels.join("; ")
            ),
        )
    } else {
        (
            "NotApplicable",
            format!(
                "{}; the local runtime runs every Pod on this host",
                levels.join("; ")
            ),
        )
    };
    status.conditions.push(Condition {
        kind: "TopologyTranslated".into(),
        status: if translated { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: now.to_string(),
        observed_generation: status.observed_generation,
    });
    keep_transition_times(status, previous);
}

/// The condition of `kind`, if present.
pub fn condition<'a>(s: &'a RbgStatus, kind: &str) -> Option<&'a Condition> {
    s.conditions.iter().find(|c| c.kind == kind)
}
