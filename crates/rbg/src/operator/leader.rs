//! Leader election on a `coordination.k8s.io/v1` Lease, so that two or
//! more replicas of `rbg operator` can run and exactly one reconciles.
//!
//! The split is the usual one: [`decide`] is pure (the Lease as read, the
//! local time this replica first saw it in that state, now, my identity →
//! create / acquire / renew / wait) and table-tested; [`Elector`] is the
//! I/O shell that reads the Lease and writes it with optimistic
//! concurrency (a `replace` carries the `resourceVersion` it read, so of
//! two replicas racing for an expired Lease the API server lets one win
//! and answers the other 409 Conflict).
//!
//! Expiry is judged as client-go judges it: not from the holder's
//! `renewTime` (another machine's clock) but from when *this* replica
//! first observed the record unchanged. A holder whose clock runs slow
//! cannot be overthrown early; the price is one extra lease duration
//! after a restart of the waiting replica.
//!
//! A leader that cannot renew for [`RENEW_DEADLINE`] (shorter than the
//! lease duration) considers itself deposed before anybody else may take
//! over, which leaves a margin for its last reconciles to finish.

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::Api;

/// Name of the Lease the operator replicas compete for.
pub const LEASE_NAME: &str = "rbg-operator";
/// How long a Lease stays valid without a renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the leader renews (and a candidate retries).
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How soon a leader tries again after a failed renewal.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How long a leader keeps leading without a successful renewal: less than
/// [`LEASE_DURATION`], so it stops before a candidate may take over.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// What [`decide`] needs of a Lease as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.holderIdentity`; `None` or empty when released.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds` (0 when unset: treated as
    /// [`LEASE_DURATION`]).
    pub duration_secs: i64,
    /// `spec.renewTime` in Unix microseconds, as the holder wrote it.
    pub renew_us: Option<i64>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
}

impl LeaseView {
    /// The parts of `lease` the decision reads.
    pub fn of(lease: &Lease) -> LeaseView {
        let spec = lease.spec.clone().unwrap_or_default();
        LeaseView {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            duration_secs: i64::from(spec.lease_duration_seconds.unwrap_or(0)),
            renew_us: spec.renew_time.map(|t| t.0.as_microsecond()),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What a replica does with the Lease on one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it, holding it.
    Create,
    /// Released or expired: take it over (one more transition).
    Acquire,
    /// Mine: write a fresh `renewTime`.
    Renew,
    /// Someone else holds it; it expires (by my clock) in `remaining`.
    Wait {
        /// The current holder.
        holder: String,
        /// Time left before it may be taken over, at the earliest.
        remaining: Duration,
    },
}

/// The decision for `me` given `lease` as read; `observed_us` is the local
/// time (Unix microseconds) at which this replica first saw the Lease in
/// this state, `now_us` the local time now.
pub fn decide(lease: Option<&LeaseView>, observed_us: i64, now_us: i64, me: &str) -> Decision {
    let Some(l) = lease else {
        return Decision::Create;
    };
    let Some(holder) = l.holder.as_deref() else {
        return Decision::Acquire;
    };
    if holder == me {
        return Decision::Renew;
    }
    let duration_us = if l.duration_secs > 0 {
        l.duration_secs.saturating_mul(1_000_000)
    } else {
        i64::try_from(LEASE_DURATION.as_micros()).unwrap_or(i64::MAX)
    };
    let expires = observed_us.saturating_add(duration_us);
    if now_us >= expires {
        Decision::Acquire
    } else {
        Decision::Wait {
            holder: holder.to_string(),
            remaining: Duration::from_micros(u64::try_from(expires - now_us).unwrap_or(0)),
        }
    }
}

/// What one round of [`Elector::round`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This replica holds the Lease (created, acquired or renewed now).
    Leading,
    /// Someone else holds it, or won the race for it.
    Following {
        /// The holder, when known.
        holder: Option<String>,
    },
}

impl Outcome {
    /// Whether a leader seeing this outcome has been deposed: someone else
    /// holds the Lease. A refused write on a Lease that was still mine (a
    /// Conflict after another client touched it) is not: the next round
    /// reads it again, within the renew deadline.
    pub fn deposes(&self, me: &str) -> bool {
        matches!(self, Outcome::Following { holder } if holder.as_deref() != Some(me))
    }
}

/// The Lease as last read and when this replica first saw it so.
struct Seen {
    view: LeaseView,
    resource_version: Option<String>,
    at_us: i64,
}

/// Competes for one Lease on behalf of one replica (the I/O shell around
/// [`decide`]).
pub struct Elector {
    api: Api<Lease>,
    name: String,
    me: String,
    duration: Duration,
    seen: Mutex<Option<Seen>>,
}

fn micro_time(us: i64) -> Option<MicroTime> {
    k8s_openapi::jiff::Timestamp::from_microsecond(us)
        .ok()
        .map(MicroTime)
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Elector {
    /// An elector for Lease `name` in `api`'s namespace, as identity `me`
    /// (unique per replica: the Pod name).
    pub fn new(api: Api<Lease>, name: &str, me: &str) -> Elector {
        Elector {
            api,
            name: name.to_string(),
            me: me.to_string(),
            duration: LEASE_DURATION,
            seen: Mutex::new(None),
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.me
    }

    /// One round at local time `now_us` (Unix microseconds): read the
    /// Lease, decide, and write it if the decision says so. A conflict on
    /// the write means another replica won this round: following, not an
    /// error.
    pub async fn round(&self, now_us: i64) -> Result<Outcome, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let view = current.as_ref().map(LeaseView::of);
        let rv = current
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone());
        let observed_us = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            match (&*seen, &view) {
                // Unchanged since last round: keep the first observation.
                (Some(s), Some(v)) if &s.view == v && s.resource_version == rv => s.at_us,
                (_, Some(v)) => {
                    *seen = Some(Seen {
                        view: v.clone(),
                        resource_version: rv.clone(),
                        at_us: now_us,
                    });
                    now_us
                }
                (_, None) => {
                    *seen = None;
                    now_us
                }
            }
        };
        let decision = decide(view.as_ref(), observed_us, now_us, &self.me);
        let write = |transitions: i32, acquire_us: Option<i64>| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: rv.clone(),
                ..current
                    .as_ref()
                    .map(|l| l.metadata.clone())
                    .unwrap_or_default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.clone()),
                lease_duration_seconds: i32::try_from(self.duration.as_secs()).ok(),
                acquire_time: acquire_us.and_then(micro_time).or_else(|| {
                    current
                        .as_ref()
                        .and_then(|l| l.spec.as_ref())
                        .and_then(|s| s.acquire_time.clone())
                }),
                renew_time: micro_time(now_us),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        };
        let transitions = view.as_ref().map_or(0, |v| v.transitions);
        let result = match decision {
            Decision::Wait { holder, .. } => {
                return Ok(Outcome::Following {
                    holder: Some(holder),
                })
            }
            Decision::Create => self
                .api
                .create(&PostParams::default(), &write(0, Some(now_us)))
                .await
                .map(|_| ()),
            Decision::Acquire => self
                .api
                .replace(
                    &self.name,
                    &PostParams::default(),
                    &write(transitions + 1, Some(now_us)),
                )
                .await
                .map(|_| ()),
            Decision::Renew => self
                .api
                .replace(
                    &self.name,
                    &PostParams::default(),
                    &write(transitions, None),
                )
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => Ok(Outcome::Leading),
            Err(e) if conflict(&e) => Ok(Outcome::Following {
                holder: view.and_then(|v| v.holder),
            }),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up (holder cleared), so another replica takes over
    /// at once rather than after the lease duration; only if still mine.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        if LeaseView::of(&lease).holder.as_deref() != Some(self.me.as_str()) {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Unix microseconds now, by the wall clock.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The clock the operator hands to [`Elector::round`]: the wall clock at
/// start plus tokio's monotonic time since. Expiry is measured on it, so a
/// wall-clock step (NTP) cannot expire or prolong a Lease, and tests with
/// paused tokio time move it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_us: i64,
    start: tokio::time::Instant,
}

