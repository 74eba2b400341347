//! The PyO3 module `kvpool._native`: the native client class, the transfer
//! engine class, result buffers,
//! setting resolution, and the two helpers every call goes through — [`wait`]
//! (the only place that blocks, always with the GIL released) and [`raise`]
//! (the only place a kvpool error becomes a Python exception).

mod buffers;
mod client;
mod convert;
mod engine;
mod extras;
mod results;

use std::future::Future;

use kvpool_proto::{Code, KvError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::runtime;

/// Runs `fut` to completion on the process runtime with the GIL released, so
/// other Python threads run while this one waits on the network. Every
/// blocking call in the module goes through here; nothing else calls
/// `block_on`.
pub(crate) fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime::get().map_err(|e| raise(py, e))?;
    Ok(py.detach(move || runtime::block_on(rt, fut)))
}

/// `kvpool.errors.error_for`, looked up once.
static ERROR_FOR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Turns a kvpool error into the matching `kvpool.errors` exception. The
/// code-to-class table lives in `kvpool/errors.py` (`error_for`) and nowhere
/// else.
pub(crate) fn raise(py: Python<'_>, e: KvError) -> PyErr {
    let made = ERROR_FOR
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("kvpool.errors")?.getattr("error_for")?.unbind())
        })
        .and_then(|f| f.bind(py).call1((e.code.as_i32(), e.message.as_str())));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        // The package is broken (errors.py missing): still say what failed.
        Err(import_err) => pyo3::exceptions::PyRuntimeError::new_err(format!(
            "{e} (and kvpool.errors is unusable: {import_err})"
        )),
    }
}

/// An `INVALID_PARAMS` error for a bad argument.
pub(crate) fn invalid(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    raise(py, KvError::new(Code::InvalidParams, msg))
}

/// Starts `tracing` output on stderr when `KVPOOL_LOG` is set (e.g. `debug`).
fn init_logging() {
    if let Ok(filter) = std::env::var("KVPOOL_LOG") {
        if !filter.trim().is_empty() {
            // A line as each `request{id, op}` span closes, as in the binary.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
                .try_init();
        }
    }
}

/// The native half of the `kvpool` package. Use `kvpool`, `kvpool.mooncake`
/// or `kvpool.sglang` instead of importing this directly.
///
/// `gil_used = true`: client state is only locked while the GIL is held,
/// which is what makes `fork()` safe (see `client.rs`); on free-threaded
/// CPython importing the module re-enables the GIL.
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<client::Client>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add_class::<engine::Engine>()?;
    m.add_function(wrap_pyfunction!(convert::resolve_settings, m)?)?;
    m.add_function(wrap_pyfunction!(convert::code_name, m)?)?;
    m.add("CODES", convert::codes(m.py())?)?;
    m.add_function(wrap_pyfunction!(convert::address_of, m)?)?;
    m.add_function(wrap_pyfunction!(extras::host_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(extras::host_free, m)?)?;
    m.add_function(wrap_pyfunction!(extras::host_alloc_functions, m)?)?;
    m.add_function(wrap_pyfunction!(extras::store_about, m)?)?;
    m.add_function(wrap_pyfunction!(extras::note_registered, m)?)?;
    m.add_function(wrap_pyfunction!(extras::note_unregistered, m)?)?;
    Ok(())
}
