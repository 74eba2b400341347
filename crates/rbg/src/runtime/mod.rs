//! The local runtime: runs a group as processes on one machine (RBG.md §6).
//!
//! [`supervisor`] is the loop around the planner; [`process`] starts and
//! signals process groups; [`probe`] runs readiness probes; [`images`]
//! resolves container images to local commands; [`control`] is the socket
//! `rbg apply/status/down` talk to; [`state`] lays out the state directory
//! and the status types they exchange; [`launch`] is the pure launch plan
//! of an instance (dirs, mounts, argv, env, probe, grace) the supervisor
//! carries out.

pub mod control;
pub mod images;
pub mod launch;
pub mod probe;
pub mod process;
pub mod state;
pub mod supervisor;

pub use supervisor::{run, Options, RuntimeError};
