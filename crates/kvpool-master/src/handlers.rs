//! One handler per control request: it checks the request's limits, acts on
//! the state and counts itself in the metrics. [`Master::answer`](crate::Master)
//! only admits a request for the master's role and dispatches on its
//! opcode; [`handle`] refuses a batch over the item limit before decoding it.

use std::time::Duration;

use kvpool_net::capability::unix_ms;
use kvpool_net::request_id;
use kvpool_proto::limits::{
    check_batch, validate_endpoint, validate_name, LIST_PAGE_BYTES, MAX_LIST_KEYS, MAX_PATH_LEN,
    MAX_PATTERN_LEN, MAX_PREFERRED_SEGMENTS,
};
use kvpool_proto::msg::{self, to_wire, WireResult};
use kvpool_proto::tenant::{self, Scope};
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use kvpool_proto::{Opcode, Request, Rpc};
use tokio::time::Instant;
use tracing::info;

use crate::refusals::Refusal;
use crate::state::{FenceWait, MountSpec};
use crate::{Master, Peer, Role};

/// Compiled size a remove-by-regex pattern may reach (its NFA, and each of
/// its lazy DFA caches): compiling stops there, so a small pattern that
/// expands hugely (`\w{1000}{1000}`) costs at most this.
pub(crate) const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// How long a location's read grants last: well past its read lease, so a
/// client's cached location stays readable while it keeps renewing it.
const READ_GRANT_TTL: Duration = Duration::from_secs(60);

/// What a handler gets besides its request.
pub(crate) struct Ctx<'a> {
    /// The master answering.
    pub master: &'a Master,
    /// The time of the request, for every decision that depends on time.
    pub now: Instant,
    /// The role the request was admitted under.
    pub role: Role,
    /// What the peer proved at the handshake, and the protocol version
    /// its connection speaks.
    pub peer: &'a Peer,
    /// What the reply must wait for, if anything: a new value or a removal
    /// is reported only once the key's old versions are destroyed on their
    /// stores (or can no longer be read without asking this master).
    pub fence: Option<crate::state::FenceWait>,
}

/// A control request the master answers.
pub(crate) trait Handle: Rpc + Sized {
    /// Acts on the request.
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Self::Response>;
}

/// Decodes `meta` as the message the request table gives `op` (and the
/// request id after it, from a v6 peer), handles it in a `request` span
/// carrying that id, encodes the answer. A batch over
/// [`kvpool_proto::MAX_BATCH_KEYS`] items, which `Request::decode` refuses
/// too, is refused here first so the refusal is counted.
pub(crate) fn handle(cx: &mut Ctx<'_>, op: Opcode, meta: &[u8]) -> KvResult<Vec<u8>> {
    if let Some(n) = op.batch_len(meta) {
        check_batch(op.name(), n).map_err(|e| cx.refuse(Refusal::BatchKeys, e))?;
    }
    let (req, trailer) = Request::decode(op, meta)?;
    let _span = request_id::span(trailer.id, op).entered();
    cx.check_scope(&req)?;
    match req {
        Request::RegisterClient(m) => reply(cx, m),
        Request::Heartbeat(m) => reply(cx, m),
        Request::MountSegment(m) => reply(cx, m),
        Request::ReportObjects(m) => reply(cx, m),
        Request::DrainSegment(m) => reply(cx, m),
        Request::DrainOwn(m) => reply(cx, m),
        Request::UnmountSegment(m) => reply(cx, m),
        Request::PutStart(m) => reply(cx, m),
        Request::PutEnd(m) => reply(cx, m),
        Request::PutRevoke(m) => reply(cx, m),
        Request::PutCancel(m) => reply(cx, m),
        Request::GetReplicaList(m) => reply(cx, m),
        Request::Exist(m) => reply(cx, m),
        Request::ExistLeased(m) => reply(cx, m),
        Request::Touch(m) => reply(cx, m),
        Request::Remove(m) => reply(cx, m),
        Request::RemoveByRegex(m) => reply(cx, m),
        Request::RemoveAll(m) => reply(cx, m),
        Request::ListKeys(m) => reply(cx, m),
        Request::Status(m) => reply(cx, m),
        Request::ReplicaAdd(m) => reply(cx, m),
        Request::ReplicaCommit(m) => reply(cx, m),
        Request::ReplicaClear(m) => reply(cx, m),
        Request::TaskCreate(m) => reply(cx, m),
        Request::TaskUpdate(m) => reply(cx, m),
        Request::TaskQuery(m) => reply(cx, m),
        // Other planes' requests: `admit` refused them already.
        Request::Hello(_)
        | Request::Auth(_)
        | Request::Write(_)
        | Request::Read(_)
        | Request::Invalidate(_)
        | Request::StoreAbout(_)
        | Request::TierMove(_)
        | Request::TierMoveCancel(_)
        | Request::EngineWrite(_)
        | Request::EngineRead(_)
        | Request::EngineNotify(_)
        | Request::EngineAbout(_)
        | Request::EngineWriteFrom(_)
        | Request::EngineReadInto(_) => Err(KvError::new(
            Code::NotSupported,
            format!("{} is not served by the master", op.name()),
        )),
    }
}

