//! The master's background tasks, owned by [`crate::start`] and stopped with
//! it: the sweeper (expiry), the evictor (LRU at the high watermark), the
//! invalidator (destroying freed objects on their stores) and the tierer
//! (moving objects between a store's memory and disk).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_proto::frame::Limits;
use kvpool_proto::msg;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Master;

/// Expires silent clients, stale puts and ended leases, and ends a new
/// leader's recovery grace. A tick that comes late means this master did
/// not run (paused, or starved of CPU): the heartbeats sent meanwhile wait
/// unread in its sockets, so that time is not counted as the clients'
/// silence, nor as the stores' time to re-mount.
pub(crate) async fn sweeper(master: Arc<Master>, shutdown: CancellationToken) {
    let period = (master.state.config().client_ttl / 8)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let late = now.saturating_duration_since(last).saturating_sub(period);
        let stalled = if late > period {
            tracing::warn!(
                late_ms = late.as_millis() as u64,
                "master stalled; not counting the stall against clients"
            );
            master.state.forgive_stall(late, now);
            late
        } else {
            Duration::ZERO
        };
        master.recovery_tick(now, stalled);
        // Dropping a dead store's segment walks every key: off the event loop.
        crate::off_the_runtime(|| master.state.sweep(now));
        // Counted from the end of the sweep: its own work is no stall.
        last = Instant::now();
    }
}

/// Delivers freed and replaced versions to their stores, which destroy the
/// objects there so that neither a restart nor a cached location can bring
/// them back. Runs every 20 ms, or at once when a reply waits on it. A
/// store that cannot be reached gets them again later (or reconciles on
/// remount).
pub(crate) async fn invalidator(
    master: Arc<Master>,
    security: Security,
    shutdown: CancellationToken,
) {
    let mut pools: HashMap<String, Arc<kvpool_net::ConnPool>> = HashMap::new();
    let mut backoff: HashMap<msg::SegmentId, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            _ = master.invalidate_now.notified() => {}
        }
        let now = Instant::now();
        backoff.retain(|_, until| *until > now);
        let (batches, through) = master.state.take_invalidations();
        let mut sends = Vec::new();
        for (id, endpoint, regions) in batches {
            if backoff.contains_key(&id) {
                master.state.requeue_invalidations(id, regions);
                continue;
            }
            let pool = store_pool(&mut pools, &endpoint, &security, 2);
            // A store takes at most MAX_BATCH_KEYS regions per request:
            // the parts go one after another on one connection.
            // Under the segment's current mount: this master's decisions
            // hold across a remount it took the inventory of.
            let fence = master.state.fence_of(id);
            sends.push(async move {
                let mut parts = regions.chunks(kvpool_proto::MAX_BATCH_KEYS);
                while let Some(part) = parts.next() {
                    let req = msg::InvalidateReq {
                        segment: id,
                        fence,
                        regions: part.to_vec(),
                    };
                    let sent = tokio::time::timeout(Duration::from_secs(2), pool.call(&req)).await;
                    if let Ok(Ok(destroyed)) = &sent {
                        tracing::debug!(segment = %id, regions = part.len(), destroyed, "invalidations delivered");
                        tracing::trace!(target: "kvpool_keys", segment = %id, ?part, destroyed, "invalidations delivered");
                    }
                    if !matches!(sent, Ok(Ok(_))) {
                        let rest: Vec<(u64, u64)> = std::iter::once(part)
                            .chain(parts)
                            .flatten()
                            .copied()
                            .collect();
                        return (id, Some(rest));
                    }
                }
                (id, None)
            });
        }
        for (segment, undelivered) in futures::future::join_all(sends).await {
            match undelivered {
                // Fenced replies wait on this segment until it is
                // delivered, or no cached read can use the old versions.
                Some(regions) => {
                    tracing::debug!(%segment, "invalidation not delivered; will retry");
                    master.state.requeue_invalidations(segment, regions);
                    backoff.insert(segment, now + Duration::from_secs(1));
                }
                None => master.state.invalidations_delivered(segment),
            }
        }
        master.state.invalidations_sent(through);
        let _ = master.invalidated.send(through);
    }
}

/// The master's connections to the store at `endpoint`, made on first use
/// (2 s to connect, `idle` kept).
fn store_pool(
    pools: &mut HashMap<String, Arc<kvpool_net::ConnPool>>,
    endpoint: &str,
    security: &Security,
    idle: usize,
) -> Arc<kvpool_net::ConnPool> {
    pools
        .entry(endpoint.to_string())
        .or_insert_with(|| {
            let pool = kvpool_net::ConnPool::new(
                endpoint,
                "master",
                Limits::default(),
                Duration::from_secs(2),
                idle,
            );
            Arc::new(pool.with_security(security.clone()))
        })
        .clone()
}

