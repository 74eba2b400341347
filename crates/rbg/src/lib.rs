//! `rbg`: run a RoleBasedGroup (`workloads.x-k8s.io/v1alpha1`) — a group of
//! cooperating roles with dependencies, discovery and rolling updates.
//!
//! The crate is split the way STYLE.md asks: [`spec`] parses and validates
//! the user's YAML, [`planner`] decides what to do (pure, table-tested,
//! shared with a future Kubernetes operator), [`discovery`] computes names,
//! addresses, environments and the discovery file (pure), and [`runtime`]
//! is the thin I/O shell that runs the group as local processes.

pub mod discovery;
pub mod merge;
pub mod planner;
pub mod revision;
pub mod runtime;
pub mod spec;
