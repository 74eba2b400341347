//! Caller memory coming in (raw addresses, buffer-protocol objects, CPU
//! tensors) and result memory going out ([`Buffer`], a buffer-protocol object
//! over bytes the client read).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use super::{invalid, raise};
use crate::memory::{overlapping, Region};
use kvpool_proto::{Code, KvError, KvResult};

/// Caller memory pinned for one call: the region, plus whatever keeps it
/// valid (a buffer-protocol export, or a reference to the tensor).
pub(crate) struct Held {
    /// Where the bytes are.
    pub region: Region,
    _keep: Keep,
}

enum Keep {
    /// A raw address: the caller vouches for it (Mooncake's contract).
    Nothing,
    /// A buffer export, released (with the GIL) when the call is done; while
    /// it lives the exporter cannot resize or free the memory.
    View(Box<ffi::Py_buffer>),
    /// An object exposing `data_ptr()` (a torch tensor), kept alive.
    Object(#[allow(dead_code)] Py<PyAny>),
}

impl Drop for Keep {
    fn drop(&mut self) {
        if let Keep::View(view) = self {
            // SAFETY: the view was filled by a successful PyObject_GetBuffer
            // and is released exactly once, with the GIL held.
            Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut **view) });
        }
    }
}

impl Held {
    /// Memory at a raw address the caller vouches for.
    pub fn raw(region: Region) -> Held {
        Held {
            region,
            _keep: Keep::Nothing,
        }
    }

    /// The held bytes, to read from, borrowed for no longer than `self`
    /// holds them.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `_keep` pins the memory for as long as `self` lives (a
        // buffer export its exporter cannot resize or free, or a reference to
        // the tensor; a raw address is the caller's promise, Mooncake's
        // contract), and the borrow of `self` bounds the slice's lifetime.
        // Rust writes to it only through `bytes_mut`, which borrows `self`
        // mutably, so not while this slice lives.
        unsafe { self.region.as_slice() }
    }

    /// The held bytes, to fill (memory held with `writable`), borrowed
    /// mutably from `self`. Another `Held` may name the same memory: a call
    /// that fills several takes them through [`fill_targets`], which refuses
    /// overlaps.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`; the mutable borrow of `self` keeps every
        // other Rust reference through this `Held` away while the slice
        // lives, and `fill_targets` rules out overlap between `Held`s.
        unsafe { self.region.as_mut_slice() }
    }
}

/// The error message of a destination that shares bytes with an earlier one.
pub(crate) const OVERLAP: &str = "destination overlaps another destination of the batch";

/// The destinations of one batch read, each item a list of held regions
/// (or the error that kept it from being held): per item, the bytes to fill
/// in order, or an `INVALID_PARAMS` error where the item shares a byte with
/// an earlier item or with itself (two reads into one byte would alias).
pub(crate) fn fill_targets(items: &mut [KvResult<Vec<Held>>]) -> Vec<KvResult<Vec<&mut [u8]>>> {
    let regions: Vec<Vec<Region>> = items
        .iter()
        .map(|item| match item {
            Ok(hs) => hs.iter().map(|h| h.region).collect(),
            Err(_) => Vec::new(),
        })
        .collect();
    let clash = overlapping(&regions);
    items
        .iter_mut()
        .zip(clash)
        .map(|(item, clash)| match item {
            Err(e) => Err(e.clone()),
            Ok(_) if clash => Err(KvError::new(Code::InvalidParams, OVERLAP)),
            Ok(hs) => Ok(hs.iter_mut().map(Held::bytes_mut).collect()),
        })
        .collect()
}

