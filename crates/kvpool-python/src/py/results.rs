//! The per-key side of the native client's batch calls: results as
//! Mooncake-style integer codes, one-key batches raised as exceptions, and
//! the caller's buffers held (and checked) for the length of a call.

use kvpool_proto::{Code, KvError, KvResult};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::buffers::{hold, Held};
use super::raise;
use crate::memory::Region;

/// An error as a Mooncake-style (negative) integer.
pub(super) fn code(e: &KvError) -> i64 {
    i64::from(e.code.as_i32())
}

/// Per key: `ok` of its value, or its negative error code.
pub(super) fn each_or_code<'py, T>(
    py: Python<'py>,
    results: Vec<KvResult<T>>,
    mut ok: impl FnMut(T) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(v) => ok(v),
            Err(e) => Ok(code(&e).into_pyobject(py)?.into_any()),
        })
        .collect()
}

/// A single-key result as a Mooncake-style integer.
pub(super) fn code_of<T>(r: &KvResult<T>) -> i64 {
    r.as_ref().map_or_else(code, |_| 0)
}

/// Borrows owned keys for the core client's `&[&str]` batch calls.
pub(super) fn strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

/// Per-item memory for a batch: `values[i]` is one memory object or a
/// list/tuple of them; `sizes[i]` is `None`, an int, or a list of ints.
pub(super) fn hold_items(
    py: Python<'_>,
    n: usize,
    values: &Bound<'_, PyAny>,
    sizes: Option<&Bound<'_, PyAny>>,
    writable: bool,
) -> PyResult<Vec<KvResult<Vec<Held>>>> {
    let values: Vec<Bound<'_, PyAny>> = values.extract()?;
    if values.len() != n {
        return Err(PyValueError::new_err(format!(
            "{n} keys but {} buffers",
            values.len()
        )));
    }
    let sizes: Option<Vec<Bound<'_, PyAny>>> = match sizes {
        Some(s) if !s.is_none() => Some(s.extract()?),
        _ => None,
    };
    if let Some(s) = &sizes {
        if s.len() != n {
            return Err(PyValueError::new_err(format!(
                "{n} keys but {} sizes",
                s.len()
            )));
        }
    }
    let mut out = Vec::with_capacity(n);
    for (i, v) in values.iter().enumerate() {
        let size = sizes.as_ref().map(|s| &s[i]).filter(|s| !s.is_none());
        let multi = v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>();
        let item: KvResult<Vec<Held>> = if multi {
            let parts: Vec<Bound<'_, PyAny>> = v.extract()?;
            let part_sizes: Option<Vec<Option<u64>>> = size.map(|s| s.extract()).transpose()?;
            if part_sizes
                .as_ref()
                .is_some_and(|ps| ps.len() != parts.len())
            {
                Err(KvError::new(
                    Code::InvalidParams,
                    format!("item {i}: buffer and size lists differ in length"),
                ))
            } else {
                parts
                    .iter()
                    .enumerate()
                    .map(|(j, p)| {
                        let sz = part_sizes.as_ref().and_then(|ps| ps[j]);
                        hold_or_code(py, p, sz, writable)
                    })
                    .collect::<PyResult<Vec<_>>>()?
                    .into_iter()
                    .collect()
            }
        } else {
            let sz: Option<u64> = size.map(|s| s.extract()).transpose()?;
            hold_or_code(py, v, sz, writable)?.map(|h| vec![h])
        };
        out.push(item);
    }
    Ok(out)
}

/// Holds memory, turning a bad address or size into a per-item error (the
/// batch goes on) while type errors still raise (a programming mistake).
pub(super) fn hold_or_code(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    size: Option<u64>,
    writable: bool,
) -> PyResult<KvResult<Held>> {
    match hold(py, obj, size, writable) {
        Ok(h) => Ok(Ok(h)),
        Err(e) => {
            // Only kvpool errors (InvalidArgument) become per-item codes.
            match e.value(py).getattr("code").and_then(|c| c.extract::<i32>()) {
                Ok(code) => Ok(Err(KvError::new(
                    Code::from_i32(code),
                    e.value(py).str().map(|s| s.to_string()).unwrap_or_default(),
                ))),
                Err(_) => Err(e),
            }
        }
    }
}

/// The only result of a one-key batch put, raised if it failed.
pub(super) fn one(py: Python<'_>, r: Vec<KvResult<()>>) -> PyResult<()> {
    match r.into_iter().next() {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(raise(py, e)),
        None => Err(raise(py, KvError::from(Code::InternalError))),
    }
}

/// The only result of a one-key batch, raised if it failed.
pub(super) fn one_of<T>(py: Python<'_>, r: Vec<KvResult<T>>) -> PyResult<T> {
    r.into_iter()
        .next()
        .unwrap_or_else(|| Err(KvError::from(Code::InternalError)))
        .map_err(|e| raise(py, e))
}

/// Copies `value[off..off+len]` to address `dst`; the bytes copied or −600.
pub(super) fn copy_range(value: &[u8], dst: u64, off: u64, len: u64) -> i64 {
    let invalid = i64::from(Code::InvalidParams.as_i32());
    let Some(end) = off.checked_add(len) else {
        return invalid;
    };
    if end > value.len() as u64 {
        return invalid;
    }
    let Ok(region) = Region::new(dst, len) else {
        return invalid;
    };
    // SAFETY: the caller vouches for the destination address (Mooncake's raw
    // pointer contract); `off..end` was bounds-checked above.
    unsafe {
        region
            .as_mut_slice()
            .copy_from_slice(&value[off as usize..end as usize]);
    }
    len as i64
}
