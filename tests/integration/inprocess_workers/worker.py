"""One rank of an in-process restart test: ``worker.py SCENARIO``.

Events go to ``$INPROCESS_OUT/rank<initial rank>.jsonl`` (one JSON object per
line, with the pid and wall-clock time) so the test can check what happened
in which process and iteration.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ft_core.inprocess import (
    AbortTorchDistributed,
    ActiveWorldSize,
    CallWrapper,
    FaultCounter,
    FillGaps,
    RetryController,
    State,
    Wrapper,
)

INITIAL_RANK = int(os.environ["RANK"])
OUT = os.environ["INPROCESS_OUT"]
#: Short timeouts so that the tests run fast, yet long enough for a loaded 2-core machine.
FAST: dict[str, Any] = dict(
    soft_timeout=3.0, hard_timeout=6.0, heartbeat_timeout=20.0, barrier_timeout=60.0,
    monitor_thread_interval=0.05, monitor_process_interval=0.25, progress_watchdog_interval=0.25,
    termination_grace_time=2.0,
)


def record(event: str, **fields: Any) -> None:
    with open(os.path.join(OUT, f"rank{INITIAL_RANK}.jsonl"), "a") as file:
        file.write(json.dumps({"event": event, "time": time.time(), "pid": os.getpid(), **fields}) + "\n")


def start(cw: CallWrapper) -> None:
    record("start", iteration=cw.iteration, rank=cw.rank, world_size=cw.world_size,
           env_rank=int(os.environ["RANK"]), env_world_size=int(os.environ["WORLD_SIZE"]))
    # A long gloo timeout: only an abort can unblock a collective within the test.
    dist.init_process_group("gloo", store=cw.store, rank=cw.rank, world_size=cw.world_size,
                            timeout=timedelta(minutes=10))


def collective(cw: CallWrapper) -> int:
    """Sum of ones over the active ranks, bracketed by ``collective_begin``/``collective_done`` events.

    Nothing is recorded on the way out of an interrupted all_reduce: the
    restart signal may arrive in any later line (an ``except`` block too), so
    such a record would be lost at random. A ``collective_begin`` without its
    ``collective_done`` is what shows that the rank left a blocked collective.
    """
    total = torch.ones(1)
    record("collective_begin", iteration=cw.iteration)
    dist.all_reduce(total)
    record("collective_done", iteration=cw.iteration)
    dist.destroy_process_group()
    return int(total.item())


def fault_on(rank: int, iteration: int, fault: Callable[[CallWrapper], None], delay: float = 0.5):
    """A training function that runs ``fault`` on one initial rank in one iteration (``-1``: every one)."""

    def train(call_wrapper: CallWrapper = None) -> int:
        start(call_wrapper)
        if INITIAL_RANK == rank and iteration in (call_wrapper.iteration, -1):
            time.sleep(delay)  # let the other ranks block in the all_reduce
            record("fault", iteration=call_wrapper.iteration)
            fault(call_wrapper)
        return collective(call_wrapper)

    return train


def raise_error(_cw: CallWrapper) -> None:
    raise ValueError("injected fault")


def hang_in_python(_cw: CallWrapper) -> None:
    time.sleep(1000)


def hang_in_atomic(cw: CallWrapper) -> None:
    with cw.atomic():
        time.sleep(1000)


def die(_cw: CallWrapper) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def atomic_scenario() -> tuple[Wrapper, Callable[..., int]]:
    def abort(state: State) -> None:
        record("abort", iteration=state.iteration)
        AbortTorchDistributed()(state)

    def train(call_wrapper: CallWrapper = None) -> int:
        start(call_wrapper)
        if call_wrapper.iteration == 0:
            if INITIAL_RANK == 0:
                time.sleep(1.0)  # rank 1 is inside its atomic section by now
                raise ValueError("injected fault")
            if INITIAL_RANK == 1:
                with call_wrapper.atomic():
                    record("atomic_begin")
                    time.sleep(2.5)
                    record("atomic_end")
            time.sleep(30)  # interrupted by the restart
        return collective(call_wrapper)

    options = dict(FAST, soft_timeout=6.0, hard_timeout=12.0)
    return Wrapper(abort=abort, **options), train


SCENARIOS: dict[str, Callable[[], tuple[Wrapper, Callable[..., int]]]] = {
    "exception": lambda: (Wrapper(**FAST), fault_on(1, 0, raise_error)),
    "soft_timeout": lambda: (Wrapper(**FAST), fault_on(2, 0, hang_in_python)),
    "hard_timeout": lambda: (Wrapper(**FAST), fault_on(1, 0, hang_in_atomic)),
    "spare": lambda: (
        Wrapper(rank_filter=ActiveWorldSize(2), rank_assignment=FillGaps(), **FAST),
        fault_on(1, 0, die),
    ),
    "exhausted": lambda: (
        Wrapper(initialize=RetryController(max_iterations=2), **FAST),
        fault_on(0, -1, raise_error),
    ),
    "fault_counter": lambda: (
        Wrapper(health_check=FaultCounter(max_rank_faults=2), **FAST),
        fault_on(2, -1, raise_error),
    ),
    "atomic": atomic_scenario,
}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{INITIAL_RANK} %(levelname)s %(message)s")
    wrapper, train = SCENARIOS[sys.argv[1]]()
    record("result", value=wrapper(train)())