/// Handles one decoded request and encodes its answer.
fn reply<R: Handle>(cx: &mut Ctx<'_>, req: R) -> KvResult<Vec<u8>> {
    req.handle(cx).map(|r| msg::encode(&r))
}

/// The keys `req` names, and whether it only reads them; `None` for a
/// request that names no key.
fn named_keys(req: &Request) -> Option<(bool, Box<dyn Iterator<Item = &str> + '_>)> {
    fn all(keys: &[String]) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(keys.iter().map(String::as_str))
    }
    Some(match req {
        Request::GetReplicaList(m) => (true, all(&m.keys)),
        Request::Exist(m) => (true, all(&m.keys)),
        Request::ExistLeased(m) => (true, all(&m.keys)),
        Request::Touch(m) => (true, Box::new(m.items.iter().map(|i| i.key.as_str()))),
        Request::PutStart(m) => (false, Box::new(m.items.iter().map(|i| i.key.as_str()))),
        Request::PutEnd(m) => (false, Box::new(m.items.iter().map(|i| i.key.as_str()))),
        Request::PutRevoke(m) => (false, all(&m.keys)),
        Request::Remove(m) => (false, all(&m.keys)),
        Request::ReplicaClear(m) => (false, all(&m.keys)),
        Request::ReplicaAdd(m) => (false, Box::new(std::iter::once(m.key.as_str()))),
        Request::ReplicaCommit(m) => (false, Box::new(std::iter::once(m.key.as_str()))),
        Request::TaskCreate(m) => (false, Box::new(std::iter::once(m.key.as_str()))),
        _ => return None,
    })
}

impl Ctx<'_> {
    /// The namespaces the peer may reach: a store's or an admin's key
    /// reaches all (a store holds every tenant's bytes anyway).
    fn scope(&self) -> Scope<'_> {
        match &self.peer.tenant {
            _ if self.peer.role >= kvpool_net::auth::Role::Store => Scope::All,
            Some(t) => Scope::Tenant(t),
            None => Scope::Untenanted,
        }
    }

    /// Refuses, whole, a request that names a key outside its peer's
    /// namespace: a tenant's client writes only its own keys and reads
    /// those and the shared namespaces; a client without a tenant the
    /// same for keys without one.
    fn check_scope(&self, req: &Request) -> KvResult<()> {
        let scope = self.scope();
        if scope == Scope::All {
            return Ok(());
        }
        let Some((read, mut keys)) = named_keys(req) else {
            return Ok(());
        };
        let tenants = &self.master.state.config().tenants;
        let shared = |t: &str| tenants.is_shared(t);
        let outside = keys.find(|k| {
            if read {
                !scope.may_read(k, &shared)
            } else {
                !scope.may_write(k)
            }
        });
        match outside {
            None => Ok(()),
            Some(k) => Err(self.refuse(Refusal::Namespace, tenant::outside(scope, k))),
        }
    }

    /// Counts (and maybe logs) a refusal; hands the error back.
    fn refuse(&self, reason: Refusal, e: KvError) -> KvError {
        self.master.state.refusals().refuse(reason, e)
    }

    /// Checks a name or path carried by a request.
    fn check_name(&self, what: &str, name: &str) -> KvResult<()> {
        validate_name(what, name).map_err(|e| self.refuse(Refusal::NameLength, e))
    }

    /// Signs each replica's region for `access` to the object version
    /// `generation`, when this master has a secret; with `key`, bound to
    /// that key's object where the segment's store checks bound grants.
    fn grant(&self, access: u8, generation: u64, key: Option<&str>, replicas: &mut [msg::Replica]) {
        let Some(signer) = &self.master.grants else {
            return;
        };
        let unbound = self.master.unbound.read();
        let ttl = if access & msg::Capability::WRITE != 0 {
            // A put not ended by then is revoked anyway.
            self.master.state.config().pending_ttl
        } else {
            READ_GRANT_TTL
        };
        let expires = unix_ms().saturating_add(ttl.as_millis() as u64);
        for r in replicas {
            let region = (r.offset, r.len);
            let fields = (generation, r.fence);
            let bound = key.filter(|_| !unbound.contains(&r.segment));
            let bound = bound.map(str::as_bytes);
            r.cap = Some(signer.sign(access, r.segment, region, fields, expires, bound));
        }
    }

    /// Counts the keys of a batch that fail [`validate_key`]; the state
    /// answers each of them `INVALID_KEY` without looking it up.
    fn count_bad_keys<'k>(&self, op: &str, keys: impl Iterator<Item = &'k str>) {
        let bad = keys.filter(|k| validate_key(k).is_err()).count() as u64;
        if bad > 0 {
            let detail = format!("{op}: {bad} keys empty or over the length limit");
            let r = self.master.state.refusals();
            r.record(Refusal::KeyLength, bad, &detail);
        }
    }
}

