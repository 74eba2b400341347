//! `kvpool._native.Client`: one connection to a kvpool cluster, shared by the
//! Pythonic `kvpool.Client` and `kvpool.mooncake.MooncakeDistributedStore`.
//!
//! Conventions: single-object calls raise `kvpool.errors` exceptions; batch
//! calls return one integer per key (0 / bytes read / 1-0 for existence, or a
//! negative Mooncake code) so no partial success is hidden. Every network
//! wait goes through [`wait`] with the GIL released.
//!
//! Fork: the connection belongs to the process that made it. A forked child
//! that uses the object reconnects on first use as a pure client (it never
//! lends the parent's segment, and never touches the parent's sockets).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use kvpool_client::{ClientConfig, GetInto, ReplicateConfig};
use kvpool_proto::{Code, KvError, KvResult};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::buffers::{fill_targets, hold, Buffer, Held, OVERLAP};
use super::convert::{replicate_config, settings_from_dict};
use super::results::*;
use super::{raise, wait};
use crate::runtime;

/// Connection state; locked only while the GIL is held and never across a
/// GIL release, so a `fork()` (which happens with the GIL held) cannot leave
/// it locked in the child.
struct State {
    /// Process that owns `client`.
    pid: u32,
    /// The live connection, if any.
    client: Option<kvpool_client::Client>,
    /// `close()` was called.
    closed: bool,
}

/// A connection to a kvpool cluster (see the module docs for conventions).
#[pyclass(module = "kvpool._native", name = "Client", frozen, weakref)]
pub struct Client {
    cfg: ClientConfig,
    /// The process that connected (and lends the segment, if any).
    creator_pid: u32,
    state: Mutex<State>,
}

impl Client {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the state is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection for this process, reconnecting (as a pure client)
    /// after a fork.
    fn client(&self, py: Python<'_>) -> PyResult<kvpool_client::Client> {
        let cfg = {
            let mut st = self.lock();
            if st.closed {
                return Err(raise(
                    py,
                    KvError::new(Code::UnavailableInCurrentStatus, "the client is closed"),
                ));
            }
            if runtime::is_current(st.pid) {
                if let Some(c) = &st.client {
                    return Ok(c.clone());
                }
            }
            // A forked child: the parent's connection, heartbeat and lent
            // segment are the parent's. Leak them (dropping would deregister
            // the parent's sockets from the shared epoll instance).
            if let Some(old) = st.client.take() {
                std::mem::forget(old);
            }
            let mut cfg = self.cfg.clone();
            cfg.segment_size = 0;
            cfg
        };
        let c = wait(py, kvpool_client::Client::connect(cfg))?.map_err(|e| raise(py, e))?;
        let mut st = self.lock();
        if runtime::is_current(st.pid) {
            if let Some(existing) = &st.client {
                // Another thread reconnected first; keep its connection.
                let existing = existing.clone();
                drop(st);
                spawn_close(c);
                return Ok(existing);
            }
        }
        st.pid = std::process::id();
        st.client = Some(c.clone());
        Ok(c)
    }

    /// Name of the segment this process lends, if it lends one (only the
    /// process that connected lends; a forked child is a pure client).
    fn own_segment(&self) -> Option<String> {
        (self.lent_bytes() > 0).then(|| self.cfg.hostname.clone())
    }

    fn config(&self, py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<ReplicateConfig> {
        let own = self.own_segment();
        replicate_config(py, obj, own.as_deref())
    }

    /// Reads `keys` into new `bytes` objects, each made at its value's
    /// exact size and read into directly (no second copy), by the client's
    /// one get algorithm. One result per key.
    fn read_new_bytes<'py>(
        &self,
        py: Python<'py>,
        keys: &[&str],
    ) -> PyResult<Vec<KvResult<Bound<'py, PyBytes>>>> {
        let c = self.client(py)?;
        // One trip back into Python per pass, for all its values. A
        // `bytes` Python cannot make (MemoryError) is raised, as before.
        let refused: std::sync::Mutex<Option<PyErr>> = Default::default();
        let alloc = |lens: &[usize]| {
            Python::attach(|py| {
                lens.iter()
                    .map(|&n| {
                        // SAFETY: the client fills the whole value or drops
                        // the object unseen; `NewBytes` keeps it alive for
                        // as long as the slice is used.
                        unsafe { unfilled_bytes(py, n) }
                            .map(|(obj, dst)| NewBytes {
                                obj: obj.unbind(),
                                dst,
                            })
                            .map_err(|e| {
                                let k = KvError::new(Code::InternalError, e.to_string());
                                let mut first = refused.lock().unwrap_or_else(|p| p.into_inner());
                                first.get_or_insert(e);
                                k
                            })
                    })
                    .collect()
            })
        };
        let got = wait(py, async { c.batch_get_with(keys, alloc).await })?;
        if let Some(e) = refused.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        Ok(got
            .into_iter()
            .map(|r| r.map(|b| b.obj.into_bound(py)))
            .collect())
    }
}

