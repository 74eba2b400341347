//! Error codes: stable integers on the wire, with Mooncake's numbers where
//! Mooncake has the same condition (users already branch on them).

use std::fmt;

/// A stable error code. `Ok` is 0; every error is negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Code {
    /// Success.
    Ok = 0,
    /// A bug or an unexpected condition inside kvpool.
    InternalError = -1,
    /// A caller buffer or a frame is larger than allowed.
    BufferOverflow = -10,
    /// The named segment is not mounted.
    SegmentNotFound = -101,
    /// A segment with this id is already mounted.
    SegmentAlreadyExists = -102,
    /// The master does not know this client (expired or never registered).
    ClientNotFound = -103,
    /// No space for the object even after eviction.
    NoAvailableHandle = -200,
    /// Protocol version mismatch in the handshake.
    InvalidVersion = -300,
    /// Empty or oversized key.
    InvalidKey = -400,
    /// Writing the object failed.
    WriteFail = -500,
    /// A parameter is out of range (e.g. a caller buffer too small).
    InvalidParams = -600,
    /// PutEnd/PutRevoke from a client that did not start the put.
    IllegalClient = -601,
    /// A write outside a segment or otherwise malformed.
    InvalidWrite = -700,
    /// A read outside a segment or otherwise malformed.
    InvalidRead = -701,
    /// The object is still being written.
    ReplicaIsNotReady = -703,
    /// No such object (never written, removed, or evicted).
    ObjectNotFound = -704,
    /// The object exists (insert of an existing key at the master level).
    ObjectAlreadyExists = -705,
    /// Remove refused: a read lease is live.
    ObjectHasLease = -706,
    /// A read outlived its lease; its bytes were discarded.
    LeaseExpired = -707,
    /// Moving bytes to or from a storage node failed.
    TransferFail = -800,
    /// Bytes read do not match the object's checksum or header.
    ChecksumMismatch = -801,
    /// A control or data connection failed.
    RpcFail = -900,
    /// A call did not complete within its timeout.
    RpcTimeout = -901,
    /// etcd failed.
    EtcdOperationError = -1000,
    /// The server cannot serve this now (e.g. not the leader, draining).
    UnavailableInCurrentStatus = -1010,
    /// The operation or option is not supported.
    NotSupported = -1012,
    /// kvpool's own: the peer did not prove the cluster secret, or its role
    /// may not do this (see docs/security.md).
    Unauthorized = -1100,
    /// kvpool's own: the tenant's quota (objects, bytes or clients) is
    /// used up; other tenants' puts still succeed (docs/security.md).
    QuotaExceeded = -1101,
    /// No replica copy or move task with this id (Mooncake's number).
    TaskNotFound = -1400,
}

impl Code {
    /// Every code, for exhaustive tests and docs.
    pub const ALL: [Code; 29] = [
        Code::Ok,
        Code::InternalError,
        Code::BufferOverflow,
        Code::SegmentNotFound,
        Code::SegmentAlreadyExists,
        Code::ClientNotFound,
        Code::NoAvailableHandle,
        Code::InvalidVersion,
        Code::InvalidKey,
        Code::WriteFail,
        Code::InvalidParams,
        Code::IllegalClient,
        Code::InvalidWrite,
        Code::InvalidRead,
        Code::ReplicaIsNotReady,
        Code::ObjectNotFound,
        Code::ObjectAlreadyExists,
        Code::ObjectHasLease,
        Code::LeaseExpired,
        Code::TransferFail,
        Code::ChecksumMismatch,
        Code::RpcFail,
        Code::RpcTimeout,
        Code::EtcdOperationError,
        Code::UnavailableInCurrentStatus,
        Code::NotSupported,
        Code::Unauthorized,
        Code::QuotaExceeded,
        Code::TaskNotFound,
    ];

    /// The integer sent on the wire and returned by the Mooncake-compatible API.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// Decodes a wire integer; unknown values map to `InternalError` so a newer
    /// peer's code never turns into success.
    pub fn from_i32(v: i32) -> Code {
        Code::ALL
            .iter()
            .copied()
            .find(|c| c.as_i32() == v)
            .unwrap_or(Code::InternalError)
    }

