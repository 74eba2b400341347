#!/usr/bin/env python3
"""Checks that kvpool.mooncake offers every public name of Mooncake's Python
module ``mooncake.store`` and every public method of its
``MooncakeDistributedStore``, with the same parameter names.

The names come from the real Mooncake when it is importable (the
``mooncake-transfer-engine-non-cuda`` wheel; it needs ``libibverbs1``), else
from the lists recorded below from Mooncake 0.3.13 and 0.3.14 (each is
checked; kvpool offers their union: 0.3.14 dropped names 0.3.13 users call).
Prints the counts per version and every missing or differing name; exits 1
if anything is missing.

Usage: python scripts/mooncake-surface.py [--recorded] [--version V] [--quiet]
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from typing import Dict, List, Optional, Tuple

#: The Mooncake versions whose names are recorded here.
VERSIONS = ("0.3.13", "0.3.14")

# Public names of mooncake.store 0.3.13 (dir() without leading underscores).
MODULE_NAMES = """
ACTIVATION BufferHandle BufferLease BufferLeaseView BufferPool COMPLETE Descriptor DiskDescriptor EngramStore
EngramStoreConfig FAILED GENERAL GRADIENT INITIALIZED KVCACHE METADATA MemoryDescriptor
MooncakeDistributedNoFRegister MooncakeDistributedStore MooncakeHostMemAllocator OPTIMIZER_STATE ObjectDataType
PENDING PROCESSING ParallelAxis QueryTaskResponse REMOVED REPLICA_COPY REPLICA_MOVE ReadTarget
RegisteredBufferLease RegisteredBufferLeaseView RegisteredBufferPool ReplicaDescriptor ReplicaStatus
ReplicateConfig SAMPLE SUCCESS SoftPinAction TENSOR TaskStatus TaskType TensorParallelism UNDEFINED UNKNOWN WEIGHT
bind_to_numa_node get_alloc_func_addr get_free_func_addr
""".split()

# Public methods of MooncakeDistributedStore 0.3.13 and their parameters
# (after self; "*" marks *args; argN are positional-only in Mooncake).
METHODS: Dict[str, List[str]] = {
    "alloc_from_mem_pool": ["arg0"],
    "allocate_and_mount_segment": ["size", "protocol", "location"],
    "batch_get_buffer": ["arg0"],
    "batch_get_into": ["keys", "buffer_ptrs", "sizes"],
    "batch_get_into_multi_buffer_ranges": ["keys", "all_buffer_ptrs", "all_sizes", "all_src_offsets"],
    "batch_get_into_multi_buffers": ["keys", "all_buffer_ptrs", "all_sizes", "prefer_alloc_in_same_node"],
    "batch_get_replica_desc": ["keys"],
    "batch_get_session_end": ["keys"],
    "batch_get_session_start": ["keys"],
    "batch_get_tensor": ["keys"],
    "batch_get_tensor_into": ["keys", "buffer_ptrs", "sizes"],
    "batch_get_tensor_into_cuda": ["keys", "tensors_list"],
    "batch_get_tensor_with_parallelism": ["keys", "targets"],
    "batch_get_tensor_with_parallelism_into": ["keys", "buffer_ptrs", "sizes", "targets"],
    "batch_get_tensor_with_tp": ["base_keys", "tp_rank", "tp_size"],
    "batch_get_tensor_with_tp_into": ["base_keys", "buffer_ptrs", "sizes", "tp_rank", "tp_size"],
    "batch_is_exist": ["keys"],
    "batch_pub_tensor": ["keys", "tensors_list", "config"],
    "batch_pub_tensor_with_tp": ["base_keys", "tensors_list", "config", "tp_rank", "tp_size", "split_dim"],
    "batch_put_from": ["keys", "buffer_ptrs", "sizes", "config"],
    "batch_put_from_multi_buffer_ranges": ["keys", "all_buffer_ptrs", "all_sizes", "all_dst_offsets"],
    "batch_put_from_multi_buffers": ["keys", "all_buffer_ptrs", "all_sizes", "config"],
    "batch_put_session_end": ["keys"],
    "batch_put_session_revoke": ["keys"],
    "batch_put_session_start": ["keys", "sizes", "config"],
    "batch_put_tensor": ["keys", "tensors_list"],
    "batch_put_tensor_from": ["keys", "buffer_ptrs", "sizes"],
    "batch_put_tensor_with_parallelism": ["keys", "tensors_list", "parallelisms", "config", "writer_partitions"],
    "batch_put_tensor_with_parallelism_from": ["keys", "buffer_ptrs", "sizes", "parallelisms", "config", "writer_partitions"],
    "batch_put_tensor_with_tp": ["base_keys", "tensors_list", "tp_rank", "tp_size", "split_dim"],
    "batch_put_tensor_with_tp_from": ["base_keys", "buffer_ptrs", "sizes", "tp_rank", "tp_size", "split_dim"],
    "batch_remove": ["keys", "force"],
    "batch_replica_clear": ["keys", "segment_name"],
    "batch_upsert_from": ["keys", "buffer_ptrs", "sizes", "config"],
    "batch_upsert_pub_tensor": ["keys", "tensors_list", "config"],
    "batch_upsert_tensor": ["keys", "tensors_list"],
    "batch_upsert_tensor_from": ["keys", "buffer_ptrs", "sizes"],
    "batch_upsert_tensor_with_parallelism": ["keys", "tensors_list", "parallelisms", "config", "writer_partitions"],
    "batch_upsert_tensor_with_parallelism_from": ["keys", "buffer_ptrs", "sizes", "parallelisms", "config", "writer_partitions"],
    "close": [],
    "create_copy_task": ["key", "targets"],
    "create_move_task": ["key", "source", "target"],
    "get": ["arg0"],
    "get_batch": ["arg0"],
    "get_buffer": ["arg0"],
    "get_hostname": [],
    "get_into": ["key", "buffer_ptr", "size"],
    "get_into_ranges": ["buffer_ptrs", "all_keys", "all_dst_offsets", "all_src_offsets", "all_sizes"],
    "get_offload_rpc_read_count": [],
    "get_replica_desc": ["key"],
    "get_size": ["arg0"],
    "get_tensor": ["key"],
    "get_tensor_into": ["key", "buffer_ptr", "size"],
    "get_tensor_into_cuda": ["key", "tensor"],
    "get_tensor_with_parallelism": ["key", "target"],
    "get_tensor_with_parallelism_into": ["key", "buffer_ptr", "size", "target"],
    "get_tensor_with_tp": ["key", "tp_rank", "tp_size", "split_dim"],
    "get_tensor_with_tp_into": ["key", "buffer_ptr", "size", "tp_rank", "tp_size", "split_dim"],
    "health_check": [],
    "init_all": ["arg0", "arg1", "arg2"],
    "is_exist": ["arg0"],
    "load_tensor_from_safetensor": ["key", "file_name"],
    "mount_segment": ["path", "size", "offset", "protocol", "location"],
    "pub_tensor": ["key", "tensor", "config"],
    "pub_tensor_with_tp": ["key", "tensor", "config", "tp_rank", "tp_size", "split_dim"],
    "put": ["key", "value", "config"],
    "put_batch": ["keys", "values", "config"],
    "put_from": ["key", "buffer_ptr", "size", "config"],
    "put_from_with_metadata": ["key", "buffer_ptr", "metadata_buffer_ptr", "size", "metadata_size", "config"],
    "put_parts": ["key", "*", "config"],
    "put_tensor": ["key", "tensor"],
    "put_tensor_from": ["key", "buffer_ptr", "size"],
    "put_tensor_with_parallelism": ["key", "tensor", "parallelism", "config", "writer_partition"],
    "put_tensor_with_parallelism_from": ["key", "buffer_ptr", "size", "parallelism", "config", "writer_partition"],
    "put_tensor_with_tp": ["key", "tensor", "tp_rank", "tp_size", "split_dim"],
    "put_tensor_with_tp_from": ["key", "buffer_ptr", "size", "tp_rank", "tp_size", "split_dim"],
    "query_task": ["task_id"],
    "register_buffer": ["buffer_ptr", "size"],
    "remove": ["key", "force"],
    "remove_all": ["force"],
    "remove_by_regex": ["regex_pattern", "force"],
    "save_tensor_to_safetensor": ["key", "file_name"],
    "setup": ["*"],
    "setup_dummy": ["mem_pool_size", "local_buffer_size", "server_address"],
    "unmount_and_free_segment": ["segment_ids", "grace_period_seconds"],
    "unmount_local_disk_segment": ["grace_period_seconds"],
    "unmount_segment": ["segment_ids", "grace_period_seconds"],
    "unregister_buffer": ["buffer_ptr"],
    "upsert": ["key", "value", "config"],
    "upsert_batch": ["keys", "values", "config"],
    "upsert_from": ["key", "buffer_ptr", "size", "config"],
    "upsert_parts": ["key", "*", "config"],
    "upsert_pub_tensor": ["key", "tensor", "config"],
    "upsert_tensor": ["key", "tensor"],
    "upsert_tensor_from": ["key", "buffer_ptr", "size"],
    "upsert_tensor_with_parallelism": ["key", "tensor", "parallelism", "config", "writer_partition"],
    "upsert_tensor_with_parallelism_from": ["key", "buffer_ptr", "size", "parallelism", "config", "writer_partition"],
}

# Mooncake 0.3.14 (recorded from the pybind11 signatures of the
# mooncake-transfer-engine-cuda13 0.3.14 wheel, whose ``mooncake.store`` is a
# package with ``__all__``): 0.3.13's names without these, plus those below.
REMOVED_IN_0314 = ("EngramStoreConfig", "ParallelAxis", "ReadTarget", "TensorParallelism")
MODULE_NAMES_0314 = sorted(
    [n for n in MODULE_NAMES if n not in REMOVED_IN_0314] + ["ExistOptions", "RangedReadSnapshot"]
)
# 0.3.14's methods: 0.3.13's without the twelve *_with_parallelism ones, with
# these added or changed (every other method's parameters are the same).
METHODS_0314: Dict[str, List[str]] = {
    **{m: p for m, p in METHODS.items() if "_with_parallelism" not in m},
    "batch_is_exist": ["keys", "options"],
    "batch_probe_key": ["keys", "policy", "candidate_size"],
    "begin_weight_snapshot": ["snapshot", "adapter"],
    "get_into_ranges_from_snapshot": [
        "snapshot", "buffer_ptrs", "all_keys", "all_dst_offsets", "all_src_offsets", "all_sizes",
    ],
    "is_exist": ["key", "options"],
    "prepare_get_into_ranges_snapshot": ["keys"],
    "probe_key": ["key"],
}

RECORDED: Dict[str, Tuple[List[str], Dict[str, List[str]]]] = {
    "0.3.13": (MODULE_NAMES, METHODS),
    "0.3.14": (MODULE_NAMES_0314, METHODS_0314),
}


def _params_from_doc(doc: Optional[str]) -> Optional[List[str]]:
    """Parameter names of a pybind11 signature line ``name(self: X, a: T = d, *args, b: T) -> R``."""
    if not doc:
        return None
    first = doc.strip().splitlines()[0]
    m = re.match(r"^\w+\((.*)\)\s*->", first)
    if not m:
        return None
    out = []
    depth, cur = 0, ""
    for ch in m.group(1) + ",":
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        if ch == "," and depth == 0:
            name = cur.strip().split(":")[0].split("=")[0].strip()
            if name == "*args":
                out.append("*")
            elif name and name != "self" and not name.startswith("**"):
                out.append(name)
            cur = ""
        else:
            cur += ch
    return out


def installed() -> Optional[Tuple[str, List[str], Dict[str, List[str]]]]:
    """The importable Mooncake's label, module names and methods (with
    parameters), or None (printing why) when it does not import."""
    try:
        import mooncake.store as ms  # type: ignore[import-not-found]
    except Exception as e:  # noqa: BLE001 - any import failure means "use the record"
        print(f"(mooncake.store not importable: {e}; using the names recorded from {', '.join(VERSIONS)})")
        return None
    cls = ms.MooncakeDistributedStore
    version = "installed"
    try:
        from importlib import metadata

        dists = metadata.packages_distributions().get("mooncake") or []
        if dists:
            version = f"installed {metadata.version(dists[0])}"
    except Exception:  # noqa: BLE001 - the version is only a label
        pass
    methods = {}
    for n in dir(cls):
        if n.startswith("_"):
            continue
        params = _params_from_doc(getattr(cls, n).__doc__)
        if n == "setup" or params is None:
            params = METHODS_0314.get(n) or METHODS.get(n, ["*"])
        methods[n] = params
    # 0.3.14's mooncake.store is a package whose dir() also lists its own
    # imports (os, importlib, ...); its __all__ is the public names.
    names = list(getattr(ms, "__all__", None) or [n for n in dir(ms) if not n.startswith("_")])
    return version, names, methods


def check_params(fn: object, want: List[str]) -> Optional[str]:
    """Why ``fn`` cannot be called like Mooncake's method with ``want``, if it cannot."""
    if want == ["*"]:
        return None
    try:
        sig = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "no signature"
    have = [p for p in sig.parameters.values() if p.name != "self"]
    names = [p.name for p in have]
    pos = 0
    for w in want:
        if w == "*":
            if not any(p.kind == p.VAR_POSITIONAL for p in have):
                return "takes no *parts"
            continue
        if re.fullmatch(r"arg\d+", w):
            # Positional only in Mooncake: any name will do.
            if pos >= len(have) or have[pos].kind not in (have[pos].POSITIONAL_ONLY, have[pos].POSITIONAL_OR_KEYWORD):
                return f"parameter {pos + 1} missing"
            pos += 1
            continue
        if w not in names:
            return f"no parameter {w!r} (has {names})"
        pos = names.index(w) + 1
    return None


