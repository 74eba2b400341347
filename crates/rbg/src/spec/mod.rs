//! The objects users write (`workloads.x-k8s.io` v1alpha1 and v1alpha2,
//! plus the plain Kubernetes objects around them) and their validation into
//! a [`Group`] the planner and both runtimes consume.
//!
//! Field names follow the upstream CRDs (shared/rbg-crds) and the
//! Kubernetes Pod template. Every level keeps the keys it does not know in
//! an `extra` map instead of rejecting them, so a user's existing file
//! parses; [`Loaded::fields`] names each of them (with its path, as an
//! unknown field or one rbg does not support) so nothing is silently
//! ignored. Validation collects every problem it finds,
//! each message naming the document, role and field.
//!
//! `types` (v1alpha1), `v2` (v1alpha2, also the operator's custom
//! resources) and `pod` hold the serde structs; `convert` turns v1alpha1
//! into v1alpha2; `load` splits a file into documents; `validate` and
//! `template` hold the rules; `walk` reports ignored fields; `group`
//! is the validated model; `schema` the CRD schema helpers; `status` the
//! shape of the custom resources' status block (computed by
//! [`crate::status`]). Everything callers need is re-exported here.

mod amount;
pub mod convert;
mod group;
mod load;
mod pod;
mod schema;
mod status;
mod template;
mod types;
pub mod v2;
mod validate;
mod walk;

#[cfg(test)]
mod tests;

pub use amount::{Amount, IntOrString};
pub use group::{
    CoordinationPolicy, Group, Objects, Pattern, Placement, PodSlot, Role, RolloutCoordination,
    ScalingCoordination, SpecError, UpdatePolicy,
};
pub use load::{load, load_all, Bundle, Loaded};
pub use pod::*;
pub use status::{Condition, RbgStatus, RoleStatusEntry};
pub use template::resolve_port;
pub use types::*;
pub use v2::{PodManagementPolicy, RoleBasedGroupV2};
pub use validate::{validate, validate_v2, Context, EngineProfile};
pub use walk::{
    ignored_fields, ignored_fields_v2, FieldIssue, FieldReport, SpecAt, NOT_SUPPORTED, PROFILE,
};

pub use crate::naming::is_dns_label;
