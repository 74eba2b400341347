//! The client side of the data plane: many region writes and reads
//! pipelined on one connection (or, for reads, a batch shared by several
//! connections to one store), each write sent straight from the caller's
//! buffers and each read landing straight in them.
//!
//! At most [`WINDOW`] requests are in flight per connection, so neither side
//! ever has to buffer more than that and pipelining cannot deadlock.

use std::collections::VecDeque;

use kvpool_format::ValueHasher;
use kvpool_net::conn::FramedConn;
use kvpool_proto::msg::{ReadReq, WriteReq};
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::Mutex;

use super::WINDOW;

/// One region write: the concatenation of `parts` goes to `req`'s region.
pub struct WriteOp<'a> {
    /// Where to write.
    pub req: WriteReq,
    /// Bytes to write, in order (e.g. object header, then the caller's value).
    pub parts: Vec<&'a [u8]>,
}

/// One region read: `req.len` bytes scattered over `dst`, in order.
pub struct ReadOp<'a> {
    /// What to read.
    pub req: ReadReq,
    /// Destination buffers; their lengths must add up to `req.len`.
    pub dst: Vec<&'a mut [u8]>,
}

/// Pipelines `ops` on `conn`. The outer error means the connection broke and
/// must be dropped (no item's outcome is known); otherwise one result per op.
pub async fn write_regions(
    conn: &mut FramedConn,
    ops: &[WriteOp<'_>],
) -> KvResult<Vec<KvResult<()>>> {
    let mut ids = Vec::with_capacity(ops.len());
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        if ids.len() - results.len() == WINDOW {
            conn.flush().await?;
            results.push(conn.read_ack(ids[results.len()]).await?);
        }
        ids.push(conn.send_request(&op.req, &op.parts).await?);
    }
    conn.flush().await?;
    while results.len() < ids.len() {
        results.push(conn.read_ack(ids[results.len()]).await?);
    }
    Ok(results)
}

/// Pipelines `ops` on `conn` alone, filling each op's buffers, in order.
/// Same error contract as [`write_regions`].
pub async fn read_regions(
    conn: &mut FramedConn,
    ops: Vec<ReadOp<'_>>,
) -> KvResult<Vec<KvResult<()>>> {
    let queue = Mutex::new(ops.into_iter().map(|op| ((), op)).collect());
    match read_regions_shared(conn, &queue).await {
        (_, Some(e)) => Err(e),
        (done, None) => Ok(done.into_iter().map(|(_, _, r)| r.map(drop)).collect()),
    }
}

/// Bytes one connection keeps requested ahead when it shares a batch of
/// reads with other connections: enough to keep the stream full, little
/// enough that a connection running ahead takes what the others have not.
const SHARED_AHEAD: u64 = 1 << 20;

/// Pipelines reads taken one at a time from `queue`, which other
/// connections to the same store take from too, so a faster connection
/// does more of the batch and none idles while another still has a tail.
/// Returns each op taken, with its tag and result: the checksum of the
/// bytes that landed in all its buffers but the first (an object's value,
/// after its header), hashed as they landed. If the connection broke,
/// the ops it had in flight fail with that error (the rest stay queued) and
/// the error is returned too: drop the connection.
pub async fn read_regions_shared<'a, T>(
    conn: &mut FramedConn,
    queue: &Mutex<VecDeque<(T, ReadOp<'a>)>>,
) -> (Vec<(T, ReadOp<'a>, KvResult<u64>)>, Option<KvError>) {
    let mut done = Vec::new();
    let mut inflight: VecDeque<(u64, T, ReadOp<'a>)> = VecDeque::new();
    let mut ahead = 0u64;
    let broke = 'conn: loop {
        // Bounded in count too: requests must fit the peer's receive buffer
        // while this side is not reading, or both would wait forever.
        while inflight.is_empty() || (ahead < SHARED_AHEAD && inflight.len() < WINDOW) {
            let Some((tag, op)) = queue.lock().pop_front() else {
                break;
            };
            if op.dst.iter().map(|d| d.len() as u64).sum::<u64>() != op.req.len {
                let e = KvError::new(
                    Code::InvalidParams,
                    "read buffers do not match the read length",
                );
                done.push((tag, op, Err(e)));
                continue;
            }
            match conn.send_request(&op.req, &[]).await {
                Ok(id) => {
                    ahead += op.req.len;
                    inflight.push_back((id, tag, op));
                }
                Err(e) => {
                    done.push((tag, op, Err(e.clone())));
                    break 'conn e;
                }
            }
        }
        let Some((id, tag, mut op)) = inflight.pop_front() else {
            return (done, None);
        };
        ahead -= op.req.len;
        // The outer `Err`: the stream broke or is out of step.
        let r = async {
            conn.flush().await?;
            let h = match conn.read_answer(id).await? {
                Ok(h) => h,
                Err(e) => return Ok(Err(e)),
            };
            if h.meta_len != 0 || h.payload_len != op.req.len {
                return Err(KvError::new(
                    Code::RpcFail,
                    "read response of the wrong length",
                ));
            }
            let mut sum = ValueHasher::new();
            let mut dst = op.dst.iter_mut();
            if let Some(head) = dst.next() {
                conn.read_payload(head).await?;
            }
            for d in dst {
                conn.read_payload_seen(d, |piece| sum.update(piece)).await?;
            }
            Ok(Ok(sum.digest()))
        }
        .await;
        match r {
            // A broken stream (not an error response) fails the rest.
            Err(e) => {
                done.push((tag, op, Err(e.clone())));
                break e;
            }
            Ok(r) => done.push((tag, op, r)),
        }
    };
    for (_, tag, op) in inflight {
        done.push((tag, op, Err(broke.clone())));
    }
    (done, Some(broke))
}
