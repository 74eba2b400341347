#!/usr/bin/env python3
"""Orchestrator of the fault-latency bench for one system (kvpool or the real
Mooncake); bench/faults_latency.sh runs it once per system with that
system's Python. It starts the pool, populates the key sets, starts the load
processes (load.py), injects the faults in sequence and writes:

  OUT/<system>/phases.json   phases (name, kind, fault, start, end) and events
  OUT/<system>/ops-*.csv     every operation of every load process
  OUT/<system>/*.log         every process's output
  OUT/<system>/pids          "pid name exe" of every process it started (the
                             shell's trap kills those, and only those)

Clusters and phases (--phases, default kill,stop,leader,netns):
  cluster 1: one master, two storage nodes (victim, survivor)
    kill    kill -9 the victim for --fault s, then start it again (kvpool:
            same --data-dir and name, so it comes back with its objects;
            Mooncake: a new store process, a new, empty segment)
    stop    SIGSTOP the victim for --stop-secs s, then SIGCONT
  cluster 2: two masters in HA through etcd (--etcd), two storage nodes
    leader  kill -9 the leading master (found through its etcd key) for
            --fault s, then start it again (it comes back as a standby)
  cluster 3: one master on a veth address, the victim store in its own
            network namespace (NetNS below)
    netns   take the namespace's end of the veth down for --fault s
            (packets to the victim are dropped), then up again
Before each fault: fresh key sets (epoch) are populated
  A: 1 replica, preferred segment = victim      ("only on the victim")
  B: 2 replicas (one per storage node)
  C: 1 replica, preferred segment = survivor
and each key is classified by where the system says its replicas are
(batch_get_replica_desc), so a placement that ignored the preference is
filed where it really is. Then --steady s of steady load, the fault window,
and --recover s after it.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import etcd_leader_port, set_config, value_for  # noqa: E402

MiB = 1 << 20


def now():
    return time.time()


def parse_size(s):
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?)?", str(s).strip(), re.I)
    if not m:
        raise ValueError(s)
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[(m.group(2) or "")[:1].upper()]
    return int(m.group(1)) * mult


class Procs:
    """Every process this orchestrator starts, recorded in OUT/pids."""

    def __init__(self, out):
        self.out = out
        self.procs = {}  # name -> Popen
        self.pidfile = open(os.path.join(out, "pids"), "a")
        self.cpu = {}  # process kind (load, store, master) -> CPU seconds

    def start(self, name, argv, env=None, log=None):
        logf = open(log or os.path.join(self.out, f"{name}.log"), "ab")
        p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = p
        # What the process runs, for the shell's trap to check before it kills
        # a recorded PID: the script for Python, else the program (`ip netns
        # exec` execs the program it wraps).
        prog = argv[4] if argv[:3] == ["ip", "netns", "exec"] else argv[0]
        exe = next((os.path.basename(x) for x in argv if x.endswith(".py")), os.path.basename(prog))
        self.pidfile.write(f"{p.pid} {name} {exe}\n")
        self.pidfile.flush()
        return p

    @staticmethod
    def cpu_seconds(pid):
        """utime + stime of a live process (children it waited for included)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def note_cpu(self, name, p):
        c = self.cpu_seconds(p.pid)
        if c is not None:
            kind = "master" if "master" in name else name.split("-")[0]
            self.cpu[kind] = self.cpu.get(kind, 0.0) + c

    def signal(self, name, sig):
        p = self.procs[name]
        if p.poll() is None:
            os.kill(p.pid, sig)

    def kill9(self, name):
        p = self.procs.pop(name)
        if p.poll() is None:
            self.note_cpu(name, p)
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGKILL)
        p.wait()

    def stop_all(self, grace=3.0):
        for name, p in self.procs.items():
            if p.poll() is None:
                self.note_cpu(name, p)
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = now() + grace
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.05, end - now()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


