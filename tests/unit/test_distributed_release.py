"""A failed broadcast into a shared weight-update group lets the engines still alive go at once.

Two receivers join the trainer's gloo group the way SGLang's weight updater does (rank 1 and rank 2, each blocked in
`torch.distributed.broadcast` from rank 0). Rank 1 dies; the trainer's broadcast fails. Rank 2 must see its receive
fail with a closed connection, not wait for its group's timeout: that wait kept a live engine of the soak blocked
for minutes, fenced as dead, while its clients timed out."""

import datetime
import multiprocessing as mp
import os
import queue
import time

import pytest
import torch

RECEIVER_TIMEOUT_S = 40  # rank 2's group: its receive ends with "Timed out" if nothing else ends it


def _receiver(rank: int, host: str, port: int, out) -> None:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world

    timeout = datetime.timedelta(seconds=RECEIVER_TIMEOUT_S)
    store = dist.TCPStore(host, port, 3, False, timeout)
    pg, _ = _new_process_group_helper(3, rank, [], dist.Backend("gloo"), PrefixStore("g", store), group_name="g",
                                      backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(3)}
    flat = torch.empty(1 << 16)
    dist.broadcast(flat, src=0, group=pg)  # the bucket before the fault lands everywhere
    out.put((rank, "landed"))
    if rank == 1:
        out.close()
        out.join_thread()  # "landed" sent before the process goes
        time.sleep(0.5)
        os._exit(1)  # the engine killed between two buckets
    try:
        dist.broadcast(flat, src=0, group=pg)
        out.put((rank, "received"))
    except RuntimeError as e:
        out.put((rank, str(e)))


def test_a_failed_broadcast_releases_the_group_so_a_live_receiver_fails_at_once():
    from labkit.sync.transports.distributed import Distributed, bind_store, broadcast, join_group

    ctx = mp.get_context("spawn")
    store, port, _ = bind_store("127.0.0.1", 3, timeout_s=60)
    out = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(r, "127.0.0.1", port, out), daemon=True) for r in (1, 2)]
    for p in procs:
        p.start()
    t = Distributed(timeout_s=60)
    try:
        t.pg = join_group(store, 3, "g", "gloo", timeout_s=60)
        broadcast(t, torch.ones(1 << 16))
        landed = sorted(out.get(timeout=60) for _ in range(2))
        assert landed == [(1, "landed"), (2, "landed")], landed
        procs[0].join(timeout=30)
        assert procs[0].exitcode == 1
        with pytest.raises(RuntimeError, match="broadcast into the weight-update group failed") as failed:
            broadcast(t, torch.ones(1 << 16))
        assert t.pg is None and t.released  # released before the error was raised, which holds no frame of it
        try:
            rank, said = out.get(timeout=RECEIVER_TIMEOUT_S - 10)
        except queue.Empty:
            said = None
        assert said is not None and "Timed out" not in said and "closed" in said.lower(), (said, failed.value)
    finally:
        t.release()
        for p in procs:
            p.kill()
            p.join(timeout=10)


def test_close_after_a_released_group_still_tells_the_engine_once():
    """A failed broadcast releases this side of the group; the engine's side is still dropped by `close`, once."""
    from labkit.sync.transports.distributed import Distributed

    class Engine:
        def __init__(self):
            self.dropped = []

        def destroy_weights_update_group(self, name):
            self.dropped.append(name)

    t, engine = Distributed(), Engine()
    t.close(engine)
    assert engine.dropped == []  # never built: nothing to drop
    t.joined, t.landed, t.released = True, False, True  # what a failed broadcast leaves (pg released, None)
    t.close(engine)
    t.close(engine)
    assert engine.dropped == ["labkit_weight_update"]
