//! The fault schedule: a pure function from a seed, the topology and a
//! scenario to the list of faults to inject, when, and for how long. The
//! same seed gives the same schedule (the generator is SplitMix64, defined
//! here so no library upgrade changes it); the interleaving with the
//! workload is the one thing a rerun does not reproduce.
//!
//! Faults may overlap (at most `max_concurrent` at once), but never two on
//! one host, and a bridge split never overlaps another network fault, so
//! every fault heals by undoing exactly what it did.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// SplitMix64: a small, fixed pseudo-random generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift: no modulo bias worth caring about at these sizes.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// A duration uniform in `lo..=hi`, at millisecond resolution.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        Duration::from_millis(self.between(lo.as_millis() as u64, hi.as_millis() as u64))
    }

    /// A seed for a sub-stream named by `salt` (a worker, a phase).
    pub fn derive(seed: u64, salt: u64) -> u64 {
        Rng::new(seed ^ salt.wrapping_mul(0x2545_f491_4f6c_dd1d)).next_u64()
    }
}

/// What a host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Role {
    /// An etcd member.
    Etcd,
    /// A `kvpool master` (HA).
    Master,
    /// A `kvpool store`.
    Store,
    /// A workload client process.
    Client,
}

impl Role {
    /// The host-name prefix.
    pub fn name(self) -> &'static str {
        match self {
            Role::Etcd => "etcd",
            Role::Master => "master",
            Role::Store => "store",
            Role::Client => "client",
        }
    }
}

/// One host of the pool: a network namespace with one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Host {
    /// What it runs.
    pub role: Role,
    /// Its number among hosts of that role.
    pub idx: usize,
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.role.name(), self.idx)
    }
}

/// How many hosts of each role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// etcd members.
    pub etcd: usize,
    /// Masters.
    pub masters: usize,
    /// Stores.
    pub stores: usize,
    /// Workload client processes.
    pub clients: usize,
}

impl Topology {
    /// Every host, etcd first.
    pub fn hosts(&self) -> Vec<Host> {
        let mut v = Vec::new();
        for (role, n) in [
            (Role::Etcd, self.etcd),
            (Role::Master, self.masters),
            (Role::Store, self.stores),
            (Role::Client, self.clients),
        ] {
            v.extend((0..n).map(|idx| Host { role, idx }));
        }
        v
    }

    /// How many hosts run `role`.
    pub fn count(&self, role: Role) -> usize {
        match role {
            Role::Etcd => self.etcd,
            Role::Master => self.masters,
            Role::Store => self.stores,
            Role::Client => self.clients,
        }
    }
}

/// Whom a fault hits: a fixed host, or whichever master leads when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Target {
    /// This host.
    Host(Host),
    /// The master leading at the fault's start.
    Leader,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Host(h) => h.fmt(f),
            Target::Leader => f.write_str("leader"),
        }
    }
}

/// A fault and how it is undone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// `kill -9`; restarted (same data dir, same flags) when the fault ends.
    Kill(Target),
    /// SIGSTOP; SIGCONT when the fault ends.
    Pause(Target),
    /// The host's link down (both directions); up when the fault ends.
    Isolate(Target),
    /// These hosts moved to a second bridge: two halves that cannot talk.
    Split(Vec<Host>),
    /// Packets into the host (`inbound`) or out of it dropped; the other
    /// direction still flows.
    OneWay {
        /// The host.
        target: Target,
        /// Drop what the host receives (else what it sends).
        inbound: bool,
    },
    /// The store's data filesystem filled, and the store restarted on it;
    /// the space is freed when the fault ends.
    DiskFull(usize),
    /// SIGTERM, then a restart on the other copy of the binary (an
    /// in-place upgrade, and a downgrade the next time).
    Upgrade(Target),
}