class NetNS:
    """A network namespace for the victim store, joined to this one by a veth
    pair (10.213.N.1 here, 10.213.N.2 inside). `cut` takes the inside end
    down: packets to the victim are dropped silently (a partition, not a
    refusal); `heal` brings it back. Recorded in OUT/netns so the shell's trap
    can delete it."""

    def __init__(self, out):
        pid = os.getpid()
        self.name = f"kvfl-{pid}"
        self.host_if, self.ns_if = f"kvflh{pid % 100000}", f"kvfln{pid % 100000}"
        octet = 100 + pid % 150
        self.host_ip, self.ns_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
        self.out = out
        self.created = False

    def _ip(self, *args, ns=False):
        cmd = (["ip", "netns", "exec", self.name] if ns else []) + ["ip", *args]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=10)

    def up(self):
        with open(os.path.join(self.out, "netns"), "a") as f:
            f.write(f"{self.name} {self.host_if}\n")
        self._ip("netns", "add", self.name)
        self.created = True
        self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self._ip("link", "set", self.ns_if, "netns", self.name)
        self._ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        self._ip("link", "set", self.host_if, "up")
        self._ip("link", "set", "lo", "up", ns=True)
        self._ip("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if, ns=True)
        self._ip("link", "set", self.ns_if, "up", ns=True)

    def cut(self):
        self._ip("link", "set", self.ns_if, "down", ns=True)

    def heal(self):
        self._ip("link", "set", self.ns_if, "up", ns=True)

    def wrap(self, argv):
        return ["ip", "netns", "exec", self.name] + argv

    def down(self):
        if self.created:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=10)
            self.created = False


class System:
    """What differs between kvpool and Mooncake. Cluster kinds (tag): c1 one
    master on loopback; ha two masters through etcd; ns one master, the
    victim store in a network namespace (addresses off loopback)."""

    def __init__(self, a, procs, out, tag, netns=None):
        self.a, self.procs, self.out, self.tag = a, procs, out, tag
        self.ha = tag == "ha"
        self.netns = netns
        self.ip = netns.host_ip if netns else "127.0.0.1"  # this side's address
        self.master_names = []
        self.master_ports = {}
        self.store_names = {}  # role -> segment name
        self.gen = 0
        self._store_log = {}

    def env(self, role=None):
        return dict(os.environ)

    def wrap(self, role, argv):
        return self.netns.wrap(argv) if (self.netns and role == "victim") else argv

    def store_ip(self, role):
        return self.netns.ns_ip if (self.netns and role == "victim") else self.ip

    def wait_masters(self, timeout=30):
        """Every master process running and the serving one listening on its
        RPC port: the only master, or with HA the leader named in etcd (a
        Mooncake standby opens no RPC port). A master that could not start,
        e.g. a port taken, fails the cluster loudly."""
        end = now() + timeout
        while True:
            for name in self.master_names:
                p = self.procs.procs.get(name)
                if p is None or p.poll() is not None:
                    raise RuntimeError(f"master {name} exited at start (rc={p.returncode if p else '?'}); "
                                       f"see its log in {self.out}")
            serving = self.leader() if self.ha else self.master_names[0]
            if serving:
                port = self.master_ports[serving]
                out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
                if out.strip():
                    if self.ha:
                        time.sleep(1.0)  # a master that dies at start (port taken) does so at once
                        for name in self.master_names:
                            p = self.procs.procs.get(name)
                            if p is None or p.poll() is not None:
                                raise RuntimeError(f"master {name} exited at start; see its log in {self.out}")
                    return serving
            if now() > end:
                raise RuntimeError(f"no master serving after {timeout} s (leader: {serving})")
            time.sleep(0.2)

    def start_masters(self, base):
        """Starts the cluster's masters (two with HA) on ports from `base`
        and waits for them."""
        for i in range(2 if self.ha else 1):
            name = f"{self.tag}-master{i}"
            self.master_ports[name] = base + i
            self.master_names.append(name)
            self.start_master(name)
        self.wait_masters()

    def start_stores(self):
        """Starts the victim and the survivor and waits for both."""
        for role in ("victim", "survivor"):
            self.start_store(role)
        for role in ("victim", "survivor"):
            self.wait_store(role)

    def wait_log(self, role, ready, timeout):
        """Waits until `ready(text of the store's log)` holds, or fails when
        the store exits or `timeout` passes."""
        log = self._store_log[role]
        end = now() + timeout
        while now() < end:
            try:
                with open(log) as f:
                    text = f.read()
            except OSError:
                text = ""
            if ready(text):
                return
            if self.procs.procs[f"store-{role}"].poll() is not None:
                raise RuntimeError(f"{self.name} store {role} exited; see {log}")
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} store {role} did not come up; see {log}")

    def leader_name(self, key):
        port = etcd_leader_port(self.a.etcd, key.encode())
        for name, p in self.master_ports.items():
            if p == port and name in self.master_names:
                return name
        return None