/// Per-key results on the wire, counted in the metrics of `R`.
fn counted<R: Rpc, T>(cx: &Ctx<'_>, v: Vec<KvResult<T>>) -> Vec<WireResult<T>> {
    let failed = v.iter().filter(|r| r.is_err()).count();
    cx.master.metrics.record(R::OPCODE, v.len(), failed);
    v.into_iter().map(to_wire).collect()
}

impl Handle for msg::RegisterClient {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::RegisterReply> {
        cx.check_name("hostname", &self.hostname)?;
        cx.master.metrics.record(Self::OPCODE, 0, 0);
        let s = &cx.master.state;
        let reply = s.register_client_as(
            self.client_id,
            &self.hostname,
            cx.now,
            (cx.peer.role, cx.peer.tenant.as_ref()),
        )?;
        info!(client = %self.client_id, hostname = %self.hostname, "client registered");
        Ok(reply)
    }
}

impl Handle for msg::Heartbeat {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::HeartbeatReply> {
        let known = cx.master.state.heartbeat(self.client_id, cx.now);
        if known {
            cx.master.state.record_io(self.client_id, &self.io);
            cx.master.state.record_held(self.client_id, &self.held);
        }
        Ok(msg::HeartbeatReply { known })
    }
}

impl Handle for msg::MountSegment {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<()> {
        let seg = &self.segment;
        cx.check_name("segment name", &seg.name)?;
        validate_endpoint(&seg.endpoint).map_err(|e| cx.refuse(Refusal::Endpoint, e))?;
        if let Some(path) = &seg.path {
            if path.len() > MAX_PATH_LEN {
                return Err(cx.refuse(
                    Refusal::NameLength,
                    KvError::new(
                        Code::InvalidParams,
                        format!(
                            "segment path of {} bytes (at most {MAX_PATH_LEN})",
                            path.len()
                        ),
                    ),
                ));
            }
        }
        let spec = MountSpec {
            objects: self.objects,
            scan_age: Duration::from_millis(self.scan_age_ms),
            possession: self.possession,
            fence: self.fence,
            held: self.held,
        };
        let id = self.segment.id;
        let s = &cx.master.state;
        s.mount_scanned(self.client_id, self.segment, spec, cx.now)?;
        let mut unbound = cx.master.unbound.write();
        if cx.peer.version < msg::Capability::KEY_SINCE {
            unbound.insert(id);
        } else {
            unbound.remove(&id);
        }
        Ok(())
    }
}

