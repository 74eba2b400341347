//! `rbg`: run a RoleBasedGroup (`workloads.x-k8s.io/v1alpha1`) — a group of
//! cooperating roles with dependencies, discovery and rolling updates.
//!
//! The crate is split the way STYLE.md asks: [`spec`] parses and validates
//! the user's YAML, [`planner`] decides what to do (pure, table-tested,
//! shared with a future Kubernetes operator), [`discovery`] computes names,
//! addresses, environments and the discovery file (pure), and [`runtime`]
//! is the thin I/O shell that runs the group as local processes.
//!
//! [`graph`], [`naming`], [`field_path`] and [`merge`] are leaves that
//! depend on nothing else in the crate: spec validation and the
//! planner/discovery both need them. The module graph is acyclic, and
//! `crates/kvpool/tests/architecture.rs` checks it: `spec` never reaches
//! into `planner`, `discovery` or `status` (the status *shape*, which the
//! custom resources carry, lives in `spec`; [`status`] computes it from the
//! planner's view), so `status` and `planner` can read the spec freely.

pub mod discovery;
pub mod field_path;
pub mod graph;
pub mod merge;
pub mod naming;
pub mod operator;
pub mod planner;
pub mod revision;
pub mod runtime;
pub mod spec;
pub mod status;
