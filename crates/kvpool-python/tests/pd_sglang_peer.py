"""One side of SGLang's Mooncake PD transfer, as its own process:
``python pd_sglang_peer.py prefill|decode BOOTSTRAP_PORT``.

test_pd_sglang.py drives it: one JSON command a line on stdin, one JSON
reply a line on stdout (everything else the process prints goes to
stderr). It exits at the end of stdin, so it does not outlive the test.

The process sets itself up as SGLang's scheduler does for its role: kvpool's
Mooncake shim first, then ``publish`` of a ``ServerArgs``, SGLang's shared
transfer engine, a real (CPU) ``MHATokenToKVPool`` and ``MetadataBuffers``,
the ``KVArgs`` the scheduler builds from them, and ``MooncakeKVManager``.
The prefill also runs SGLang's bootstrap server, as ``start_disagg_service``
does. Importing this module imports neither SGLang nor torch: the test
takes the layout and the page pattern from here.
"""

from __future__ import annotations

import base64
import json
import sys
import time

import numpy as np

from peers import reply_channel

LAYERS = 3
HEADS = 2
HEAD_DIM = 64
PAGE_SIZE = 4  # tokens a page
TOKENS = 64  # the pool adds one padding page: pages 0..16
ITEM_LEN = PAGE_SIZE * HEADS * HEAD_DIM * 2  # bytes of one page of one float16 buffer
GUARD = 0xEE  # every byte of decode's KV before a transfer
FIRST_TOKEN = 31337  # the first output token prefill hands decode in its metadata


def prefill_bytes(buffer: int, nbytes: int) -> np.ndarray:
    """What prefill's KV buffer ``buffer`` (K of layers 0.., then V) holds:
    random bytes, different in every buffer, so a page copied from or to
    the wrong place shows."""
    return np.random.default_rng(1000 + buffer).integers(0, 256, nbytes, dtype=np.uint8)


