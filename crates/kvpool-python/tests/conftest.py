"""Fixtures: a real ``kvpool master`` + ``kvpool store`` on free loopback ports,
started from ``$KVPOOL_BIN`` (or ``<repo>/target/debug/kvpool``) and killed at
teardown."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, List, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[3]


def load_bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (the scripts are not a package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def kvpool_bin() -> str:
    """Path of the kvpool binary under test."""
    b = os.environ.get("KVPOOL_BIN") or str(REPO / "target" / "debug" / "kvpool")
    if not os.access(b, os.X_OK):
        pytest.exit(f"kvpool binary not found at {b}: run `cargo build -p kvpool` or set KVPOOL_BIN", returncode=2)
    return b


def require_sglang() -> ModuleType:
    """Gate of a test module that needs SGLang (call at import): skipped with
    KVPOOL_TEST_SGLANG=0, failed with =1 if SGLang does not import, else
    skipped without it. Returns torch."""
    if os.environ.get("KVPOOL_TEST_SGLANG") == "0":
        pytest.skip("KVPOOL_TEST_SGLANG=0", allow_module_level=True)
    os.environ.setdefault("SGLANG_HICACHE_MOONCAKE_REUSE_TE", "0")
    if os.environ.get("KVPOOL_TEST_SGLANG") == "1":
        import sglang.srt.mem_cache.storage.backend_factory  # noqa: F401  (must import)
    torch = pytest.importorskip("torch")
    pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory")
    return torch


def free_port() -> int:
    """A port nobody listens on right now, picked below the kernel's
    ephemeral range (32768 and up by default): an outgoing connection of
    another test cannot take it before the server it is for binds it
    ("Address already in use" was a flake), as the Rust tests' helper."""
    for _ in range(1000):
        port = random.randrange(20_000, 32_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict:
    """The environment for server processes, without client settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("KVPOOL_", "MOONCAKE_"))}


@dataclass
class Cluster:
    """Processes of one test cluster."""

    bin: str
    master: str
    metrics_port: int
    workdir: str
    procs: List[subprocess.Popen] = field(default_factory=list)
    master_proc: Optional[subprocess.Popen] = None
    #: Key files by role ("admin", "store", "client") when the cluster is secured.
    keys: dict = field(default_factory=dict)
    #: Disk-tier directories (on disk, not under /dev/shm), removed at stop.
    disk_dirs: List[str] = field(default_factory=list)
    #: The TLS directory (``ca.pem``, ``master.pem``/``.key``, ``store.pem``/``.key``) with TLS on.
    tls_dir: Optional[str] = None

    def use_tls(self) -> None:
        """Makes a CA and certificates; servers started after this serve TLS only."""
        self.tls_dir = os.path.join(self.workdir, "tls")
        subprocess.run([self.bin, "tls", "new", "--out", self.tls_dir, "--cert", "master", "--cert", "store"],
                       check=True, capture_output=True, env=clean_env())

    def tls_flags(self, name: Optional[str]) -> list:
        """``--tls-*`` flags: the CA, and ``name``'s certificate if given."""
        if self.tls_dir is None:
            return []
        flags = ["--tls-ca", os.path.join(self.tls_dir, "ca.pem")]
        if name:
            flags += ["--tls-cert", os.path.join(self.tls_dir, f"{name}.pem"),
                      "--tls-key", os.path.join(self.tls_dir, f"{name}.key")]
        return flags

    def secure(self) -> None:
        """Makes a cluster secret and its role keys; servers started after
        this require them."""
        admin = os.path.join(self.workdir, "admin.key")
        subprocess.run([self.bin, "secret", "new", "--out", admin], check=True, capture_output=True, env=clean_env())
        self.keys["admin"] = admin
        for role in ("store", "client"):
            out = subprocess.run([self.bin, "secret", "derive", "--role", role, "--secret-file", admin],
                                 check=True, capture_output=True, text=True, env=clean_env()).stdout
            path = os.path.join(self.workdir, f"{role}.key")
            with open(path, "w") as f:
                f.write(out)
            os.chmod(path, 0o600)
            self.keys[role] = path

    def key_flags(self, role: str) -> list:
        """``--secret-file`` for ``role`` when secured."""
        return ["--secret-file", self.keys[role]] if self.keys else []

    def start_master(self, *extra: str) -> None:
        """Starts the master on this cluster's ports."""
        host, port = self.master.rsplit(":", 1)
        log = open(os.path.join(self.workdir, "master.log"), "ab")
        p = subprocess.Popen(
            [self.bin, "master", "--rpc-address", host, "--rpc-port", port,
             "--metrics-address", host, "--metrics-port", str(self.metrics_port),
             *self.key_flags("admin"), *self.tls_flags("master"), *extra],
            stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
        )
        self.procs.append(p)
        self.master_proc = p

    def start_store(self, size: str = "256MiB", disk: Optional[str] = None) -> subprocess.Popen:
        """Starts one storage node lending ``size`` of memory and, with
        ``disk``, that much of a disk tier (in a directory on disk)."""
        data = tempfile.mkdtemp(prefix="store-", dir=self.workdir)
        disk_flags: list = []
        if disk:
            disk_dir = tempfile.mkdtemp(prefix="kvpool-pytest-disk-")
            self.disk_dirs.append(disk_dir)
            disk_flags = ["--disk-dir", disk_dir, "--disk-size", disk]
        log = open(os.path.join(self.workdir, f"store-{len(self.procs)}.log"), "ab")
        p = subprocess.Popen(
            [self.bin, "store", "--master", self.master, "--segment-size", size,
             "--data-dir", data, "--address", "127.0.0.1", *self.key_flags("store"),
             *self.tls_flags("store"), *disk_flags],
            stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
        )
        self.procs.append(p)
        return p

    def status(self) -> str:
        """``kvpool status`` output ("" if the master does not answer)."""
        r = subprocess.run([self.bin, "status", "--master", self.master, *self.key_flags("client"),
                            *self.tls_flags(None)],
                           capture_output=True, text=True, env=clean_env())
        return r.stdout if r.returncode == 0 else ""

    def store_endpoint(self) -> str:
        """The data endpoint of the (first) storage node's memory segment."""
        for line in self.status().splitlines():
            # SEGMENT TIER ENDPOINT ...
            f = line.split()
            if line.startswith("127.0.0.1:") and f[1] == "memory":
                return f[2]
        raise AssertionError("no store segment:\n" + self.status())

    def segments(self) -> int:
        """Mounted segments as the master reports them."""
        for line in self.status().splitlines():
            if line.startswith("segments:"):
                return int(line.split(":")[1])
        return -1

    def wait_segments(self, n: int, timeout: float = 20.0) -> None:
        """Waits until the master reports at least ``n`` segments."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.segments() >= n:
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster did not reach {n} segments:\n{self.logs()}")

    def kill_master(self) -> None:
        """Kills the master (SIGKILL) and waits for it."""
        if self.master_proc is not None:
            self.master_proc.kill()
            self.master_proc.wait()

    def stop(self) -> None:
        """Stops every process (stores first) and removes the work dir."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
        for d in self.disk_dirs:
            shutil.rmtree(d, ignore_errors=True)

    def logs(self) -> str:
        """Tail of every log, for failure messages."""
        out = []
        for f in sorted(os.listdir(self.workdir)):
            if f.endswith(".log"):
                with open(os.path.join(self.workdir, f), "rb") as fh:
                    out.append(f"--- {f}\n" + fh.read()[-3000:].decode(errors="replace"))
        return "\n".join(out)


def new_cluster(stores: int = 1, store_size: str = "256MiB", secured: bool = False, tls: bool = False,
                master_args: Sequence[str] = ()) -> Cluster:
    """Starts a master (with ``master_args``) and ``stores`` storage nodes
    (with a cluster secret when ``secured``, serving TLS only with ``tls``);
    waits until they mount."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    c = Cluster(
        bin=kvpool_bin(),
        master=f"127.0.0.1:{free_port()}",
        metrics_port=free_port(),
        workdir=tempfile.mkdtemp(prefix="kvpool-pytest-", dir=base),
    )
    try:
        if secured:
            c.secure()
        if tls:
            c.use_tls()
        c.start_master(*master_args)
        for _ in range(stores):
            c.start_store(store_size)
        c.wait_segments(stores)
    except Exception:
        c.stop()
        raise
    return c


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """One master and one 256 MiB storage node for the whole session."""
    c = new_cluster()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def short_lease() -> Iterator[Cluster]:
    """A master whose read lease is 1 s and a 64 MiB storage node (lease
    expiry and renewal, clearing replicas)."""
    c = new_cluster(store_size="64MiB", master_args=("--default_kv_lease_ttl", "1000"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def secured_cluster() -> Iterator[Cluster]:
    """A master and a storage node that require a key of their cluster."""
    c = new_cluster(store_size="64MiB", secured=True)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[Cluster]:
    """A master and a storage node that require a key and speak TLS only."""
    c = new_cluster(store_size="64MiB", secured=True, tls=True)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def disk_cluster() -> Iterator[Cluster]:
    """A store with 1 MiB of memory (kept under half full) and 64 MiB of
    disk tier: nearly everything written lives on disk."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    c = Cluster(
        bin=kvpool_bin(),
        master=f"127.0.0.1:{free_port()}",
        metrics_port=free_port(),
        workdir=tempfile.mkdtemp(prefix="kvpool-pytest-", dir=base),
    )
    try:
        c.start_master("--demote-watermark", "0.5")
        c.start_store("1MiB", disk="64MiB")
        c.wait_segments(2)
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A private cluster a test may break (kill the master, ...)."""
    c = new_cluster(store_size="64MiB")
    yield c
    c.stop()


@pytest.fixture
def master(cluster: Cluster) -> str:
    """The session cluster's master address."""
    return cluster.master


@pytest.fixture
def prefix() -> str:
    """A key prefix unique to the test."""
    return f"t{uuid.uuid4().hex[:12]}/"


def setup7(s: Any, master: str, segment: int = 0) -> int:
    """Mooncake's 7-argument ``setup`` of ``s`` over TCP, lending ``segment`` bytes."""
    return s.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 << 20, "tcp", "", master)


@contextmanager
def scribbling(a: Any) -> Iterator[None]:
    """A thread writing into one byte of every page of the numpy array
    ``a`` (2 and 3 in turn) until the block ends: a caller changing its
    buffer while a put of it is in flight."""
    stop = threading.Event()

    def scribble() -> None:
        v = 2
        while not stop.is_set():
            a[::4096] = v
            v = 5 - v

    t = threading.Thread(target=scribble)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


@pytest.fixture
def store(master: str):
    """A set-up MooncakeDistributedStore (pure client), closed afterwards."""
    from kvpool.mooncake import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert setup7(s, master) == 0
    yield s
    s.remove_all(True)
    s.close()


@pytest.fixture
def client(master: str):
    """A kvpool.Client (pure client), closed afterwards."""
    import kvpool

    c = kvpool.Client(master)
    yield c
    c.remove_all(force=True)
    c.close()