impl Clock {
    /// A clock reading the wall clock now.
    pub fn start() -> Clock {
        Clock {
            base_us: now_us(),
            start: tokio::time::Instant::now(),
        }
    }

    /// Unix microseconds now by this clock.
    pub fn now_us(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_micros()).unwrap_or(i64::MAX);
        self.base_us.saturating_add(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn held(by: &str, renew_s: i64) -> LeaseView {
        LeaseView {
            holder: Some(by.into()),
            duration_secs: 15,
            renew_us: Some(renew_s * S),
            transitions: 3,
        }
    }

    #[test]
    fn decisions() {
        let wait = |holder: &str, secs: u64| Decision::Wait {
            holder: holder.into(),
            remaining: Duration::from_secs(secs),
        };
        let released = LeaseView {
            holder: None,
            ..held("a", 0)
        };
        let no_duration = LeaseView {
            duration_secs: 0,
            ..held("b", 100)
        };
        // (lease, first observed at s, now s, me, decision)
        let table: Vec<(Option<LeaseView>, i64, i64, &str, Decision)> = vec![
            (None, 0, 100, "a", Decision::Create),
            (Some(released), 100, 100, "a", Decision::Acquire),
            (Some(held("a", 90)), 90, 100, "a", Decision::Renew),
            // Mine even when long expired: renewing is still right.
            (Some(held("a", 0)), 0, 100, "a", Decision::Renew),
            (Some(held("b", 100)), 100, 100, "a", wait("b", 15)),
            (Some(held("b", 100)), 100, 110, "a", wait("b", 5)),
            (Some(held("b", 100)), 100, 115, "a", Decision::Acquire),
            (Some(held("b", 100)), 100, 200, "a", Decision::Acquire),
            // renewTime long past by my clock, but only just observed:
            // the holder's clock may be slow, so wait a full duration.
            (Some(held("b", 10)), 100, 101, "a", wait("b", 14)),
            // Unset duration: the default 15 s.
            (Some(no_duration), 100, 110, "a", wait("b", 5)),
        ];
        for (lease, observed, now, me, want) in table {
            let got = decide(lease.as_ref(), observed * S, now * S, me);
            assert_eq!(got, want, "{lease:?} observed {observed} now {now} me {me}");
        }
    }

    #[test]
    fn only_another_holder_deposes() {
        let f = |h: Option<&str>| Outcome::Following {
            holder: h.map(String::from),
        };
        assert!(f(Some("b")).deposes("a"));
        assert!(f(None).deposes("a"), "released by someone: not mine");
        assert!(!f(Some("a")).deposes("a"), "my write refused: retry");
        assert!(!Outcome::Leading.deposes("a"));
    }

    #[test]
    fn renew_deadline_is_inside_the_lease() {
        assert!(RETRY_EVERY < RENEW_EVERY);
        assert!(RENEW_EVERY < RENEW_DEADLINE && RENEW_DEADLINE < LEASE_DURATION);
    }

    #[test]
    fn lease_view_reads_the_spec() {
        let lease = Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(15),
                renew_time: micro_time(7 * S),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            }),
        };
        let v = LeaseView::of(&lease);
        assert_eq!(v.holder, None, "an empty holder is a released lease");
        assert_eq!(
            (v.duration_secs, v.renew_us, v.transitions),
            (15, Some(7 * S), 2)
        );
    }
}
