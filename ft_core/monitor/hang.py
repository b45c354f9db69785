"""What the monitor does with one hung rank, as a small state machine.

::

    DETECTED ──request_stack_dump()──> AWAITING_STACK_DUMP ──terminate()──> TERMINATED
        └──────────────────────────terminate()──────────────────────────────┘

The object decides; the server acts (signals, file reads), so every transition
is testable without a process. The stack dump is awaited without blocking the
loop: :meth:`Hang.poll` says how long the server may sleep before asking again.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

import msgspec

from ft_core.events import HangDetected, HangReason

__all__ = ["DUMP_POLL", "DumpWait", "Expiry", "Hang", "HangState"]

#: While a stack dump is pending, the server checks the dump file this often.
DUMP_POLL = 0.005


class HangState(enum.Enum):
    DETECTED = "detected"
    AWAITING_STACK_DUMP = "awaiting_stack_dump"
    TERMINATED = "terminated"


@dataclasses.dataclass(frozen=True)
class Expiry:
    """A rank's earliest deadline: when it expires, which rule set it, and since when it runs."""

    deadline: float
    reason: HangReason
    section: Optional[str]
    timeout: float
    since: float


@dataclasses.dataclass
class DumpWait:
    """A stack dump asked of a rank: new bytes past ``offset`` in its dump file, awaited until ``deadline``."""

    #: Size of the rank's dump file before the dump was asked for: the new stack starts there.
    offset: int
    deadline: float
    _last_size: int = -1

    def poll(self, now: float, dump_size: int) -> Optional[float]:
        """Seconds to wait for the dump to settle, or None once it is complete or the deadline passed.

        The dump is complete once the file grew past the offset and kept the
        same size over one poll interval (faulthandler writes it in pieces).
        """
        if now >= self.deadline:
            return None
        settled = dump_size > self.offset and dump_size == self._last_size
        self._last_size = dump_size
        return None if settled else min(DUMP_POLL, self.deadline - now)


@dataclasses.dataclass
class Hang:
    """One hung rank, from detection to termination (times are monotonic, ``report`` has unix times)."""

    #: The ``hang_detected`` record; the stack is added when the rank is terminated.
    report: HangDetected
    state: HangState = HangState.DETECTED
    dump: Optional[DumpWait] = None

    @classmethod
    def detect(cls, expiry: Expiry, *, rank: int, pid: int, iteration: Optional[int], open_sections: list[str],
               now: float, wall_now: float, stopped: bool = False) -> Hang:
        """The hang of a rank whose ``expiry`` passed at monotonic ``now`` (unix ``wall_now``)."""
        return cls(HangDetected(
            time=wall_now, rank=rank, pid=pid, reason=expiry.reason, section=expiry.section,
            elapsed=round(now - expiry.since, 3), timeout=expiry.timeout, iteration=iteration,
            open_sections=sorted(open_sections), deadline_time=wall_now - (now - expiry.deadline),
            detected_time=wall_now, stack_dump_file=None, stopped=stopped))

    @property
    def terminated(self) -> bool:
        return self.state is HangState.TERMINATED

    def request_stack_dump(self, dump_offset: int, deadline: float) -> None:
        """The dump signal was sent: wait for new bytes past ``dump_offset`` until ``deadline``."""
        self._expect(HangState.DETECTED)
        self.dump = DumpWait(dump_offset, deadline)
        self.state = HangState.AWAITING_STACK_DUMP

    @property
    def dump_offset(self) -> int:
        """Where the stack starts in the rank's dump file (0 when no dump was asked for)."""
        return self.dump.offset if self.dump is not None else 0

    def poll(self, now: float, dump_size: int) -> Optional[float]:
        """Seconds to wait for the dump to settle, or None when the rank is to be terminated now (see DumpWait)."""
        if self.state is HangState.DETECTED:
            return None
        self._expect(HangState.AWAITING_STACK_DUMP)
        assert self.dump is not None
        return self.dump.poll(now, dump_size)

    def terminate(self, stack: Optional[str] = None, stack_dump_file: Optional[str] = None) -> HangDetected:
        """The termination signal is being sent; ``stack`` is what the dump file gained, if anything.

        Returns the final ``hang_detected`` record.
        """
        if self.state is HangState.TERMINATED:
            raise RuntimeError(f"rank {self.report.rank}: hang already terminated")
        self.report = msgspec.structs.replace(self.report, stack=stack, stack_dump_file=stack_dump_file)
        self.state = HangState.TERMINATED
        return self.report

    def _expect(self, state: HangState) -> None:
        if self.state is not state:
            raise RuntimeError(f"rank {self.report.rank}: hang is {self.state.value}, expected {state.value}")
