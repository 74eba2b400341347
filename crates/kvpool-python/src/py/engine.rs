//! `kvpool._native.Engine`: this process's transfer engine (registered
//! memory, the server peers write into, and the client that writes into
//! theirs), behind `kvpool.engine.TransferEngine`, Mooncake's
//! `mooncake.engine.TransferEngine` surface.
//!
//! Conventions: registration errors raise `kvpool.errors` exceptions;
//! transfers return one integer per item (0 or a negative kvpool code) and
//! the Python layer folds them into Mooncake's 0 / -1. Transfers and
//! unregisters wait with the GIL released ([`wait`]). Asynchronous batches
//! run on the process runtime; their results wait in a table under their
//! batch id until asked for once (Mooncake frees a batch id when its
//! status is read as finished).
//!
//! Fork: the engine belongs to the process that made it (its server runs
//! on that process's runtime). A forked child gets an error from every call
//! and leaks the parent's sockets rather than deregistering them from the
//! epoll instance it shares with the parent.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvpool_client::auth::{Credentials, Security};
use kvpool_engine::{
    Direction, Engine as Client, EngineServer, Memory, Notifies, Region as Registered, Regions,
    SameHost, Transfer,
};
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;

use super::{invalid, raise, wait};
use crate::memory::Region;
use crate::runtime;

/// Asynchronous batches submitted and not yet asked for at once.
const MAX_PENDING_BATCHES: usize = 65_536;

/// What one process's engine holds.
struct Inner {
    regions: Arc<Regions>,
    notifies: Arc<Notifies>,
    server: EngineServer,
    client: Arc<Client>,
    /// Asynchronous batches by id: each answers 0 or its first failure's code.
    batches: Mutex<HashMap<u64, oneshot::Receiver<i32>>>,
    next_batch: AtomicU64,
}

/// A batch's code: 0 when every item succeeded, else the first failure's.
fn batch_code(results: Vec<KvResult<()>>, peer: &str) -> i32 {
    match results.into_iter().find_map(Result::err) {
        None => 0,
        Some(e) => {
            tracing::debug!(peer, error = %e, "transfer item failed");
            e.code.as_i32()
        }
    }
}

/// Items from three equally long lists, or an `INVALID_PARAMS` message.
fn items(locals: &[u64], remotes: &[u64], lengths: &[u64]) -> Result<Vec<Transfer>, String> {
    if locals.len() != remotes.len() || locals.len() != lengths.len() {
        return Err(format!(
            "{} local addresses, {} remote addresses and {} lengths: one of each per item",
            locals.len(),
            remotes.len(),
            lengths.len()
        ));
    }
    Ok((locals.iter().zip(remotes).zip(lengths))
        .map(|((&local, &remote), &len)| Transfer { local, remote, len })
        .collect())
}

/// A transfer engine: registered memory served to peers on a TCP port, and
/// transfers into and out of peers' registered memory.
#[pyclass(module = "kvpool._native", name = "Engine", frozen)]
pub struct Engine {
    /// The process that made it.
    pid: u32,
    inner: ManuallyDrop<Inner>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        if runtime::is_current(self.pid) {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.inner) };
        }
        // In a forked child the sockets are the parent's: leaked.
    }
}

impl Engine {
    /// The engine, unless this is a forked child of its maker.
    fn inner(&self, py: Python<'_>) -> PyResult<&Inner> {
        if runtime::is_current(self.pid) {
            Ok(&self.inner)
        } else {
            Err(raise(
                py,
                KvError::new(
                    Code::UnavailableInCurrentStatus,
                    "this transfer engine belongs to the parent process; make a new one after fork()",
                ),
            ))
        }
    }

    /// Runs `f` on the registered region holding `[addr, addr + len)`,
    /// which stays registered meanwhile; refused outside registered memory.
    fn with_registered<T>(
        &self,
        py: Python<'_>,
        addr: u64,
        len: u64,
        f: impl FnOnce(&Registered) -> T,
    ) -> PyResult<T> {
        let region = (self.inner(py)?.regions)
            .check(addr, len, "this engine's")
            .map_err(|e| raise(py, e))?;
        let Some(_pin) = region.try_pin() else {
            let e = KvError::new(Code::InvalidParams, "buffer is being unregistered");
            return Err(raise(py, e));
        };
        Ok(f(&region))
    }