impl Handle for msg::ReportObjects {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::InventoryVerdict> {
        // A store only finds keys that were valid when put: a part with
        // another is refused whole, like a batch over the limit.
        if let Some(bad) = self.objects.iter().find(|i| validate_key(&i.key).is_err()) {
            let e = validate_key(&bad.key).unwrap_err();
            let e = KvError::new(
                e.code,
                format!("inventory of {}: {}", self.segment, e.message),
            );
            return Err(cx.refuse(Refusal::KeyLength, e));
        }
        let s = &cx.master.state;
        s.report_objects(
            self.client_id,
            self.segment,
            self.objects,
            self.last,
            cx.now,
        )
    }
}

impl Handle for msg::DrainSegment {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<msg::SegmentId>> {
        cx.check_name("segment name", &self.segment)?;
        let ids = cx.master.state.drain(&self.segment);
        if ids.is_empty() {
            return Err(KvError::new(
                Code::SegmentNotFound,
                format!("no segment named {:?}", self.segment),
            ));
        }
        info!(segment = %self.segment, unmount_after_ms = ?self.unmount_after_ms, "segment draining");
        if let Some(ms) = self.unmount_after_ms {
            cx.master
                .unmount_later(ids.clone(), Duration::from_millis(ms));
        }
        Ok(ids)
    }
}

impl Handle for msg::DrainOwn {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<()> {
        cx.master.state.drain_own(self.segment, &self.possession)?;
        info!(segment = %self.segment, "segment draining (its store's request)");
        Ok(())
    }
}

impl Handle for msg::UnmountSegment {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<()> {
        cx.master.state.unmount(self.client_id, self.segment)
    }
}