impl Fault {
    /// The fault's kind, for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill",
            Fault::Pause(_) => "pause",
            Fault::Isolate(_) => "isolate",
            Fault::Split(_) => "split",
            Fault::OneWay { inbound: true, .. } => "drop-inbound",
            Fault::OneWay { inbound: false, .. } => "drop-outbound",
            Fault::DiskFull(_) => "disk-full",
            Fault::Upgrade(_) => "upgrade",
        }
    }

    /// The hosts it names (a leader fault names none until it starts).
    pub fn hosts(&self) -> Vec<Host> {
        match self {
            Fault::Kill(t)
            | Fault::Pause(t)
            | Fault::Isolate(t)
            | Fault::OneWay { target: t, .. }
            | Fault::Upgrade(t) => match t {
                Target::Host(h) => vec![*h],
                Target::Leader => vec![],
            },
            Fault::Split(side) => side.clone(),
            Fault::DiskFull(s) => vec![Host {
                role: Role::Store,
                idx: *s,
            }],
        }
    }

    /// Whether it acts on links (and so must not overlap a split).
    pub fn is_network(&self) -> bool {
        matches!(
            self,
            Fault::Isolate(_) | Fault::Split(_) | Fault::OneWay { .. }
        )
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill(t) | Fault::Pause(t) | Fault::Isolate(t) | Fault::Upgrade(t) => {
                write!(f, "{} {t}", self.kind())
            }
            Fault::OneWay { target, .. } => write!(f, "{} {target}", self.kind()),
            Fault::DiskFull(s) => write!(f, "disk-full store-{s}"),
            Fault::Split(side) => {
                let names: Vec<String> = side.iter().map(Host::to_string).collect();
                write!(f, "split {{{}}} from the rest", names.join(","))
            }
        }
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Planned {
    /// Its number, in start order.
    pub n: u32,
    /// When it starts, from the beginning of the fault phase.
    pub at: Duration,
    /// How long until it is undone.
    pub hold: Duration,
    /// The fault.
    pub fault: Fault,
}

/// What kind of campaign to plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Scenario {
    /// Every kind of fault, overlapping.
    Mixed,
    /// Only kills of the leading master, evenly spaced, for failover times.
    Failover,
    /// Only pauses of the leading master (past its lease), evenly spaced.
    PauseLeader,
    /// Store partitions (link down, one-way loss, splits) and restarts.
    Partition,
    /// Rolling upgrades: one master or store at a time drains and comes
    /// back on the other binary (with an earlier build, see
    /// `CampaignConfig::previous`, a mixed-version pool throughout), and
    /// now and then a store is killed meanwhile.
    Upgrade,
}

impl std::str::FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mixed" => Ok(Scenario::Mixed),
            "failover" => Ok(Scenario::Failover),
            "partition" => Ok(Scenario::Partition),
            "pause-leader" => Ok(Scenario::PauseLeader),
            "upgrade" => Ok(Scenario::Upgrade),
            other => Err(format!(
                "unknown scenario {other:?} (mixed, failover, pause-leader, partition, upgrade)"
            )),
        }
    }
}

/// Knobs of [`plan`].
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    /// Faults active at once, at most.
    pub max_concurrent: usize,
    /// Seconds between leader kills in [`Scenario::Failover`].
    pub failover_every: Duration,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            max_concurrent: 2,
            failover_every: Duration::from_secs(8),
        }
    }
}

/// A random host of `role`.
fn host(rng: &mut Rng, topo: &Topology, role: Role) -> Host {
    Host {
        role,
        idx: rng.below(topo.count(role) as u64) as usize,
    }
}