    /// Runs a batch; one 0-or-negative code per item.
    fn transfer(
        &self,
        py: Python<'_>,
        dir: Direction,
        peer: &str,
        locals: Vec<u64>,
        remotes: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<Vec<i32>> {
        let items = items(&locals, &remotes, &lengths).map_err(|m| invalid(py, m))?;
        let inner = self.inner(py)?;
        // On the caller's own thread where the engine takes it (a peer the
        // shared runtime reached, see `transfer_blocking`), else there.
        let client = &inner.client;
        let alone = py
            .detach(|| runtime::waiting(|spin| client.transfer_blocking(peer, dir, &items, spin)));
        let results = match alone {
            Some(results) => results,
            None => wait(py, client.transfer(peer, dir, &items))?,
        };
        Ok(results
            .into_iter()
            .map(|r| match r {
                Ok(()) => 0,
                Err(e) => {
                    tracing::debug!(peer, error = %e, "transfer item failed");
                    e.code.as_i32()
                }
            })
            .collect())
    }
}

#[pymethods]
impl Engine {
    /// Binds `bind` (`host:port`, port 0 picks one) and serves this
    /// engine's registered memory there (and, unless
    /// `KVPOOL_ENGINE_SAME_HOST=0`, to processes of this user on this host
    /// on a Unix socket named after that address). Peers authenticate with the
    /// cluster secret of `secret` (a secret or secret-file text) or else
    /// `KVPOOL_SECRET_FILE`; without one, serving off loopback needs
    /// `insecure` (or `KVPOOL_INSECURE=1`). `timeout` (seconds) bounds each
    /// transfer call; default `MC_TRANSFER_TIMEOUT` or 30.
    #[new]
    #[pyo3(signature = (bind, secret = None, insecure = false, timeout = None))]
    fn new(
        py: Python<'_>,
        bind: &str,
        secret: Option<&str>,
        insecure: bool,
        timeout: Option<f64>,
    ) -> PyResult<Engine> {
        let mut security = Security::from_env().map_err(|e| raise(py, e))?;
        if let Some(s) = secret {
            security.credentials = Some(Credentials::parse(s).map_err(|e| raise(py, e))?);
        }
        security.insecure |= insecure;
        let client_timeout = timeout
            .map(|t| {
                kvpool_engine::timeout_secs(t).ok_or_else(|| {
                    PyValueError::new_err("timeout must be a positive number of seconds")
                })
            })
            .transpose()?;
        let regions = Arc::new(Regions::new());
        let notifies = Arc::new(Notifies::new());
        let same_host = SameHost::from_env();
        let serving = EngineServer::bind(
            bind,
            regions.clone(),
            notifies.clone(),
            security.clone(),
            same_host,
        );
        let server = wait(py, serving)?.map_err(|e| raise(py, e))?;
        let mut client =
            Client::new(regions.clone(), security).with_same_host(same_host != SameHost::Off);
        if let Some(t) = client_timeout {
            client = client.with_timeout(t);
        }
        Ok(Engine {
            pid: std::process::id(),
            inner: ManuallyDrop::new(Inner {
                regions,
                notifies,
                server,
                client: Arc::new(client),
                batches: Mutex::default(),
                next_batch: AtomicU64::new(1),
            }),
        })
    }

    /// The port the server listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.inner.server.local_addr().port()
    }

    /// The address the server listens on, `ip:port`.
    #[getter]
    fn bound(&self) -> String {
        self.inner.server.local_addr().to_string()
    }