class Kvpool(System):
    name = "kvpool"
    module = "kvpool.mooncake"

    def start_cluster(self):
        a = self.a
        base = a.base_port + {"c1": 0, "ha": 20, "ns": 80}[self.tag]
        self.cluster = f"faults{os.getpid()}"
        self.start_masters(base)
        self.addr = f"etcd://{a.etcd}/{self.cluster}" if self.ha else f"{self.ip}:{base}"
        self.metadata = "P2PHANDSHAKE"
        self.datadirs = {}
        for role in ("victim", "survivor"):
            d = os.path.join(a.tmp, f"{self.tag}-{role}")
            os.makedirs(d, exist_ok=True)
            self.datadirs[role] = d
        self.start_stores()

    def start_master(self, name):
        a = self.a
        port = self.master_ports[name]
        argv = [a.kvpool_bin, "master", "--rpc-address", self.ip, "--rpc-port", str(port),
                "--metrics-address", "127.0.0.1", "--metrics-port", str(port + 10)]
        if self.netns:
            argv += ["--insecure"]  # off loopback without a secret: a test pool on a private veth
        if self.ha:
            argv += ["--enable-ha", "--etcd-endpoints", a.etcd, "--cluster-id", self.cluster]
        self.procs.start(name, argv, log=os.path.join(self.out, f"{name}.{int(now())}.log"))

    def start_store(self, role):
        a = self.a
        self.gen += 1
        seg = f"faults-{self.tag}-{role}"
        self.store_names[role] = seg
        log = os.path.join(self.out, f"store-{self.tag}-{role}.{self.gen}.log")
        self._store_log[role] = log
        argv = [a.kvpool_bin, "store", "--master", self.addr, "--segment-size", str(a.segment),
                "--data-dir", self.datadirs[role], "--address", self.store_ip(role), "--name", seg]
        if self.netns:
            argv += ["--insecure"]
        self.procs.start(f"store-{role}", self.wrap(role, argv), log=log)

    def wait_store(self, role, timeout=60):
        seg = self.store_names[role]

        def ready(log):
            if "segment mounted" not in log:
                return False
            st = subprocess.run([self.a.kvpool_bin, "status", "--master", self.addr],
                                capture_output=True, text=True, timeout=10).stdout
            return any(l.split()[:1] == [seg] and l.split()[-1] == "live" for l in st.splitlines())

        self.wait_log(role, ready, timeout)

    def leader(self):
        return self.leader_name(f"/kvpool/{self.cluster}/master")


class Mooncake(System):
    name = "Mooncake"
    module = "mooncake.store"

    def env(self, role=None):
        e = dict(os.environ)
        # Else the transfer engine advertises another address.
        e["MC_TCP_BIND_ADDRESS"] = self.store_ip(role) if role else self.ip
        return e

    def start_cluster(self):
        a = self.a
        base = a.base_port + {"c1": 40, "ha": 60, "ns": 100}[self.tag]
        # Mooncake clients find the leader under the default cluster id.
        self.cluster = "mooncake_cluster"
        self.start_masters(base)
        if self.ha:
            # The HTTP metadata server lives in a master and would die with
            # the leader, so the HA cluster uses the peer-to-peer handshake.
            self.addr = f"etcd://{a.etcd}"
            self.metadata = "P2PHANDSHAKE"
        else:
            self.addr = f"{self.ip}:{base}"
            self.metadata = f"http://{self.ip}:{base + 5}/metadata"
        time.sleep(2)
        self.start_stores()

    def start_master(self, name):
        a = self.a
        port = self.master_ports[name]
        argv = [os.path.join(os.path.dirname(sys.executable), "mooncake_master"),
                f"--rpc_port={port}", f"--rpc_address={self.ip}",
                "--metrics_host=127.0.0.1", f"--metrics_port={port + 10}",
                "--eviction_high_watermark_ratio=0.95", "--logtostderr"]
        if self.ha:
            argv += ["--enable_ha=true", f"--etcd_endpoints={a.etcd}"]
        else:
            argv += ["--enable_http_metadata_server=true", f"--http_metadata_server_host={self.ip}",
                     f"--http_metadata_server_port={port + 5}"]
        self.procs.start(name, argv, env=self.env(), log=os.path.join(self.out, f"{name}.{int(now())}.log"))

    def start_store(self, role):
        self.gen += 1
        log = os.path.join(self.out, f"store-{self.tag}-{role}.{self.gen}.log")
        self._store_log[role] = log
        self.store_names.pop(role, None)
        argv = [sys.executable, os.path.join(HERE, "..", "compare", "store_proc.py"), "--module", self.module,
                "--segment", str(self.a.segment), "--master", self.addr, "--metadata", self.metadata,
                "--hostname", self.store_ip(role)]
        self.procs.start(f"store-{role}", self.wrap(role, argv), env=self.env(role), log=log)

    def wait_store(self, role, timeout=60):
        def ready(log):
            m = re.search(r"store setup rc=(-?\d+) .* name=(\S+)", log)
            if m and m.group(1) != "0":
                raise RuntimeError(f"Mooncake store {role} setup rc={m.group(1)}")
            if m:
                self.store_names[role] = m.group(2)
            return m is not None

        self.wait_log(role, ready, timeout)

    def leader(self):
        return self.leader_name(f"mooncake-store/{self.cluster}/master_view")


