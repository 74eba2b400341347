// Long on purpose: every table here runs on the one simulated runtime (`Sim`) defined below; split files would have to share it through a module for no gain in reading.
//! Planner tables: levels, cycles, gating, rolling updates step by step,
//! partition, surge, coordinated rollouts (maxSkew with 200/100 replicas),
//! coordinated scaling and restart policies. Everything runs against a tiny
//! simulated runtime, no processes.
//!
//! Long on purpose (over 800 lines): one table per planner rule, sharing the
//! simulated runtime; splitting would only copy that harness around.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rbg::planner::{
    coordination_skew, levels, plan, Action, Backoff, Crash, DesiredRole, GraphError, Observed,
    ObservedInstance, PlanInput, Wait,
};
use rbg::spec::{
    Amount, CoordinationPolicy, Progression, RestartPolicy, RolloutCoordination,
    ScalingCoordination, UpdatePolicy, UpdateType,
};

fn role(name: &str, replicas: u32, deps: &[&str]) -> DesiredRole {
    DesiredRole {
        name: name.to_string(),
        replicas,
        dependencies: deps.iter().map(|d| d.to_string()).collect(),
        revision: "v1".to_string(),
        shape: "s1".to_string(),
        current_revision: None,
        update: UpdatePolicy::default(),
        restart_policy: RestartPolicy::None,
        ordered: false,
        backoff: None,
    }
}

/// A simulated runtime: actions take effect at once; a started instance
/// becomes ready on the pass after it was started (or later, see `delay`).
#[derive(Default)]
struct Sim {
    roles: Vec<DesiredRole>,
    coordination: Vec<CoordinationPolicy>,
    observed: Observed,
    now: u64,
    /// Shapes of revisions, as the runtime would know them from templates.
    shapes: BTreeMap<String, String>,
    /// Instances that stay unready until this many passes have gone by.
    not_ready_for: BTreeMap<(String, u32), u32>,
    /// Log of every action taken.
    log: Vec<Action>,
}

impl Sim {
    fn new(roles: Vec<DesiredRole>) -> Sim {
        let mut s = Sim {
            roles,
            ..Sim::default()
        };
        s.shapes.insert("v1".into(), "s1".into());
        s
    }

    fn inst(&mut self, role: &str, index: u32) -> Option<&mut ObservedInstance> {
        self.observed
            .get_mut(role)?
            .iter_mut()
            .find(|i| i.index == index)
    }

    fn start(&mut self, role: &str, index: u32, revision: &str, restarts: u32) {
        let shape = self.shapes.get(revision).cloned().unwrap_or_default();
        let list = self.observed.entry(role.to_string()).or_default();
        list.retain(|i| i.index != index);
        list.push(ObservedInstance {
            index,
            revision: revision.to_string(),
            shape,
            ready: false,
            running: true,
            restarts,
            crash: None,
            busy: false,
        });
        list.sort_by_key(|i| i.index);
    }

    /// One planning pass; returns the actions and applies them.
    fn pass(&mut self) -> Vec<Action> {
        let plan = plan(PlanInput {
            roles: &self.roles,
            coordination: &self.coordination,
            observed: &self.observed,
            now: self.now,
            backoff: Backoff::default(),
        });
        for a in &plan.actions {
            self.apply(a);
        }
        self.log.extend(plan.actions.iter().cloned());
        plan.actions
    }

    fn apply(&mut self, a: &Action) {
        match a {
            Action::Create {
                role,
                index,
                revision,
            } => self.start(role, *index, revision, 0),
            Action::Delete { role, index } => {
                if let Some(l) = self.observed.get_mut(role) {
                    l.retain(|i| i.index != *index);
                }
            }
            Action::RestartInPlace {
                role,
                index,
                revision,
            } => {
                let shape = self.shapes.get(revision).cloned().unwrap_or_default();
                if let Some(i) = self.inst(role, *index) {
                    i.revision = revision.clone();
                    i.shape = shape;
                    i.ready = false;
                    i.restarts += 1;
                    i.crash = None;
                }
            }
            Action::Recreate {
                role,
                index,
                revision,
            } => self.start(role, *index, revision, 0),
            Action::RecreateGroup { .. } => self.observed.clear(),
        }
    }

