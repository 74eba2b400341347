//! Counts written as a number or a percentage (`maxUnavailable`, `maxSurge`,
//! `partition`, `maxSkew`), and how a percentage turns into a count.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An integer or a string such as `"25%"` (Kubernetes `IntOrString`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A plain number.
    Int(i64),
    /// A string: a percentage `"N%"` or, for probe ports, a port name.
    String(String),
}

impl fmt::Display for IntOrString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntOrString::Int(n) => write!(f, "{n}"),
            IntOrString::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// A count given as an absolute number or a percentage of some total.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Amount {
    /// An absolute number of instances.
    Count(u32),
    /// A percentage (0..=100) of the total it is applied to.
    Percent(u32),
}

impl Amount {
    /// Parses an `IntOrString` that must be a non-negative count or `"N%"`.
    pub fn parse(v: &IntOrString) -> Result<Amount, String> {
        match v {
            IntOrString::Int(n) => u32::try_from(*n)
                .map(Amount::Count)
                .map_err(|_| format!("{n} is not a non-negative count")),
            IntOrString::String(s) => {
                let t = s.trim();
                if let Some(p) = t.strip_suffix('%') {
                    match p.trim().parse::<u32>() {
                        Ok(n) if n <= 100 => Ok(Amount::Percent(n)),
                        _ => Err(format!("{s:?} is not a percentage between 0% and 100%")),
                    }
                } else {
                    t.parse::<u32>().map(Amount::Count).map_err(|_| {
                        format!("{s:?} is neither a count nor a percentage like \"10%\"")
                    })
                }
            }
        }
    }

    /// The count this amount stands for out of `total`; percentages round up
    /// when `round_up`, down otherwise (Kubernetes rounds maxSurge up and
    /// maxUnavailable down).
    pub fn of(self, total: u32, round_up: bool) -> u32 {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => {
                let num = u64::from(total) * u64::from(p);
                let v = if round_up {
                    num.div_ceil(100)
                } else {
                    num / 100
                };
                u32::try_from(v).unwrap_or(u32::MAX)
            }
        }
    }

    /// True when this amount is zero whatever it is applied to.
    pub fn is_zero(self) -> bool {
        matches!(self, Amount::Count(0) | Amount::Percent(0))
    }
}

impl schemars::JsonSchema for IntOrString {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IntOrString".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// Kubernetes' own shape for int-or-string fields, so the API server
    /// accepts `1` and `"10%"` alike.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}]
        })
    }
}
