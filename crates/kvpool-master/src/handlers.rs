//! One handler per control request: it acts on the state and counts itself
//! in the metrics. [`Master::answer`](crate::Master) only admits a request
//! for the master's role, decodes it and dispatches on its opcode.

use std::time::Duration;

use kvpool_proto::msg::{self, to_wire, Rpc, WireResult};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::time::Instant;
use tracing::info;

use crate::{Master, Role};

/// What a handler gets besides its request.
pub(crate) struct Ctx<'a> {
    /// The master answering.
    pub master: &'a Master,
    /// The time of the request, for every decision that depends on time.
    pub now: Instant,
    /// The invalidation sequence number the reply must wait for, if any:
    /// a new value or a removal is reported only once the key's old
    /// versions are destroyed on their stores.
    pub fence: Option<u64>,
}

/// A control request the master answers.
pub(crate) trait Handle: Rpc + Sized {
    /// Acts on the request.
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Self::Response>;
}

/// Decodes `meta` as `R`, handles it, encodes the answer.
pub(crate) fn handle<R: Handle>(cx: &mut Ctx<'_>, meta: &[u8]) -> KvResult<Vec<u8>> {
    let req: R = msg::decode(meta)?;
    req.handle(cx).map(|r| msg::encode(&r))
}

/// Per-key results on the wire, counted in the metrics of `R`.
fn counted<R: Rpc, T>(cx: &Ctx<'_>, v: Vec<KvResult<T>>) -> Vec<WireResult<T>> {
    let failed = v.iter().filter(|r| r.is_err()).count();
    cx.master.metrics.record(R::OPCODE, v.len(), failed);
    v.into_iter().map(to_wire).collect()
}

impl Handle for msg::RegisterClient {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::RegisterReply> {
        info!(client = %self.client_id, hostname = %self.hostname, "client registered");
        cx.master.metrics.record(Self::OPCODE, 0, 0);
        let s = &cx.master.state;
        Ok(s.register_client(self.client_id, &self.hostname, cx.now))
    }
}

impl Handle for msg::Heartbeat {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::HeartbeatReply> {
        let known = cx.master.state.heartbeat(self.client_id, cx.now);
        Ok(msg::HeartbeatReply { known })
    }
}

impl Handle for msg::MountSegment {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<()> {
        let age = Duration::from_millis(self.scan_age_ms);
        let s = &cx.master.state;
        let (client, objects) = (self.client_id, self.objects);
        s.mount_scanned(client, self.segment, objects, age, self.possession, cx.now)
    }
}

impl Handle for msg::ReportObjects {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::InventoryVerdict> {
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

impl Handle for msg::UnmountSegment {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<()> {
        cx.master.state.unmount(self.client_id, self.segment)
    }
}

impl Handle for msg::PutStart {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<msg::PutGrant>>> {
        let m = cx.master;
        let v = m.state.put_start(
            self.client_id,
            &self.items,
            &self.config,
            self.upsert,
            cx.now,
        );
        if m.state.above_watermark() {
            m.evict_soon.notify_one();
        }
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::PutEnd {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<()>>> {
        let s = &cx.master.state;
        let v = s.put_end(self.client_id, &self.items, cx.now);
        cx.fence = s.fence(self.items.iter().map(|i| i.key.as_str()));
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::PutRevoke {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<()>>> {
        let v = cx.master.state.put_revoke(self.client_id, &self.keys);
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::GetReplicaList {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<msg::ObjectLocation>>> {
        let v = cx.master.state.get_replica_list(&self.keys, cx.now);
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::Exist {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<u64>>> {
        let v = cx.master.state.exist(&self.keys);
        // A missing key is an answer, not a failure.
        cx.master.metrics.record(Self::OPCODE, v.len(), 0);
        Ok(v.into_iter().map(to_wire).collect())
    }
}

impl Handle for msg::Touch {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<bool>> {
        let v = cx.master.state.touch(&self.items, cx.now);
        // A touch of a replaced version is no failure: the client just
        // stops using that location.
        cx.master.metrics.record(Self::OPCODE, v.len(), 0);
        Ok(v)
    }
}

impl Handle for msg::Remove {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<Vec<WireResult<()>>> {
        let s = &cx.master.state;
        let v = s.remove(&self.keys, self.force, cx.now);
        cx.fence = s.fence(self.keys.iter().map(String::as_str));
        Ok(counted::<Self, _>(cx, v))
    }
}

impl Handle for msg::RemoveByRegex {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<u64> {
        let re = regex::Regex::new(&self.pattern)
            .map_err(|e| KvError::new(Code::InvalidParams, format!("bad regex: {e}")))?;
        cx.master.metrics.record(Self::OPCODE, 0, 0);
        let s = &cx.master.state;
        let removed = s.remove_matching(|k| re.is_match(k), self.force, cx.now);
        cx.fence = s.fence_all();
        Ok(removed)
    }
}

impl Handle for msg::RemoveAll {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<u64> {
        cx.master.metrics.record(Self::OPCODE, 0, 0);
        let s = &cx.master.state;
        let removed = s.remove_matching(|_| true, self.force, cx.now);
        cx.fence = s.fence_all();
        Ok(removed)
    }
}

impl Handle for msg::Status {
    fn handle(self, cx: &mut Ctx<'_>) -> KvResult<msg::ClusterStatus> {
        let mut st = cx.master.state.status();
        st.role = match cx.master.role(cx.now) {
            Role::Leader => "leader",
            Role::Recovering(_) => "recovering",
            Role::Standby => "standby",
        }
        .into();
        Ok(st)
    }
}