def check(label: str, names: List[str], methods: Dict[str, List[str]], quiet: bool) -> bool:
    """Prints how much of one version's surface kvpool.mooncake offers; whether all of it."""
    import kvpool.mooncake as km

    cls = km.MooncakeDistributedStore
    missing_names = [n for n in names if not hasattr(km, n)]
    missing_methods = [m for m in methods if not callable(getattr(cls, m, None))]
    differing = {}
    for m, want in methods.items():
        if m in missing_methods:
            continue
        why = check_params(getattr(cls, m), want)
        if why:
            differing[m] = why
    ok_params = len(methods) - len(missing_methods) - len(differing)
    print(f"[{label}] module names: {len(names) - len(missing_names)}/{len(names)}")
    print(f"[{label}] MooncakeDistributedStore methods: {len(methods) - len(missing_methods)}/{len(methods)}")
    print(f"[{label}] methods callable with Mooncake's parameter names: {ok_params}/{len(methods)}")
    if not quiet:
        for n in missing_names:
            print(f"  missing module name: {n}")
        for m in missing_methods:
            print(f"  missing method: {m}")
        for m, why in sorted(differing.items()):
            print(f"  parameters of {m}: {why}")
    return not (missing_names or missing_methods or differing)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recorded", action="store_true", help="use the recorded names even if mooncake is installed")
    ap.add_argument("--version", choices=VERSIONS, action="append",
                    help="check only this recorded version (repeatable; default: all of them)")
    ap.add_argument("--quiet", action="store_true", help="print only the summary lines")
    a = ap.parse_args()
    real = None if a.recorded else installed()
    if real is not None:
        label, names, methods = real
        print(f"reference: mooncake.store ({label})")
        return 0 if check(label, names, methods, a.quiet) else 1
    ok = True
    for v in a.version or VERSIONS:
        names, methods = RECORDED[v]
        print(f"reference: recorded from Mooncake {v}")
        ok = check(v, names, methods, a.quiet) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
