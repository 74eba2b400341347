//! The validated model the planner and runtimes consume: a [`Group`] with
//! every template resolved and every count parsed, plus the load error.

use std::collections::BTreeMap;

use super::amount::Amount;
use super::pod::PodTemplateSpec;
use super::types::{Progression, RestartPolicy, ServicePort, UpdateType};

/// Errors from loading a group.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The text is not YAML of the right shape; `path` locates the field.
    #[error("{path}: {message}")]
    Parse {
        /// Dotted path of the offending field (`.` for the document).
        path: String,
        /// What serde_yaml said, with line and column.
        message: String,
    },
    /// The object parsed but breaks the rules of RBG.md; one message each.
    #[error("invalid RoleBasedGroup:\n{}", bullet(.0))]
    Invalid(Vec<String>),
}

fn bullet(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("  - {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A validated group with every template resolved: what the planner plans.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// Group name.
    pub name: String,
    /// Namespace (`default` when absent).
    pub namespace: String,
    /// Roles, in the order written.
    pub roles: Vec<Role>,
    /// Validated coordination entries (v1alpha1 `spec.coordination` and
    /// the rules of CoordinatedPolicy documents bound to the group).
    pub coordination: Vec<CoordinationPolicy>,
    /// Topology constraints: roles' `instanceTopologyConstraint` and the
    /// `scheduling.topologyConstraint` of coordination rules.
    pub placements: Vec<Placement>,
    /// ConfigMaps, Secrets and Services of the same file, for env, volumes
    /// and host names.
    pub objects: Objects,
}

/// The plain Kubernetes objects of a file a local runtime gives meaning to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Objects {
    /// ConfigMap name -> key -> value (`data`, then decoded `binaryData`).
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Secret name -> key -> value (`stringData` over decoded `data`).
    pub secrets: BTreeMap<String, BTreeMap<String, String>>,
    /// Service name -> the role its selector picks, for host names.
    pub services: BTreeMap<String, String>,
}

/// How the Pods of one instance are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// One Pod per instance (`standalonePattern`, v1alpha1 `template`).
    Standalone,
    /// A leader and `size - 1` workers (`leaderWorkerPattern`).
    LeaderWorker {
        /// Pods per instance, the leader included.
        size: u32,
    },
    /// Named components (`customComponentsPattern`).
    CustomComponents,
}

/// One Pod of an instance: instance `g-r-i` has Pods `g-r-i{suffix}`.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSlot {
    /// `""` for a standalone Pod or a leader, `-j` for worker `j`,
    /// `-<component>-<j>` for a component's Pod.
    pub suffix: String,
    /// `""` (standalone), `leader`, `worker`, or the component name.
    pub component: String,
    /// Index within its component (worker index for leader-worker, the
    /// leader being 0).
    pub ordinal: u32,
    /// The resolved template of this Pod.
    pub template: PodTemplateSpec,
}

/// A validated role with its resolved template.
#[derive(Clone, Debug, PartialEq)]
pub struct Role {
    /// Role name.
    pub name: String,
    /// Instances wanted.
    pub replicas: u32,
    /// Roles that must be ready first.
    pub dependencies: Vec<String>,
    /// What a restarted instance triggers.
    pub restart_policy: RestartPolicy,
    /// How instances update.
    pub update: UpdatePolicy,
    /// Named service ports.
    pub service_ports: Vec<ServicePort>,
    /// The first Pod's resolved template (the leader's, for leader-worker);
    /// what per-role settings such as grace and labels are read from.
    pub template: PodTemplateSpec,
    /// Every Pod of an instance, `pods[0].template == template`.
    pub pods: Vec<PodSlot>,
    /// The pattern the Pods come from.
    pub pattern: Pattern,
    /// `workload.kind` (StatefulSet by default).
    pub workload_kind: String,
    /// Seconds an instance must be ready before it counts as available.
    pub min_ready_seconds: u32,
    /// `podManagementPolicy: OrderedReady`: instance `i` waits for `0..i`.
    pub ordered: bool,
    /// `restartPolicyConfig` delays (base, max) in seconds, when given.
    pub restart_delays: Option<(u32, u32)>,
}

impl Group {
    /// The role called `name`.
    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }
}

/// A role's validated rolling-update parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdatePolicy {
    /// In place when possible, or recreate.
    pub kind: UpdateType,
    /// Unready instances allowed during an update.
    pub max_unavailable: Amount,
    /// Extra instances allowed during an update.
    pub max_surge: Amount,
    /// Indexes below this keep their revision.
    pub partition: Amount,
    /// No instance moves to a new revision while set.
    pub paused: bool,
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        UpdatePolicy {
            kind: UpdateType::InPlaceIfPossible,
            max_unavailable: Amount::Count(1),
            max_surge: Amount::Count(0),
            partition: Amount::Count(0),
            paused: false,
        }
    }
}

impl UpdatePolicy {
    /// `partition` as an instance count out of `replicas`. A percentage
    /// rounds up so that "20%" never updates more than 80% of the role.
    pub fn partition_of(&self, replicas: u32) -> u32 {
        self.partition.of(replicas, true).min(replicas)
    }

    /// `maxUnavailable` as an instance count; rounds down, as Kubernetes does.
    pub fn max_unavailable_of(&self, replicas: u32) -> u32 {
        self.max_unavailable.of(replicas, false)
    }

    /// `maxSurge` as an instance count; rounds up, as Kubernetes does.
    pub fn max_surge_of(&self, replicas: u32) -> u32 {
        self.max_surge.of(replicas, true)
    }
}

/// A validated coordination entry.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinationPolicy {
    /// Name, for messages.
    pub name: String,
    /// Roles it covers.
    pub roles: Vec<String>,
    /// Coordinated rollout, if any.
    pub rolling_update: Option<RolloutCoordination>,
    /// Coordinated scaling, if any.
    pub scaling: Option<ScalingCoordination>,
}

/// One validated topology constraint (KEP-473): the Pods it covers land in
/// one domain of a level. Levels are the scheduler's own names; with
/// Kubernetes' default scheduler they are node-label keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Who declared it: `r-<role>` for a role's instance constraint,
    /// `p-<rule>` for a coordination rule's.
    pub name: String,
    /// The roles whose Pods it covers.
    pub roles: Vec<String>,
    /// Each instance of the roles is its own group (a role's
    /// `instanceTopologyConstraint`); otherwise every Pod of the roles is
    /// one group.
    pub per_instance: bool,
    /// The level whose one domain the group must share.
    pub required: Option<String>,
    /// The level whose one domain the group shares when capacity allows.
    pub preferred: Option<String>,
    /// The scheduler's topology resource, where it has one (KAI).
    pub topology_name: Option<String>,
}

/// Validated `strategy.rollingUpdate` of a coordination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RolloutCoordination {
    /// Largest allowed difference of updated fractions, 0..=1.
    pub max_skew: f64,
    /// Overrides the roles' partition.
    pub partition: Option<Amount>,
    /// Overrides the roles' maxUnavailable.
    pub max_unavailable: Option<Amount>,
}

/// Validated `strategy.scaling` of a coordination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalingCoordination {
    /// Largest allowed lead over the slowest role's progress, 0..=1.
    pub max_skew: f64,
    /// When an instance counts as progress.
    pub progression: Progression,
}