/// What a caller may pass as memory: an `int` address (with a size), an
/// object with the buffer protocol (bytes, bytearray, memoryview, numpy
/// arrays, mmap, ...), or a contiguous CPU tensor (anything with `data_ptr()`,
/// `numel()` and `element_size()`). `size` limits the region to its first
/// `size` bytes; `writable` asks for memory the client may fill.
pub(crate) fn hold(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    size: Option<u64>,
    writable: bool,
) -> PyResult<Held> {
    // An address is an int — or, with a size, any integer-like object such as
    // a numpy integer (which would otherwise export its own 8 bytes as a buffer).
    let is_address = (obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>())
        || (size.is_some() && !obj.is_instance_of::<PyBool>() && obj.hasattr("__index__")?);
    if is_address {
        let ptr: u64 = obj
            .call_method0("__index__")
            .and_then(|i| i.extract())
            .map_err(|_| invalid(py, "a buffer address must be a non-negative int"))?;
        let Some(size) = size else {
            return Err(PyTypeError::new_err(
                "a size is required with a raw buffer address",
            ));
        };
        // A raw address is the caller's word (Mooncake's contract), but
        // one for unmapped memory is answered, not taken as a crash.
        return Region::new(ptr, size)
            .and_then(|r| r.readable().map(|()| r))
            .map(Held::raw)
            .map_err(|e| raise(py, e));
    }
    if let Some(held) = hold_buffer(py, obj, size, writable)? {
        return Ok(held);
    }
    if obj.hasattr("data_ptr")? {
        return hold_tensor(py, obj, size);
    }
    Err(PyTypeError::new_err(format!(
        "expected an int address, an object with the buffer protocol, or a CPU tensor; got {}",
        obj.get_type().name()?
    )))
}

/// Exports `obj`'s buffer as one contiguous byte region, if it has one.
fn hold_buffer(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    size: Option<u64>,
    writable: bool,
) -> PyResult<Option<Held>> {
    // SAFETY: an all-zero Py_buffer is the documented "empty" state.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    // PyBUF_SIMPLE: contiguous bytes, no format/shape; exporters that cannot
    // give that (non-contiguous arrays) raise BufferError.
    let flags = if writable {
        ffi::PyBUF_SIMPLE | ffi::PyBUF_WRITABLE
    } else {
        ffi::PyBUF_SIMPLE
    };
    // SAFETY: `obj` is a live object and `view` points to writable storage.
    let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
    if rc != 0 {
        let err = PyErr::fetch(py);
        // Not a buffer at all: let the caller try other forms.
        if err.is_instance_of::<PyTypeError>(py) && !obj.hasattr("__buffer__").unwrap_or(false) {
            return Ok(None);
        }
        if err.is_instance_of::<PyBufferError>(py) && writable {
            return Err(PyBufferError::new_err(format!(
                "destination must be writable, contiguous memory: {err}"
            )));
        }
        return Err(err);
    }
    let len = u64::try_from(view.len).unwrap_or(0);
    let ptr = view.buf as usize as u64;
    // Owned from here on, so an error below still releases the export.
    let keep = Keep::View(view);
    let region = region_of(py, ptr, len, size, "buffer")?;
    Ok(Some(Held {
        region,
        _keep: keep,
    }))
}

/// The first `size` bytes (all `len` when `None`) of the memory at `ptr`;
/// a `size` past the end is an `INVALID_PARAMS` error naming `what`.
fn region_of(
    py: Python<'_>,
    ptr: u64,
    len: u64,
    size: Option<u64>,
    what: &str,
) -> PyResult<Region> {
    let take = match size {
        Some(s) if s > len => {
            return Err(invalid(
                py,
                format!("size {s} exceeds the {what}'s {len} bytes"),
            ))
        }
        Some(s) => s,
        None => len,
    };
    Region::new(ptr, take).map_err(|e| raise(py, e))
}

