//! Replica copies and moves between segments, and the tasks that track them.

use serde::{Deserialize, Serialize};

use super::*;

/// Regions on more segments for the current version of an object, so a
/// client can copy it there (a replica copy or move): it reads the object
/// from a source replica, writes it into each target region, and then
/// sends [`ReplicaCommit`]. Extends the object's read lease like a read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAdd {
    /// The copying client; only it may commit these regions.
    pub client_id: ClientId,
    /// The object.
    pub key: String,
    /// Segment names (or ids in hex) to copy to.
    pub targets: Vec<String>,
}

/// Where to copy an object from and to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPlan {
    /// Value bytes.
    pub value_len: u64,
    /// The version being copied; the commit must name it.
    pub generation: u64,
    /// The object's read lease, as in [`ObjectLocation`].
    pub lease_ms: u64,
    /// Its replicas now, to read from (with read grants).
    pub sources: Vec<Replica>,
    /// Per target: a region to write (with a write grant), `None` when the
    /// object already has a replica there, or the error for that target.
    pub targets: Vec<WireResult<Option<Replica>>>,
}

/// The end of a copy: attaches the written regions as replicas (when the
/// object is still the version copied), frees the failed ones, and drops
/// the object's replicas on `drop` (a move) as long as one stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaCommit {
    /// The copying client.
    pub client_id: ClientId,
    /// The object.
    pub key: String,
    /// The version copied.
    pub generation: u64,
    /// Segments whose region was written in full.
    pub written: Vec<SegmentId>,
    /// Segments whose region was not written.
    pub failed: Vec<SegmentId>,
    /// Segments whose replica to drop once the written ones are attached.
    pub drop: Vec<SegmentId>,
}

/// Drops the replicas of `keys` on `segment` (all of them, so the whole
/// object, when `None`); an object losing its last replica is removed.
/// Objects under a live read lease are left alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaClear {
    /// The objects.
    pub keys: Vec<String>,
    /// Segment name (or id in hex); `None` for every replica.
    pub segment: Option<String>,
}

/// A replica task's kind (Mooncake's `TaskType`).
pub mod task_kind {
    /// Copy an object to more segments.
    pub const COPY: u8 = 0;
    /// Move an object's replica from one segment to another.
    pub const MOVE: u8 = 1;
}

/// A replica task's state (Mooncake's `TaskStatus` numbers).
pub mod task_status {
    /// Recorded, not started.
    pub const PENDING: u8 = 0;
    /// Being carried out.
    pub const PROCESSING: u8 = 1;
    /// Ended in failure; the message says why.
    pub const FAILED: u8 = 2;
    /// Done.
    pub const SUCCESS: u8 = 3;
}

/// Records a replica copy or move of `key`, carried out by the calling
/// client; checked first (the key exists, the segments are mounted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCreate {
    /// The client that carries the task out.
    pub client_id: ClientId,
    /// [`task_kind`].
    pub kind: u8,
    /// The object.
    pub key: String,
    /// For a move: the segment to move from.
    pub source: String,
    /// Segments to copy or move to.
    pub targets: Vec<String>,
}

/// Progress of a task, from the client carrying it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUpdate {
    /// The client carrying it out.
    pub client_id: ClientId,
    /// The task.
    pub id: u128,
    /// [`task_status`].
    pub status: u8,
    /// What happened, for people.
    pub message: String,
}

/// Asks for a task's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskQuery {
    /// The task.
    pub id: u128,
}

/// A task as the master knows it (Mooncake's `QueryTaskResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// The task.
    pub id: u128,
    /// [`task_kind`].
    pub kind: u8,
    /// [`task_status`].
    pub status: u8,
    /// When it was recorded, ms since the Unix epoch.
    pub created_ms: u64,
    /// When its state last changed, ms since the Unix epoch.
    pub updated_ms: u64,
    /// The client carrying it out.
    pub assigned_client: ClientId,
    /// What happened, for people.
    pub message: String,
}
