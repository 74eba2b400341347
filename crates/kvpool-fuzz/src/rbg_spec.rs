//! rbg's inputs: a RoleBasedGroup as YAML text (`rbg up/apply/validate`),
//! taken through validation, the planner and discovery as the local runtime
//! takes it; and the JSON lines of a running group's control socket.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use rbg::discovery::{
    discovery_file, host_table, instance_labels, launch, local_address, InstanceFacts,
};
use rbg::planner::{
    group_levels, plan, Action, Backoff, Crash, DesiredRole, Observed, ObservedInstance, PlanInput,
};
use rbg::runtime::control::{Request, Response};
use rbg::runtime::launch::check_local_limits;
use rbg::spec::Group;

/// Host-table entries beyond which launching is skipped: each container
/// rewrites every argument against the whole table.
const MAX_HOSTS: usize = 2048;

/// YAML text (non-UTF-8 is refused as a file read would); a group that
/// loads and fits the local runtime is planned for a few passes, its
/// discovery file built and its containers' command lines expanded.
pub fn rbg_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Files hold several documents (groups, policies, ConfigMaps, ...).
    let Ok(bundle) = rbg::spec::load_all(text) else {
        return;
    };
    for loaded in &bundle.groups {
        group(&loaded.group);
    }
}

/// One loaded group through levels, discovery, launch and the planner.
fn group(g: &Group) {
    if check_local_limits(g).is_err() {
        return;
    }
    let mut levelled: Vec<String> = group_levels(g).into_iter().flatten().collect();
    let mut names: Vec<String> = g.roles.iter().map(|r| r.name.clone()).collect();
    levelled.sort();
    names.sort();
    assert_eq!(levelled, names, "every role in exactly one level");
    let file = discovery_file(g, &|role, i| format!("{role}-{i}"));
    assert_eq!(file.roles.len(), g.roles.len());
    launch_all(g);
    simulate(g);
}

/// Builds the command line and environment of instance 0 of every
/// container, as the runtime does before starting it.
fn launch_all(g: &Group) {
    let hosts = host_table(g, &|_, i, p| local_address(9, p as u32, i));
    if hosts.len() > MAX_HOSTS {
        return;
    }
    for r in &g.roles {
        let meta = r.template.metadata.as_ref();
        let facts = InstanceFacts {
            group: g.name.clone(),
            namespace: g.namespace.clone(),
            role: r.name.clone(),
            index: 0,
            ip: Ipv4Addr::new(127, 9, 1, 1),
            labels: instance_labels(g, &r.name),
            annotations: meta.map(|m| m.annotations.clone()).unwrap_or_default(),
            node_name: "node".into(),
            config_path: "/tmp/rbg/config.yaml".into(),
            mounts: vec![("/data".into(), "/tmp/rbg/data".into())],
            pod_suffix: String::new(),
            pattern_env: rbg::discovery::pattern_env(g, &r.name, 0, 0),
            objects: g.objects.clone(),
        };
        for c in &r.template.spec.containers {
            let _ = launch(c, &facts, &hosts);
        }
    }
}

/// Runs the planner for a few passes, carrying out its actions on a model
/// of the instances (with a crash on the third pass); every pass must be
/// idempotent and every action must name an instance that can take it.
fn simulate(g: &Group) {
    let roles: Vec<DesiredRole> = g.roles.iter().map(DesiredRole::from_role).collect();
    let mut observed = Observed::new();
    for pass in 0..6u64 {
        let now = pass * 1_000;
        if pass == 2 {
            for i in observed.values_mut().flatten().filter(|i| i.index == 0) {
                i.crash = Some(Crash { at: now, streak: 1 });
                i.ready = false;
            }
        }
        let input = PlanInput {
            roles: &roles,
            coordination: &g.coordination,
            observed: &observed,
            now,
            backoff: Backoff::default(),
        };
        let p = plan(input);
        assert_eq!(plan(input), p, "planning is idempotent");
        for a in &p.actions {
            apply(&mut observed, &roles, a);
        }
    }
}

/// Carries out one planner action on the model, instantly and successfully.
fn apply(observed: &mut Observed, roles: &[DesiredRole], a: &Action) {
    let shape = |role: &str| {
        roles
            .iter()
            .find(|r| r.name == role)
            .map(|r| r.shape.clone())
            .unwrap_or_default()
    };
    match a {
        Action::Create {
            role,
            index,
            revision,
        } => {
            let list = observed.entry(role.clone()).or_default();
            assert!(list.iter().all(|i| i.index != *index), "{a}: exists");
            list.push(ObservedInstance {
                index: *index,
                revision: revision.clone(),
                shape: shape(role),
                ready: true,
                running: true,
                restarts: 0,
                crash: None,
                busy: false,
            });
            list.sort_by_key(|i| i.index);
        }
        Action::Delete { role, index } => {
            let list = observed.entry(role.clone()).or_default();
            list.retain(|i| i.index != *index);
        }
        Action::RestartInPlace {
            role,
            index,
            revision,
        }
        | Action::Recreate {
            role,
            index,
            revision,
        } => {
            let list = observed.entry(role.clone()).or_default();
            let i = list.iter_mut().find(|i| i.index == *index);
            let i = i.unwrap_or_else(|| panic!("{a}: no such instance"));
            i.revision = revision.clone();
            i.shape = shape(role);
            i.crash = None;
            i.ready = true;
            i.running = true;
        }
        Action::RecreateGroup { .. } => *observed = BTreeMap::new(),
    }
}

/// A JSON line of a group's control socket, read as the group (a request)
/// and as the CLI (a response) read it; an `apply` request's spec goes on
/// to [`rbg_spec`].
pub fn rbg_control(data: &[u8]) {
    if let Ok(req) = serde_json::from_slice::<Request>(data) {
        let line = serde_json::to_vec(&req).expect("a request serializes");
        serde_json::from_slice::<Request>(&line).expect("request round trip");
        if let Request::Apply { spec, .. } = req {
            rbg_spec(spec.as_bytes());
        }
    }
    if let Ok(resp) = serde_json::from_slice::<Response>(data) {
        let line = serde_json::to_vec(&resp).expect("a response serializes");
        serde_json::from_slice::<Response>(&line).expect("response round trip");
    }
}
