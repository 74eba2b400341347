//! Master high availability: masters of one cluster campaign for a key in
//! etcd held under a lease; the holder leads and publishes its RPC address
//! there (clients and stores given `etcd://...` follow it). etcd holds
//! leadership only: a new leader starts empty and rebuilds the object map
//! from the stores' inventories as they re-mount, answering object calls
//! with a retryable `UNAVAILABLE_IN_CURRENT_STATUS` meanwhile.
//!
//! The leader also keeps in etcd the list of segments that may hold
//! objects, and a new leader expects those back before it answers for keys
//! it does not know (see `state/membership.rs`); and the removals some
//! store has not heard of, which a new leader honours when the store comes
//! back (see `state/tombstones.rs`).
//!
//! A leader that cannot renew its lease within the TTL steps down by exiting
//! (its supervisor restarts it as a standby): it cannot know whether another
//! master has taken over, and must not serve a stale map beside it.

use std::sync::Arc;
use std::time::Duration;

use kvpool_net::etcd::{leader_key, segments_key, tombstones_key, Etcd};
use kvpool_net::tls::TlsClientConfig;
use kvpool_proto::msg::SegmentId;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::state::Tombstone;
use crate::{Master, MasterError, Role};

/// Settings of `--enable-ha`.
#[derive(Debug, Clone)]
pub struct HaConfig {
    /// etcd endpoints, `host:port` separated by `;` or `,`.
    pub etcd_endpoints: String,
    /// Masters with the same id compete for leadership of one pool.
    pub cluster_id: String,
    /// Leadership lease: a dead leader is replaced within about this long.
    pub lease_ttl: Duration,
}

/// Campaigns until `shutdown`; while leading, keeps the lease alive. Returns
/// an error when leadership was lost (the process should exit).
pub async fn run(
    master: Arc<Master>,
    ha: HaConfig,
    etcd_tls: Option<Arc<TlsClientConfig>>,
    advertise: String,
    recovery_grace: Duration,
    shutdown: CancellationToken,
) -> Result<(), MasterError> {
    let etcd =
        Etcd::new(&ha.etcd_endpoints, etcd_tls).map_err(|e| MasterError::Config(e.to_string()))?;
    let key = leader_key(&ha.cluster_id);
    let (lease, granted) = loop {
        // The lease runs from before the request that made it, at the latest.
        let asked = Instant::now();
        let attempt = campaign(&etcd, &key, &advertise, ha.lease_ttl);
        let won = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = attempt => r,
        };
        match won {
            Ok(Some(lease)) => break (lease, asked),
            Ok(None) => {}
            Err(e) => warn!(error = %e, "etcd unreachable while campaigning"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(CAMPAIGN_EVERY) => {}
        }
    };
    // Serve only while the lease surely holds: etcd can let it expire no
    // sooner than a TTL after the last renewal was sent, and a standby can
    // lead from then on. A margin covers clocks that tick a little apart.
    let margin = ha.lease_ttl / 10;
    let mut valid_until = granted + ha.lease_ttl - margin;
    master.lead_until(Some(valid_until));
    info!(%key, %advertise, grace = ?recovery_grace, "elected master leader; rebuilding from the stores");
    master.state.begin_term(Instant::now());
    master.set_role(Role::Recovering(Instant::now() + recovery_grace));
    // The segments the previous leader had: expected back before keys they
    // may hold are answered (see state/membership.rs).
    let segments = segments_key(&ha.cluster_id);
    let listed = read_while_leading(&etcd, &segments, valid_until, "the segment list").await?;
    master
        .state
        .expect_segments(listed.map(|v| parse_segments(&v)), Instant::now());
    let tombstones = tombstones_key(&ha.cluster_id);
    let loaded = read_while_leading(&etcd, &tombstones, valid_until, "the tombstones").await?;
    let loaded = loaded.map(|v| parse_tombstones(&v)).unwrap_or_default();
    master.state.keep_tombstones(loaded, Instant::now());
    let (mut tombs_version, mut tombs_written) = (0, String::new());
    let every = (ha.lease_ttl / 3).max(Duration::from_millis(100));
    let mut next_renewal = Instant::now() + every;
    let mut written: Option<Vec<SegmentId>> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                // Hand over at once instead of making the standbys wait a TTL.
                master.lead_until(Some(Instant::now()));
                let _ = etcd.revoke(lease).await;
                return Ok(());
            }
            // Often enough that a new store takes objects soon after it mounts.
            _ = tokio::time::sleep(MEMBERSHIP_EVERY.min(every)) => {}
        }
        let ids = master.state.membership();
        if written.as_ref() != Some(&ids) {
            let value = segments_value(&ids);
            match tokio::time::timeout_at(
                valid_until,
                etcd.put_if_held(&segments, &value, &key, lease),
            )
            .await
            {
                Ok(Ok(true)) => {
                    master.state.membership_written(&ids);
                    written = Some(ids);
                }
                Ok(Ok(false)) => return Err(lost("the leader key is no longer this master's")),
                Ok(Err(e)) => warn!(error = %e, "cannot write the segment list"),
                Err(_) => return Err(lost("etcd did not answer before the lease could lapse")),
            }
        }
        let changed = master
            .state
            .tombstones_to_write(tombs_version, Instant::now());
        if let Some((version, through, tombs)) = changed {
            let value = serde_json::json!({ "tombstones": tombs }).to_string();
            // Removals delivered before they were ever written change
            // nothing in etcd: no write for them.
            let written = if value == tombs_written {
                true
            } else {
                match tokio::time::timeout_at(
                    valid_until,
                    etcd.put_if_held(&tombstones, &value, &key, lease),
                )
                .await
                {
                    Ok(Ok(true)) => true,
                    Ok(Ok(false)) => return Err(lost("the leader key is no longer this master's")),
                    Ok(Err(e)) => {
                        warn!(error = %e, "cannot write the tombstones");
                        false
                    }
                    Err(_) => return Err(lost("etcd did not answer before the lease could lapse")),
                }
            };
            if written {
                master.state.tombstones_written(through);
                tombs_version = version;
                tombs_written = value;
            }
        }
        if Instant::now() < next_renewal {
            continue;
        }
        let sent = Instant::now();
        next_renewal = sent + every;
        // A renewal that has not answered when the lease may lapse is as
        // good as lost: etcd's client waits for seconds on a dead endpoint.
        match tokio::time::timeout_at(valid_until, etcd.keep_alive(lease)).await {
            Ok(Ok(true)) => {
                valid_until = sent + ha.lease_ttl - margin;
                master.lead_until(Some(valid_until));
            }
            Ok(Ok(false)) => return Err(lost("the lease expired")),
            Ok(Err(e)) => {
                warn!(error = %e, "cannot renew the leadership lease");
                if Instant::now() + every >= valid_until {
                    return Err(lost("etcd unreachable for a whole lease"));
                }
            }
            Err(_) => return Err(lost("etcd did not renew the lease before it could lapse")),
        }
    }
}