    /// Time passes: instances started before this call become ready unless
    /// held back by `not_ready_for`.
    fn settle(&mut self) {
        self.now += 100;
        for (role, list) in self.observed.iter_mut() {
            for i in list.iter_mut() {
                let key = (role.clone(), i.index);
                match self.not_ready_for.get_mut(&key) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => {
                        if i.running && i.crash.is_none() {
                            i.ready = true;
                        }
                    }
                }
            }
        }
    }

    fn ready(&self, role: &str) -> u32 {
        self.observed
            .get(role)
            .map_or(0, |l| l.iter().filter(|i| i.ready).count() as u32)
    }

    fn revisions(&self, role: &str) -> Vec<String> {
        self.observed
            .get(role)
            .map(|l| l.iter().map(|i| i.revision.clone()).collect())
            .unwrap_or_default()
    }

    /// Runs pass/settle until nothing happens for two passes; returns passes.
    fn run_to_completion(&mut self, limit: usize) -> usize {
        let mut idle = 0;
        for n in 0..limit {
            let acts = self.pass();
            self.settle();
            if acts.is_empty() {
                idle += 1;
                if idle >= 3 {
                    return n;
                }
            } else {
                idle = 0;
            }
        }
        panic!("did not converge in {limit} passes");
    }

    fn new_revision(&mut self, role: &str, rev: &str, shape: &str) {
        self.shapes.insert(rev.to_string(), shape.to_string());
        for r in &mut self.roles {
            if r.name == role {
                r.revision = rev.to_string();
                r.shape = shape.to_string();
            }
        }
    }
}

fn create(role: &str, index: u32, rev: &str) -> Action {
    Action::Create {
        role: role.into(),
        index,
        revision: rev.into(),
    }
}

fn in_place(role: &str, index: u32, rev: &str) -> Action {
    Action::RestartInPlace {
        role: role.into(),
        index,
        revision: rev.into(),
    }
}

fn recreate(role: &str, index: u32, rev: &str) -> Action {
    Action::Recreate {
        role: role.into(),
        index,
        revision: rev.into(),
    }
}

#[test]
fn levels_table() {
    type Case = (
        &'static [(&'static str, &'static [&'static str])],
        &'static [&'static [&'static str]],
    );
    let cases: &[Case] = &[
        (&[("a", &[])], &[&["a"]]),
        (&[("a", &[]), ("b", &[])], &[&["a", "b"]]),
        (
            &[
                ("store", &["master"]),
                ("master", &[]),
                ("engine", &["master"]),
            ],
            &[&["master"], &["store", "engine"]],
        ),
        (
            &[
                ("router", &["prefill", "decode"]),
                ("prefill", &["cache"]),
                ("decode", &["cache"]),
                ("cache", &[]),
            ],
            &[&["cache"], &["prefill", "decode"], &["router"]],
        ),
        // Level is 1 + the *highest* dependency level, not the count.
        (
            &[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &["a", "c"])],
            &[&["a"], &["b"], &["c"], &["d"]],
        ),
    ];
    for (graph, want) in cases {
        let edges: Vec<(&str, Vec<&str>)> = graph.iter().map(|(n, d)| (*n, d.to_vec())).collect();
        let got = levels(&edges).expect("acyclic");
        let want: Vec<Vec<String>> = want
            .iter()
            .map(|l| l.iter().map(|s| s.to_string()).collect())
            .collect();
        assert_eq!(got, want, "{graph:?}");
    }
}

