"""One engine of vLLM's Mooncake PD connector, as its own process:
``python pd_vllm_peer.py prefill|decode ENGINE_ID VLLM_SITE``.

test_pd_vllm.py drives it: one JSON command a line on stdin, one JSON reply
a line on stdout (everything else the process prints goes to stderr). It
exits at the end of stdin, so it does not outlive the test.

The process is the worker of a one-rank vLLM engine: kvpool's Mooncake
shim first, then vLLM's config, its gloo CPU process group, the KV cache
vLLM's own planner and allocator make for a two-layer model (one backing
buffer, a ``[block, head, token, K|V]`` view per layer), and the worker side
of ``MooncakeConnector``, which registers that cache with the engine (the
prefill's also starts vLLM's bootstrap server and its ZMQ side channel).
The commands hand the worker the ``MooncakeConnectorMetadata`` vLLM's
scheduler side builds for a request, and read back what the worker reports,
as the model runner does each step. Importing this module imports neither
vLLM nor torch: the test takes the layout and the byte patterns from here.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import time

import numpy as np

from peers import reply_channel

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
BLOCK = 32  # tokens a block: the CPU attention backend's kernel wants a multiple of 32
BLOCKS = 16  # blocks in each engine's KV cache
HEADS, HEAD_DIM = 2, 32  # KV heads; 32 is the smallest head size CPU attention takes
#: Bytes of one block of one layer: HEADS x BLOCK tokens x (K and V of HEAD_DIM float32).
BLOCK_BYTES = HEADS * BLOCK * 2 * HEAD_DIM * 4
GUARD = 0xEE  # every byte of decode's KV cache before a transfer


def prefill_bytes(layer: int) -> np.ndarray:
    """What prefill's KV cache of layer ``layer`` holds, ``BLOCKS`` rows of
    ``BLOCK_BYTES``: random bytes, different in every layer and block, so a
    block copied from or to the wrong place shows."""
    rng = np.random.default_rng(2000 + layer)
    return rng.integers(0, 256, (BLOCKS, BLOCK_BYTES), dtype=np.uint8)


def main(role: str, engine_id: str, site: str) -> None:
    # Replies get stdout to themselves (peers.py): vLLM's logs land in the log file.
    reply = reply_channel()

    # Before vLLM imports the connector: it does
    # `from mooncake.engine import TransferEngine` at import time, and the
    # real Mooncake wheel may be installed too.
    import kvpool.engine

    kvpool.engine.install_mooncake_shim()

    # vLLM from its add-on directory, appended so the venv's packages win
    # (as test_vllm.py); ModelConfig inspects the model class in a
    # subprocess, which finds vLLM through PYTHONPATH.
    sys.path.append(site)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), site) if p)

    import torch

    # The worker asks torch for the current accelerator to bind its sender
    # threads to (current_platform.set_device). torch here is a CUDA build on
    # a machine without a GPU, where that call raises; a CPU engine is device 0.
    torch.accelerator.current_device_index = lambda: 0

    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as mc
    from vllm.utils.network_utils import get_open_port
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.utils import allocate_kv_cache

    model_dir = tempfile.mkdtemp(prefix="kvpool-pd-vllm-model-")
    # A two-layer Llama, 2 KV heads of 32: no weights are loaded, vLLM's
    # config and the connector read only the shape.
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
                   "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": HEADS,
                   "num_hidden_layers": len(LAYERS), "vocab_size": 256, "max_position_embeddings": 1024,
                   "torch_dtype": "float32"}, f)
    config = VllmConfig(
        # The planner wants a request of max_model_len to fit the cache (less
        # vLLM's null block 0).
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32",
                                 max_model_len=BLOCK * (BLOCKS // 2)),
        cache_config=CacheConfig(block_size=BLOCK, num_gpu_blocks_override=BLOCKS),
        # No extra config: vLLM's defaults (protocol "rdma", which kvpool's
        # engine serves over TCP, 10 sender threads).
        kv_transfer_config=KVTransferConfig(kv_connector="MooncakeConnector",
                                            kv_role="kv_producer" if role == "prefill" else "kv_consumer",
                                            engine_id=engine_id),
    )
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}")
        ensure_model_parallel_initialized(1, 1)

        # What the engine core and the worker do at startup: resolve the
        # layout the backend and the connector agree on, plan the cache (its
        # size is num_gpu_blocks_override's, whatever memory is offered),
        # allocate it.
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.float32)
        specs = [{name: spec for name in LAYERS}]
        # No model is loaded, so no attention layer names its backend: vLLM
        # falls back to the platform's default (CPU_ATTN), as the connector does.
        layouts = [[layout.name for layout in get_current_attn_backends(config)[0].supported_kv_cache_layouts()]]
        layout = resolve_kv_cache_layout(config, layouts, specs[0].values())
        kv_cache_config = get_kv_cache_configs(config, specs, [1 << 30], get_global_kv_cache_groups(config, specs))[0]
        caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"), layout)
        # Each layer's cache as rows of bytes, one a block.
        blocks = [caches[name].view(torch.uint8).reshape(BLOCKS, -1) for name in LAYERS]
        assert all(b.shape == (BLOCKS, BLOCK_BYTES) for b in blocks), [b.shape for b in blocks]
        for i, b in enumerate(blocks):
            if role == "prefill":
                b.copy_(torch.from_numpy(prefill_bytes(i)))
            else:
                b.fill_(GUARD)

        connector = mc.MooncakeConnector(config, KVConnectorRole.WORKER, kv_cache_config)
        worker = connector.connector_worker
        connector.register_kv_caches(caches)

    reply(
        engine_class=f"{type(worker.engine).__module__}.{type(worker.engine).__qualname__}",
        mooncake_engine_module=sys.modules["mooncake.engine"].__name__,
        layout=layout.name,
        registered=[[a, n] for a, n in zip(worker.seen_base_addresses, worker._kv_data_lens)],
        regions=[[a, n] for a, n in zip(worker.kv_caches_base_addr, worker.block_len_per_layer)],
        caches=[caches[name].data_ptr() for name in LAYERS],
    )

    def step(meta: "mc.MooncakeConnectorMetadata") -> None:
        """One model-runner step with the scheduler's metadata for it."""
        connector.bind_connector_metadata(meta)
        connector.start_load_kv(None)
        connector.wait_for_save()
        connector.clear_connector_metadata()

    recved: set = set()
    sent: set = set()
    load_errors: set = set()

    def poll() -> None:
        """What the model runner collects after a step."""
        results = connector.get_transfer_results(set())
        assert not results.failed_recving, results  # per-request failures are for hybrid models only
        recved.update(results.finished_recving)
        sent.update(results.finished_sending)
        load_errors.update(connector.get_block_ids_with_load_errors())

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op in ("admit", "finish"):
            # Prefill. Admitted (update_state_after_alloc), the request reaches
            # the worker with no blocks, so it waits for them; finished
            # (request_finished, length capped), with the blocks it fills.
            meta = mc.MooncakeConnectorMetadata()
            meta.add_new_req(request_id=cmd["req"], local_block_ids=[cmd["blocks"]] if op == "finish" else [],
                             kv_transfer_params={"do_remote_decode": True, "transfer_id": cmd["transfer_id"]},
                             load_remote_cache=False)
            step(meta)
            reply(ok=True)
        elif op == "load":  # decode: the request's unhashed blocks, to pull from the prefill
            meta = mc.MooncakeConnectorMetadata()
            meta.add_new_req(request_id=cmd["req"], local_block_ids=[cmd["blocks"]],
                             kv_transfer_params={"do_remote_prefill": True, "transfer_id": cmd["transfer_id"],
                                                 "remote_engine_id": cmd["remote_engine_id"],
                                                 "remote_bootstrap_addr": cmd["remote_bootstrap_addr"]})
            step(meta)
            reply(ok=True)
        elif op == "wait":  # the model runner's per-step poll, until the request is reported or the deadline
            deadline = time.monotonic() + cmd["timeout"]
            while True:
                poll()
                done = cmd["req"] in (recved if cmd["side"] == "recv" else sent)
                if done or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            reply(done=done, load_errors=sorted(load_errors))
            load_errors.clear()
        elif op == "stats":
            stats = connector.get_kv_connector_stats()
            reply(stats={} if stats is None else dict(stats.data))
        elif op == "unregister":  # sleep mode: the KV memory leaves the engine
            connector.unregister_kv_caches()
            reply(ok=True)
        elif op == "restore":  # wake up: registered again, at the same addresses
            connector.restore_kv_caches()
            reply(ok=True)
        elif op == "memory":
            reply(kv=[base64.b64encode(b.numpy().tobytes()).decode() for b in blocks])
        elif op == "exit":
            break
    connector.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
