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
from typing import Annotated, Any, Optional, Union

import msgspec

from ft_core.utils.strenum import StrEnum
from ft_core.utils.validation import (
    ValidationError,
    convert,
    enum_member,
    int_in_range,
    non_negative_seconds,
)

__all__ = ["FAULT_KINDS", "FaultInjector", "FaultKind", "SimulatedFault", "SimulatedFaultError"]

log = logging.getLogger("ft_integrations.fault_injection")


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
        # frozen: the kind is converted once, here
        object.__setattr__(self, "kind", enum_member("SimulatedFault.kind", self.kind, FaultKind))
        if (self.step is None) == (self.delay is None):
            raise ValidationError("SimulatedFault", {"step": self.step, "delay": self.delay},
                                  "exactly one of step= or delay=",
                                  problem=f"got step={self.step!r}, delay={self.delay!r}")
        if self.step is not None:
            int_in_range("SimulatedFault.step", self.step, 0)
        if self.delay is not None:
            if self.kind == FaultKind.HANG_CHECKPOINT:
                raise ValidationError("SimulatedFault.delay", self.delay,
                                      "None for kind='hang_checkpoint', which fires at a checkpoint write: use step=")
            non_negative_seconds("SimulatedFault.delay", self.delay)
        convert("SimulatedFault.rank", self.rank, Optional[Annotated[int, msgspec.Meta(ge=0)]],
                "an integer >= 0 or None (random rank)")

    @classmethod
    def coerce(cls, value: Union[SimulatedFault, Mapping[str, Any]]) -> SimulatedFault:
        """Accept a :class:`SimulatedFault` or a mapping of its fields (e.g. from a YAML/Hydra config)."""
        if isinstance(value, SimulatedFault):
            return value
        if isinstance(value, Mapping):
            allowed = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - allowed)
            if unknown:
                raise ValidationError("simulated_fault", unknown, f"keys {sorted(allowed)}",
                                      problem=f"unknown key(s) {unknown}")
            return cls(**dict(value))
        raise ValidationError("simulated_fault", value, "a SimulatedFault, a mapping of its fields, or None")


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