    /// Mooncake's upper-case name.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::InternalError => "INTERNAL_ERROR",
            Code::BufferOverflow => "BUFFER_OVERFLOW",
            Code::SegmentNotFound => "SEGMENT_NOT_FOUND",
            Code::SegmentAlreadyExists => "SEGMENT_ALREADY_EXISTS",
            Code::ClientNotFound => "CLIENT_NOT_FOUND",
            Code::NoAvailableHandle => "NO_AVAILABLE_HANDLE",
            Code::InvalidVersion => "INVALID_VERSION",
            Code::InvalidKey => "INVALID_KEY",
            Code::WriteFail => "WRITE_FAIL",
            Code::InvalidParams => "INVALID_PARAMS",
            Code::IllegalClient => "ILLEGAL_CLIENT",
            Code::InvalidWrite => "INVALID_WRITE",
            Code::InvalidRead => "INVALID_READ",
            Code::ReplicaIsNotReady => "REPLICA_IS_NOT_READY",
            Code::ObjectNotFound => "OBJECT_NOT_FOUND",
            Code::ObjectAlreadyExists => "OBJECT_ALREADY_EXISTS",
            Code::ObjectHasLease => "OBJECT_HAS_LEASE",
            Code::LeaseExpired => "LEASE_EXPIRED",
            Code::TransferFail => "TRANSFER_FAIL",
            Code::ChecksumMismatch => "CHECKSUM_MISMATCH",
            Code::RpcFail => "RPC_FAIL",
            Code::RpcTimeout => "RPC_TIMEOUT",
            Code::EtcdOperationError => "ETCD_OPERATION_ERROR",
            Code::UnavailableInCurrentStatus => "UNAVAILABLE_IN_CURRENT_STATUS",
            Code::NotSupported => "NOT_SUPPORTED",
            Code::Unauthorized => "UNAUTHORIZED",
            Code::QuotaExceeded => "QUOTA_EXCEEDED",
            Code::TaskNotFound => "TASK_NOT_FOUND",
        }
    }

    /// Whether retrying the same call later may succeed (connection trouble,
    /// a store restarting, a read too slow for its lease, a write still in
    /// flight, a master that is not ready yet).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Code::RpcFail
                | Code::RpcTimeout
                | Code::TransferFail
                | Code::LeaseExpired
                | Code::ReplicaIsNotReady
                | Code::UnavailableInCurrentStatus
                | Code::ClientNotFound
        )
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.as_i32())
    }
}

/// An error with a stable [`Code`] callers branch on and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct KvError {
    /// What kind of failure; maps to the wire and to Mooncake's return codes.
    pub code: Code,
    /// Human-readable detail.
    pub message: String,
    /// Set by [`KvError::settled`]: not worth another try within this call.
    settled: bool,
}

impl KvError {
    /// Builds an error from a code and a message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        KvError {
            code,
            message: message.into(),
            settled: false,
        }
    }

    /// This error, final for the call that met it although its code is
    /// transient: what caused it will not change within the call (every
    /// replica of an object is on a store this process knows is down), so
    /// retrying would only spend the caller's time. Never sent on the wire.
    pub fn settled(mut self) -> Self {
        self.settled = true;
        self
    }

    /// Whether trying the call again may succeed: a transient code, not
    /// [settled](KvError::settled).
    pub fn is_retryable(&self) -> bool {
        self.code.is_transient() && !self.settled
    }
}

impl From<Code> for KvError {
    fn from(code: Code) -> Self {
        KvError::new(code, code.name())
    }
}

/// Result with a [`KvError`].
pub type KvResult<T> = Result<T, KvError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_i32()), "duplicate {c}");
            assert_eq!(Code::from_i32(c.as_i32()), c);
        }
        assert_eq!(Code::from_i32(-12345), Code::InternalError);
    }

    #[test]
    fn mooncake_numbers() {
        assert_eq!(Code::ObjectNotFound.as_i32(), -704);
        assert_eq!(Code::ObjectHasLease.as_i32(), -706);
        assert_eq!(Code::NoAvailableHandle.as_i32(), -200);
        assert_eq!(Code::InvalidParams.as_i32(), -600);
        assert_eq!(Code::NotSupported.as_i32(), -1012);
    }
}