    /// Registers `length` bytes at `addr`: peers may write and read them,
    /// and transfers may use them as local buffers, until unregistered.
    /// The caller vouches the memory stays valid and writable until then
    /// (Mooncake's contract); unreadable memory, an empty range, or one
    /// overlapping a registered buffer is refused.
    fn register(&self, py: Python<'_>, addr: u64, length: u64) -> PyResult<()> {
        let inner = self.inner(py)?;
        let region = Region::new(addr, length).map_err(|e| raise(py, e))?;
        let memory = Memory::locate(addr, length).map_err(|e| raise(py, e))?;
        if memory == Memory::Host {
            py.detach(|| region.readable()).map_err(|e| raise(py, e))?;
        }
        // SAFETY: the caller vouches the memory is valid for reads and
        // writes until it unregisters it (the documented contract); host
        // memory is mapped and readable now (checked above), GPU memory is
        // the driver's to check on each copy.
        unsafe { inner.regions.register(addr, length, memory) }.map_err(|e| raise(py, e))
    }

    /// Unregisters the buffer registered at `addr`, once transfers in
    /// flight into or out of it are done; whether one was registered there.
    fn unregister(&self, py: Python<'_>, addr: u64) -> PyResult<bool> {
        let inner = self.inner(py)?;
        wait(py, inner.regions.unregister(addr))
    }

    /// Start and length of the earliest registered buffer still in place.
    fn first_buffer(&self) -> Option<(u64, u64)> {
        self.inner.regions.first()
    }

