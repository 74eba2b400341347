//! Starting and signalling container processes.
//!
//! Each container runs as the leader of its own process group, so a signal
//! reaches everything it started (a shell and its children, a server and its
//! workers), exactly as stopping a container stops its whole PID namespace.
//! On Linux the leader also gets `PR_SET_PDEATHSIG = SIGKILL`: if the `rbg`
//! supervisor dies without stopping the group, its direct children die with
//! it instead of lingering on the group's addresses.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Environment variables passed through from `rbg`'s own environment; all
/// others are dropped, as a container does not see its host's environment.
pub const PASSED_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL",
    "TERM",
];

/// Everything needed to start one container process.
#[derive(Clone, Debug)]
pub struct Spawn {
    /// argv; `argv[0]` is looked up on the container's `PATH`.
    pub argv: Vec<String>,
    /// The container's environment (added after [`PASSED_ENV`]).
    pub env: Vec<(String, String)>,
    /// Directory put first on `PATH` (from the image map).
    pub path_dir: Option<PathBuf>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// File receiving stdout and stderr (appended).
    pub log: PathBuf,
    /// A line written to the log before the process starts.
    pub banner: String,
}

impl Spawn {
    /// The full environment the process gets.
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = PASSED_ENV
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        if let Some(d) = &self.path_dir {
            let old = env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_string());
            env.retain(|(k, _)| k != "PATH");
            env.push(("PATH".into(), format!("{}:{old}", d.display())));
        }
        for (k, v) in &self.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        env
    }
}

/// Starts the process as a new process group leader.
pub fn spawn(s: &Spawn) -> std::io::Result<Child> {
    let Some((prog, args)) = s.argv.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ));
    };
    if let Some(parent) = s.log.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut log = OpenOptions::new().create(true).append(true).open(&s.log)?;
    writeln!(log, "{}", s.banner)?;
    let err = log.try_clone()?;
    let env = s.environment();
    let mut cmd = Command::new(resolve_program(prog, &env));
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .process_group(0);
    if let Some(d) = &s.cwd {
        cmd.current_dir(d);
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the closure runs in the child between fork and exec and
        // only calls prctl, which is async-signal-safe and touches no memory
        // shared with the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// Looks `prog` up on the given PATH when it has no `/` (std would use the
/// child's PATH too, but resolving here makes "not found" errors name it).
fn resolve_program(prog: &str, env: &[(String, String)]) -> PathBuf {
    if prog.contains('/') {
        return PathBuf::from(prog);
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(prog);
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from(prog)
}

/// Sends `sig` to the process group `pgid`; a group already gone is fine.
pub fn signal_group(pgid: u32, sig: i32) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        // Never signal "every process" (0/-1) or init by mistake.
        return;
    }
    // SAFETY: killpg only sends a signal; a positive pgid that no longer
    // exists yields ESRCH, which is ignored.
    unsafe {
        libc::killpg(pgid, sig);
    }
}

/// True when a process group `pgid` still has members.
pub fn group_alive(pgid: u32) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check.
    unsafe { libc::killpg(pgid, 0) == 0 }
}
