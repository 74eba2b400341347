//! `kvpool._native.Engine`: this process's transfer engine (registered
//! memory, the server peers write into, and the client that writes into
//! theirs), behind `kvpool.engine.TransferEngine`, Mooncake's
//! `mooncake.engine.TransferEngine` surface.
//!
//! Conventions: registration errors raise `kvpool.errors` exceptions;
//! transfers return one integer per item (0 or a negative kvpool code) and
//! the Python layer folds them into Mooncake's 0 / -1. Transfers and
//! unregisters wait with the GIL released ([`wait`]).
//!
//! Fork: the engine belongs to the process that made it (its server runs
//! on that process's runtime). A forked child gets an error from every call
//! and leaks the parent's sockets rather than deregistering them from the
//! epoll instance it shares with the parent.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use kvpool_client::auth::{Credentials, Security};
use kvpool_engine::{Direction, Engine as Client, EngineServer, Regions, Transfer};
use kvpool_proto::{Code, KvError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{invalid, raise, wait};
use crate::memory::Region;
use crate::runtime;

/// What one process's engine holds.
struct Inner {
    regions: Arc<Regions>,
    server: EngineServer,
    client: Client,
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
        if locals.len() != remotes.len() || locals.len() != lengths.len() {
            return Err(invalid(
                py,
                format!(
                    "{} local addresses, {} remote addresses and {} lengths: one of each per item",
                    locals.len(),
                    remotes.len(),
                    lengths.len()
                ),
            ));
        }
        let items: Vec<Transfer> = (locals.iter().zip(&remotes).zip(&lengths))
            .map(|((&local, &remote), &len)| Transfer { local, remote, len })
            .collect();
        let inner = self.inner(py)?;
        let results = wait(py, inner.client.transfer(peer, dir, &items))?;
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
    /// engine's registered memory there. Peers authenticate with the
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
        let server = wait(
            py,
            EngineServer::bind(bind, regions.clone(), security.clone()),
        )?
        .map_err(|e| raise(py, e))?;
        let mut client = Client::new(regions.clone(), security);
        if let Some(t) = client_timeout {
            client = client.with_timeout(t);
        }
        Ok(Engine {
            pid: std::process::id(),
            inner: ManuallyDrop::new(Inner {
                regions,
                server,
                client,
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
        py.detach(|| region.readable()).map_err(|e| raise(py, e))?;
        // SAFETY: the caller vouches the memory is valid for reads and
        // writes until it unregisters it (the documented contract); it is
        // mapped and readable now (checked above).
        unsafe { inner.regions.register(addr, length) }.map_err(|e| raise(py, e))
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

    /// Stops serving: peers' transfers are refused from now on.
    fn close(&self) {
        self.inner.server.shutdown();
    }
}
