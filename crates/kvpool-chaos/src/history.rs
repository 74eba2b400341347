//! The recorded history of a campaign: JSON lines, one file per worker
//! process incarnation and one for the coordinator's faults and marks.
//!
//! Every operation is an `invoke` written *before* its first byte goes out,
//! and a `complete` written after its answer: a worker killed mid-call
//! leaves an invoke without a completion, which the checker treats as an
//! operation that may take effect at any later time. Each line is one
//! `write(2)`, so what a `kill -9` interrupts is at most the line being
//! written (dropped on load), never a line the kernel already has.
//!
//! Times are CLOCK_MONOTONIC nanoseconds, one clock for every process on
//! the machine whatever its network namespace, so the records of all hosts
//! order against each other.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we pass and nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The wall clock now as RFC 3339 UTC with milliseconds, the form the
/// pool's logs use: a mark with both clocks lets a reader match history
/// times to log lines.
pub fn wall_clock() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Nanoseconds since the Unix epoch of a time as [`wall_clock`] and the
/// pool's logs write it (`2026-11-30T13:20:39.118Z`, any fraction).
pub fn parse_wall_clock(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, mo, day) = (d.next()??, d.next()??, d.next()??);
    let mut hms = time.splitn(3, ':');
    let (h, mi) = (
        hms.next()?.parse::<u64>().ok()?,
        hms.next()?.parse::<u64>().ok()?,
    );
    let sec: f64 = hms.next()?.parse().ok()?;
    // Days from 1970-01-01 to the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (mo + if mo > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some((days * 86_400 + h * 3600 + mi * 60) * 1_000_000_000 + (sec * 1e9).round() as u64)
}

/// One object written by a put or an upsert.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// The key.
    pub key: String,
    /// The version its value encodes (see [`crate::value`]).
    pub version: u64,
    /// Bytes of the value.
    pub len: u32,
}

/// What an operation asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Write-once puts (one item: `put`; several: `batch_put`).
    Put {
        /// The objects.
        items: Vec<Written>,
    },
    /// Overwriting puts (one item: `upsert`; several: `batch_put` with upsert).
    Upsert {
        /// The objects.
        items: Vec<Written>,
    },
    /// Reads (`get` or `batch_get`).
    Get {
        /// The keys.
        keys: Vec<String>,
    },
    /// Removals (`remove` or `batch_remove`).
    Remove {
        /// The keys.
        keys: Vec<String>,
        /// Whether read leases were overridden.
        force: bool,
    },
    /// Existence checks (`exist` or `batch_exist`).
    Exist {
        /// The keys.
        keys: Vec<String>,
    },
}

impl Op {
    /// The keys the operation touches, in order.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            Op::Put { items } | Op::Upsert { items } => {
                items.iter().map(|w| w.key.as_str()).collect()
            }
            Op::Get { keys } | Op::Remove { keys, .. } | Op::Exist { keys } => {
                keys.iter().map(String::as_str).collect()
            }
        }
    }

    /// A short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Put { items } if items.len() > 1 => "batch_put",
            Op::Put { .. } => "put",
            Op::Upsert { items } if items.len() > 1 => "batch_upsert",
            Op::Upsert { .. } => "upsert",
            Op::Get { keys } if keys.len() > 1 => "batch_get",
            Op::Get { .. } => "get",
            Op::Remove { keys, .. } if keys.len() > 1 => "batch_remove",
            Op::Remove { .. } => "remove",
            Op::Exist { keys } if keys.len() > 1 => "batch_exist",
            Op::Exist { .. } => "exist",
        }
    }
}

/// The answer for one key of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "r", rename_all = "snake_case")]
pub enum Outcome {
    /// A write or removal succeeded.
    Ok,
    /// The call failed for this key with a kvpool error code
    /// (`-704`, not found, is how a read reports a missing key).
    Err {
        /// The code (API.md).
        code: i32,
        /// The message the client gave.
        msg: String,
    },
    /// A read returned a value written by the workload, of this version.
    Value {
        /// The version decoded from the bytes.
        version: u64,
    },
    /// A read returned bytes no write of the key produced.
    Corrupt {
        /// What was wrong with them.
        why: String,
    },
    /// An existence check answered.
    Exists {
        /// Whether the key exists.
        present: bool,
    },
}

