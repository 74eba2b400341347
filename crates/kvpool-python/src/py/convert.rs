//! Conversions between Python values and the core's types: setup settings,
//! `ReplicateConfig`, code names.

use std::collections::BTreeMap;

use kvpool_client::settings::Raw;
use kvpool_client::{ReplicateConfig, Settings};
use kvpool_proto::{Code, KvError};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use super::buffers::hold;
use super::raise;

/// A Python value as a raw setting.
fn to_raw(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Raw> {
    if v.is_none() {
        Ok(Raw::Null)
    } else if v.is_instance_of::<PyBool>() {
        Ok(Raw::Bool(v.extract()?))
    } else if v.is_instance_of::<PyInt>() {
        v.extract::<i128>()
            .map(Raw::Int)
            .map_err(|_| PyTypeError::new_err(format!("{name}: integer out of range")))
    } else if v.is_instance_of::<PyFloat>() {
        Ok(Raw::Float(v.extract()?))
    } else if v.is_instance_of::<PyString>() {
        Ok(Raw::Str(v.extract()?))
    } else {
        // Mooncake setup(dict) callers sometimes pass objects (an engine); the
        // resolver decides whether the key matters.
        Ok(Raw::Str(v.str()?.to_string()))
    }
}

/// The raw settings in a Python dict (every entry; the resolver decides
/// which keys matter).
fn raw_map(d: &Bound<'_, PyDict>) -> PyResult<BTreeMap<String, Raw>> {
    let mut args = BTreeMap::new();
    for (k, v) in d.iter() {
        let k: String = k.extract()?;
        let raw = to_raw(&k, &v)?;
        args.insert(k, raw);
    }
    Ok(args)
}

/// A raw setting as a Python value.
fn raw_to_py<'py>(py: Python<'py>, v: &Raw) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Raw::Str(s) => s.into_pyobject(py)?.into_any(),
        Raw::Int(i) => i.into_pyobject(py)?.into_any(),
        Raw::Float(f) => f.into_pyobject(py)?.into_any(),
        Raw::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Raw::Null => py.None().into_bound(py),
    })
}

/// Resolves `setup` settings (`kvpool_client::Settings::resolve`):
/// `explicit` maps setting names (or Mooncake / SGLang aliases) to values;
/// missing ones come from `KVPOOL_*`, then `MOONCAKE_*`/`MC_*` env vars,
/// then the JSON file in `KVPOOL_CONFIG_PATH` / `MOONCAKE_CONFIG_PATH`, then
/// defaults. Returns the settings by canonical name, plus `ignored` and
/// `notes` for warnings; `Client(settings)` takes the dict back. Raises a
/// `kvpool.errors` exception (`InvalidArgument`, `NotSupported`) for values
/// kvpool cannot honour.
#[pyfunction]
pub fn resolve_settings<'py>(
    py: Python<'py>,
    explicit: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyDict>> {
    let s = Settings::resolve(&raw_map(explicit)?).map_err(|e| raise(py, e))?;
    let d = PyDict::new(py);
    for (k, v) in s.explicit() {
        d.set_item(k, raw_to_py(py, &v)?)?;
    }
    d.set_item("ignored", s.ignored)?;
    d.set_item("notes", s.notes)?;
    Ok(d)
}

/// The settings in a dict from [`resolve_settings`], checked again but not
/// resolved against the environment again (`Settings::explicit` resolves to
/// itself with no env and no file).
pub(crate) fn settings_from_dict(py: Python<'_>, d: &Bound<'_, PyDict>) -> PyResult<Settings> {
    let mut args = raw_map(d)?;
    // Reports of the first resolution, not settings.
    args.remove("ignored");
    args.remove("notes");
    Settings::resolve_with(&args, &|_| None, None).map_err(|e| raise(py, e))
}

/// Mooncake's upper-case name of an error code (`-704` → `OBJECT_NOT_FOUND`);
/// unknown codes are `INTERNAL_ERROR`.
#[pyfunction]
pub fn code_name(code: i64) -> &'static str {
    i32::try_from(code)
        .map(Code::from_i32)
        .unwrap_or(Code::InternalError)
        .name()
}