#[test]
fn cycles_and_unknown_dependencies_are_named() {
    type Graph<'a> = &'a [(&'a str, &'a [&'a str])];
    let cases: &[(Graph, &str)] = &[
        (&[("a", &["a"])], "dependency cycle: a -> a"),
        (
            &[("a", &["b"]), ("b", &["a"])],
            "dependency cycle: a -> b -> a",
        ),
        (
            &[("x", &[]), ("a", &["c"]), ("b", &["a"]), ("c", &["b", "x"])],
            "dependency cycle: a -> c -> b -> a",
        ),
        (
            &[("a", &["ghost"])],
            "role \"a\": dependencies: unknown role \"ghost\"",
        ),
    ];
    for (graph, want) in cases {
        let edges: Vec<(&str, Vec<&str>)> = graph.iter().map(|(n, d)| (*n, d.to_vec())).collect();
        let err = levels(&edges).expect_err("must fail");
        assert_eq!(err.to_string(), *want);
        if want.contains("cycle") {
            assert!(matches!(err, GraphError::Cycle(_)));
        }
    }
}

#[test]
fn bring_up_is_gated_level_by_level() {
    let mut sim = Sim::new(vec![
        role("master", 1, &[]),
        role("store", 3, &["master"]),
        role("engine", 1, &["master", "store"]),
    ]);
    // Pass 1: only the master.
    assert_eq!(sim.pass(), vec![create("master", 0, "v1")]);
    // Master started but not ready: nothing else moves, and says why.
    let p = plan(PlanInput {
        roles: &sim.roles,
        coordination: &[],
        observed: &sim.observed,
        now: 0,
        backoff: Backoff::default(),
    });
    assert!(p.actions.is_empty());
    assert!(p.waiting.contains(&Wait::Dependency {
        role: "store".into(),
        dependency: "master".into()
    }));
    sim.settle();
    assert_eq!(
        sim.pass(),
        vec![
            create("store", 0, "v1"),
            create("store", 1, "v1"),
            create("store", 2, "v1")
        ]
    );
    assert!(sim.pass().is_empty(), "engine waits for all stores");
    sim.settle();
    assert_eq!(sim.pass(), vec![create("engine", 0, "v1")]);
}

#[test]
fn dependents_freeze_while_a_dependency_is_unready() {
    let mut sim = Sim::new(vec![role("master", 1, &[]), role("store", 2, &["master"])]);
    sim.run_to_completion(20);
    // Master falls back to unready; a store template change must wait.
    sim.inst("master", 0).expect("master").ready = false;
    sim.new_revision("store", "v2", "s1");
    assert!(sim.pass().is_empty());
    // Scale-up is frozen too.
    sim.roles[1].replicas = 3;
    assert!(sim.pass().is_empty());
    sim.inst("master", 0).expect("master").ready = true;
    // The new index 2 is unavailable until ready: it uses up maxUnavailable.
    assert_eq!(sim.pass(), vec![create("store", 2, "v2")]);
    sim.settle();
    assert_eq!(sim.pass(), vec![in_place("store", 1, "v2")]);
}

#[test]
fn replicas_alone_change_nothing_else() {
    let mut sim = Sim::new(vec![role("store", 3, &[])]);
    sim.run_to_completion(20);
    sim.roles[0].replicas = 5;
    assert_eq!(
        sim.pass(),
        vec![create("store", 3, "v1"), create("store", 4, "v1")]
    );
    sim.settle();
    sim.roles[0].replicas = 2;
    let acts = sim.pass();
    assert!(acts
        .iter()
        .all(|a| matches!(a, Action::Delete { index, .. } if *index >= 2)));
    assert_eq!(acts.len(), 3);
    assert!(sim
        .log
        .iter()
        .all(|a| !matches!(a, Action::RestartInPlace { .. } | Action::Recreate { .. })));
}

#[test]
fn rolling_update_in_place_one_at_a_time_in_decreasing_order() {
    let mut sim = Sim::new(vec![role("store", 3, &[])]);
    sim.run_to_completion(20);
    sim.log.clear();
    sim.new_revision("store", "v2", "s1"); // image-only change
    let mut steps = Vec::new();
    for _ in 0..10 {
        let acts = sim.pass();
        // Never more than maxUnavailable (1) unready.
        assert!(3 - sim.ready("store") <= 1, "{acts:?}");
        steps.push(acts);
        sim.settle();
    }
    let steps: Vec<Vec<Action>> = steps.into_iter().filter(|s| !s.is_empty()).collect();
    assert_eq!(
        steps,
        vec![
            vec![in_place("store", 2, "v2")],
            vec![in_place("store", 1, "v2")],
            vec![in_place("store", 0, "v2")],
        ]
    );
    assert_eq!(sim.revisions("store"), vec!["v2", "v2", "v2"]);
}

#[test]
fn update_waits_for_the_previous_instance_to_be_ready() {
    let mut sim = Sim::new(vec![role("store", 3, &[])]);
    sim.run_to_completion(20);
    sim.new_revision("store", "v2", "s1");
    sim.not_ready_for.insert(("store".into(), 2), 3);
    assert_eq!(sim.pass(), vec![in_place("store", 2, "v2")]);
    for _ in 0..3 {
        sim.settle();
        assert!(sim.pass().is_empty(), "index 1 must wait for index 2");
    }
    sim.settle();
    assert_eq!(sim.pass(), vec![in_place("store", 1, "v2")]);
}

#[test]
fn in_place_only_when_allowed_and_images_only() {
    // (update type, new shape, expect in place)
    let cases = [
        (UpdateType::InPlaceIfPossible, "s1", true),
        (UpdateType::InPlaceIfPossible, "s2", false),
        (UpdateType::Recreate, "s1", false),
        (UpdateType::Recreate, "s2", false),
    ];
    for (kind, shape, want_in_place) in cases {
        let mut r = role("store", 1, &[]);
        r.update.kind = kind;
        let mut sim = Sim::new(vec![r]);
        sim.run_to_completion(20);
        sim.new_revision("store", "v2", shape);
        let acts = sim.pass();
        let want = if want_in_place {
            in_place("store", 0, "v2")
        } else {
            recreate("store", 0, "v2")
        };
        assert_eq!(acts, vec![want], "{kind:?} {shape}");
    }
}

#[test]
fn max_unavailable_counts_and_percentages() {
    // (replicas, maxUnavailable, first step size)
    let cases = [
        (4, Amount::Count(2), 2),
        (10, Amount::Percent(30), 3),
        (10, Amount::Percent(5), 1), // rounds to 0 with maxSurge 0: one at a time
        (3, Amount::Count(5), 3),
    ];
    for (n, mu, first) in cases {
        let mut r = role("r", n, &[]);
        r.update.max_unavailable = mu;
        let mut sim = Sim::new(vec![r]);
        sim.run_to_completion(40);
        sim.new_revision("r", "v2", "s1");
        let acts = sim.pass();
        assert_eq!(acts.len(), first, "{n} {mu:?}");
        // Highest indexes first.
        let idx: Vec<u32> = acts
            .iter()
            .map(|a| match a {
                Action::RestartInPlace { index, .. } => *index,
                other => panic!("{other:?}"),
            })
            .collect();
        let want: Vec<u32> = (n - first as u32..n).rev().collect();
        assert_eq!(idx, want);
        sim.settle();
        sim.run_to_completion(40);
        assert!(sim.revisions("r").iter().all(|r| r == "v2"));
    }
}

#[test]
fn partition_leaves_low_indexes_alone() {
    // (replicas, partition, indexes expected to stay at v1)
    let cases = [
        (4, Amount::Count(0), vec![]),
        (4, Amount::Count(2), vec![0, 1]),
        (4, Amount::Count(4), vec![0, 1, 2, 3]),
        (10, Amount::Percent(20), vec![0, 1]),
        (9, Amount::Percent(20), vec![0, 1]), // 1.8 rounds up
    ];
    for (n, partition, stay) in cases {
        let mut r = role("r", n, &[]);
        r.update.partition = partition;
        let mut sim = Sim::new(vec![r]);
        sim.run_to_completion(60);
        sim.new_revision("r", "v2", "s1");
        sim.run_to_completion(60);
        for (i, rev) in sim.revisions("r").iter().enumerate() {
            let want = if stay.contains(&(i as u32)) {
                "v1"
            } else {
                "v2"
            };
            assert_eq!(rev, want, "n={n} {partition:?} index {i}");
        }
    }
}

#[test]
fn missing_instance_below_partition_comes_back_at_current_revision() {
    let mut r = role("r", 3, &[]);
    r.update.partition = Amount::Count(2);
    let mut sim = Sim::new(vec![r]);
    sim.run_to_completion(20);
    sim.new_revision("r", "v2", "s1");
    sim.roles[0].current_revision = Some("v1".into());
    sim.run_to_completion(20);
    sim.observed
        .get_mut("r")
        .expect("role")
        .retain(|i| i.index != 0);
    assert_eq!(sim.pass(), vec![create("r", 0, "v1")]);
}

#[test]
fn max_surge_adds_then_removes_extra_instances() {
    let mut r = role("r", 3, &[]);
    r.update.max_surge = Amount::Count(1);
    r.update.max_unavailable = Amount::Count(0);
    let mut sim = Sim::new(vec![r]);
    sim.run_to_completion(20);
    sim.log.clear();
    sim.new_revision("r", "v2", "s1");
    let mut max_instances = 0;
    for _ in 0..30 {
        sim.pass();
        // maxUnavailable 0: never fewer than 3 ready among the wanted ones,
        // counting the surge instance.
        assert!(sim.ready("r") >= 3 || sim.observed["r"].iter().filter(|i| i.ready).count() >= 3);
        max_instances = max_instances.max(sim.observed["r"].len());
        sim.settle();
    }
    assert_eq!(max_instances, 4, "exactly one surge instance");
    assert_eq!(sim.log.first(), Some(&create("r", 3, "v2")));
    assert!(sim.log.contains(&Action::Delete {
        role: "r".into(),
        index: 3
    }));
    assert_eq!(sim.revisions("r"), vec!["v2", "v2", "v2"]);
}

fn pd_sim(prefill: u32, decode: u32, skew: f64, max_unavailable: Amount) -> Sim {
    let mut p = role("prefill", prefill, &[]);
    let mut d = role("decode", decode, &[]);
    p.update.max_unavailable = max_unavailable;
    d.update.max_unavailable = max_unavailable;
    let mut sim = Sim::new(vec![p, d]);
    sim.coordination = vec![CoordinationPolicy {
        name: "pd".into(),
        roles: vec!["prefill".into(), "decode".into()],
        rolling_update: Some(RolloutCoordination {
            max_skew: skew,
            partition: None,
            max_unavailable: None,
        }),
        scaling: None,
    }];
    sim.run_to_completion(50);
    sim
}

#[test]
fn max_skew_200_100_holds_at_every_step() {
    for mu in [
        Amount::Count(1),
        Amount::Count(7),
        Amount::Percent(20),
        Amount::Percent(100),
    ] {
        let mut sim = pd_sim(200, 100, 0.10, mu);
        sim.new_revision("prefill", "v2", "s1");
        sim.new_revision("decode", "v2", "s1");
        let c = sim.coordination[0].clone();
        let mut done = false;
        for step in 0..2000 {
            sim.pass();
            for ready_only in [false, true] {
                let s = coordination_skew(&c, &sim.roles, &sim.observed, ready_only);
                assert!(
                    s <= 0.10 + 1e-9,
                    "{mu:?} step {step}: skew {s} (ready_only={ready_only})"
                );
            }
            sim.settle();
            if sim.revisions("prefill").iter().all(|r| r == "v2")
                && sim.revisions("decode").iter().all(|r| r == "v2")
                && sim.ready("prefill") == 200
                && sim.ready("decode") == 100
            {
                done = true;
                break;
            }
        }
        assert!(done, "{mu:?}: rollout did not finish");
    }
}

#[test]
fn max_skew_slowest_role_moves_first() {
    let mut sim = pd_sim(200, 100, 0.10, Amount::Percent(100));
    sim.new_revision("prefill", "v2", "s1");
    sim.new_revision("decode", "v2", "s1");
    // Hold decode back: prefill may run at most 10% ahead of it.
    let acts = sim.pass();
    let count = |role: &str| count_restarts(&acts, role);
    assert_eq!(count("prefill"), 20);
    assert_eq!(count("decode"), 10);
    // Decode instances stay unready: prefill must not advance further.
    for i in 0..100 {
        sim.not_ready_for.insert(("decode".into(), i), 5);
    }
    sim.settle();
    assert!(sim
        .pass()
        .iter()
        .all(|a| !matches!(a, Action::RestartInPlace { role, .. } if role == "prefill")));
}

#[test]
fn coordination_overrides_partition_and_max_unavailable() {
    let mut sim = pd_sim(10, 20, 1.0, Amount::Count(1));
    if let Some(ru) = sim.coordination[0].rolling_update.as_mut() {
        ru.partition = Some(Amount::Percent(50));
        ru.max_unavailable = Some(Amount::Percent(20));
    }
    sim.new_revision("prefill", "v2", "s1");
    sim.new_revision("decode", "v2", "s1");
    let acts = sim.pass();
    let count = |role: &str| count_restarts(&acts, role);
    assert_eq!((count("prefill"), count("decode")), (2, 4));
    sim.settle();
    sim.run_to_completion(100);
    let updated = |role: &str| sim.revisions(role).iter().filter(|r| *r == "v2").count();
    assert_eq!((updated("prefill"), updated("decode")), (5, 10));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Random readiness delays and sizes: the bound holds at every step and
    /// the rollout always finishes.
    #[test]
    fn max_skew_bound_under_random_delays(
        a in 1u32..60, b in 1u32..60, skew_pct in 1u32..60,
        mu in 1u32..10, delays in proptest::collection::vec(0u32..4, 120),
    ) {
        let skew = f64::from(skew_pct) / 100.0;
        let mut sim = pd_sim(a, b, skew, Amount::Count(mu));
        sim.new_revision("prefill", "v2", "s1");
        sim.new_revision("decode", "v2", "s1");
        let c = sim.coordination[0].clone();
        // The bound is exact when one instance of the smaller role is finer
        // than maxSkew; otherwise it is one instance wide.
        let grain = 1.0 / f64::from(a.min(b));
        let bound = skew.max(grain) + 1e-9;
        let mut k = 0;
        let mut finished = false;
        for _ in 0..3000 {
            let acts = sim.pass();
            for act in &acts {
                if let Action::RestartInPlace { role, index, .. } = act {
                    sim.not_ready_for.insert((role.clone(), *index), delays[k % delays.len()]);
                    k += 1;
                }
            }
            let s = coordination_skew(&c, &sim.roles, &sim.observed, false);
            prop_assert!(s <= bound, "skew {} > {}", s, bound);
            sim.settle();
            if sim.revisions("prefill").iter().all(|r| r == "v2")
                && sim.revisions("decode").iter().all(|r| r == "v2")
                && sim.ready("prefill") == a && sim.ready("decode") == b {
                finished = true;
                break;
            }
        }
        prop_assert!(finished);
    }

    /// Planning twice on the same observations gives the same plan.
    #[test]
    fn plan_is_deterministic(n in 0u32..8, ready_mask in 0u32..256, rev_mask in 0u32..256) {
        let mut r = role("r", n, &[]);
        r.revision = "v2".into();
        let mut obs = Observed::new();
        obs.insert("r".into(), (0..8).filter(|i| (ready_mask >> 7) & 1 == 0 || *i < n).map(|i| ObservedInstance {
            index: i,
            revision: if rev_mask >> i & 1 == 1 { "v2".into() } else { "v1".into() },
            shape: "s1".into(),
            ready: ready_mask >> i & 1 == 1,
            running: true,
            restarts: 0,
            crash: None,
            busy: false,
        }).collect());
        let roles = vec![r];
        let input = PlanInput { roles: &roles, coordination: &[], observed: &obs, now: 0, backoff: Backoff::default() };
        prop_assert_eq!(plan(input), plan(input));
    }
}

fn scaling_sim(a: u32, b: u32, skew: f64, progression: Progression) -> Sim {
    let mut sim = Sim::new(vec![role("prefill", a, &[]), role("decode", b, &[])]);
    sim.coordination = vec![CoordinationPolicy {
        name: "pd".into(),
        roles: vec!["prefill".into(), "decode".into()],
        rolling_update: None,
        scaling: Some(ScalingCoordination {
            max_skew: skew,
            progression,
        }),
    }];
    sim
}

fn count_restarts(acts: &[Action], role: &str) -> usize {
    acts.iter()
        .filter(|a| matches!(a, Action::RestartInPlace { role: r, .. } if r == role))
        .count()
}

fn count_creates(acts: &[Action], role: &str) -> usize {
    acts.iter()
        .filter(|a| matches!(a, Action::Create { role: r, .. } if r == role))
        .count()
}

/// Creates of `(prefill, decode)` among `acts`.
fn pd_creates(acts: &[Action]) -> (usize, usize) {
    (
        count_creates(acts, "prefill"),
        count_creates(acts, "decode"),
    )
}

#[test]
fn scaling_progression_order_ready() {
    // target = min(desired, ceil((minProgress + maxSkew) × desired))
    let mut sim = scaling_sim(10, 4, 0.25, Progression::OrderReady);
    let acts = sim.pass();
    // minProgress 0: ceil(0.25×10)=3, ceil(0.25×4)=1.
    assert_eq!(pd_creates(&acts), (3, 1));
    // Nothing is ready yet: OrderReady waits.
    assert!(sim.pass().is_empty());
    sim.settle();
    // minProgress = min(3/10, 1/4) = 0.25: ceil(0.5×10)=5, ceil(0.5×4)=2.
    let acts = sim.pass();
    assert_eq!(pd_creates(&acts), (2, 1));
    sim.settle();
    // minProgress = min(0.5, 0.5): ceil(0.75×10)=8, ceil(0.75×4)=3.
    let acts = sim.pass();
    assert_eq!(pd_creates(&acts), (3, 1));
    sim.settle();
    let acts = sim.pass();
    assert_eq!(pd_creates(&acts), (2, 1));
    sim.settle();
    assert!(sim.pass().is_empty());
    assert_eq!((sim.ready("prefill"), sim.ready("decode")), (10, 4));
}

#[test]
fn scaling_progression_order_scheduled_does_not_wait_for_readiness() {
    let mut sim = scaling_sim(10, 4, 0.25, Progression::OrderScheduled);
    let mut steps = Vec::new();
    for _ in 0..6 {
        let acts = sim.pass();
        steps.push(pd_creates(&acts));
    }
    // Instances count once started, so each pass steps without readiness.
    assert_eq!(steps, vec![(3, 1), (2, 1), (3, 1), (2, 1), (0, 0), (0, 0)]);
}

#[test]
fn scaling_with_zero_skew_still_progresses() {
    let mut sim = scaling_sim(3, 3, 0.0, Progression::OrderReady);
    sim.run_to_completion(30);
    assert_eq!((sim.ready("prefill"), sim.ready("decode")), (3, 3));
}

fn crashed(sim: &mut Sim, role: &str, index: u32, at: u64, streak: u32) {
    let i = sim.inst(role, index).expect("instance");
    i.ready = false;
    i.running = false;
    i.restarts += 1;
    i.crash = Some(Crash { at, streak });
}

#[test]
fn restart_policies() {
    let cases = [
        (RestartPolicy::None, in_place("store", 1, "v1")),
        (
            RestartPolicy::RecreateRoleInstanceOnPodRestart,
            recreate("store", 1, "v1"),
        ),
    ];
    for (policy, want) in cases {
        let mut store = role("store", 2, &["master"]);
        store.restart_policy = policy;
        let mut sim = Sim::new(vec![role("master", 1, &[]), store]);
        sim.run_to_completion(20);
        let t = sim.now;
        crashed(&mut sim, "store", 1, t, 1);
        // Within the backoff: wait.
        let p = plan(PlanInput {
            roles: &sim.roles,
            coordination: &[],
            observed: &sim.observed,
            now: t + 999,
            backoff: Backoff::default(),
        });
        assert!(p.actions.is_empty(), "{policy:?}");
        assert_eq!(
            p.waiting,
            vec![Wait::Backoff {
                role: "store".into(),
                index: 1,
                until: t + 1000
            }]
        );
        sim.now = t + 1000;
        assert_eq!(sim.pass(), vec![want], "{policy:?}");
    }
}

#[test]
fn crash_restarts_are_not_gated_by_dependencies() {
    let mut sim = Sim::new(vec![role("master", 1, &[]), role("store", 1, &["master"])]);
    sim.run_to_completion(20);
    sim.inst("master", 0).expect("m").ready = false;
    let t = sim.now;
    crashed(&mut sim, "store", 0, t, 1);
    sim.now += 5000;
    assert_eq!(sim.pass(), vec![in_place("store", 0, "v1")]);
}

#[test]
fn recreate_group_on_pod_restart_rebuilds_in_order() {
    let mut store = role("store", 2, &["master"]);
    store.restart_policy = RestartPolicy::RecreateRBGOnPodRestart;
    let mut sim = Sim::new(vec![
        role("master", 1, &[]),
        store,
        role("engine", 1, &["store"]),
    ]);
    sim.run_to_completion(20);
    sim.log.clear();
    let t = sim.now;
    crashed(&mut sim, "store", 0, t, 1);
    sim.now += 1000;
    let acts = sim.pass();
    assert_eq!(acts.len(), 1);
    assert!(matches!(&acts[0], Action::RecreateGroup { reason } if reason.contains("store-0")));
    sim.run_to_completion(20);
    let order: Vec<String> = sim
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Create { role, .. } => Some(role.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(order, vec!["master", "store", "store", "engine"]);
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let b = Backoff {
        base_ms: 1000,
        max_ms: 10_000,
    };
    let got: Vec<u64> = (1..=6).map(|s| b.delay(s)).collect();
    assert_eq!(got, vec![1000, 2000, 4000, 8000, 10_000, 10_000]);
    assert_eq!(b.delay(u32::MAX), 10_000);
}
