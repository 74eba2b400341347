//! Module functions beside the client: host memory by address (Mooncake's
//! `MooncakeHostMemAllocator` and allocation-function addresses) and the
//! question an engine asks a storage process it attaches to, and the
//! registered-memory notes that spare zero-copy calls their page probes.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::client::segment_dict;
use super::convert::settings_from_dict;
use super::{raise, wait};
use crate::hostmem;
use crate::memory::{self, Region};

/// A zeroed block of `size` bytes of host memory; its address, or 0 when
/// `size` is 0 or the memory cannot be had.
#[pyfunction]
pub fn host_alloc(py: Python<'_>, size: usize) -> usize {
    py.detach(|| hostmem::alloc(size))
}

/// Frees a block `host_alloc` handed out: 0, or -1 for any other address.
#[pyfunction]
pub fn host_free(ptr: usize) -> i32 {
    hostmem::free(ptr)
}

/// Addresses of the C functions `alloc(size, device, stream)` and
/// `free(ptr, size, device, stream)` over the same memory (PyTorch's
/// pluggable-allocator signatures).
#[pyfunction]
pub fn host_alloc_functions() -> (usize, usize) {
    (hostmem::alloc_fn_addr(), hostmem::free_fn_addr())
}

/// Notes `size` bytes at `ptr` as memory registered for zero-copy calls,
/// which its owner keeps mapped until [`note_unregistered`]: raw addresses
/// inside it are then used without probing their pages.
#[pyfunction]
pub fn note_registered(py: Python<'_>, ptr: u64, size: u64) -> PyResult<()> {
    let region = Region::new(ptr, size).map_err(|e| raise(py, e))?;
    memory::note_registered(region);
    Ok(())
}

/// Forgets one [`note_registered`] of the same region; whether there was one.
#[pyfunction]
pub fn note_unregistered(py: Python<'_>, ptr: u64, size: u64) -> PyResult<bool> {
    let region = Region::new(ptr, size).map_err(|e| raise(py, e))?;
    Ok(memory::note_unregistered(region))
}

/// What the storage process whose data plane is at `endpoint` serves, and
/// its master: a dict with `master` and `segments` (dicts as
/// `Client.lent_segments` gives), asked with the key and TLS of `settings`
/// (as `resolve_settings` returns them).
#[pyfunction]
#[pyo3(signature = (endpoint, settings, timeout = 5.0))]
pub fn store_about<'py>(
    py: Python<'py>,
    endpoint: &str,
    settings: &Bound<'_, PyDict>,
    timeout: f64,
) -> PyResult<Bound<'py, PyDict>> {
    if !(timeout.is_finite() && timeout > 0.0 && timeout < 1e9) {
        return Err(PyValueError::new_err(
            "timeout must be a positive number of seconds",
        ));
    }
    let security = settings_from_dict(py, settings)?
        .security()
        .map_err(|e| raise(py, e))?;
    let limit = Duration::from_secs_f64(timeout);
    let about = wait(py, async {
        kvpool_client::store_about(endpoint, &security, limit).await
    })?
    .map_err(|e| raise(py, e))?;
    let d = PyDict::new(py);
    d.set_item("master", &about.master)?;
    let segs = about
        .segments
        .iter()
        .map(|s| segment_dict(py, s))
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("segments", segs)?;
    Ok(d)
}
