"""The real Mooncake beside kvpool, for tests that make the same calls on
both and compare the answers: a ``mooncake_master`` and a Mooncake process
lending memory (Mooncake's counterpart of a ``kvpool store``), started on
free loopback ports, and a kvpool master + store with the same read lease.

Mooncake comes from the ``mooncake-transfer-engine-non-cuda`` wheel that
``scripts/test-python.sh`` adds to the test venv; where it cannot be
imported (no wheel, no ``libibverbs1``) the comparisons are skipped, and
``KVPOOL_TEST_MOONCAKE=0`` skips them outright."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from conftest import Cluster, clean_env, free_port, kvpool_bin

#: Read lease of both systems in these tests: long enough to see it, short
#: enough to wait out.
LEASE_MS = 2000


def mooncake_missing() -> Optional[str]:
    """Why the real Mooncake cannot run here, or None."""
    if os.environ.get("KVPOOL_TEST_MOONCAKE") == "0":
        return "KVPOOL_TEST_MOONCAKE=0"
    if not shutil.which("mooncake_master", path=os.path.dirname(sys.executable)):
        return "mooncake_master not installed (pip install -r tests/requirements-mooncake.txt)"
    try:
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        import mooncake.store  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot run"
        return f"mooncake.store does not import: {e}"
    return None


class System:
    """One system under comparison: how to make stores, and the names its
    answers carry that differ between systems (normalized away)."""

    def __init__(self, name: str, module: Any, master: str, metadata: str, storage: str) -> None:
        self.name = name
        self.module = module
        self.master = master
        self.metadata = metadata
        #: Name of the segment of the storage process.
        self.storage = storage
        self.prefix = f"{name}-{uuid.uuid4().hex[:8]}/"
        self._stores: List[Any] = []
        self.lender: Any = None

    def key(self, name: str) -> str:
        """A key unique to this test run."""
        return self.prefix + name

    def store(self, segment: int = 0, host: str = "127.0.0.1", protocol: str = "tcp", **kw: Any) -> Any:
        """A set-up MooncakeDistributedStore of this system, closed at the end."""
        s = self.module.MooncakeDistributedStore()
        rc = s.setup(host, self.metadata, segment, 16 << 20, protocol, "", self.master, **kw)
        assert rc == 0, f"{self.name} setup: {rc}"
        self._stores.append(s)
        return s

    def the_lender(self) -> Any:
        """A second store lending 64 MiB (the target of copies and moves)."""
        if self.lender is None:
            self.lender = self.store(segment=64 << 20)
        return self.lender

    def norm(self, v: Any) -> Any:
        """``v`` with this system's key prefix and segment names replaced by
        placeholders, so both systems' answers compare equal."""
        subs = {self.prefix: "<p>/", self.storage: "<storage>"}
        if self.lender is not None:
            subs[self.lender.get_hostname()] = "<lender>"
        if isinstance(v, str):
            for a, b in subs.items():
                v = v.replace(a, b)
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(self.norm(x) for x in v)
        if isinstance(v, dict):
            return {self.norm(k): self.norm(x) for k, x in v.items()}
        return v

    def close(self) -> None:
        for s in self._stores:
            try:
                s.remove_all(True)
            except Exception:  # noqa: BLE001
                pass
            s.close()


def start_mooncake(workdir: str) -> Dict[str, Any]:
    """Starts ``mooncake_master`` (HTTP metadata included) and a Mooncake
    process lending 128 MiB; returns their addresses and processes."""
    rpc, meta, metrics = free_port(), free_port(), free_port()
    env = dict(clean_env(), MC_TCP_BIND_ADDRESS="127.0.0.1")
    binary = os.path.join(os.path.dirname(sys.executable), "mooncake_master")
    log = open(os.path.join(workdir, "mooncake_master.log"), "ab")
    master = subprocess.Popen(
        [binary, f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", "--enable_http_metadata_server=true",
         "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={meta}",
         "--metrics_host=127.0.0.1", f"--metrics_port={metrics}", f"--default_kv_lease_ttl={LEASE_MS}",
         "--logtostderr"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    storage_log = open(os.path.join(workdir, "mooncake_store.log"), "ab")
    code = (
        "import sys, time, mooncake.store as ms\n"
        "s = ms.MooncakeDistributedStore()\n"
        f"rc = s.setup('127.0.0.1', 'http://127.0.0.1:{meta}/metadata', 128 << 20, 16 << 20, 'tcp', '', '127.0.0.1:{rpc}')\n"
        "print('READY', rc, s.get_hostname(), flush=True)\n"
        "time.sleep(3600)\n"
    )
    deadline = time.time() + 30
    storage = None
    while time.time() < deadline and storage is None:
        time.sleep(0.5)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=storage_log, env=env, text=True)
        line = p.stdout.readline() if p.stdout else ""
        m = re.match(r"READY 0 (\S+)", line)
        if m:
            storage = (p, m.group(1))
        else:
            p.kill()
            p.wait()
    if storage is None:
        master.kill()
        raise RuntimeError("Mooncake did not start; see " + workdir)
    return {
        "master": f"127.0.0.1:{rpc}",
        "metadata": f"http://127.0.0.1:{meta}/metadata",
        "procs": [storage[0], master],
        "storage": storage[1],
    }


@pytest.fixture(scope="module")
def systems() -> Iterator[Dict[str, Any]]:
    """kvpool and Mooncake, each a master and a storage process with a
    2 s read lease; yields ``{"kvpool": (module, master, metadata, storage),
    "mooncake": (...)}``."""
    why = mooncake_missing()
    if why:
        pytest.skip(why)
    import mooncake.store as ms

    import kvpool.mooncake as km

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    workdir = tempfile.mkdtemp(prefix="kvpool-compat-", dir=base)
    kv = Cluster(bin=kvpool_bin(), master=f"127.0.0.1:{free_port()}", metrics_port=free_port(), workdir=workdir)
    mc: Dict[str, Any] = {"procs": []}
    try:
        kv.start_master("--default_kv_lease_ttl", str(LEASE_MS))
        kv.start_store("128MiB")
        kv.wait_segments(1)
        storage = next(
            line.split()[0] for line in kv.status().splitlines() if line.startswith("127.0.0.1:")
        )
        mc = start_mooncake(workdir)
        yield {
            "kvpool": (km, kv.master, "P2PHANDSHAKE", storage),
            "mooncake": (ms, mc["master"], mc["metadata"], mc["storage"]),
        }
    finally:
        for p in mc["procs"]:
            p.kill()
            p.wait()
        kv.stop()


def both(systems: Dict[str, Any], scenario: Callable[[System], Any]) -> Dict[str, Any]:
    """Runs ``scenario`` on each system (fresh stores each); its normalized
    answers by system name."""
    out = {}
    for name, (module, master, metadata, storage) in systems.items():
        sys_ = System(name, module, master, metadata, storage)
        try:
            out[name] = sys_.norm(scenario(sys_))
        finally:
            sys_.close()
    return out