/// A `bytes` object being filled by a get, and its contents.
struct NewBytes {
    obj: Py<PyBytes>,
    dst: &'static mut [u8],
}

impl AsRef<[u8]> for NewBytes {
    fn as_ref(&self) -> &[u8] {
        self.dst
    }
}

impl AsMut<[u8]> for NewBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        self.dst
    }
}

/// A new `bytes` of `len` bytes, not yet filled, and its contents to fill.
/// Not zeroed first: a read writes every byte, and for big values zeroing
/// would touch all that memory once more.
///
/// # Safety
/// The caller fills it (or drops it) before Python can see it, and keeps
/// the object alive for as long as it uses the slice.
unsafe fn unfilled_bytes<'py>(
    py: Python<'py>,
    len: usize,
) -> PyResult<(Bound<'py, PyBytes>, &'static mut [u8])> {
    let size = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| PyValueError::new_err("value too large for bytes"))?;
    // SAFETY: a NULL source asks CPython for an uninitialised bytes object of
    // `size` bytes, which only this function references; the slice covers
    // exactly its contents and lives no longer than the caller keeps it.
    unsafe {
        let obj = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), size);
        let b = Bound::from_owned_ptr_or_err(py, obj)?.cast_into_unchecked::<PyBytes>();
        let data = pyo3::ffi::PyBytes_AsString(b.as_ptr()).cast::<u8>();
        Ok((b, std::slice::from_raw_parts_mut(data, len)))
    }
}

/// Closes a connection in the background (used where blocking is wrong).
fn spawn_close(c: kvpool_client::Client) {
    if let Ok(rt) = runtime::get() {
        rt.spawn(async move { c.close().await });
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = st.client.take() {
            if !runtime::is_current(st.pid) {
                // The parent's connection, seen from a forked child.
                std::mem::forget(c);
            } else if !st.closed {
                // Unmount a lent segment promptly instead of waiting for the
                // master's client TTL.
                spawn_close(c);
            }
        }
    }
}

/// A page of `list_keys`: `(key, value size)` pairs and the cursor bytes.
type KeyPage<'py> = (Vec<(String, u64)>, Bound<'py, PyBytes>);

#[pymethods]
impl Client {
    /// Connects with resolved settings: the dict `resolve_settings` returns
    /// (the caller may change values in it, e.g. `local_hostname`); with
    /// `global_segment_size` > 0 this process also lends that many bytes to
    /// the pool. Values are checked as `resolve_settings` checks them, but
    /// the environment and config file are not read again.
    #[new]
    fn new(py: Python<'_>, settings: &Bound<'_, PyDict>) -> PyResult<Self> {
        let cfg = settings_from_dict(py, settings)?
            .client_config()
            .map_err(|e| raise(py, e))?;
        let c = wait(py, kvpool_client::Client::connect(cfg.clone()))?.map_err(|e| raise(py, e))?;
        Ok(Client {
            cfg,
            creator_pid: std::process::id(),
            state: Mutex::new(State {
                pid: std::process::id(),
                client: Some(c),
                closed: false,
            }),
        })
    }

    /// Master address in use.
    #[getter]
    fn master(&self) -> String {
        self.cfg.master.clone()
    }

    /// This client's name (and its lent segment's name).
    #[getter]
    fn hostname(&self) -> String {
        self.cfg.hostname.clone()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().closed
    }

    /// Bytes this process lends to the pool through this client (0 in a
    /// forked child, which is a pure client).
    #[getter]
    fn lent_bytes(&self) -> u64 {
        let st = self.lock();
        if st.closed || !runtime::is_current(self.creator_pid) || st.client.is_none() {
            0
        } else {
            self.cfg.segment_size
        }
    }

