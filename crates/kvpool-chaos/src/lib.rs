//! kvpool's chaos harness: a multi-host pool built in network namespaces
//! (etcd, HA masters, stores, client processes, each on its own address),
//! faults drawn from a seed (kills, pauses, partitions, one-way loss, full
//! disks, in-place upgrades), a workload whose every call is recorded, and
//! a checker that reads the record against the pool's guarantees.
//!
//! Modules: [`schedule`] (the faults, pure), [`value`] (self-describing
//! values), [`history`] (the record), [`checker`] (the rules, pure),
//! [`leaders`] (who led on which build, from the logs),
//! [`net`] (namespaces and link faults), [`procs`] (process supervision),
//! [`workload`] (the client processes), [`campaign`] (the coordinator).
//! How to run it and read its reports: `docs/chaos.md`.

pub mod campaign;
pub mod checker;
pub mod history;
pub mod leaders;
pub mod net;
pub mod procs;
pub mod schedule;
pub mod value;
pub mod workload;

/// Logs to stderr at `KVPOOL_LOG` (default `info`), for the harness's own processes.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KVPOOL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
