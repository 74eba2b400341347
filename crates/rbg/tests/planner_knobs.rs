//! Planner tables for the v1alpha2 knobs (paused, InPlaceOnly,
//! OrderedReady, a role's own restart backoff) and for an executor that
//! deletes an instance on one pass and creates it on the next (the
//! Kubernetes one): a missing instance being recreated at the new revision
//! counts as updated under maxSkew.

use rbg::planner::{
    plan, Action, Backoff, Crash, DesiredRole, Observed, ObservedInstance, PlanInput, Wait,
};
use rbg::spec::{CoordinationPolicy, RestartPolicy, RolloutCoordination, UpdatePolicy, UpdateType};

fn role(name: &str, replicas: u32) -> DesiredRole {
    DesiredRole {
        name: name.into(),
        replicas,
        dependencies: vec![],
        revision: "v2".into(),
        shape: "s".into(),
        current_revision: None,
        update: UpdatePolicy::default(),
        restart_policy: RestartPolicy::None,
        ordered: false,
        backoff: None,
    }
}

fn inst(index: u32, revision: &str, shape: &str, ready: bool) -> ObservedInstance {
    ObservedInstance {
        index,
        revision: revision.into(),
        shape: shape.into(),
        ready,
        running: ready,
        restarts: 0,
        crash: None,
        busy: false,
    }
}

fn run(
    roles: &[DesiredRole],
    c: &[CoordinationPolicy],
    o: &Observed,
    now: u64,
) -> rbg::planner::Plan {
    plan(PlanInput {
        roles,
        coordination: c,
        observed: o,
        now,
        backoff: Backoff::default(),
    })
}

#[test]
fn paused_rollout_scales_but_does_not_update() {
    let mut r = role("a", 3);
    r.update.paused = true;
    let o = Observed::from([(
        "a".to_string(),
        vec![inst(0, "v1", "s", true), inst(1, "v1", "s", true)],
    )]);
    let p = run(&[r.clone()], &[], &o, 0);
    assert_eq!(
        p.actions,
        [Action::Create {
            role: "a".into(),
            index: 2,
            revision: "v2".into()
        }]
    );
    assert!(p.waiting.contains(&Wait::Paused { role: "a".into() }));
    // Unpaused, with every instance there and ready: the update starts.
    r.update.paused = false;
    let o = Observed::from([(
        "a".to_string(),
        (0..3).map(|i| inst(i, "v1", "s", true)).collect(),
    )]);
    let p = run(&[r], &[], &o, 0);
    assert_eq!(
        p.actions,
        [Action::RestartInPlace {
            role: "a".into(),
            index: 2,
            revision: "v2".into()
        }]
    );
}

#[test]
fn in_place_only_never_recreates() {
    let mut r = role("a", 2);
    r.update.kind = UpdateType::InPlaceOnly;
    // Same shape: in place.
    let o = Observed::from([(
        "a".to_string(),
        vec![inst(0, "v1", "s", true), inst(1, "v1", "s", true)],
    )]);
    let p = run(&[r.clone()], &[], &o, 0);
    assert_eq!(
        p.actions,
        [Action::RestartInPlace {
            role: "a".into(),
            index: 1,
            revision: "v2".into()
        }]
    );
    // Another shape: nothing, and the wait says why.
    let o = Observed::from([(
        "a".to_string(),
        vec![inst(0, "v1", "x", true), inst(1, "v1", "x", true)],
    )]);
    let p = run(&[r], &[], &o, 0);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.waiting.contains(&Wait::InPlaceImpossible {
        role: "a".into(),
        index: 1
    }));
}

#[test]
fn ordered_ready_creates_one_after_another() {
    let mut r = role("a", 3);
    r.ordered = true;
    let p = run(&[r.clone()], &[], &Observed::new(), 0);
    assert_eq!(
        p.actions,
        [Action::Create {
            role: "a".into(),
            index: 0,
            revision: "v2".into()
        }]
    );
    let o = Observed::from([("a".to_string(), vec![inst(0, "v2", "s", false)])]);
    assert!(
        run(&[r.clone()], &[], &o, 0).actions.is_empty(),
        "waits for 0 to be ready"
    );
    let o = Observed::from([("a".to_string(), vec![inst(0, "v2", "s", true)])]);
    assert_eq!(
        run(&[r], &[], &o, 0).actions,
        [Action::Create {
            role: "a".into(),
            index: 1,
            revision: "v2".into()
        }]
    );
}

#[test]
fn a_roles_own_backoff_wins() {
    let mut r = role("a", 1);
    r.restart_policy = RestartPolicy::RecreateRoleInstanceOnPodRestart;
    r.backoff = Some(Backoff {
        base_ms: 30_000,
        max_ms: 600_000,
    });
    let mut i = inst(0, "v2", "s", false);
    i.crash = Some(Crash {
        at: 1_000,
        streak: 2,
    });
    let o = Observed::from([("a".to_string(), vec![i])]);
    // 30 s doubled once: 61 s after the crash at 1 s.
    let p = run(&[r.clone()], &[], &o, 60_000);
    assert!(p.actions.is_empty());
    assert!(
        matches!(p.waiting[0], Wait::Backoff { until: 61_000, .. }),
        "{:?}",
        p.waiting
    );
    let p = run(&[r], &[], &o, 61_000);
    assert_eq!(
        p.actions,
        [Action::Recreate {
            role: "a".into(),
            index: 0,
            revision: "v2".into()
        }]
    );
}

#[test]
fn instance_being_recreated_counts_as_updated_under_max_skew() {
    let mut a = role("a", 4);
    a.update.kind = UpdateType::Recreate;
    a.update.max_unavailable = rbg::spec::Amount::Count(4);
    let mut b = role("b", 2);
    b.update = a.update;
    let c = [CoordinationPolicy {
        name: "pd".into(),
        roles: vec!["a".into(), "b".into()],
        rolling_update: Some(RolloutCoordination {
            max_skew: 0.25,
            partition: None,
            max_unavailable: None,
        }),
        scaling: None,
    }];
    // a-3 was deleted for its recreate; b-1 is done.
    let o = Observed::from([
        (
            "a".to_string(),
            (0..3).map(|i| inst(i, "v1", "s", true)).collect(),
        ),
        (
            "b".to_string(),
            vec![inst(0, "v1", "s", true), inst(1, "v2", "s", true)],
        ),
    ]);
    let p = run(&[a, b], &c, &o, 0);
    // Recreating a-3 is a's one step; a-2 must wait.
    assert_eq!(
        p.actions,
        [Action::Create {
            role: "a".into(),
            index: 3,
            revision: "v2".into()
        }]
    );
}
