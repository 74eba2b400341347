//! The `RoleBasedGroup` object (`workloads.x-k8s.io/v1alpha1`) as users write
//! it, and its validation into a [`Group`] the planner and runtimes consume.
//!
//! Field names follow RBG.md §1 and the Kubernetes Pod template. Every level
//! keeps the keys it does not know in an `extra` map instead of rejecting
//! them, so a user's existing file parses; [`Loaded::unimplemented`] names each
//! of them (with its path) so nothing is silently ignored. Validation collects
//! every problem it finds, each message naming the role and the field.
//!
//! `types` holds the serde structs, `amount` counts and percentages,
//! `load` parsing, `validate` and `template` the rules, and `group`
//! the validated model. Everything is re-exported here: callers say
//! `spec::Group`, never `spec::group::Group`.

mod amount;
mod group;
mod load;
mod template;
mod types;
mod validate;

#[cfg(test)]
mod tests;

pub use amount::{Amount, IntOrString};
pub use group::{
    CoordinationPolicy, Group, Role, RolloutCoordination, ScalingCoordination, SpecError,
    UpdatePolicy,
};
pub use load::{load, parse, unimplemented, Loaded};
pub use template::resolve_port;
pub use types::*;
pub use validate::validate;

pub use crate::naming::is_dns_label;