    /// Writes `lengths[i]` bytes at `locals[i]` (registered here) to
    /// `remotes[i]` in the peer `peer` (`host:port`), pipelined; one code per
    /// item (0 or a negative kvpool code).
    fn write(
        &self,
        py: Python<'_>,
        peer: &str,
        locals: Vec<u64>,
        remotes: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<Vec<i32>> {
        self.transfer(py, Direction::Write, peer, locals, remotes, lengths)
    }

    /// Reads `lengths[i]` bytes at `remotes[i]` in the peer into
    /// `locals[i]` (registered here); one code per item.
    fn read(
        &self,
        py: Python<'_>,
        peer: &str,
        locals: Vec<u64>,
        remotes: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<Vec<i32>> {
        self.transfer(py, Direction::Read, peer, locals, remotes, lengths)
    }

    /// Starts a batch (a write when `write`, else a read) and returns its
    /// id at once (never 0). Ask for the outcome with `poll` or
    /// `wait_batches`, once.
    fn submit(
        &self,
        py: Python<'_>,
        write: bool,
        peer: String,
        locals: Vec<u64>,
        remotes: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<u64> {
        let items = items(&locals, &remotes, &lengths).map_err(|m| invalid(py, m))?;
        let inner = self.inner(py)?;
        let rt = runtime::get().map_err(|e| raise(py, e))?;
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut batches = inner.batches.lock();
            if batches.len() >= MAX_PENDING_BATCHES {
                return Err(raise(
                    py,
                    KvError::new(
                        Code::UnavailableInCurrentStatus,
                        format!(
                            "{MAX_PENDING_BATCHES} batches are waiting to be asked for: \
                             read their status before submitting more"
                        ),
                    ),
                ));
            }
            let id = inner.next_batch.fetch_add(1, Ordering::Relaxed);
            batches.insert(id, rx);
            id
        };
        let dir = if write {
            Direction::Write
        } else {
            Direction::Read
        };
        let client = inner.client.clone();
        rt.spawn(async move {
            let code = batch_code(client.transfer(&peer, dir, &items).await, &peer);
            let _ = tx.send(code);
        });
        Ok(id)
    }

    /// The outcome of batch `id` if it is over (0 or its first failure's
    /// code; the id is forgotten then), `None` while it runs. An unknown id
    /// is `INVALID_PARAMS`.
    fn poll(&self, py: Python<'_>, id: u64) -> PyResult<Option<i32>> {
        let inner = self.inner(py)?;
        let mut batches = inner.batches.lock();
        let Some(rx) = batches.get_mut(&id) else {
            return Err(invalid(py, format!("no batch {id}")));
        };
        let code = match rx.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => return Ok(None),
            Ok(code) => code,
            Err(oneshot::error::TryRecvError::Closed) => Code::InternalError.as_i32(),
        };
        batches.remove(&id);
        Ok(Some(code))
    }

    /// Waits for every batch in `ids` (the GIL released) and forgets them:
    /// 0 when all succeeded, else the first failure's code (an unknown id
    /// is `INVALID_PARAMS`'s).
    fn wait_batches(&self, py: Python<'_>, ids: Vec<u64>) -> PyResult<i32> {
        let inner = self.inner(py)?;
        let mut waiting = Vec::with_capacity(ids.len());
        let mut first = 0;
        {
            let mut batches = inner.batches.lock();
            for id in &ids {
                match batches.remove(id) {
                    Some(rx) => waiting.push(rx),
                    None if first == 0 => first = Code::InvalidParams.as_i32(),
                    None => {}
                }
            }
        }
        let codes = wait(py, async move {
            let mut codes = Vec::with_capacity(waiting.len());
            for rx in waiting {
                codes.push(rx.await.unwrap_or(Code::InternalError.as_i32()));
            }
            codes
        })?;
        Ok(std::iter::once(first)
            .chain(codes)
            .find(|&c| c != 0)
            .unwrap_or(0))
    }

    /// Queues the notify `(name, msg)` at the peer: 0 or a negative code.
    fn notify(&self, py: Python<'_>, peer: &str, name: &str, msg: &str) -> PyResult<i32> {
        let inner = self.inner(py)?;
        Ok(match wait(py, inner.client.notify(peer, name, msg))? {
            Ok(()) => 0,
            Err(e) => {
                tracing::debug!(peer, error = %e, "notify failed");
                e.code.as_i32()
            }
        })
    }

    /// Every notify peers queued here, oldest first, as `(name, msg)`; each
    /// is handed out once.
    fn take_notifies(&self, py: Python<'_>) -> PyResult<Vec<(String, String)>> {
        let inner = self.inner(py)?;
        Ok(inner
            .notifies
            .take_all()
            .into_iter()
            .map(|n| (n.name, n.msg))
            .collect())
    }

    /// Asks the peer what it holds, in a fresh round trip: the start of
    /// its earliest registered buffer (or `None`). Raises when the peer
    /// cannot be reached or refuses us.
    fn about(&self, py: Python<'_>, peer: &str) -> PyResult<Option<u64>> {
        let inner = self.inner(py)?;
        let about = wait(py, inner.client.about(peer))?.map_err(|e| raise(py, e))?;
        Ok(about.first_buffer)
    }

    /// Waits (the GIL released) until CUDA stream `stream` (0: the legacy
    /// default stream) has done the work queued on it so far, in the
    /// context of the GPU memory at `addr` when it is registered here as
    /// such, else in the calling thread's current one.
    fn wait_for_stream(&self, py: Python<'_>, addr: u64, stream: u64) -> PyResult<()> {
        let region = self.inner(py)?.regions.find(addr, 1);
        let device = region.and_then(|r| r.memory().device());
        py.detach(|| kvpool_engine::wait_for_stream(stream, device))
            .map_err(|e| raise(py, e))
    }

    /// Copies `data` to `addr`, which must lie in memory registered here.
    fn copy_in(&self, py: Python<'_>, addr: u64, data: &[u8]) -> PyResult<()> {
        let copied = self.with_registered(py, addr, data.len() as u64, |region| {
            // SAFETY: inside a registered region, kept registered meanwhile.
            unsafe { region.store(addr, data) }
        })?;
        copied.map_err(|e| raise(py, e))
    }

    /// The `length` bytes at `addr`, which must lie in memory registered here.
    fn copy_out<'py>(
        &self,
        py: Python<'py>,
        addr: u64,
        length: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut staging = Vec::new();
        let bytes = self.with_registered(py, addr, length, |region| {
            // SAFETY: inside a registered region, kept registered meanwhile.
            unsafe { region.load(addr, length, &mut staging) }.map(|b| PyBytes::new(py, b))
        })?;
        bytes.map_err(|e| raise(py, e))
    }

    /// How `peer` was last reached: `copy`, `socket`, `tcp` or `unknown`.
    fn link(&self, py: Python<'_>, peer: &str) -> PyResult<&'static str> {
        Ok(self.inner(py)?.client.link(peer))
    }

    /// Stops serving: peers' transfers are refused from now on.
    fn close(&self) {
        self.inner.server.shutdown();
    }
}