/// A random fault for `scenario`, with its hold time.
fn draw(rng: &mut Rng, topo: &Topology, scenario: Scenario) -> (Fault, Duration) {
    let ms = Duration::from_millis;
    let secs = Duration::from_secs;
    let any_process = |rng: &mut Rng| -> Target {
        // Weighted towards the roles that hold state: stores and the leader.
        match rng.below(10) {
            0 => Target::Host(host(rng, topo, Role::Etcd)),
            1 | 2 => Target::Leader,
            3 => Target::Host(host(rng, topo, Role::Master)),
            4..=7 => Target::Host(host(rng, topo, Role::Store)),
            _ => Target::Host(host(rng, topo, Role::Client)),
        }
    };
    match scenario {
        Scenario::Failover => (Fault::Kill(Target::Leader), ms(500)),
        Scenario::PauseLeader => (Fault::Pause(Target::Leader), rng.duration(secs(1), secs(5))),
        Scenario::Partition => {
            let store = Target::Host(host(rng, topo, Role::Store));
            match rng.below(6) {
                0 | 1 => (Fault::Isolate(store), rng.duration(secs(1), secs(12))),
                2 => (
                    Fault::OneWay {
                        target: store,
                        inbound: rng.chance(0.5),
                    },
                    rng.duration(secs(1), secs(8)),
                ),
                3 => (split(rng, topo), rng.duration(secs(2), secs(10))),
                4 => (Fault::Kill(store), rng.duration(ms(500), secs(8))),
                _ => (Fault::Pause(store), rng.duration(ms(500), secs(6))),
            }
        }
        Scenario::Upgrade => match rng.below(10) {
            0 | 1 => (Fault::Upgrade(Target::Leader), Duration::ZERO),
            2 => (
                Fault::Upgrade(Target::Host(host(rng, topo, Role::Master))),
                Duration::ZERO,
            ),
            3..=8 => (
                Fault::Upgrade(Target::Host(host(rng, topo, Role::Store))),
                Duration::ZERO,
            ),
            _ => (
                Fault::Kill(Target::Host(host(rng, topo, Role::Store))),
                rng.duration(ms(500), secs(4)),
            ),
        },
        Scenario::Mixed => match rng.below(20) {
            0..=4 => (
                Fault::Kill(any_process(rng)),
                rng.duration(ms(300), secs(6)),
            ),
            5..=7 => (
                Fault::Pause(any_process(rng)),
                rng.duration(ms(300), secs(5)),
            ),
            8..=10 => (
                Fault::Isolate(any_process(rng)),
                rng.duration(secs(1), secs(8)),
            ),
            11 | 12 => (split(rng, topo), rng.duration(secs(2), secs(8))),
            13 | 14 => (
                Fault::OneWay {
                    target: any_process(rng),
                    inbound: rng.chance(0.5),
                },
                rng.duration(secs(1), secs(6)),
            ),
            15 | 16 => (
                Fault::DiskFull(host(rng, topo, Role::Store).idx),
                rng.duration(secs(2), secs(6)),
            ),
            17 => (Fault::Upgrade(Target::Leader), Duration::ZERO),
            _ => (
                Fault::Upgrade(Target::Host(host(rng, topo, Role::Store))),
                Duration::ZERO,
            ),
        },
    }
}

/// A random split: each host on either side, neither side empty.
fn split(rng: &mut Rng, topo: &Topology) -> Fault {
    let hosts = topo.hosts();
    loop {
        let side: Vec<Host> = hosts.iter().copied().filter(|_| rng.chance(0.5)).collect();
        if !side.is_empty() && side.len() < hosts.len() {
            return Fault::Split(side);
        }
    }
}