/// Evicts in the background once usage crosses the high watermark, so puts
/// rarely have to evict inline.
pub(crate) async fn evictor(master: Arc<Master>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = master.evict_soon.notified() => {}
        }
        if master.state.above_watermark() {
            let m = master.clone();
            let _ = tokio::task::spawn_blocking(move || m.state.evict(Instant::now(), 0)).await;
        }
    }
}

/// Moves per `TierMove` request; a store copies them in parallel.
const MOVES_PER_REQUEST: usize = 32;
/// `TierMove` requests in flight per store.
const MOVE_REQUESTS_IN_FLIGHT: usize = 8;
/// How long it waits for a store to answer a `TierMoveCancel`.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// How often a cancellation that did not reach its store is tried again.
const CANCEL_RETRY: Duration = Duration::from_secs(1);

/// A `TierMove` request given up without an answer whose cancellation has
/// not reached its store yet (see [`settle`]). Its moves stay unfinished
/// until it does (or their destination is mounted again): the regions
/// reserved for them are not freed, since a copy may still land there.
struct Owed {
    pool: Arc<kvpool_net::ConnPool>,
    id: msg::RequestId,
    tickets: Vec<crate::state::MoveTicket>,
}

/// What the master gets back from a store about its moves.
type Finished = Vec<(crate::state::MoveTicket, kvpool_proto::KvResult<()>)>;

/// Keeps the memory of stores with a disk tier below the demotion
/// watermark and promotes objects read again from disk: plans a round of
/// moves, has each store carry out its own, and finishes them with what the
/// stores answered. A store that cannot be reached fails its moves (their
/// copies are destroyed; the objects stay where they were) once it is
/// known that none of them can still land (see [`give_up`]).
pub(crate) async fn tierer(master: Arc<Master>, security: Security, shutdown: CancellationToken) {
    let mut pools: HashMap<String, Arc<kvpool_net::ConnPool>> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut owed: Vec<Owed> = Vec::new();
    let mut owed_tried = Instant::now();
    // A round that moved something is followed by the next at once: puts
    // may be filling memory as fast as the disk takes it.
    let mut busy = false;
    loop {
        if !busy {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
        }
        // A round waits on stores (up to `tier_move_timeout` a request, a
        // minute by default): a master told to stop does not wait for an
        // unreachable one. Moves left in flight are what a killed master
        // leaves; the next leader takes the stores' word for them.
        busy = tokio::select! {
            _ = shutdown.cancelled() => return,
            busy = tier_round(&master, &security, &mut pools, &mut owed, &mut owed_tried) => busy,
        };
    }
}

/// One round of [`tierer`]: settles cancellations owed, plans moves and
/// sends them; whether it moved anything.
async fn tier_round(
    master: &Arc<Master>,
    security: &Security,
    pools: &mut HashMap<String, Arc<kvpool_net::ConnPool>>,
    owed: &mut Vec<Owed>,
    owed_tried: &mut Instant,
) -> bool {
    use futures::StreamExt;
    if !owed.is_empty() && owed_tried.elapsed() >= CANCEL_RETRY {
        *owed_tried = Instant::now();
        *owed = settle(master, std::mem::take(owed)).await;
        show_owed(master, owed);
    }
    if !matches!(master.role(Instant::now()), crate::Role::Leader) || !master.state.has_disk_tier()
    {
        return false;
    }
    let m = master.clone();
    // Planning scans the object map: off the event loop.
    let Ok(plan) =
        tokio::task::spawn_blocking(move || m.state.plan_tier_moves(Instant::now())).await
    else {
        return false;
    };
    if plan.is_empty() {
        return false;
    }
    let mut stores = Vec::new();
    for (endpoint, tickets) in plan {
        let pool = store_pool(pools, &endpoint, security, MOVE_REQUESTS_IN_FLIGHT);
        stores.push(async move {
            let parts: Vec<Vec<crate::state::MoveTicket>> = tickets
                .chunks(MOVES_PER_REQUEST)
                .map(<[_]>::to_vec)
                .collect();
            futures::stream::iter(parts)
                .map(|part| move_part(master, pool.clone(), part))
                .buffer_unordered(MOVE_REQUESTS_IN_FLIGHT)
                .collect::<Vec<_>>()
                .await
        });
    }
    let (mut done, mut fresh) = (Vec::new(), Vec::new());
    for (finished, unsettled) in futures::future::join_all(stores)
        .await
        .into_iter()
        .flatten()
    {
        done.extend(finished);
        fresh.extend(unsettled);
    }
    finish(master, done).await;
    // A request given up now is cancelled at once; those still owed
    // from before wait for their turn above, not for every round.
    if !fresh.is_empty() {
        owed.extend(settle(master, fresh).await);
        show_owed(master, owed);
    }
    true
}