impl Handle for msg::PutStart {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<msg::PutGrant>>> {
        let preferred = &self.config.preferred_segments;
        if preferred.len() > MAX_PREFERRED_SEGMENTS {
            return Err(cx.refuse(
                Refusal::PreferredSegments,
                KvError::new(
                    Code::InvalidParams,
                    format!(
                        "{} preferred segments (at most {MAX_PREFERRED_SEGMENTS})",
                        preferred.len()
                    ),
                ),
            ));
        }
        for name in preferred {
            cx.check_name("preferred segment name", name)?;
        }
        cx.count_bad_keys("PutStart", self.items.iter().map(|i| i.key.as_str()));
        let m = cx.master;
        if !self.upsert && !matches!(cx.role, Role::Leader) {
            // A segment not back yet may hold the key: a write-once put
            // must not install over it (see `Master::admit`).
            return Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                "new master leader: stores are re-mounting, retry shortly (upserts are served)",
            ));
        }
        let mut v = m.state.put_start_op(
            (self.client_id, self.op),
            &self.items,
            &self.config,
            self.upsert,
            cx.now,
        );
        // The writer may read back what it wrote (a put is a read hint).
        let access = msg::Capability::READ | msg::Capability::WRITE;
        for (g, item) in v.iter_mut().zip(&self.items) {
            if let Ok(msg::PutGrant::Write {
                generation,
                replicas,
            }) = g
            {
                cx.grant(access, *generation, Some(&item.key), replicas);
            }
        }
        if m.state.above_watermark() {
            m.evict_soon.notify_one();
        }
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::PutEnd {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<()>>> {
        cx.count_bad_keys("PutEnd", self.items.iter().map(|i| i.key.as_str()));
        let s = &cx.master.state;
        // In a new leader's recovery, any key may have a newer version than
        // the one known here on a store not back yet: see `recovery_wait`.
        let wait = s.recovery_wait(cx.now);
        let v = s.put_end(self.client_id, &self.items, cx.now);
        cx.fence = s.fence(self.items.iter().map(|i| i.key.as_str()), cx.now);
        if let Some(t) = wait {
            cx.fence = Some(match cx.fence.take() {
                Some(w) => w.not_before(t),
                None => FenceWait::at(t),
            });
        }
        #[cfg(feature = "planted-bugs")]
        if kvpool_net::planted::active("skip-upsert-fence") {
            // Planted: the commit answers before the old version is gone.
            cx.fence = None;
        }
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::PutRevoke {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<()>>> {
        cx.count_bad_keys("PutRevoke", self.keys.iter().map(String::as_str));
        let v = cx
            .master
            .state
            .put_revoke(self.client_id, &self.keys, cx.now);
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::PutCancel {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<u64> {
        cx.master.metrics.record(Self::OPCODE, self.ops.len(), 0);
        Ok(cx
            .master
            .state
            .put_cancel(self.client_id, &self.ops, cx.now))
    }
}

impl Handle for msg::GetReplicaList {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<msg::ObjectLocation>>> {
        cx.count_bad_keys("GetReplicaList", self.keys.iter().map(String::as_str));
        let mut v = cx.master.state.get_replica_list(&self.keys, cx.now);
        for l in v.iter_mut().flatten() {
            cx.grant(msg::Capability::READ, l.generation, None, &mut l.replicas);
        }
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::Exist {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<u64>>> {
        cx.count_bad_keys("Exist", self.keys.iter().map(String::as_str));
        let v = cx.master.state.exist(&self.keys);
        // A missing key is an answer, not a failure.
        cx.master.metrics.record(Self::OPCODE, v.len(), 0);
        Ok(v.into_iter().map(to_wire).collect())
    }
}

impl Handle for msg::ExistLeased {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<u64>>> {
        cx.count_bad_keys("ExistLeased", self.keys.iter().map(String::as_str));
        let v = cx.master.state.exist_leased(&self.keys, cx.now);
        cx.master.metrics.record(Self::OPCODE, v.len(), 0);
        Ok(v.into_iter().map(to_wire).collect())
    }
}

impl Handle for msg::ListKeys {
    /// Lists the caller's own namespace only (not namespaces shared with
    /// it): the prefix filters, the scope decides what may be seen.
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::KeyPage> {
        if self.limit == 0 {
            return Err(KvError::new(Code::InvalidParams, "ListKeys limit of 0"));
        }
        let from = match self.cursor[..] {
            [] => (0, 0),
            ref c => <[u8; 8]>::try_from(c)
                .map(|b| {
                    let n = u64::from_le_bytes(b);
                    ((n >> 32) as u32, n as u32)
                })
                .map_err(|_| KvError::new(Code::InvalidParams, "malformed ListKeys cursor"))?,
        };
        let limit = (self.limit as usize).min(MAX_LIST_KEYS);
        let scope = cx.scope();
        let keep = |k: &str| k.starts_with(&self.prefix) && scope.may_write(k);
        let s = &cx.master.state;
        let (keys, next) = s.list_keys(keep, from, limit, LIST_PAGE_BYTES);
        cx.master.metrics.record(Self::OPCODE, keys.len(), 0);
        let cursor = next.map_or_else(Vec::new, |(shard, slot)| {
            (u64::from(shard) << 32 | u64::from(slot))
                .to_le_bytes()
                .to_vec()
        });
        Ok(msg::KeyPage { keys, cursor })
    }
}

impl Handle for msg::Touch {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<bool>> {
        cx.count_bad_keys("Touch", self.items.iter().map(|i| i.key.as_str()));
        let v = cx.master.state.touch(&self.items, cx.now);
        // A touch of a replaced version is no failure: the client just
        // stops using that location.
        cx.master.metrics.record(Self::OPCODE, v.len(), 0);
        Ok(v)
    }
}

impl Handle for msg::Remove {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<()>>> {
        cx.count_bad_keys("Remove", self.keys.iter().map(String::as_str));
        let s = &cx.master.state;
        let v = s.remove(&self.keys, self.force, cx.now);
        cx.fence = s.fence(self.keys.iter().map(String::as_str), cx.now);
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::RemoveByRegex {
    /// Runs off the runtime's workers (see `Master::may_take_long`): the
    /// compile and the walk over every key never hold up heartbeats.
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<u64> {
        if self.pattern.len() > MAX_PATTERN_LEN {
            return Err(cx.refuse(
                Refusal::RegexPattern,
                KvError::new(
                    Code::InvalidParams,
                    format!(
                        "regex pattern of {} bytes (at most {MAX_PATTERN_LEN})",
                        self.pattern.len()
                    ),
                ),
            ));
        }
        let re = regex::RegexBuilder::new(&self.pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| match e {
                regex::Error::CompiledTooBig(limit) => cx.refuse(
                    Refusal::RegexSize,
                    KvError::new(
                        Code::InvalidParams,
                        format!("regex compiles to more than {limit} bytes, the limit"),
                    ),
                ),
                e => KvError::new(Code::InvalidParams, format!("bad regex: {e}")),
            })?;
        cx.master.metrics.record(Self::OPCODE, 0, 0);
        let s = &cx.master.state;
        let removed = s.remove_matching(|k| re.is_match(k), self.force, cx.now);
        cx.fence = s.fence_all(cx.now);
        Ok(removed)
    }
}

impl Handle for msg::RemoveAll {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<u64> {
        cx.master.metrics.record(Self::OPCODE, 0, 0);
        let s = &cx.master.state;
        let removed = s.remove_matching(|_| true, self.force, cx.now);
        cx.fence = s.fence_all(cx.now);
        Ok(removed)
    }
}

impl Handle for msg::Status {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::ClusterStatus> {
        let mut st = cx.master.state.status();
        st.role = cx.master.role(cx.now).name().into();
        if let Scope::Tenant(t) = cx.scope() {
            // A tenant counts its own objects, not the pool's.
            st.keys = cx.master.state.tenant_usage(t).objects;
        }
        Ok(st)
    }
}

impl Handle for msg::ReplicaAdd {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::ReplicaPlan> {
        if self.targets.len() > MAX_PREFERRED_SEGMENTS {
            return Err(KvError::new(
                Code::InvalidParams,
                format!(
                    "{} target segments (at most {MAX_PREFERRED_SEGMENTS})",
                    self.targets.len()
                ),
            ));
        }
        for name in &self.targets {
            cx.check_name("segment name", name)?;
        }
        cx.master.metrics.record(Self::OPCODE, 1, 0);
        let s = &cx.master.state;
        let mut plan = s.replica_add(self.client_id, &self.key, &self.targets, cx.now)?;
        cx.grant(
            msg::Capability::READ,
            plan.generation,
            None,
            &mut plan.sources,
        );
        let access = msg::Capability::READ | msg::Capability::WRITE;
        for t in plan.targets.iter_mut().flatten().flatten() {
            let target = std::slice::from_mut(t);
            cx.grant(access, plan.generation, Some(&self.key), target);
        }
        Ok(plan)
    }
}

impl Handle for msg::ReplicaCommit {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<()> {
        cx.master.metrics.record(Self::OPCODE, 1, 0);
        let s = &cx.master.state;
        s.replica_commit(
            self.client_id,
            &self.key,
            self.generation,
            &self.written,
            &self.failed,
            &self.drop,
            cx.now,
        )?;
        // A dropped replica is reported gone once its store destroyed it.
        cx.fence = s.fence([self.key.as_str()], cx.now);
        Ok(())
    }
}

impl Handle for msg::ReplicaClear {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<bool>> {
        if let Some(name) = &self.segment {
            cx.check_name("segment name", name)?;
        }
        cx.count_bad_keys("ReplicaClear", self.keys.iter().map(String::as_str));
        let s = &cx.master.state;
        let v = s.replica_clear(&self.keys, self.segment.as_deref(), cx.now);
        cx.master.metrics.record(Self::OPCODE, v.len(), 0);
        cx.fence = s.fence(self.keys.iter().map(String::as_str), cx.now);
        Ok(v)
    }
}

impl Handle for msg::TaskCreate {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<u128> {
        if self.targets.len() > MAX_PREFERRED_SEGMENTS {
            return Err(KvError::new(
                Code::InvalidParams,
                format!(
                    "{} target segments (at most {MAX_PREFERRED_SEGMENTS})",
                    self.targets.len()
                ),
            ));
        }
        if !self.source.is_empty() {
            cx.check_name("segment name", &self.source)?;
        }
        for name in &self.targets {
            cx.check_name("segment name", name)?;
        }
        cx.master.metrics.record(Self::OPCODE, 1, 0);
        let s = &cx.master.state;
        let id = s.task_create(
            self.client_id,
            self.kind,
            &self.key,
            &self.source,
            &self.targets,
            cx.now,
        )?;
        info!(client = %self.client_id, key = %self.key, kind = self.kind, task = %format!("{id:032x}"), "replica task created");
        Ok(id)
    }
}

impl Handle for msg::TaskUpdate {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<()> {
        let s = &cx.master.state;
        s.task_update(self.client_id, self.id, self.status, &self.message)
    }
}

impl Handle for msg::TaskQuery {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::TaskInfo> {
        cx.master.state.task_query(self.id)
    }
}