/// How often a standby looks for the leader key to be gone: a leader
/// handing over deletes it, and the pool waits for a new leader this long
/// at most (one read of etcd per standby each time).
const CAMPAIGN_EVERY: Duration = Duration::from_millis(100);

/// How often the leader checks whether the segment list in etcd is current.
const MEMBERSHIP_EVERY: Duration = Duration::from_millis(100);

/// Reads `key` at the start of a term, retrying until `valid_until` (the
/// lease may lapse then): `what` names it in logs and in the error.
async fn read_while_leading(
    etcd: &Etcd,
    key: &str,
    valid_until: Instant,
    what: &str,
) -> Result<Option<String>, MasterError> {
    loop {
        match tokio::time::timeout_at(valid_until, etcd.get(key)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => warn!(error = %e, "cannot read {what}"),
            Err(_) => {}
        }
        if Instant::now() + Duration::from_millis(100) >= valid_until {
            return Err(lost(&format!("etcd unreachable while reading {what}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads the tombstones a leader wrote (`{"tombstones": [{"key", "generation"}, ...]}`);
/// a value that does not parse is skipped with a warning.
fn parse_tombstones(v: &str) -> Vec<Tombstone> {
    #[derive(serde::Deserialize)]
    struct Stored {
        tombstones: Vec<Tombstone>,
    }
    serde_json::from_str::<Stored>(v)
        .map(|s| s.tombstones)
        .unwrap_or_else(|e| {
            warn!(error = %e, "tombstones in etcd do not parse; ignored");
            Vec::new()
        })
}

/// The segment list as stored in etcd: `{"segments": ["<32 hex digits>", ...]}`.
fn segments_value(ids: &[SegmentId]) -> String {
    let ids: Vec<String> = ids.iter().map(SegmentId::to_string).collect();
    serde_json::json!({ "segments": ids }).to_string()
}

/// Reads [`segments_value`]; entries that do not parse are skipped (with a warning).
fn parse_segments(v: &str) -> Vec<SegmentId> {
    let ids = serde_json::from_str::<serde_json::Value>(v)
        .ok()
        .and_then(|j| j.get("segments").cloned())
        .and_then(|s| serde_json::from_value::<Vec<String>>(s).ok());
    let Some(ids) = ids else {
        warn!(
            value = v,
            "the segment list in etcd does not parse; expecting none"
        );
        return Vec::new();
    };
    ids.iter()
        .filter_map(|h| u128::from_str_radix(h, 16).ok().map(SegmentId))
        .collect()
}

/// The error of a leader that stops leading, saying why.
fn lost(why: &str) -> MasterError {
    MasterError::LostLeadership(why.to_string())
}

/// One try: a fresh lease and a create-if-absent of the leader key. `None`
/// when another master leads.
async fn campaign(
    etcd: &Etcd,
    key: &str,
    advertise: &str,
    ttl: Duration,
) -> kvpool_proto::KvResult<Option<i64>> {
    if etcd.get(key).await?.is_some() {
        return Ok(None);
    }
    let lease = etcd.grant(ttl).await?;
    if etcd.create(key, advertise, lease).await? {
        return Ok(Some(lease));
    }
    let _ = etcd.revoke(lease).await;
    Ok(None)
}