/// A line of a history file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "snake_case")]
pub enum Event {
    /// An operation is about to be sent.
    Invoke {
        /// Unique in the campaign (worker, incarnation and sequence).
        id: u64,
        /// When, in CLOCK_MONOTONIC ns.
        t: u64,
        /// The worker process incarnation, e.g. `client-2.1`.
        client: String,
        /// What it asks.
        #[serde(flatten)]
        op: Op,
    },
    /// An operation answered, one outcome per key in the invoke's order.
    Complete {
        /// The invoke's id.
        id: u64,
        /// When, in CLOCK_MONOTONIC ns.
        t: u64,
        /// Per key.
        results: Vec<Outcome>,
    },
    /// A fault began or ended (written by the coordinator).
    Fault {
        /// When, in CLOCK_MONOTONIC ns.
        t: u64,
        /// The fault's number in the schedule.
        n: u32,
        /// `start` or `end`.
        phase: String,
        /// e.g. `kill`, `pause`, `isolate`, `split`.
        kind: String,
        /// The hosts or processes it hit.
        target: String,
    },
    /// Something the coordinator wants in the record (phases, leaders).
    Mark {
        /// When, in CLOCK_MONOTONIC ns.
        t: u64,
        /// What happened.
        what: String,
    },
}

impl Event {
    /// The event's time.
    pub fn t(&self) -> u64 {
        match self {
            Event::Invoke { t, .. }
            | Event::Complete { t, .. }
            | Event::Fault { t, .. }
            | Event::Mark { t, .. } => *t,
        }
    }
}

/// Appends events to a history file, one `write(2)` per line.
pub struct Recorder {
    file: Mutex<File>,
    path: PathBuf,
}

impl Recorder {
    /// Creates (or appends to) the history file at `path`.
    pub fn create(path: &Path) -> std::io::Result<Recorder> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Recorder {
            file: Mutex::new(file),
            path: path.to_path_buf(),
        })
    }

    /// Writes one event. A failure to record is fatal to the campaign: a
    /// history with holes would be checked as if the holes did not happen.
    pub fn record(&self, e: &Event) {
        let mut line = serde_json::to_vec(e).expect("events serialize");
        line.push(b'\n');
        self.file
            .lock()
            .write_all(&line)
            .unwrap_or_else(|err| panic!("cannot record to {}: {err}", self.path.display()));
    }
}

/// Reads every event of `paths`. A last line cut short by a kill is
/// dropped; any other unreadable line is an error.
pub fn load(paths: &[PathBuf]) -> anyhow::Result<Vec<Event>> {
    let mut out = Vec::new();
    for p in paths {
        let f = File::open(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        let lines: Vec<String> = BufReader::new(f).lines().collect::<Result<_, _>>()?;
        let n = lines.len();
        for (i, line) in lines.into_iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(&line) {
                Ok(e) => out.push(e),
                Err(_) if i + 1 == n => {}
                Err(e) => anyhow::bail!("{}:{}: {e}", p.display(), i + 1),
            }
        }
    }
    out.sort_by_key(Event::t);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_times_parse_to_epoch_nanoseconds() {
        assert_eq!(
            parse_wall_clock("1970-01-01T00:00:01.5Z"),
            Some(1_500_000_000)
        );
        // 2026-11-30 is day 20,787 of the epoch.
        let day = 20_787u64 * 86_400 * 1_000_000_000;
        assert_eq!(
            parse_wall_clock("2026-11-30T13:20:39.118000Z"),
            Some(day + ((13 * 3600 + 20 * 60 + 39) * 1_000_000_000 + 118_000_000))
        );
        assert_eq!(parse_wall_clock("not a time"), None);
    }

    #[test]
    fn events_round_trip_through_a_file_and_a_torn_last_line_is_dropped() {
        let dir = std::env::temp_dir().join(format!("kvchaos-hist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.jsonl");
        let _ = std::fs::remove_file(&path);
        let rec = Recorder::create(&path).unwrap();
        let events = vec![
            Event::Invoke {
                id: 1,
                t: 10,
                client: "client-0.0".into(),
                op: Op::Upsert {
                    items: vec![Written {
                        key: "k".into(),
                        version: 5,
                        len: 64,
                    }],
                },
            },
            Event::Complete {
                id: 1,
                t: 20,
                results: vec![Outcome::Err {
                    code: -1010,
                    msg: "x".into(),
                }],
            },
            Event::Fault {
                t: 15,
                n: 0,
                phase: "start".into(),
                kind: "kill".into(),
                target: "master-0".into(),
            },
        ];
        for e in &events {
            rec.record(e);
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"e\":\"invo")
            .unwrap();
        let back = load(&[path]).unwrap();
        assert_eq!(
            back,
            vec![events[0].clone(), events[2].clone(), events[1].clone()]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