/// The faults of a campaign of `duration` for `seed`: each starts at `at`
/// and is undone `hold` later, all undone by `duration`.
pub fn plan(
    seed: u64,
    topo: &Topology,
    scenario: Scenario,
    duration: Duration,
    opts: PlanOptions,
) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let mut out: Vec<Planned> = Vec::new();
    let secs = Duration::from_secs;
    // Let the pool warm up before the first fault.
    let mut at = secs(2);
    while at < duration {
        let (fault, mut hold) = draw(&mut rng, topo, scenario);
        // An upgrade waits for the old process to drain and exit.
        if hold.is_zero() {
            hold = secs(1);
        }
        let end = (at + hold).min(duration);
        let hold = end - at;
        let active: Vec<&Planned> = out.iter().filter(|p| p.at + p.hold > at).collect();
        let busy = |h: &Host| active.iter().any(|p| p.fault.hosts().contains(h));
        let leader_busy = |f: &Fault| {
            let leader = |p: &&Planned| {
                p.fault.hosts().is_empty() || p.fault.hosts().iter().any(|h| h.role == Role::Master)
            };
            f.hosts().is_empty() && active.iter().any(leader)
        };
        let split_clash = (fault.is_network()
            && active.iter().any(|p| matches!(p.fault, Fault::Split(_))))
            || (matches!(fault, Fault::Split(_)) && active.iter().any(|p| p.fault.is_network()));
        let etcd_clash = fault.hosts().iter().any(|h| h.role == Role::Etcd)
            && active
                .iter()
                .any(|p| p.fault.hosts().iter().any(|h| h.role == Role::Etcd));
        let ok = active.len() < opts.max_concurrent
            && !hold.is_zero()
            && !fault
                .hosts()
                .iter()
                .any(|h| !matches!(fault, Fault::Split(_)) && busy(h))
            && !leader_busy(&fault)
            && !split_clash
            && !etcd_clash;
        if ok {
            out.push(Planned {
                n: out.len() as u32,
                at,
                hold,
                fault,
            });
        }
        at += match scenario {
            Scenario::Failover | Scenario::PauseLeader => opts.failover_every,
            _ => rng.duration(Duration::from_millis(500), secs(4)),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPO: Topology = Topology {
        etcd: 3,
        masters: 3,
        stores: 4,
        clients: 4,
    };

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let d = Duration::from_secs(120);
        let a = plan(7, &TOPO, Scenario::Mixed, d, PlanOptions::default());
        let b = plan(7, &TOPO, Scenario::Mixed, d, PlanOptions::default());
        let c = plan(8, &TOPO, Scenario::Mixed, d, PlanOptions::default());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.len() > 15, "{} faults in 2 minutes", a.len());
    }

    #[test]
    fn the_generator_is_fixed() {
        // A changed generator would silently change every seed's schedule.
        let mut r = Rng::new(1);
        assert_eq!(r.next_u64(), 0x910a_2dec_8902_5cc1);
        assert_eq!(r.next_u64(), 0xbeeb_8da1_658e_ec67);
    }

    #[test]
    fn faults_never_share_a_host_exceed_the_cap_or_outlive_the_campaign() {
        for seed in 0..200 {
            let d = Duration::from_secs(90);
            let opts = PlanOptions::default();
            for scenario in [Scenario::Mixed, Scenario::Partition, Scenario::Upgrade] {
                let faults = plan(seed, &TOPO, scenario, d, opts);
                for (i, p) in faults.iter().enumerate() {
                    assert!(p.at + p.hold <= d, "{p:?}");
                    assert!(!p.hold.is_zero());
                    let overlapping: Vec<&Planned> = faults[..i]
                        .iter()
                        .filter(|q| q.at + q.hold > p.at)
                        .collect();
                    assert!(
                        overlapping.len() < opts.max_concurrent,
                        "seed {seed}: {p:?}"
                    );
                    for q in &overlapping {
                        if !matches!(p.fault, Fault::Split(_)) {
                            for h in p.fault.hosts() {
                                assert!(
                                    !q.fault.hosts().contains(&h),
                                    "seed {seed}: {p:?} / {q:?}"
                                );
                            }
                        }
                        let split = |f: &Fault| matches!(f, Fault::Split(_));
                        assert!(
                            !(split(&p.fault) && q.fault.is_network()
                                || split(&q.fault) && p.fault.is_network()),
                            "seed {seed}: a split beside {p:?} / {q:?}"
                        );
                    }
                    if let Fault::Split(side) = &p.fault {
                        assert!(!side.is_empty() && side.len() < TOPO.hosts().len());
                    }
                }
            }
        }
    }

    #[test]
    fn a_failover_campaign_kills_the_leader_on_a_beat() {
        let faults = plan(
            3,
            &TOPO,
            Scenario::Failover,
            Duration::from_secs(170),
            PlanOptions::default(),
        );
        assert_eq!(faults.len(), 21);
        for (i, p) in faults.iter().enumerate() {
            assert_eq!(p.fault, Fault::Kill(Target::Leader));
            assert_eq!(p.at, Duration::from_secs(2 + 8 * i as u64));
        }
    }

    #[test]
    fn every_kind_of_fault_is_drawn() {
        let faults = plan(
            11,
            &TOPO,
            Scenario::Mixed,
            Duration::from_secs(600),
            PlanOptions::default(),
        );
        let kinds: std::collections::BTreeSet<&str> =
            faults.iter().map(|p| p.fault.kind()).collect();
        for k in [
            "kill",
            "pause",
            "isolate",
            "split",
            "drop-inbound",
            "drop-outbound",
            "disk-full",
            "upgrade",
        ] {
            assert!(kinds.contains(k), "{k} never drawn: {kinds:?}");
        }
    }
}
