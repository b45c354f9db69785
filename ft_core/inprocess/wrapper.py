"""``Wrapper``: the decorator that restarts a training function in process."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from ft_core.utils.validation import ValidationError, callable_or_none, positive_seconds

from .abort import AbortTorchDistributed
from .hook_context import RankAssignmentCtx, State
from .interruption import DEFAULT_INTERRUPT_SIGNAL
from .rank_assignment import ShiftRanks
from .restart_loop import RestartLoop
from .store_factory import StoreFactory, TCPStoreFactory

__all__ = ["Wrapper"]

T = TypeVar("T")
Hook = Callable[[State], Any]
RankHook = Callable[[RankAssignmentCtx], RankAssignmentCtx]


@dataclass(frozen=True, kw_only=True)
class Wrapper:
    """Restart a distributed training function in the surviving processes after a fault.

    When the function raises on any rank, hangs past ``soft_timeout``, or a rank
    dies, every rank leaves the function (blocked collectives are aborted),
    the failed ranks are left out, the others get new contiguous ``RANK`` /
    ``WORLD_SIZE`` values, and the function is called again - in the same
    processes, with modules, CUDA context and data already loaded. The call
    returns the function's result once all active ranks completed (``None`` on
    spare or excluded ranks). When in-process restart cannot go on it raises
    ``RestartAbort`` on every rank, so the processes exit non-zero and a
    launcher (``ft_launcher``, torchrun) restarts them.

    Run with ``torchrun --nproc-per-node=3 train.py``::

        import torch
        import torch.distributed as dist
        from ft_core.inprocess import CallWrapper, RetryController, Wrapper

        @Wrapper(initialize=RetryController(max_iterations=3), soft_timeout=30, hard_timeout=60)
        def train(call_wrapper: CallWrapper = None):
            dist.init_process_group(
                "gloo", store=call_wrapper.store,
                rank=call_wrapper.rank, world_size=call_wrapper.world_size,
            )
            if call_wrapper.iteration == 0 and call_wrapper.rank == 1:
                raise RuntimeError("injected fault")  # all ranks call train() again
            total = torch.ones(1)
            dist.all_reduce(total)
            dist.destroy_process_group()
            return int(total.item())

        if __name__ == "__main__":
            print(train())  # 3 on every rank, after one restart

    Hooks (all optional, called with a ``State`` unless noted): ``initialize``
    at the start of every iteration on every rank (raise ``RestartAbort`` to
    give up), ``abort`` when an iteration must end (from the watchdog thread,
    while the function may still run), ``finalize`` and ``health_check`` after
    an interrupted iteration (an exception excludes the rank),
    ``rank_filter`` and ``rank_assignment`` (``RankAssignmentCtx`` in and out)
    to choose the active ranks and number them. ``Compose`` chains hooks.

    Timeouts, in seconds, ``soft_timeout < hard_timeout < barrier_timeout``:

    * ``soft_timeout``: no progress of the main thread (see ``CallWrapper.ping``)
      for this long is a fault: all ranks restart;
    * ``hard_timeout``: no progress for this long and the rank could not be
      interrupted: its watchdog process terminates it, the others go on without it;
    * ``heartbeat_timeout``: a rank whose watchdog process stopped heartbeating
      for this long is gone;
    * ``barrier_timeout``: how long ranks wait for each other between iterations.

    ``progress_watchdog_interval=None`` turns off automatic progress (only
    ``ping()`` counts). ``interrupt_signal`` is the signal the watchdog thread
    uses to interrupt the main thread. The wrapped function must be called from
    the main thread, before ``torch.distributed`` is initialized, with ``RANK``
    and ``WORLD_SIZE`` set.
    """

    store_factory: StoreFactory = field(default_factory=TCPStoreFactory)
    initialize: Optional[Hook] = None
    abort: Optional[Hook] = field(default_factory=AbortTorchDistributed)
    finalize: Optional[Hook] = None
    health_check: Optional[Hook] = None
    rank_filter: Optional[RankHook] = None
    rank_assignment: RankHook = field(default_factory=ShiftRanks)
    soft_timeout: float = 60.0
    hard_timeout: float = 90.0
    heartbeat_timeout: float = 30.0
    barrier_timeout: float = 120.0
    monitor_thread_interval: float = 0.1
    monitor_process_interval: float = 1.0
    progress_watchdog_interval: Optional[float] = 1.0
    termination_grace_time: float = 5.0
    interrupt_signal: int = DEFAULT_INTERRUPT_SIGNAL

    def __post_init__(self) -> None:
        self._check_hooks()
        self._check_times()
        catchable = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
        if isinstance(self.interrupt_signal, bool) or self.interrupt_signal not in catchable:
            raise ValidationError("Wrapper.interrupt_signal", self.interrupt_signal, "a catchable signal number")

    def _check_hooks(self) -> None:
        callable_or_none("Wrapper.store_factory", self.store_factory, allow_none=False, allowed="a StoreFactory")
        callable_or_none("Wrapper.rank_assignment", self.rank_assignment, allow_none=False)
        for name in ("initialize", "abort", "finalize", "health_check", "rank_filter"):
            callable_or_none(f"Wrapper.{name}", getattr(self, name))

    def _check_times(self) -> None:
        names = [
            "soft_timeout", "hard_timeout", "heartbeat_timeout", "barrier_timeout",
            "monitor_thread_interval", "monitor_process_interval", "termination_grace_time",
        ]
        if self.progress_watchdog_interval is not None:
            names.append("progress_watchdog_interval")
        for name in names:
            positive_seconds(f"Wrapper.{name}", getattr(self, name))
        # (smaller, larger, allowed) pairs; each message names both values.
        order = [
            ("soft_timeout", "hard_timeout", "soft_timeout < hard_timeout < barrier_timeout"),
            ("hard_timeout", "barrier_timeout", "soft_timeout < hard_timeout < barrier_timeout"),
            ("heartbeat_timeout", "barrier_timeout", "heartbeat_timeout < barrier_timeout"),
            ("monitor_thread_interval", "soft_timeout", "monitor_thread_interval < soft_timeout"),
            ("monitor_process_interval", "soft_timeout", "monitor_process_interval < soft_timeout"),
            ("monitor_process_interval", "heartbeat_timeout", "monitor_process_interval < heartbeat_timeout"),
        ]
        if self.progress_watchdog_interval is not None:
            order.append(
                ("progress_watchdog_interval", "soft_timeout", "progress_watchdog_interval < soft_timeout")
            )
        for smaller, larger, allowed in order:
            if getattr(self, smaller) >= getattr(self, larger):
                raise ValidationError(f"Wrapper.{smaller}", getattr(self, smaller),
                                      f"{allowed} (here {larger}={getattr(self, larger)!r})")
        if self.hard_timeout + self.termination_grace_time >= self.barrier_timeout:
            raise ValidationError(
                "Wrapper.termination_grace_time", self.termination_grace_time,
                f"hard_timeout + termination_grace_time < barrier_timeout "
                f"(here hard_timeout={self.hard_timeout!r}, barrier_timeout={self.barrier_timeout!r})",
            )

    def __call__(self, fn: Callable[..., T]) -> Callable[..., Optional[T]]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Optional[T]:
            return RestartLoop(self, fn).run(args, kwargs)

        return wrapped
