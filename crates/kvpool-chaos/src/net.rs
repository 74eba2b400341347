//! The pool's network: one network namespace per host, each with one veth
//! pair whose outer end sits on a bridge, one address per host on
//! 10.77.0.0/24. The coordinator (root namespace) holds 10.77.0.1 on the
//! bridge to watch the pool.
//!
//! Faults act on the outer veth ends and so never need the host's
//! cooperation: a link down (isolate), a move to a second bridge with no
//! route to the first (a split into halves), and a queue of length zero on
//! one direction (one-way loss: the kernel here has no netem, but a
//! `pfifo limit 0` drops every packet it is given).
//!
//! Every name starts with [`PREFIX`]; [`cleanup_stale`] removes whatever a
//! crashed earlier run left behind, processes in its namespaces included.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use crate::schedule::{Host, Role};

/// Prefix of every namespace, link and bridge the harness makes.
pub const PREFIX: &str = "kvch";
/// The bridge every host starts on.
pub const BRIDGE: &str = "kvch-br0";
/// The bridge the other half of a split moves to.
pub const SPLIT_BRIDGE: &str = "kvch-br1";
/// The coordinator's address on [`BRIDGE`].
pub const COORDINATOR_IP: &str = "10.77.0.1";

/// Runs `ip`/`tc` with `args`; fails with its stderr.
pub fn sh(prog: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {prog}"))?;
    if !out.status.success() {
        bail!(
            "{prog} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The network namespace of `h`.
pub fn ns(h: Host) -> String {
    format!("{PREFIX}-{h}")
}

/// The outer (bridge-side) veth of `h`: at most 15 bytes, as Linux wants.
pub fn veth(h: Host) -> String {
    let r = match h.role {
        Role::Etcd => 'e',
        Role::Master => 'm',
        Role::Store => 's',
        Role::Client => 'c',
    };
    format!("{PREFIX}-{r}{}", h.idx)
}

/// The address of `h`: etcd .11+, masters .21+, stores .31+, clients .41+.
pub fn ip(h: Host) -> String {
    let base = match h.role {
        Role::Etcd => 11,
        Role::Master => 21,
        Role::Store => 31,
        Role::Client => 41,
    };
    assert!(h.idx < 10, "at most 10 hosts per role");
    format!("10.77.0.{}", base + h.idx)
}

/// Fails with a clear message unless this process can build namespaces.
pub fn preflight() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the chaos harness builds network namespaces and bridges: run it as root");
    }
    for (prog, hint) in [
        ("ip", "install iproute2"),
        ("tc", "install iproute2"),
        ("etcd", "install etcd-server (scripts/test.sh does)"),
    ] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()));
        if !found {
            bail!("{prog} not found on PATH: {hint}");
        }
    }
    Ok(())
}

/// Removes every namespace, link and bridge named with [`PREFIX`], killing
/// the processes inside those namespaces first (they can only be ours).
pub fn cleanup_stale() -> anyhow::Result<()> {
    let list = sh("ip", &["netns", "list"])?;
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if !name.starts_with(&format!("{PREFIX}-")) {
            continue;
        }
        if let Ok(pids) = sh("ip", &["netns", "pids", name]) {
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: plain syscall; the pid lives in our namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = sh("ip", &["netns", "del", name]);
    }
    let links = sh("ip", &["-o", "link", "show"])?;
    for l in links.lines() {
        // "12: kvch-s0@if3: <...>"
        let Some(name) = l.split(':').nth(1).map(str::trim) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        if name.starts_with(&format!("{PREFIX}-")) {
            let _ = sh("ip", &["link", "del", name]);
        }
    }
    Ok(())
}

/// The hosts' network, torn down on drop.
pub struct Net {
    hosts: Vec<Host>,
}

impl Net {
    /// Builds the bridges and one namespace per host in `hosts`.
    pub fn create(hosts: &[Host]) -> anyhow::Result<Net> {
        for br in [BRIDGE, SPLIT_BRIDGE] {
            sh("ip", &["link", "add", br, "type", "bridge"])?;
            sh("ip", &["link", "set", br, "up"])?;
        }
        sh(
            "ip",
            &[
                "addr",
                "add",
                &format!("{COORDINATOR_IP}/24"),
                "dev",
                BRIDGE,
            ],
        )?;
        let mut net = Net { hosts: Vec::new() };
        for h in hosts {
            net.add_host(*h)?;
        }
        Ok(net)
    }