/// Every error code by its Mooncake name (`"OBJECT_NOT_FOUND"` → -704),
/// the one table the Python package takes its numbers from.
pub fn codes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for c in Code::ALL {
        d.set_item(c.name(), c.as_i32())?;
    }
    Ok(d)
}

/// `(address, size)` of an object's memory (buffer protocol or CPU tensor).
/// The caller must keep the object alive, and unchanged in size, while it
/// uses the address.
#[pyfunction]
#[pyo3(signature = (obj, writable = false))]
pub fn address_of(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    writable: bool,
) -> PyResult<(usize, usize)> {
    let h = hold(py, obj, None, writable)?;
    Ok((h.region.ptr, h.region.len))
}

/// Reads a `ReplicateConfig`-like object (kvpool's, Mooncake's, or anything
/// with the same attributes); `None` is the default config. `own_segment` is
/// this client's lent segment name, preferred when the config asks for
/// `prefer_alloc_in_same_node`.
pub(crate) fn replicate_config(
    py: Python<'_>,
    obj: Option<&Bound<'_, PyAny>>,
    own_segment: Option<&str>,
) -> PyResult<ReplicateConfig> {
    let mut c = ReplicateConfig::default();
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(c);
    };
    if !obj.hasattr("replica_num")? {
        return Err(PyTypeError::new_err(format!(
            "config must be a ReplicateConfig, got {}",
            obj.get_type().name()?
        )));
    }
    let attr = |name: &str| obj.getattr_opt(name).map(|v| v.filter(|v| !v.is_none()));
    if let Some(v) = attr("replica_num")? {
        let n: i64 = v
            .extract()
            .map_err(|_| PyTypeError::new_err("replica_num must be an int"))?;
        if !(1..=64).contains(&n) {
            return Err(raise(
                py,
                KvError::new(
                    Code::InvalidParams,
                    format!("replica_num must be 1..=64, got {n}"),
                ),
            ));
        }
        c.replica_num = n as u32;
    }
    if let Some(v) = attr("with_soft_pin")? {
        c.with_soft_pin = v.is_truthy()?;
    }
    if let Some(v) = attr("soft_pin_action")? {
        // Mooncake's SoftPinAction: PRESERVE = 0, ENABLE = 1, DISABLE = 2.
        let action: i64 = v
            .call_method0("__int__")
            .and_then(|i| i.extract())
            .or_else(|_| v.getattr("value").and_then(|i| i.extract()))
            .map_err(|_| PyTypeError::new_err("soft_pin_action must be a SoftPinAction"))?;
        match action {
            1 => c.with_soft_pin = true,
            2 => c.with_soft_pin = false,
            _ => {}
        }
    }
    if let Some(v) = attr("soft_pin_ttl_ms")? {
        let ms: u64 = v.extract().map_err(|_| {
            PyTypeError::new_err("soft_pin_ttl_ms must be a non-negative int or None")
        })?;
        c.soft_pin_ttl_ms = Some(ms);
    }
    if let Some(v) = attr("with_hard_pin")? {
        c.with_hard_pin = v.is_truthy()?;
    }
    if let Some(v) = attr("preferred_segment")? {
        let s: String = v
            .extract()
            .map_err(|_| PyTypeError::new_err("preferred_segment must be a str"))?;
        if !s.is_empty() {
            c.preferred_segments.push(s);
        }
    }
    if let Some(v) = attr("preferred_segments")? {
        let list: Vec<String> = v
            .extract()
            .map_err(|_| PyTypeError::new_err("preferred_segments must be a list of str"))?;
        for s in list {
            if !s.is_empty() && !c.preferred_segments.contains(&s) {
                c.preferred_segments.push(s);
            }
        }
    }
    if let Some(v) = attr("prefer_alloc_in_same_node")? {
        if v.is_truthy()? {
            if let Some(own) = own_segment {
                c.preferred_segments.retain(|s| s != own);
                c.preferred_segments.insert(0, own.to_string());
            }
        }
    }
    Ok(c)
}