    /// Withdraws the lent segment and disconnects; later calls raise.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let c = {
            let mut st = self.lock();
            if st.closed {
                return Ok(());
            }
            st.closed = true;
            match st.client.take() {
                Some(c) if runtime::is_current(st.pid) => Some(c),
                Some(c) => {
                    std::mem::forget(c);
                    None
                }
                None => None,
            }
        };
        if let Some(c) = c {
            wait(py, async move { c.close().await })?;
        }
        Ok(())
    }

    /// Stores one object from `value` (memory: buffer, tensor, or int
    /// address with `size`); `upsert` replaces an existing value, otherwise an
    /// existing key is kept and the call succeeds.
    #[pyo3(signature = (key, value, size = None, config = None, upsert = false))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        size: Option<u64>,
        config: Option<&Bound<'_, PyAny>>,
        upsert: bool,
    ) -> PyResult<()> {
        let cfg = self.config(py, config)?;
        let held = hold(py, value, size, false)?;
        let c = self.client(py)?;
        let parts: [&[u8]; 1] = [held.bytes()];
        let r = wait(py, async {
            c.batch_put(&[(key, &parts[..])], &cfg, upsert).await
        })?;
        drop(held);
        one(py, r)
    }

    /// Stores the concatenation of `parts` (each a memory object) as one object.
    #[pyo3(signature = (key, parts, config = None, upsert = false))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
        config: Option<&Bound<'_, PyAny>>,
        upsert: bool,
    ) -> PyResult<()> {
        let cfg = self.config(py, config)?;
        let held: Vec<Held> = parts
            .iter()
            .map(|p| hold(py, p, None, false))
            .collect::<PyResult<_>>()?;
        let c = self.client(py)?;
        let slices: Vec<&[u8]> = held.iter().map(Held::bytes).collect();
        let r = wait(py, async {
            c.batch_put(&[(key, &slices[..])], &cfg, upsert).await
        })?;
        drop(held);
        one(py, r)
    }

    /// Stores many objects; `values[i]` is a memory object or a list of them
    /// (concatenated), `sizes[i]` its size(s) when given as int addresses.
    /// Returns one code per key: 0, or a negative Mooncake code.
    #[pyo3(signature = (keys, values, sizes = None, config = None, upsert = false))]
    fn batch_put(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        sizes: Option<&Bound<'_, PyAny>>,
        config: Option<&Bound<'_, PyAny>>,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        let cfg = self.config(py, config)?;
        let held = hold_items(py, keys.len(), values, sizes, false)?;
        let mut codes = vec![0i64; keys.len()];
        let slices: Vec<Vec<&[u8]>> = held
            .iter()
            .map(|h| match h {
                Ok(hs) => hs.iter().map(Held::bytes).collect(),
                Err(_) => Vec::new(),
            })
            .collect();
        let mut items: Vec<(&str, &[&[u8]])> = Vec::with_capacity(keys.len());
        let mut index = Vec::with_capacity(keys.len());
        for (i, h) in held.iter().enumerate() {
            match h {
                Ok(_) => {
                    items.push((keys[i].as_str(), &slices[i][..]));
                    index.push(i);
                }
                Err(e) => codes[i] = code(e),
            }
        }
        if !items.is_empty() {
            let c = self.client(py)?;
            let r = wait(py, async { c.batch_put(&items, &cfg, upsert).await })?;
            for (i, r) in index.into_iter().zip(r) {
                codes[i] = code_of(&r);
            }
        }
        drop(held);
        Ok(codes)
    }

    /// Reads one object as `bytes`: located first, so the `bytes` is made at
    /// its exact size and the value is read straight into it (no second
    /// copy). A transient failure takes the client's retrying path.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let r = self.read_new_bytes(py, &[key])?.into_iter().next();
        r.unwrap_or_else(|| Err(KvError::from(Code::InternalError)))
            .map_err(|e| raise(py, e))
    }

    /// Reads one object into a new `Buffer` (no copy after the read).
    fn get_buffer(&self, py: Python<'_>, key: &str) -> PyResult<Buffer> {
        let c = self.client(py)?;
        let v = wait(py, async { c.get(key).await })?.map_err(|e| raise(py, e))?;
        Ok(Buffer::new(v))
    }

    /// Reads one object into caller memory (`dst`: writable buffer, tensor,
    /// or int address with `size`); returns the value's length.
    #[pyo3(signature = (key, dst, size = None))]
    fn get_into(
        &self,
        py: Python<'_>,
        key: &str,
        dst: &Bound<'_, PyAny>,
        size: Option<u64>,
    ) -> PyResult<usize> {
        let mut held = hold(py, dst, size, true)?;
        let c = self.client(py)?;
        // The only destination of this call: nothing it could overlap.
        let buf = held.bytes_mut();
        let r = wait(py, async { c.get_into(key, buf).await })?;
        drop(held);
        r.map_err(|e| raise(py, e))
    }

    /// Reads many objects as `bytes`; a failed key gives its negative code.
    fn batch_get<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let r = self.read_new_bytes(py, &strs(&keys))?;
        each_or_code(py, r, |b| Ok(b.into_any()))
    }

    /// Reads many objects into new `Buffer`s; a failed key gives its negative code.
    fn batch_get_buffer<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let c = self.client(py)?;
        let refs = strs(&keys);
        let r = wait(py, async { c.batch_get(&refs).await })?;
        each_or_code(py, r, |v| Ok(Bound::new(py, Buffer::new(v))?.into_any()))
    }

    /// Reads many objects into caller memory; `dsts[i]` is a memory object or
    /// a list of them (filled in order). Returns per key the bytes read or a
    /// negative code (−600 for a buffer too small or overlapping another).
    #[pyo3(signature = (keys, dsts, sizes = None))]
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        dsts: &Bound<'_, PyAny>,
        sizes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        let mut held = hold_items(py, keys.len(), dsts, sizes, true)?;
        let mut codes = vec![0i64; keys.len()];
        // Destinations that share bytes are filled one after another, in
        // batch order (a later item's bytes win where they overlap), each
        // round a batch of disjoint destinations.
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        while !todo.is_empty() {
            let mut round: Vec<KvResult<Vec<Held>>> = todo
                .iter()
                .map(|&i| std::mem::replace(&mut held[i], Ok(Vec::new())))
                .collect();
            let mut items: Vec<GetInto<'_>> = Vec::with_capacity(round.len());
            let mut index = Vec::with_capacity(round.len());
            let mut later = Vec::new();
            for (j, dst) in fill_targets(&mut round).into_iter().enumerate() {
                let i = todo[j];
                match dst {
                    Err(e) if e.code == Code::InvalidParams && e.message.contains(OVERLAP) => {
                        later.push(j)
                    }
                    Err(e) => codes[i] = code(&e),
                    Ok(dst) => {
                        items.push(GetInto {
                            key: keys[i].as_str(),
                            dst,
                        });
                        index.push(i);
                    }
                }
            }
            if !items.is_empty() {
                let c = self.client(py)?;
                let r = wait(py, async { c.batch_get_into(&mut items).await })?;
                for (i, r) in index.into_iter().zip(r) {
                    codes[i] = r.map_or_else(|e| code(&e), |n| n as i64);
                }
            }
            drop(items);
            if later.len() == round.len() {
                // No progress: what is left overlaps itself (one item's own
                // buffers share bytes), which no order can fill.
                for &j in &later {
                    codes[todo[j]] = i64::from(Code::InvalidParams.as_i32());
                }
                break;
            }
            let next: Vec<usize> = later.iter().map(|&j| todo[j]).collect();
            for (&j, &i) in later.iter().zip(&next) {
                held[i] = std::mem::replace(&mut round[j], Ok(Vec::new()));
            }
            drop(round);
            todo = next;
        }
        drop(held);
        Ok(codes)
    }

    /// Copies byte ranges of objects into caller memory: for each key,
    /// `ranges[i]` lists `(dst_address, src_offset, size)`. Each object is
    /// read once. Returns per range the bytes copied or a negative code.
    fn read_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ranges: Vec<Vec<(u64, u64, u64)>>,
    ) -> PyResult<Vec<Vec<i64>>> {
        if keys.len() != ranges.len() {
            return Err(PyValueError::new_err(format!(
                "{} keys but {} range lists",
                keys.len(),
                ranges.len()
            )));
        }
        let c = self.client(py)?;
        let mut uniq = strs(&keys);
        uniq.sort_unstable();
        uniq.dedup();
        let r = wait(py, async { c.batch_get(&uniq).await })?;
        let mut out = Vec::with_capacity(keys.len());
        for (key, rs) in keys.iter().zip(&ranges) {
            let pos = uniq.binary_search(&key.as_str()).ok();
            let value = pos.and_then(|p| r.get(p));
            out.push(
                rs.iter()
                    .map(|&(dst, off, len)| match value {
                        None => i64::from(Code::InternalError.as_i32()),
                        Some(Err(e)) => code(e),
                        Some(Ok(v)) => copy_range(v, dst, off, len),
                    })
                    .collect(),
            );
        }
        Ok(out)
    }

    /// Whether `key` exists. Does not extend its life, unless `lease`:
    /// then it takes a read lease as a read does (Mooncake's `is_exist`).
    #[pyo3(signature = (key, lease = false))]
    fn exists(&self, py: Python<'_>, key: &str, lease: bool) -> PyResult<bool> {
        let c = self.client(py)?;
        if lease {
            let r = wait(py, async { c.batch_exist_leased(&[key]).await })?;
            return one_of(py, r).map(|s| s.is_some());
        }
        wait(py, async { c.exist(key).await })?.map_err(|e| raise(py, e))
    }

    /// Existence of many keys: 1, 0, or a negative code per key (`lease`:
    /// as for [`Self::exists`]).
    #[pyo3(signature = (keys, lease = false))]
    fn batch_exists(&self, py: Python<'_>, keys: Vec<String>, lease: bool) -> PyResult<Vec<i64>> {
        let c = self.client(py)?;
        let refs = strs(&keys);
        let r: Vec<KvResult<bool>> = if lease {
            let r = wait(py, async { c.batch_exist_leased(&refs).await })?;
            r.into_iter().map(|r| r.map(|s| s.is_some())).collect()
        } else {
            wait(py, async { c.batch_exist(&refs).await })?
        };
        Ok(r.into_iter()
            .map(|r| match r {
                Ok(true) => 1,
                Ok(false) => 0,
                Err(e) => code(&e),
            })
            .collect())
    }

    /// Value size of `key` in bytes (`lease`: as for [`Self::exists`]).
    #[pyo3(signature = (key, lease = false))]
    fn get_size(&self, py: Python<'_>, key: &str, lease: bool) -> PyResult<u64> {
        let c = self.client(py)?;
        if lease {
            let r = wait(py, async { c.batch_exist_leased(&[key]).await })?;
            return one_of(py, r)?.ok_or_else(|| {
                raise(
                    py,
                    KvError::new(Code::ObjectNotFound, format!("{key:?} not found")),
                )
            });
        }
        wait(py, async { c.get_size(key).await })?.map_err(|e| raise(py, e))
    }

    /// Where each of `keys` is stored (taking a read lease): per key a list
    /// of `(segment name, segment id hex, endpoint, value offset, value
    /// length)`, or a negative code.
    fn replica_descs<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let c = self.client(py)?;
        let refs = strs(&keys);
        let r = wait(py, async { c.replica_descs(&refs).await })?;
        each_or_code(py, r, |list| {
            let items: Vec<(String, String, String, u64, u64)> = list
                .into_iter()
                .map(|d| {
                    (
                        d.segment,
                        d.segment_id.to_string(),
                        d.endpoint,
                        d.value_offset,
                        d.value_len,
                    )
                })
                .collect();
            Ok(items.into_pyobject(py)?.into_any())
        })
    }

    /// Copies `key` to the segments named `targets` now (raises on failure).
    fn copy_replicas(&self, py: Python<'_>, key: &str, targets: Vec<String>) -> PyResult<()> {
        let c = self.client(py)?;
        wait(py, async { c.copy_replicas(key, &targets).await })?.map_err(|e| raise(py, e))
    }

    /// Moves `key`'s replica from segment `source` to segment `target` now.
    fn move_replica(&self, py: Python<'_>, key: &str, source: &str, target: &str) -> PyResult<()> {
        let c = self.client(py)?;
        wait(py, async { c.move_replica(key, source, target).await })?.map_err(|e| raise(py, e))
    }

    /// Records a replica task (`kind` "copy" or "move") at the master and
    /// carries it out in the background; returns its id.
    #[pyo3(signature = (kind, key, targets, source = ""))]
    fn start_task(
        &self,
        py: Python<'_>,
        kind: &str,
        key: &str,
        targets: Vec<String>,
        source: &str,
    ) -> PyResult<u128> {
        let kind = match kind {
            "copy" => kvpool_client::TaskKind::Copy,
            "move" => kvpool_client::TaskKind::Move,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown task kind {other:?}"
                )))
            }
        };
        let c = self.client(py)?;
        wait(py, async {
            c.start_task(kind, key, source, &targets).await
        })?
        .map_err(|e| raise(py, e))
    }

    /// A task as a dict: `id`, `kind`, `status` (Mooncake's numbers),
    /// `created_ms`, `updated_ms`, `assigned_client`, `message`.
    fn query_task<'py>(&self, py: Python<'py>, id: u128) -> PyResult<Bound<'py, PyDict>> {
        let c = self.client(py)?;
        let t = wait(py, async { c.query_task(id).await })?.map_err(|e| raise(py, e))?;
        let d = PyDict::new(py);
        d.set_item("id", t.id)?;
        d.set_item("kind", t.kind)?;
        d.set_item("status", t.status)?;
        d.set_item("created_ms", t.created_ms)?;
        d.set_item("updated_ms", t.updated_ms)?;
        d.set_item("assigned_client", t.assigned_client.0)?;
        d.set_item("message", t.message)?;
        Ok(d)
    }

    /// Drops `keys`' replicas on segment `segment` (every replica, so the
    /// object, for `None`), except under a live read lease; per key whether
    /// something was dropped.
    #[pyo3(signature = (keys, segment = None))]
    fn clear_replicas(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        segment: Option<&str>,
    ) -> PyResult<Vec<bool>> {
        let c = self.client(py)?;
        let refs = strs(&keys);
        wait(py, async { c.clear_replicas(&refs, segment).await })?.map_err(|e| raise(py, e))
    }

    /// Lends more memory as a new segment: `size` bytes of anonymous memory,
    /// or of the file at `path` from `offset`. Returns the segment as a dict
    /// (`id` hex, `name`, `size`).
    #[pyo3(signature = (size, path = None, offset = 0))]
    fn mount_segment<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        path: Option<PathBuf>,
        offset: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let c = self.client(py)?;
        let info = wait(py, async {
            match &path {
                Some(p) => c.mount_file_segment(p, offset, size).await,
                None => c.mount_anonymous_segment(size).await,
            }
        })?
        .map_err(|e| raise(py, e))?;
        segment_dict(py, &info)
    }

    /// Takes back a segment this client lends, by id (hex); returns it as a dict.
    fn unmount_segment<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Bound<'py, PyDict>> {
        let id = u128::from_str_radix(id.trim(), 16)
            .map(kvpool_proto::msg::SegmentId)
            .map_err(|_| {
                raise(
                    py,
                    KvError::new(Code::InvalidParams, format!("bad segment id {id:?}")),
                )
            })?;
        let c = self.client(py)?;
        let info = wait(py, async { c.unmount_segment(id).await })?.map_err(|e| raise(py, e))?;
        segment_dict(py, &info)
    }

    /// The segments this client lends, as dicts (none in a forked child
    /// or after `close()`; never connects).
    fn lent_segments<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let c = {
            let st = self.lock();
            match &st.client {
                Some(c) if !st.closed && runtime::is_current(st.pid) => c.clone(),
                _ => return Ok(Vec::new()),
            }
        };
        c.lent_segments()
            .iter()
            .map(|i| segment_dict(py, i))
            .collect()
    }

    /// Removes `key`; `force` ignores a live read lease.
    #[pyo3(signature = (key, force = false))]
    fn remove(&self, py: Python<'_>, key: &str, force: bool) -> PyResult<()> {
        let c = self.client(py)?;
        wait(py, async { c.remove(key, force).await })?.map_err(|e| raise(py, e))
    }

    /// Removes many keys; one code per key.
    #[pyo3(signature = (keys, force = false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> PyResult<Vec<i64>> {
        let c = self.client(py)?;
        let refs = strs(&keys);
        let r = wait(py, async { c.batch_remove(&refs, force).await })?;
        Ok(r.iter().map(code_of).collect())
    }

    /// Removes keys matching a regex (Rust `regex` syntax); returns how many.
    #[pyo3(signature = (pattern, force = false))]
    fn remove_by_regex(&self, py: Python<'_>, pattern: &str, force: bool) -> PyResult<u64> {
        let c = self.client(py)?;
        wait(py, async { c.remove_by_regex(pattern, force).await })?.map_err(|e| raise(py, e))
    }

    /// Removes every object; returns how many.
    #[pyo3(signature = (force = false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> PyResult<u64> {
        let c = self.client(py)?;
        wait(py, async { c.remove_all(force).await })?.map_err(|e| raise(py, e))
    }

    /// One page of the keys starting with `prefix` as `(keys, cursor)`:
    /// `keys` a list of `(key, value size)`, at most `limit` (capped at
    /// 10,000) and maybe fewer before the end; `cursor` the bytes to pass
    /// next (`b""` to start), empty once the listing is done.
    #[pyo3(signature = (prefix = "", cursor = b"".to_vec(), limit = 1000))]
    fn list_keys<'py>(
        &self,
        py: Python<'py>,
        prefix: &str,
        cursor: Vec<u8>,
        limit: u32,
    ) -> PyResult<KeyPage<'py>> {
        let c = self.client(py)?;
        let page = wait(py, async { c.list_keys(prefix, &cursor, limit).await })?
            .map_err(|e| raise(py, e))?;
        Ok((page.keys, PyBytes::new(py, &page.cursor)))
    }

    /// This client's counters (keys per op and result, errors by code,
    /// bytes per transport, call latency) by Prometheus series name.
    fn get_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (series, v) in self.client(py)?.metrics().snapshot() {
            d.set_item(series, v)?;
        }
        Ok(d)
    }

    /// The same counters as Prometheus text, for an engine's `/metrics`.
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.client(py)?.metrics().render())
    }

    /// The cluster as the master sees it, as a dict.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.client(py)?;
        let s = wait(py, async { c.status().await })?.map_err(|e| raise(py, e))?;
        let d = PyDict::new(py);
        let segs = PyList::empty(py);
        for seg in &s.segments {
            let sd = PyDict::new(py);
            sd.set_item("name", &seg.info.name)?;
            sd.set_item("endpoint", &seg.info.endpoint)?;
            sd.set_item("size", seg.info.size)?;
            sd.set_item("used", seg.used)?;
            sd.set_item("regions", seg.regions)?;
            sd.set_item("state", &seg.state)?;
            sd.set_item("tier", seg.info.tier.name())?;
            segs.append(sd)?;
        }
        d.set_item("segments", segs)?;
        d.set_item("keys", s.keys)?;
        d.set_item("pending", s.pending)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("used", s.used)?;
        d.set_item("clients", s.clients)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("demotions", s.demotions)?;
        d.set_item("promotions", s.promotions)?;
        Ok(d)
    }

    /// Seconds since the master last answered this client's heartbeats
    /// (at least one a second while it answers): a caller that would rather
    /// skip the pool than wait out the retries of a call to an unreachable
    /// or stalled master checks it first.
    fn master_silent_for(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.client(py)?.master_silent_for().as_secs_f64())
    }

    /// Whether the master answers within `timeout` seconds.
    #[pyo3(signature = (timeout = 2.0))]
    fn ping(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        if !(timeout.is_finite() && timeout > 0.0 && timeout < 1e9) {
            return Err(PyTypeError::new_err(
                "timeout must be a positive number of seconds",
            ));
        }
        let c = match self.client(py) {
            Ok(c) => c,
            Err(_) if !self.lock().closed => return Ok(false),
            Err(e) => return Err(e),
        };
        let limit = Duration::from_secs_f64(timeout);
        let r = wait(py, async { tokio::time::timeout(limit, c.status()).await })?;
        Ok(matches!(r, Ok(Ok(_))))
    }
}

/// A segment as a dict: `id` (hex), `name`, `endpoint`, `size`, `path`.
pub(crate) fn segment_dict<'py>(
    py: Python<'py>,
    i: &kvpool_proto::msg::SegmentInfo,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", i.id.to_string())?;
    d.set_item("name", &i.name)?;
    d.set_item("endpoint", &i.endpoint)?;
    d.set_item("size", i.size)?;
    d.set_item("path", &i.path)?;
    Ok(d)
}
