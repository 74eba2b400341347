//! Notifications peers sent this engine after their batches landed
//! (Mooncake's `TransferNotify`), kept until the owner takes them with
//! `get_notifies`.
//!
//! The queue is bounded: an owner that never reads them would otherwise
//! let peers grow this process's memory without end. A notify that does
//! not fit is refused, so its sender's call fails (it learns the peer is
//! not keeping up) instead of the notify vanishing unseen.

use std::collections::VecDeque;

use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::Mutex;

/// Notifies kept unread before new ones are refused.
pub const MAX_UNREAD: usize = 65_536;

/// Bytes of `name` plus `msg` one notify may carry.
pub const MAX_NOTIFY_BYTES: usize = 64 << 10;

/// One notification: who sent it and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    /// The sender's name for itself (Mooncake's `notify.name`).
    pub name: String,
    /// The message (Mooncake's `notify.msg`).
    pub msg: String,
}

/// The unread notifications of one engine, oldest first.
#[derive(Debug, Default)]
pub struct Notifies {
    queue: Mutex<VecDeque<Notify>>,
}

impl Notifies {
    /// An empty queue.
    pub fn new() -> Notifies {
        Notifies::default()
    }

    /// Queues `n`, unless it is too large or [`MAX_UNREAD`] are unread.
    pub fn push(&self, n: Notify) -> KvResult<()> {
        if n.name.len() + n.msg.len() > MAX_NOTIFY_BYTES {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("a notify carries at most {MAX_NOTIFY_BYTES} bytes of name and message"),
            ));
        }
        let mut q = self.queue.lock();
        if q.len() >= MAX_UNREAD {
            return Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                format!("{MAX_UNREAD} notifies are unread: the peer is not taking them"),
            ));
        }
        q.push_back(n);
        Ok(())
    }

    /// Takes every unread notification, oldest first.
    pub fn take_all(&self) -> Vec<Notify> {
        self.queue.lock().drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: usize) -> Notify {
        Notify {
            name: format!("p{i}"),
            msg: String::new(),
        }
    }

    #[test]
    fn bounded_and_drained_in_order() {
        let q = Notifies::new();
        for i in 0..MAX_UNREAD {
            q.push(n(i)).unwrap();
        }
        let full = q.push(n(MAX_UNREAD)).unwrap_err();
        assert_eq!(full.code, Code::UnavailableInCurrentStatus);
        let all = q.take_all();
        assert_eq!(all.len(), MAX_UNREAD);
        assert_eq!(all[0], n(0));
        assert_eq!(all[MAX_UNREAD - 1], n(MAX_UNREAD - 1));
        assert!(q.take_all().is_empty());
        q.push(n(1)).unwrap();
        let big = Notify {
            name: String::new(),
            msg: "x".repeat(MAX_NOTIFY_BYTES + 1),
        };
        assert_eq!(q.push(big).unwrap_err().code, Code::InvalidParams);
    }
}