def main(role: str, bootstrap_port: int) -> None:
    # Replies get stdout to themselves (peers.py): SGLang's prints land in the log.
    reply = reply_channel()

    # Before anything imports SGLang: its PD code does
    # `from mooncake.engine import TransferEngine`, and the real Mooncake
    # wheel may be installed too.
    import kvpool.engine

    kvpool.engine.install_mooncake_shim()

    try:
        import torch
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            KVClassType,
            MetadataBuffers,
            TransferBackend,
            get_kv_class,
            get_kv_transfer_buf_infos,
            get_pd_kv_layout,
            setup_state_kv_args,
        )
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
            get_mooncake_transfer_engine,
            maybe_init_shared_mooncake_transfer_engine,
        )
        from sglang.srt.managers.disagg_service import start_disagg_service
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.runtime_context import SpawnRanks, get_device, get_disagg, get_parallel, publish
        from sglang.srt.server_args import ServerArgs
    except ImportError as e:
        reply(import_error=repr(e))
        return

    state_names = {v: k for k, v in vars(KVPoll).items() if not k.startswith("_")}
    mode = DisaggregationMode(role)
    server_args = ServerArgs(
        model_path="dummy",  # SGLang's no-model path: the args resolve without a checkpoint
        device="cpu",
        host="127.0.0.1",
        disaggregation_mode=role,
        disaggregation_transfer_backend="mooncake",
        disaggregation_bootstrap_port=bootstrap_port,
    )
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    # The scheduler builds its process groups with torch.distributed
    # (initialize_model_parallel, which imports openai: not in the test
    # set); the PD code reads only the pipeline group, and uses it only with
    # pp_size > 1.
    get_parallel().override_permanently(pp_group=None)
    if mode == DisaggregationMode.PREFILL:
        bootstrap_server = start_disagg_service()  # noqa: F841  (serves from its own thread)
    maybe_init_shared_mooncake_transfer_engine(gpu_id=get_device().gpu_id)
    engine = get_mooncake_transfer_engine()

    pool = MHATokenToKVPool(
        size=TOKENS, page_size=PAGE_SIZE, dtype=torch.float16, head_num=HEADS, head_dim=HEAD_DIM,
        layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )
    buffers = [t.view(-1).view(torch.uint8) for t in pool.k_buffer + pool.v_buffer]
    for i, b in enumerate(buffers):
        if mode == DisaggregationMode.PREFILL:
            b.copy_(torch.from_numpy(prefill_bytes(i, b.numel())))
        else:
            b.fill_(GUARD)
    metadata = MetadataBuffers(4, hidden_size=16, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=16)

    # The KVArgs PrefillBootstrapQueue / DecodePreallocQueue._init_kv_manager
    # build for a plain MHA model without a draft model.
    kv_args = get_kv_class(TransferBackend.MOONCAKE, KVClassType.KVARGS)()
    kv_args.engine_rank = 0
    kv_args.pp_rank = 0
    kv_args.system_dp_rank = get_parallel().dp_rank
    kv_args.rust_http_port = None
    kv_args.kv_cache_dtype_str = server_args.kv_cache_dtype
    kv_args.kv_layout = get_pd_kv_layout(pool)
    kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = get_kv_transfer_buf_infos(pool)
    # SGLang writes entry i of these lists into the peer's entry i.
    assert kv_args.kv_data_ptrs == [b.data_ptr() for b in buffers]
    assert kv_args.kv_item_lens == [ITEM_LEN] * 2 * LAYERS, kv_args.kv_item_lens
    kv_args.num_draft_entries = 0
    kv_args.kv_layer_ids = []  # what build_kv_layer_ids gives an MHA pool
    if mode == DisaggregationMode.PREFILL:
        kv_args.prefill_start_layer = pool.start_layer
        kv_args.prefill_end_layer = pool.end_layer
        kv_args.kv_head_num = kv_args.total_kv_head_num = HEADS
    kv_args.page_size = PAGE_SIZE
    kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = metadata.get_buf_infos()
    kv_args.ib_device = get_disagg().disaggregation_ib_device
    kv_args.gpu_id = get_device().gpu_id
    setup_state_kv_args(kv_args, pool, None, total_kv_layers=LAYERS)
    manager = get_kv_class(TransferBackend.MOONCAKE, KVClassType.MANAGER)(kv_args, mode, server_args, False)

    reply(
        engine_class=f"{type(engine.engine).__module__}.{type(engine.engine).__qualname__}",
        mooncake_engine_module=sys.modules["mooncake.engine"].__name__,
        session=engine.get_session_id(),
    )

    def wait_for(poller, want, timeout: float) -> str:
        """Polls as the scheduler's event loop does, until a state in
        `want` or the deadline; the last state's name."""
        deadline = time.monotonic() + timeout
        while True:
            state = poller.poll()
            if state in want or time.monotonic() > deadline:
                return state_names[state]
            time.sleep(0.01)

    done = (KVPoll.Success, KVPoll.Failed)
    senders, receivers = {}, {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "sender":  # a request reaches prefill: PrefillBootstrapQueue.create_sender
            sender = senders[cmd["room"]] = get_kv_class(TransferBackend.MOONCAKE, KVClassType.SENDER)(
                mgr=manager, bootstrap_addr=f"127.0.0.1:{bootstrap_port}", bootstrap_room=cmd["room"],
            )
            reply(state=state_names[sender.poll()])
        elif op == "bootstrapped":  # the bootstrap queue waits for decode's page list
            reply(state=wait_for(senders[cmd["room"]], (KVPoll.WaitingForInput, KVPoll.Failed), cmd["timeout"]))
        elif op == "send":  # prefilled: the request's only chunk goes out
            sender, aux = senders[cmd["room"]], cmd["aux"]
            metadata.output_ids[aux][0] = FIRST_TOKEN
            metadata.bootstrap_room[aux][0] = cmd["room"]
            sender.init(len(cmd["pages"]), aux)
            sender.send(np.array(cmd["pages"], dtype=np.int32))
            reply(state=wait_for(sender, done, cmd["timeout"]))
        elif op == "receive":  # decode admits the request: DecodePreallocQueue
            addr = cmd["bootstrap_addr"]
            deadline = time.monotonic() + cmd["timeout"]
            while not manager.try_ensure_parallel_info(addr):
                assert time.monotonic() < deadline, f"no prefill info from {addr}"
                time.sleep(0.1)
            receiver = receivers[cmd["room"]] = get_kv_class(TransferBackend.MOONCAKE, KVClassType.RECEIVER)(
                mgr=manager, bootstrap_addr=addr, bootstrap_room=cmd["room"],
            )
            receiver.init(0)
            state = receiver.poll()
            if state == KVPoll.WaitingForInput:
                receiver.send_metadata(np.array(cmd["pages"], dtype=np.int32), cmd["aux"], None)
            reply(state=state_names[state])
        elif op == "wait":  # decode's transfer queue polls the receiver
            reply(state=wait_for(receivers[cmd["room"]], done, cmd["timeout"]))
        elif op == "unregister":  # the KV pool's memory leaves the engine (teardown does this)
            manager.deregister_buffer_to_engine()
            reply(ok=True)
        elif op == "register":  # and comes back, as at startup
            manager.register_buffer_to_engine()
            reply(ok=True)
        elif op == "probed":  # prefill's probe loop clears a session that answers
            deadline = time.monotonic() + cmd["timeout"]
            while cmd["session"] in manager.failed_sessions and time.monotonic() < deadline:
                time.sleep(0.05)
            reply(failed=cmd["session"] in manager.failed_sessions)
        elif op == "memory":
            aux = cmd["aux"]
            reply(
                kv=[base64.b64encode(b.numpy().tobytes()).decode() for b in buffers],
                first_token=int(metadata.output_ids[aux][0]),
                room=int(metadata.bootstrap_room[aux][0]),
            )
        elif op == "exit":
            break


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