/// Tries again to cancel the requests in `owed`; finishes the moves of
/// those cancelled, and returns the rest.
async fn settle(master: &Arc<Master>, owed: Vec<Owed>) -> Vec<Owed> {
    let tries = owed
        .iter()
        .map(|o| give_up(master, &o.pool, o.id, &o.tickets));
    let given_up = futures::future::join_all(tries).await;
    let mut done = Vec::new();
    let mut still = Vec::new();
    for (o, up) in owed.into_iter().zip(given_up) {
        if up {
            let failed = |t| (t, Err(kvpool_proto::Code::TransferFail.into()));
            done.extend(o.tickets.into_iter().map(failed));
        } else {
            still.push(o);
        }
    }
    finish(master, done).await;
    still
}

/// Sets the gauge of moves waiting for their cancellation.
fn show_owed(master: &Master, owed: &[Owed]) {
    let waiting = owed.iter().map(|o| o.tickets.len()).sum::<usize>();
    (master.metrics.tier_moves_awaiting_cancel).set(waiting as i64);
}

/// Sends one `TierMove` request and returns its moves with what the store
/// answered, or, for a request given up without an answer, nothing
/// finished and its cancellation owed.
async fn move_part(
    master: &Master,
    pool: Arc<kvpool_net::ConnPool>,
    part: Vec<crate::state::MoveTicket>,
) -> (Finished, Option<Owed>) {
    let req = msg::TierMoveReq {
        moves: part.iter().map(|t| t.mv).collect(),
    };
    // The id the store knows the request by, to cancel it.
    let id = kvpool_net::request_id::fresh();
    let call = kvpool_net::request_id::within(id, pool.call(&req));
    let wait = master.state.config().tier_move_timeout;
    let in_flight = &master.metrics.tier_moves_in_flight;
    in_flight.inc_by(part.len() as i64);
    let answered = tokio::time::timeout(wait, call).await;
    in_flight.dec_by(part.len() as i64);
    match answered {
        Ok(Ok(codes)) if codes.len() == part.len() => {
            let finished = part.into_iter().zip(codes).map(|(t, c)| {
                let r = match c {
                    0 => Ok(()),
                    c => Err(kvpool_proto::KvError::from(kvpool_proto::Code::from_i32(c))),
                };
                (t, r)
            });
            (finished.collect(), None)
        }
        other => {
            tracing::debug!(result = ?other.map(|r| r.map(|c| c.len())), "tier moves not done");
            master.metrics.tier_moves_given_up.inc_by(part.len() as u64);
            let tickets = part;
            (Vec::new(), Some(Owed { pool, id, tickets }))
        }
    }
}

/// Makes sure none of the moves of request `id` (`tickets`) can still write
/// anything: true once their store answered its cancellation, or once
/// every destination was mounted again since they were planned (the store
/// refuses them by fence then). The regions reserved for them may be
/// freed after that, not before.
async fn give_up(
    master: &Master,
    pool: &kvpool_net::ConnPool,
    id: msg::RequestId,
    tickets: &[crate::state::MoveTicket],
) -> bool {
    if (tickets.iter()).all(|t| master.state.fence_of(t.mv.to) != t.mv.fence) {
        return true;
    }
    let req = msg::TierMoveCancel { requests: vec![id] };
    match tokio::time::timeout(CANCEL_WAIT, pool.call(&req)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) if e.code == kvpool_proto::Code::NotSupported => {
            // A store older than protocol 11 cannot be asked: its regions
            // go after an invalidation, as they did, which a copy still on
            // its way there can beat.
            tracing::warn!(
                store = pool.addr(),
                "tier moves given up on a store too old to cancel them"
            );
            true
        }
        other => {
            tracing::debug!(store = pool.addr(), result = ?other, "tier move cancellation not delivered");
            false
        }
    }
}

/// Finishes moves with what their stores answered (off the event loop:
/// it takes the object map's locks).
async fn finish(master: &Arc<Master>, done: Finished) {
    if done.is_empty() {
        return;
    }
    let m = master.clone();
    let _ =
        tokio::task::spawn_blocking(move || m.state.finish_tier_moves(done, Instant::now())).await;
}
