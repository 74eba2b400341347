//! Process supervision: each host's process runs inside its network
//! namespace (entered with `setns` between fork and exec), logs to one file
//! across restarts, and can be killed, paused, stopped and restarted.
//!
//! A process the harness did not stop on purpose and that exits is noticed
//! by [`Proc::poll_exit`]; the coordinator decides whether that is expected
//! (a master that lost its leadership steps down by exiting, and its
//! supervisor, here the coordinator, restarts it) or a crash to report.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use anyhow::Context;

/// One host's process.
pub struct Proc {
    /// The name in logs and reports, e.g. `store-2`.
    pub name: String,
    /// The network namespace it runs in.
    netns: String,
    /// Program and arguments.
    pub argv: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    /// Times it was started.
    pub starts: u32,
    /// SIGSTOPped by a fault and not resumed yet.
    pub paused: bool,
    /// Stopped by the harness on purpose (killed by a fault, stopping for
    /// an upgrade, or at the end): an exit is no crash.
    pub held: bool,
}

impl Proc {
    /// A process (not started) running `argv` in `netns`, logging to `log`.
    pub fn new(name: &str, netns: &str, argv: Vec<String>, log: &Path) -> Proc {
        Proc {
            name: name.to_string(),
            netns: netns.to_string(),
            argv,
            env: Vec::new(),
            log: log.to_path_buf(),
            child: None,
            starts: 0,
            paused: false,
            held: false,
        }
    }

    /// Adds an environment variable for the next starts.
    pub fn env(&mut self, k: &str, v: &str) {
        self.env.push((k.to_string(), v.to_string()));
    }

    /// Starts it (again). The log gets a line per start.
    pub fn start(&mut self) -> anyhow::Result<()> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("log {}", self.log.display()))?;
        writeln!(
            log,
            "===== start {} at {:.3}s (monotonic): {}",
            self.starts + 1,
            crate::history::now_ns() as f64 / 1e9,
            self.argv.join(" ")
        )?;
        let netns = File::open(format!("/run/netns/{}", self.netns))
            .with_context(|| format!("namespace {}", self.netns))?;
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("KVPOOL_") || k.starts_with("MOONCAKE_") {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.env("NO_COLOR", "1");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let fd = std::os::fd::AsRawFd::as_raw_fd(&netns);
        // SAFETY: between fork and exec only async-signal-safe calls:
        // setns(2) on a descriptor opened before the fork, and setsid(2) so
        // a signal to the coordinator's process group spares the pool.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("start {} ({})", self.name, self.argv[0]))?;
        drop(netns);
        self.child = Some(child);
        self.starts += 1;
        self.paused = false;
        self.held = false;
        Ok(())
    }

    /// Its pid while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: plain syscall on the pid of a child we have not reaped.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// `kill -9` and reap; held until started again.
    pub fn kill9(&mut self) {
        self.held = true;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused = false;
    }

    /// SIGTERM (a drain); held until started again. Reap with [`Proc::poll_exit`].
    pub fn terminate(&mut self) {
        self.held = true;
        if self.paused {
            self.pause(false);
        }
        self.signal(libc::SIGTERM);
    }

    /// SIGSTOP (`on`) or SIGCONT.
    pub fn pause(&mut self, on: bool) {
        self.signal(if on { libc::SIGSTOP } else { libc::SIGCONT });
        self.paused = on;
    }

    /// Whether a started process is still running (reaping it if not).
    pub fn running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The exit status if it exited since the last call (then reaped).
    pub fn poll_exit(&mut self) -> Option<ExitStatus> {
        let c = self.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(s)) => {
                self.child = None;
                Some(s)
            }
            _ => None,
        }
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.paused {
            self.pause(false);
        }
        self.kill9();
    }
}
