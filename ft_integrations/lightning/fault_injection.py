"""Simulated faults for fault-tolerance drills: kill, hang, SIGSTOP or raise on one rank.

Example::

    FaultToleranceCallback(simulated_fault=SimulatedFault("hang_step", step=50))       # rank 0 hangs
    FaultToleranceCallback(simulated_fault={"kind": "kill", "rank": None, "delay": 120, "seed": 7})

By default a fault fires only in the first cycle (``TORCHELASTIC_RESTART_COUNT`` is 0
or unset), so the restarted workers can show that training recovers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any, Optional, Union

from ft_integrations.strenum import StrEnum

__all__ = ["FAULT_KINDS", "FaultInjector", "FaultKind", "SimulatedFault", "SimulatedFaultError"]

log = logging.getLogger("ft_integrations.lightning")


class FaultKind(StrEnum):
    """What a :class:`SimulatedFault` does to the rank it targets."""

    #: SIGKILL this rank.
    KILL = "kill"
    #: Sleep forever inside a training step.
    HANG_STEP = "hang_step"
    #: Sleep forever inside a checkpoint write (on a rank that writes).
    HANG_CHECKPOINT = "hang_checkpoint"
    #: SIGSTOP this rank (a frozen process).
    SIGSTOP = "sigstop"
    #: Raise :class:`SimulatedFaultError` in a step.
    EXCEPTION = "exception"


#: The values of :class:`FaultKind`.
FAULT_KINDS = tuple(kind.value for kind in FaultKind)


class SimulatedFaultError(RuntimeError):
    """Raised by a simulated ``exception`` fault."""


@dataclasses.dataclass(frozen=True)
class SimulatedFault:
    """Which fault to inject, where and when.

    Args:
        kind: a :class:`FaultKind` or its value (one of :data:`FAULT_KINDS`).
        rank: global rank that fails; ``None`` picks one at random (same choice on every rank).
        step: fire at the first training step whose ``global_step`` is >= this (for
            ``hang_checkpoint``: the first checkpoint written at or after this step).
        delay: or fire this many seconds after training starts (not for ``hang_checkpoint``).
        seed: seed of the random rank choice; ``None`` derives one from the job
            (``TORCHELASTIC_RUN_ID``, ``MASTER_PORT``), so all ranks agree.
        all_cycles: also fire after a restart (default: first cycle only).
    """

    kind: Union[FaultKind, str]
    rank: Optional[int] = 0
    step: Optional[int] = None
    delay: Optional[float] = None
    seed: Optional[int] = None
    all_cycles: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", FaultKind(self.kind))  # frozen: set once, here
        except ValueError:
            raise ValueError(f"SimulatedFault(kind={self.kind!r}) is not supported; allowed: "
                             f"{FaultKind.choices()}") from None
        if (self.step is None) == (self.delay is None):
            raise ValueError(f"SimulatedFault needs exactly one of step= or delay=; got step={self.step!r}, "
                             f"delay={self.delay!r}")
        if self.step is not None and (isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0):
            raise ValueError(f"SimulatedFault(step={self.step!r}) must be an integer >= 0")
        if self.delay is not None:
            if self.kind == FaultKind.HANG_CHECKPOINT:
                raise ValueError("SimulatedFault(kind='hang_checkpoint') fires at a checkpoint write: use step=, "
                                 "not delay=")
            if isinstance(self.delay, bool) or not isinstance(self.delay, (int, float)) or self.delay < 0:
                raise ValueError(f"SimulatedFault(delay={self.delay!r}) must be a number of seconds >= 0")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0):
            raise ValueError(f"SimulatedFault(rank={self.rank!r}) must be an integer >= 0 or None (random rank)")

    @classmethod
    def coerce(cls, value: Union[SimulatedFault, Mapping[str, Any]]) -> SimulatedFault:
        """Accept a :class:`SimulatedFault` or a mapping of its fields (e.g. from a YAML/Hydra config)."""
        if isinstance(value, SimulatedFault):
            return value
        if isinstance(value, Mapping):
            allowed = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - allowed)
            if unknown:
                raise ValueError(f"simulated_fault: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
            return cls(**dict(value))
        raise ValueError(f"simulated_fault={value!r} must be a SimulatedFault, a mapping of its fields, or None")


def _job_seed() -> int:
    identity = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('MASTER_PORT', '')}"
    return int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "big")


class FaultInjector:
    """Fires a :class:`SimulatedFault` in the rank it targets; the callback calls the ``on_*`` hooks."""

    def __init__(self, fault: SimulatedFault, rank: int, world_size: int) -> None:
        self.fault = fault
        target = fault.rank
        if target is None:
            target = random.Random(_job_seed() if fault.seed is None else fault.seed).randrange(max(world_size, 1))
        restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self.target_rank = target
        self.armed = rank == target and (fault.all_cycles or restart_count == 0)
        self._due = threading.Event()
        self._timer: Optional[threading.Timer] = None

    def on_train_start(self) -> None:
        if not self.armed or self.fault.delay is None:
            return
        log.warning("simulated fault %s armed on this rank: fires in %.1f s", self.fault.kind, self.fault.delay)
        self._timer = threading.Timer(self.fault.delay, self._on_delay)
        self._timer.daemon = True
        self._timer.start()

    def on_step_start(self, global_step: int) -> None:
        """Called inside the training step (after the ``step`` section opened)."""
        if not self.armed or self.fault.kind == FaultKind.HANG_CHECKPOINT:
            return
        if self._due.is_set() or (self.fault.step is not None and global_step >= self.fault.step):
            self._fire(f"at step {global_step}")

    def on_checkpoint_write(self, global_step: int) -> None:
        """Called inside a checkpoint write (after the ``checkpointing`` section opened)."""
        if self.armed and self.fault.kind == FaultKind.HANG_CHECKPOINT and global_step >= (self.fault.step or 0):
            self._fire(f"in the checkpoint write at step {global_step}")

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_delay(self) -> None:
        # A dying or frozen process is asynchronous by nature: do it from the timer.
        # Hangs and exceptions must happen in the training thread, at the next step.
        if self.fault.kind in (FaultKind.KILL, FaultKind.SIGSTOP):
            self._fire(f"after {self.fault.delay} s")
        else:
            self._due.set()

    def _fire(self, when: str) -> None:
        self.armed = False
        kind = self.fault.kind
        log.warning("simulated fault: %s %s (pid %d)", kind, when, os.getpid())
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        if kind == FaultKind.KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == FaultKind.SIGSTOP:
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == FaultKind.EXCEPTION:
            raise SimulatedFaultError(f"simulated fault {when}")
        else:  # hang_step / hang_checkpoint
            while True:
                time.sleep(1.0)
