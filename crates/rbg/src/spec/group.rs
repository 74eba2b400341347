//! The validated model the planner and runtimes consume: a [`Group`] with
//! every template resolved and every count parsed, plus the load error.

use super::amount::Amount;
use super::types::{PodTemplateSpec, Progression, RestartPolicy, ServicePort, UpdateType};

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
    /// Validated coordination entries.
    pub coordination: Vec<CoordinationPolicy>,
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
    /// The resolved Pod template (templateRef and templatePatch applied).
    pub template: PodTemplateSpec,
    /// `workload.kind` (StatefulSet by default).
    pub workload_kind: String,
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
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        UpdatePolicy {
            kind: UpdateType::InPlaceIfPossible,
            max_unavailable: Amount::Count(1),
            max_surge: Amount::Count(0),
            partition: Amount::Count(0),
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