class Bench:
    def __init__(self, a):
        self.a = a
        self.out = os.path.join(a.out, a.system)
        os.makedirs(self.out, exist_ok=True)
        self.procs = Procs(self.out)
        self.phases = []
        self.events = []
        self.populations = []
        self.epoch = 0
        self.keysfile = os.path.join(self.out, "keys.json")
        self.client = None
        self.endpoints = {}  # replica endpoint -> role
        self.t0 = now()

    def event(self, what, **kw):
        e = dict(t=now(), what=what, **kw)
        self.events.append(e)
        print(f"[{self.a.system} {e['t'] - self.t0:7.1f}s] {what} {kw if kw else ''}", flush=True)
        self.save()

    def save(self):
        with open(os.path.join(self.out, "phases.json"), "w") as f:
            json.dump({"system": self.a.system, "t0": self.t0, "phases": self.phases,
                       "events": self.events, "populations": self.populations,
                       "config": {k: v for k, v in vars(self.a).items()}}, f, indent=1)

    def phase(self, name, kind, fault, seconds=None, start=None, end=None):
        ph = {"name": name, "kind": kind, "fault": fault, "start": start or now(), "end": end}
        self.phases.append(ph)
        if seconds is not None:
            time.sleep(seconds)
            ph["end"] = now()
        self.save()
        return ph

    # ------------------------------------------------------------ client side
    def connect(self):
        mod = __import__(self.sys.module, fromlist=["MooncakeDistributedStore"])
        self.mod = mod
        c = mod.MooncakeDistributedStore()
        end = now() + 60
        while True:
            rc = c.setup(self.sys.ip, self.sys.metadata, 0, 64 * MiB, "tcp", "", self.sys.addr)
            if rc == 0 or now() > end:
                break
            time.sleep(1)
        if rc != 0:
            raise RuntimeError(f"orchestrator client setup rc={rc}")
        self.client = c

    def cfg(self, **kw):
        return set_config(self.mod.ReplicateConfig(), **kw)

    def resolve(self, ep):
        """Which store ("victim"/"survivor") serves replica endpoint ``ep``:
        a segment name (kvpool names segments with --name), else the process
        listening on that host:port (Mooncake's transfer endpoint), found
        with `ss -ltnp`."""
        if ep in self.endpoints:
            return self.endpoints[ep]
        role = None
        for r, seg in self.sys.store_names.items():
            if ep == seg:
                role = r
        m = re.fullmatch(r"[\w.\-\[\]:]+:(\d+)", ep or "")
        if role is None and m:
            try:
                out = subprocess.run(["ss", "-ltnpH", f"sport = :{m.group(1)}"], capture_output=True,
                                     text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            pids = {int(x) for x in re.findall(r"pid=(\d+)", out)}
            for r in ("victim", "survivor"):
                p = self.procs.procs.get(f"store-{r}")
                if p is not None and p.pid in pids:
                    role = r
        if role is not None:
            self.endpoints[ep] = role
        return role

    def replicas(self, keys):
        """key -> set of roles holding a replica (None for an unknown endpoint)."""
        out = {}
        for i in range(0, len(keys), 256):
            part = keys[i:i + 256]
            d = self.client.batch_get_replica_desc(part)
            for k, descs in d.items():
                eps = set()
                for r in descs:
                    try:
                        eps.add(r.get_memory_descriptor().buffer_descriptor.transport_endpoint)
                    except Exception:  # noqa: BLE001
                        eps.add("?")
                out[k] = {self.resolve(e) for e in eps}
        return out

    def learn_endpoints(self):
        """Checks that a key pinned to each store (preferred_segment) lands
        there; the answer is reported (classification does not depend on it)."""
        self.endpoints = {}
        found = {}
        for role, seg in self.sys.store_names.items():
            key = f"probe/{role}/{self.sys.gen}/{int(now() * 1000)}"
            rc = self.client.put(key, b"p" * 64, self.cfg(replica_num=1, preferred_segment=seg,
                                                          preferred_segments=[seg]))
            d = self.client.batch_get_replica_desc([key]).get(key, [])
            eps = [r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in d]
            found[role] = (rc, eps, [self.resolve(e) for e in eps])
        works = all(v[2] == [r] for r, v in found.items())
        self.event("pinning check", stores=dict(self.sys.store_names), probes=found, pinning_works=works)

    def populate(self):
        self.epoch += 1
        e, n, size = self.epoch, self.a.keys_per_set, self.a.size
        vic, sur = self.sys.store_names["victim"], self.sys.store_names["survivor"]
        plan = {
            "A": self.cfg(replica_num=1, preferred_segment=vic, preferred_segments=[vic]),
            "B": self.cfg(replica_num=2, preferred_segments=[vic, sur]),
            "C": self.cfg(replica_num=1, preferred_segment=sur, preferred_segments=[sur]),
        }
        t = now()
        keys, bad = [], 0
        for s, cfg in plan.items():
            for i in range(n):
                k = f"e{e}/{s}/{i}"
                rc = self.client.put(k, value_for(k, size), cfg)
                if rc == 0:
                    keys.append(k)
                else:
                    bad += 1
        where = self.replicas(keys)
        sets = {"A": [], "B": [], "C": []}
        other = 0
        for k in keys:
            r = where.get(k, set())
            if r == {"victim"}:
                sets["A"].append(k)
            elif r == {"victim", "survivor"}:
                sets["B"].append(k)
            elif r == {"survivor"}:
                sets["C"].append(k)
            else:
                other += 1
        misplaced = sum(1 for s in sets for k in sets[s] if k.split("/")[1] != s)
        tmp = self.keysfile + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"epoch": e, **sets}, f)
        os.replace(tmp, self.keysfile)
        pop = {"epoch": e, "t": now(), "seconds": now() - t, "asked": 3 * n, "put_failed": bad,
               "unclassified": other, "refiled": misplaced, **{s: len(v) for s, v in sets.items()}}
        self.populations.append(pop)
        self.event("populated", **{k: v for k, v in pop.items() if k != "t"})
        for s in sets:
            if not sets[s]:
                self.event("WARNING: empty key set", set=s)

    def cleanup(self):
        """Remove earlier epochs and put generations older than 20 s, so the
        segments never fill (run outside fault windows only)."""
        t = now()
        cur = int(t // 10)
        olds = [f"e{i}" for i in range(1, self.epoch)]
        pat_gens = "|".join(str(g) for g in range(int(self.t0 // 10) - 1, cur - 1))
        removed = []
        for pat in ([f"^({'|'.join(olds)})/"] if olds else []) + ([f"^put/({pat_gens})/"] if pat_gens else []):
            try:
                removed.append(self.client.remove_by_regex(pat, True))
            except Exception as ex:  # noqa: BLE001
                removed.append(f"{type(ex).__name__}: {ex}")
        self.event("cleanup", removed=removed, seconds=round(now() - t, 3))

    # ------------------------------------------------------------ load
    def start_loads(self, cluster):
        self.stopfile = os.path.join(self.out, f"stop-{cluster}")
        if os.path.exists(self.stopfile):
            os.remove(self.stopfile)
        self.loads = []
        for i in range(self.a.clients):
            name = f"load-{cluster}-{i}"
            argv = [sys.executable, os.path.join(HERE, "load.py"), "--module", self.sys.module,
                    "--master", self.sys.addr, "--metadata", self.sys.metadata, "--keys", self.keysfile,
                    "--hostname", self.sys.ip,
                    "--out", os.path.join(self.out, f"ops-{cluster}-{i}.csv"), "--tag", f"{cluster}{i}",
                    "--get-rate", str(self.a.get_rate), "--put-rate", str(self.a.put_rate),
                    "--size", str(self.a.size), "--get-workers", str(self.a.get_workers),
                    "--put-workers", str(self.a.put_workers), "--stop-file", self.stopfile,
                    "--drain", str(self.a.drain)]
            self.procs.start(name, argv, env=self.sys.env())
            self.loads.append(name)
        self.event("loads started", n=len(self.loads))

    def stop_loads(self):
        open(self.stopfile, "w").close()
        end = now() + self.a.drain + 15
        for name in self.loads:
            p = self.procs.procs[name]
            try:
                p.wait(timeout=max(0.1, end - now()))
            except subprocess.TimeoutExpired:
                self.event("load process did not stop; killed", name=name)
                p.kill()
                p.wait()
            self.procs.procs.pop(name, None)
        self.event("loads stopped")

    # ------------------------------------------------------------ faults
    def fault_kill(self):
        self.event("kill -9 victim", pid=self.procs.procs["store-victim"].pid)
        ph = self.phase("kill -9 store", "fault", "kill")
        self.procs.kill9("store-victim")
        time.sleep(self.a.fault)
        ph["end"] = now()
        self.sys.start_store("victim")
        self.event("victim restarting")
        self.sys.wait_store("victim")
        self.event("victim back", segment=self.sys.store_names["victim"])

    def fault_stop(self):
        self.event("SIGSTOP victim", pid=self.procs.procs["store-victim"].pid)
        ph = self.phase("SIGSTOP store", "fault", "stop")
        self.procs.signal("store-victim", signal.SIGSTOP)
        time.sleep(self.a.stop_secs)
        self.procs.signal("store-victim", signal.SIGCONT)
        ph["end"] = now()
        self.event("SIGCONT victim")

    def fault_leader(self):
        leader = None
        for _ in range(50):
            leader = self.sys.leader()
            if leader:
                break
            time.sleep(0.2)
        if not leader:
            self.event("no leader found in etcd; leader phase skipped")
            self.phase("kill -9 leader", "fault", "leader", start=now(), end=now())["skipped"] = "no leader in etcd"
            return
        self.event("kill -9 leader", master=leader, pid=self.procs.procs[leader].pid)
        ph = self.phase("kill -9 leader", "fault", "leader")
        self.procs.kill9(leader)
        new = None
        t = now()
        while now() - t < self.a.fault:
            cur = self.sys.leader()
            if cur and cur != leader and new is None:
                new = cur
                self.event("new leader in etcd", master=cur, after=round(now() - ph["start"], 2))
            time.sleep(0.1)
        ph["end"] = now()
        self.sys.start_master(leader)
        try:
            self.sys.wait_masters()
            self.event("old leader restarted (standby)", master=leader, new_leader=self.sys.leader())
        except RuntimeError as ex:
            self.event("WARNING: old leader did not restart", error=str(ex))

    def fault_netns(self):
        ns = self.sys.netns
        self.event("cut the victim's network namespace", netns=ns.name)
        ph = self.phase("isolate store (netns)", "fault", "netns")
        ns.cut()
        time.sleep(self.a.fault)
        ns.heal()
        ph["end"] = now()
        self.event("victim's link back")

    def run_cluster(self, cluster, faults):
        self.cluster_t0 = now()
        self.sys.start_cluster()
        self.event("cluster up", cluster=cluster, master=self.sys.addr, stores=dict(self.sys.store_names))
        self.connect()
        self.learn_endpoints()
        self.populate()
        self.start_loads(cluster)
        self.phase("warmup", "warmup", None, seconds=self.a.warmup)
        for i, f in enumerate(faults):
            if i > 0:
                self.learn_endpoints()  # a restarted Mooncake store is a new segment
                self.populate()
                time.sleep(1.0)
            self.cleanup()
            self.phase(f"steady before {f}", "steady", f, seconds=self.a.steady)
            {"kill": self.fault_kill, "stop": self.fault_stop, "leader": self.fault_leader,
             "netns": self.fault_netns}[f]()
            self.phase(f"after {f}", "recovery", f, seconds=self.a.recover)
        for name in self.loads:
            p = self.procs.procs.get(name)
            if p is not None:
                self.procs.note_cpu(name, p)
        self.stop_loads()
        try:
            self.client.remove_all(True)
        except Exception:  # noqa: BLE001
            pass
        self.client = None  # a Mooncake client's close() can wait on dead peers; the process exits soon
        self.procs.stop_all()
        self.sys.master_names = []
        self.event("cluster down", cluster=cluster, cpu_seconds={k: round(v, 1) for k, v in self.procs.cpu.items()},
                   seconds=round(now() - self.cluster_t0, 1))
        self.procs.cpu = {}

    def run_one(self, cluster, faults, netns=None):
        """One cluster; a failure is reported as n/a rows with the reason."""
        cls = Kvpool if self.a.system == "kvpool" else Mooncake
        self.sys = cls(self.a, self.procs, self.out, cluster, netns)
        self.loads = []
        try:
            if netns:
                netns.up()
            self.run_cluster(cluster, faults)
        except Exception as ex:  # noqa: BLE001
            why = f"{type(ex).__name__}: {ex}"
            self.event("cluster failed", cluster=cluster, error=why)
            done = {ph["fault"] for ph in self.phases if ph["kind"] == "fault"}
            for f in faults:
                if f not in done:
                    self.phases.append({"name": f, "kind": "fault", "fault": f, "start": now(), "end": now(),
                                        "skipped": why})
            self.save()
            if getattr(self, "stopfile", None):
                open(self.stopfile, "w").close()
                time.sleep(2)
            self.procs.stop_all()
        finally:
            if netns:
                netns.down()

    def run(self):
        faults = [f for f in self.a.phases.split(",") if f]
        c1 = [f for f in faults if f in ("kill", "stop")]
        try:
            if c1:
                self.run_one("c1", c1)
            if "leader" in faults:
                if not self.a.etcd:
                    self.event("leader phase skipped: no --etcd")
                    self.phases.append({"name": "leader", "kind": "fault", "fault": "leader", "start": now(),
                                        "end": now(), "skipped": "no etcd given"})
                else:
                    self.run_one("ha", ["leader"])
            if "netns" in faults:
                self.run_one("ns", ["netns"], NetNS(self.out))
        finally:
            self.procs.stop_all()
            self.save()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--system", choices=["kvpool", "mooncake"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tmp", required=True, help="scratch dir for data dirs")
    p.add_argument("--kvpool-bin", default="kvpool")
    p.add_argument("--etcd", default="", help="host:port of the etcd for the HA phase")
    p.add_argument("--base-port", type=int, default=62600, help="above the ephemeral range (32768-60999 here)")
    p.add_argument("--phases", default="kill,stop,leader,netns", help="of kill, stop, leader, netns")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--get-rate", type=float, default=100.0)
    p.add_argument("--put-rate", type=float, default=20.0)
    p.add_argument("--get-workers", type=int, default=4)
    p.add_argument("--put-workers", type=int, default=4)
    p.add_argument("--size", type=int, default=65536)
    p.add_argument("--keys-per-set", type=int, default=100)
    p.add_argument("--segment", type=parse_size, default=256 * MiB)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--steady", type=float, default=10.0)
    p.add_argument("--fault", type=float, default=15.0)
    p.add_argument("--stop-secs", type=float, default=10.0)
    p.add_argument("--recover", type=float, default=5.0)
    p.add_argument("--drain", type=float, default=20.0)
    a = p.parse_args()
    b = Bench(a)

    def on_term(*_):
        b.procs.stop_all(grace=1.0)
        ns = getattr(getattr(b, "sys", None), "netns", None)
        if ns is not None:
            ns.down()
        b.save()
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    b.run()
    print(f"[{a.system}] done in {now() - b.t0:.0f}s", flush=True)
    os._exit(0)  # skip the clients' close(): a Mooncake client may wait on dead peers


if __name__ == "__main__":
    main()