    /// Adds a host: its namespace, veth pair, address, routes up.
    pub fn add_host(&mut self, h: Host) -> anyhow::Result<()> {
        let (n, v) = (ns(h), veth(h));
        sh("ip", &["netns", "add", &n])?;
        self.hosts.push(h);
        sh(
            "ip",
            &[
                "link", "add", &v, "type", "veth", "peer", "name", "eth0", "netns", &n,
            ],
        )?;
        sh("ip", &["link", "set", &v, "master", BRIDGE, "up"])?;
        let inside = |args: &[&str]| {
            let mut a = vec!["netns", "exec", &n, "ip"];
            a.extend_from_slice(args);
            sh("ip", &a)
        };
        inside(&["addr", "add", &format!("{}/24", ip(h)), "dev", "eth0"])?;
        inside(&["link", "set", "eth0", "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Every host.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Takes `h`'s link down (no packet in or out) or back up.
    pub fn link(&self, h: Host, up: bool) -> anyhow::Result<()> {
        sh(
            "ip",
            &["link", "set", &veth(h), if up { "up" } else { "down" }],
        )?;
        Ok(())
    }

    /// Moves `side` to the split bridge (apart) or back.
    pub fn split(&self, side: &[Host], apart: bool) -> anyhow::Result<()> {
        let br = if apart { SPLIT_BRIDGE } else { BRIDGE };
        for h in side {
            sh("ip", &["link", "set", &veth(*h), "master", br])?;
        }
        Ok(())
    }

    /// Drops every packet into `h` (`inbound`) or out of it, or stops dropping.
    pub fn drop_packets(&self, h: Host, inbound: bool, on: bool) -> anyhow::Result<()> {
        // Inbound packets leave the bridge through the outer veth end; an
        // outbound packet leaves the namespace through eth0.
        let (netns, dev) = if inbound {
            (None, veth(h))
        } else {
            (Some(ns(h)), "eth0".to_string())
        };
        let mut args: Vec<&str> = Vec::new();
        if let Some(n) = &netns {
            args.extend(["-n", n.as_str()]);
        }
        if on {
            args.extend([
                "qdisc", "replace", "dev", &dev, "root", "pfifo", "limit", "0",
            ]);
        } else {
            args.extend(["qdisc", "del", "dev", &dev, "root"]);
        }
        sh("tc", &args)?;
        Ok(())
    }

    /// Undoes every fault: links up, back on the first bridge, no drops.
    pub fn heal_all(&self) {
        for h in &self.hosts {
            let _ = self.link(*h, true);
            let _ = sh("ip", &["link", "set", &veth(*h), "master", BRIDGE]);
            let _ = self.drop_packets(*h, true, false);
            let _ = self.drop_packets(*h, false, false);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = sh("ip", &["netns", "del", &ns(*h)]);
            let _ = sh("ip", &["link", "del", &veth(*h)]);
        }
        for br in [BRIDGE, SPLIT_BRIDGE] {
            let _ = sh("ip", &["link", "del", br]);
        }
    }
}

/// Where a campaign notes the directories it mounts, so that whatever a
/// killed campaign left mounted can be found and unmounted later.
const MOUNTS_FILE: &str = "/run/lock/kvpool-chaos.mounts";

/// Mounts a tmpfs of `bytes` on `dir` (created if missing), noting it in
/// the mounts file.
pub fn mount_tmpfs(dir: &Path, bytes: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(MOUNTS_FILE)?;
        writeln!(f, "{}", dir.display())?;
    }
    sh(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={bytes}"),
            "tmpfs",
            &dir.to_string_lossy(),
        ],
    )?;
    Ok(())
}

/// Unmounts every mount at or below `dir`, deepest first.
pub fn unmount_below(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return;
    };
    let root = dir.to_string_lossy().to_string();
    let mut ours: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| *m == root || m.starts_with(&format!("{root}/")))
        .collect();
    ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in ours {
        let _ = sh("umount", &["-l", m]);
    }
}

/// Unmounts what earlier campaigns noted in the mounts file and left
/// mounted (they died before cleaning up), and empties the file. Call it
/// only while holding the campaign lock.
pub fn unmount_stale() {
    let Ok(noted) = std::fs::read_to_string(MOUNTS_FILE) else {
        return;
    };
    let mut dirs: Vec<&str> = noted.lines().filter(|l| !l.is_empty()).collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    dirs.dedup();
    for d in dirs {
        unmount_below(Path::new(d));
    }
    let _ = std::fs::write(MOUNTS_FILE, "");
}

/// Fills the filesystem of `dir` with a file named `name`; returns its size.
/// Space taken by someone else meanwhile (the free space measured is gone
/// by the time it is claimed) is measured again, a few times.
pub fn fill_disk(dir: &Path, name: &str) -> anyhow::Result<u64> {
    use std::os::fd::AsRawFd;
    let path = dir.join(name);
    let file = std::fs::File::create(&path)?;
    let c = std::ffi::CString::new(dir.to_string_lossy().as_bytes())?;
    let mut tries = 0;
    loop {
        // SAFETY: statvfs fills the struct we pass.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a struct to fill.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            bail!(
                "statvfs {}: {}",
                dir.display(),
                std::io::Error::last_os_error()
            );
        }
        let free = st.f_bavail as u64 * st.f_frsize as u64;
        if free == 0 {
            return Ok(0);
        }
        // SAFETY: plain syscall on a descriptor we own.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, free as libc::off_t) };
        tries += 1;
        match rc {
            0 => return Ok(free),
            // What a failed call allocated goes back before measuring again.
            libc::ENOSPC if tries < 5 => file.set_len(0)?,
            _ => bail!(
                "fill {}: {}",
                path.display(),
                std::io::Error::from_raw_os_error(rc)
            ),
        }
    }
}