/// A torch-style tensor: `data_ptr()`, `numel()`, `element_size()`; it must
/// be contiguous and on the CPU.
fn hold_tensor(py: Python<'_>, obj: &Bound<'_, PyAny>, size: Option<u64>) -> PyResult<Held> {
    if let Some(device) = obj.getattr_opt("device")? {
        let kind = device
            .getattr_opt("type")?
            .map(|t| t.str().map(|s| s.to_string()))
            .transpose()?
            .unwrap_or_else(|| "cpu".to_string());
        if kind != "cpu" {
            return Err(invalid(
                py,
                format!("tensor is on {kind}; kvpool reads and writes CPU memory only"),
            ));
        }
    }
    if let Some(contig) = obj.getattr_opt("is_contiguous")? {
        if !contig.call0()?.is_truthy()? {
            return Err(invalid(py, "tensor is not contiguous"));
        }
    }
    let ptr: u64 = obj.call_method0("data_ptr")?.extract()?;
    let len: u64 = match obj.getattr_opt("nbytes")? {
        Some(n) if !n.is_callable() => n.extract()?,
        _ => {
            let numel: u64 = obj.call_method0("numel")?.extract()?;
            let elem: u64 = obj.call_method0("element_size")?.extract()?;
            numel
                .checked_mul(elem)
                .ok_or_else(|| invalid(py, "tensor size overflows"))?
        }
    };
    Ok(Held {
        region: region_of(py, ptr, len, size, "tensor")?,
        _keep: Keep::Object(obj.clone().unbind()),
    })
}

/// Bytes read from the pool, owned by Python: supports the buffer protocol
/// (writable, like a `bytearray`), `ptr()` and `size()` as Mooncake's
/// `BufferHandle` does, `len()` and `bytes()`.
#[pyclass(module = "kvpool._native", name = "Buffer", frozen)]
pub struct Buffer {
    data: UnsafeCell<Box<[u8]>>,
    /// Exported as signed bytes (item format `'b'`, Mooncake's
    /// `BufferHandle`) rather than unsigned (`'B'`, a `bytearray`'s).
    signed: AtomicBool,
}

// SAFETY: the bytes are only reached through raw pointers handed to Python
// (the buffer protocol, `ptr()`), exactly like a `bytearray`'s storage; Rust
// never forms references to them after construction.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Wraps bytes the client read.
    pub fn new(v: Vec<u8>) -> Buffer {
        Buffer {
            data: UnsafeCell::new(v.into_boxed_slice()),
            signed: AtomicBool::new(false),
        }
    }

    fn raw(&self) -> (*mut u8, usize) {
        // SAFETY: the box itself is never replaced; reading its pointer and
        // length does not touch the bytes.
        let b = unsafe { &mut *self.data.get() };
        (b.as_mut_ptr(), b.len())
    }
}

#[pymethods]
impl Buffer {
    /// Address of the first byte (valid while this object lives).
    fn ptr(&self) -> usize {
        self.raw().0 as usize
    }

    /// Number of bytes.
    fn size(&self) -> usize {
        self.raw().1
    }

    fn __len__(&self) -> usize {
        self.raw().1
    }

    /// This buffer, from now on exported as signed bytes (item format
    /// `'b'`), as Mooncake's `BufferHandle` is; the bytes are the same.
    fn _signed(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf.get().signed.store(true, Ordering::Relaxed);
        slf
    }

    fn __repr__(&self) -> String {
        format!("<kvpool.Buffer of {} bytes>", self.raw().1)
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = slf.get().raw();
        let len = isize::try_from(len).map_err(|_| PyBufferError::new_err("buffer too large"))?;
        // SAFETY: `view` is valid per CPython's contract; PyBuffer_FillInfo
        // takes a new reference to `slf`, keeping the bytes alive for the export.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr as *mut c_void, len, 0, flags)
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        if slf.get().signed.load(Ordering::Relaxed) && flags & ffi::PyBUF_FORMAT != 0 {
            // SAFETY: `view` was just filled; the format is a static string.
            unsafe { (*view).format = c"b".as_ptr().cast_mut() };
        }
        Ok(())
    }

    /// # Safety
    /// Called by CPython when an export ends; nothing to free.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
