//! Setting values as callers, env vars and config files give them, and
//! their conversion to sizes, durations and text.

use std::collections::BTreeMap;
use std::time::Duration;

use kvpool_proto::units::{parse_duration, parse_size};
use kvpool_proto::{Code, KvError, KvResult};

/// A raw setting value as a caller, an env var or a JSON file gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    /// Text, e.g. `"16MB"`, `"tcp"`, `"127.0.0.1:50051"`.
    Str(String),
    /// An integer (sizes in bytes, counts).
    Int(i128),
    /// A float (timeouts in seconds).
    Float(f64),
    /// A boolean flag.
    Bool(bool),
    /// Explicitly unset (`None` / JSON `null`): falls through to env and defaults.
    Null,
}

impl Raw {
    /// Converts a JSON value; arrays and objects are not settings.
    pub fn from_json(v: &serde_json::Value) -> Option<Raw> {
        match v {
            serde_json::Value::Null => Some(Raw::Null),
            serde_json::Value::Bool(b) => Some(Raw::Bool(*b)),
            serde_json::Value::Number(n) => n
                .as_i64()
                .map(|i| Raw::Int(i128::from(i)))
                .or_else(|| n.as_u64().map(|u| Raw::Int(i128::from(u))))
                .or_else(|| n.as_f64().map(Raw::Float)),
            serde_json::Value::String(s) => Some(Raw::Str(s.clone())),
            _ => None,
        }
    }

    /// The value as text, the way an env var would spell it (`Null` is "").
    pub fn text(&self) -> String {
        match self {
            Raw::Str(s) => s.clone(),
            Raw::Int(i) => i.to_string(),
            Raw::Float(f) => f.to_string(),
            Raw::Bool(b) => b.to_string(),
            Raw::Null => String::new(),
        }
    }

    /// A byte size from an int or a human string (`"16MB"`, `"4gb"`, `"1073741824"`).
    pub fn size(&self) -> Result<u64, String> {
        match self {
            Raw::Int(i) => u64::try_from(*i).map_err(|_| format!("invalid size {i}")),
            Raw::Str(s) => parse_size(s),
            Raw::Float(f) if f.is_finite() && *f >= 0.0 && *f < u64::MAX as f64 => Ok(*f as u64),
            other => Err(format!("invalid size {}", other.text())),
        }
    }

    /// A duration: numbers are seconds, text may carry a unit (`"2500ms"`).
    pub fn duration(&self) -> Result<Duration, String> {
        match self {
            Raw::Int(i) if *i >= 0 => u64::try_from(*i)
                .map(Duration::from_secs)
                .map_err(|_| format!("invalid duration {i}")),
            Raw::Float(f) if f.is_finite() && *f >= 0.0 && *f < 1e12 => {
                Ok(Duration::from_secs_f64(*f))
            }
            Raw::Str(s) => parse_duration(s),
            other => Err(format!("invalid duration {}", other.text())),
        }
    }
}

/// Where the JSON config file is, per env (`KVPOOL_CONFIG_PATH` wins over
/// `MOONCAKE_CONFIG_PATH`; an empty variable is unset).
pub fn config_path(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    ["KVPOOL_CONFIG_PATH", "MOONCAKE_CONFIG_PATH"]
        .iter()
        .find_map(|v| env(v).filter(|p| !p.trim().is_empty()))
}

/// Parses a JSON config file's text into raw settings; `path` only names
/// the file in errors.
pub fn parse_config_file(text: &str, path: &str) -> KvResult<BTreeMap<String, Raw>> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        KvError::new(
            Code::InvalidParams,
            format!("config file {path}: invalid JSON: {e}"),
        )
    })?;
    let obj = v.as_object().ok_or_else(|| {
        KvError::new(
            Code::InvalidParams,
            format!("config file {path}: expected a JSON object"),
        )
    })?;
    Ok(obj
        .iter()
        .filter_map(|(k, v)| Raw::from_json(v).map(|r| (k.clone(), r)))
        .collect())
}

/// Reads and parses the config file the environment names, if any.
pub fn load_config_file(
    env: &dyn Fn(&str) -> Option<String>,
) -> KvResult<Option<BTreeMap<String, Raw>>> {
    let Some(path) = config_path(env) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| KvError::new(Code::InvalidParams, format!("config file {path}: {e}")))?;
    parse_config_file(&text, &path).map(Some)
}
