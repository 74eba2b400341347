//! Readiness probes: one attempt each, bounded by the probe's timeout.
//! Scheduling (initial delay, period, thresholds) is decided by
//! [`ProbeState`], a pure state machine the supervisor drives.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::planner::Millis;

/// A probe resolved against an instance: address, port and command known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeAction {
    /// Ready when a TCP connection opens.
    Tcp(SocketAddr),
    /// Ready when `GET path` answers 200..=399.
    Http {
        /// Where to connect.
        addr: SocketAddr,
        /// Host header value.
        host: String,
        /// Request path.
        path: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// Ready when the command exits 0.
    Exec {
        /// argv.
        argv: Vec<String>,
        /// Environment of the container.
        env: Vec<(String, String)>,
        /// Working directory.
        cwd: Option<PathBuf>,
    },
}

/// Runs one probe attempt; true when it passed.
pub async fn run(action: &ProbeAction, timeout: Duration) -> bool {
    let attempt = async {
        match action {
            ProbeAction::Tcp(addr) => TcpStream::connect(addr).await.is_ok(),
            ProbeAction::Http {
                addr,
                host,
                path,
                headers,
            } => http_get(*addr, host, path, headers).await.unwrap_or(false),
            ProbeAction::Exec { argv, env, cwd } => {
                let Some((prog, args)) = argv.split_first() else {
                    return false;
                };
                let mut cmd = tokio::process::Command::new(prog);
                cmd.args(args)
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true);
                if let Some(d) = cwd {
                    cmd.current_dir(d);
                }
                match cmd.status().await {
                    Ok(s) => s.success(),
                    Err(_) => false,
                }
            }
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(false)
}

async fn http_get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(String, String)],
) -> std::io::Result<bool> {
    let mut s = TcpStream::connect(addr).await?;
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: rbg-probe\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    // The status line is all we need; read until it is complete.
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'\n') && buf.len() < 4096 {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0);
    Ok((200..400).contains(&code))
}

/// Probe timing parameters, from the spec with Kubernetes defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeTiming {
    /// Delay after start before the first attempt.
    pub initial_delay: Millis,
    /// Time between attempts.
    pub period: Millis,
    /// Attempt timeout.
    pub timeout: Millis,
    /// Consecutive passes to become ready.
    pub success_threshold: u32,
    /// Consecutive failures to become unready.
    pub failure_threshold: u32,
}

impl ProbeTiming {
    /// Timing of a spec probe.
    pub fn of(p: &crate::spec::Probe) -> ProbeTiming {
        ProbeTiming {
            initial_delay: u64::from(p.initial_delay_seconds.unwrap_or(0)) * 1000,
            period: u64::from(p.period_seconds.unwrap_or(10).max(1)) * 1000,
            timeout: u64::from(p.timeout_seconds.unwrap_or(1).max(1)) * 1000,
            success_threshold: p.success_threshold.unwrap_or(1).max(1),
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1),
        }
    }
}

/// Until a container is first ready, it is probed at least this often, so a
/// local group does not idle for a whole `periodSeconds` (10 s by default)
/// after a process that binds its port in milliseconds. Once ready, the
/// spec's period applies.
pub const STARTUP_PERIOD: Millis = 250;

/// Readiness of one container, driven by probe results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeState {
    /// Timing.
    pub timing: ProbeTiming,
    /// Current readiness.
    pub ready: bool,
    /// Has been ready at least once since the container started.
    pub ever_ready: bool,
    /// Consecutive passes.
    pub successes: u32,
    /// Consecutive failures.
    pub failures: u32,
    /// Next attempt is due at.
    pub next_at: Millis,
    /// An attempt is running.
    pub in_flight: bool,
}

impl ProbeState {
    /// State for a container started at `started`.
    pub fn new(timing: ProbeTiming, started: Millis) -> ProbeState {
        ProbeState {
            timing,
            ready: false,
            ever_ready: false,
            successes: 0,
            failures: 0,
            next_at: started + timing.initial_delay,
            in_flight: false,
        }
    }

    /// True when an attempt should start now.
    pub fn due(&self, now: Millis) -> bool {
        !self.in_flight && now >= self.next_at
    }

    /// Records an attempt's result at `now`.
    pub fn record(&mut self, passed: bool, now: Millis) {
        self.in_flight = false;
        if passed {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= self.timing.success_threshold {
                self.ready = true;
                self.ever_ready = true;
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            // Before the first success the container is unready anyway; the
            // threshold only guards against flapping once it served.
            if self.failures >= self.timing.failure_threshold || !self.ever_ready {
                self.ready = false;
            }
        }
        let period = if self.ever_ready {
            self.timing.period
        } else {
            self.timing.period.min(STARTUP_PERIOD)
        };
        self.next_at = now + period;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> ProbeTiming {
        ProbeTiming {
            initial_delay: 1000,
            period: 5000,
            timeout: 1000,
            success_threshold: 1,
            failure_threshold: 3,
        }
    }

    #[test]
    fn thresholds_and_periods() {
        let mut p = ProbeState::new(timing(), 0);
        assert!(!p.due(999));
        assert!(p.due(1000));
        p.record(false, 1000);
        assert_eq!(p.next_at, 1000 + STARTUP_PERIOD);
        p.record(true, 1250);
        assert!(p.ready);
        assert_eq!(p.next_at, 1250 + 5000);
        p.record(false, 6250);
        p.record(false, 11250);
        assert!(p.ready, "two failures < threshold 3");
        p.record(false, 16250);
        assert!(!p.ready);
    }

    #[tokio::test]
    async fn tcp_and_http_probes() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
            }
        });
        assert!(run(&ProbeAction::Tcp(addr), Duration::from_secs(1)).await);
        let http = ProbeAction::Http {
            addr,
            host: "x".into(),
            path: "/health".into(),
            headers: vec![],
        };
        assert!(run(&http, Duration::from_secs(1)).await);
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let dead = closed.local_addr().expect("addr");
        drop(closed);
        assert!(!run(&ProbeAction::Tcp(dead), Duration::from_secs(1)).await);
        let ok = ProbeAction::Exec {
            argv: vec!["true".into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: None,
        };
        assert!(run(&ok, Duration::from_secs(2)).await);
        let bad = ProbeAction::Exec {
            argv: vec!["false".into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: None,
        };
        assert!(!run(&bad, Duration::from_secs(2)).await);
    }
}
