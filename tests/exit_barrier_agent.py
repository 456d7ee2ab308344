"""One machine's launcher at the end of a two-machine launch: torch elastic's own exit barrier
(``SimpleElasticAgent._exit_barrier``) on a real TCPStore, for tests/integration/test_launch_exit_barrier.py.

python tests/exit_barrier_agent.py RANK PORT FIX

Rank 0 holds the store (static rendezvous) and arrives at the barrier last; rank 1 is caught between the barrier's
two requests (``add``, then ``wait``) until rank 0 has either closed the store (its process ended) or is waiting at
the end (the fix). FIX=1: with ``accel_train.elastic.leave_store_together_after_exit_barrier``; FIX=0: torch alone.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from accel_train import elastic

IN_WINDOW, HOLDING = "test/rank1-between-add-and-wait", "test/rank0-waits-after-barrier"


class Store:
    """The real store, with a hook on ``wait`` (the barrier's second request)."""

    def __init__(self, store, on_wait):
        self._store, self._on_wait, self.waits = store, on_wait, 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def wait(self, keys, *rest):
        self.waits += 1
        self._on_wait(self)
        return self._store.wait(keys, *rest)


def rank0_on_wait(store: Store) -> None:
    if store.waits == 2:  # its first wait is the barrier's; a second one holds the store after it
        store.set(HOLDING, "1")


def rank1_on_wait(store: Store) -> None:
    store.set(IN_WINDOW, "1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if store.check([HOLDING]):
                return  # rank 0 passed the barrier and holds the store
        except Exception:  # noqa: BLE001 - the store is gone: rank 0 passed the barrier and exited
            return
        time.sleep(0.02)


def main(rank: int, port: int, fix: bool) -> None:
    if fix:
        assert elastic.leave_store_together_after_exit_barrier()
    real = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60), wait_for_workers=False)
    store = Store(real, rank0_on_wait if rank == 0 else rank1_on_wait)
    if rank == 0:
        real.wait([IN_WINDOW])  # arrive last
    agent = SimpleNamespace(
        _store=store,
        _worker_group=SimpleNamespace(group_rank=rank, group_world_size=2, state="SUCCEEDED"),
        _exit_barrier_timeout=60,
        _in_exit_barrier=False,
        _rdzv_handler=SimpleNamespace(get_backend=lambda: "static"),
    )
    SimpleElasticAgent._exit_barrier(agent)
    print(f"rank {rank}: past the exit barrier", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
