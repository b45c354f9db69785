"""The records of in-process restart in the in-process store, and the barriers built on them.

Layout (below the store factory's prefix, so every launcher cycle gets a fresh
namespace). Per-process records are global; everything that belongs to one
restart attempt lives under ``it/<k>/``, so keys left over from an earlier
attempt can never be mistaken for the current one.

=====================  ===========================================================
``hb/<r>``             heartbeat counter of initial rank ``r`` (its watchdog process)
``terminated``         ``r,`` for each process known to be gone
``excluded``           ``r,`` for each process that failed its health check
``abort``              why in-process restart gave up (first writer wins)
``left``               ``r,`` for each process that left the final barrier
``it/<k>/arrived``     ``r,`` for each process that joined attempt ``k``
``it/<k>/members``     the processes of attempt ``k`` (first writer wins)
``it/<k>/active``      the processes that run the function in attempt ``k``
``it/<k>/decision``    how attempt ``k`` ends: ``done`` or ``restart|r|reason``
``it/<k>/completed``   counter of active processes whose function returned
``it/<k>/interrupted`` ``r,`` for each active process that restarted
``it/<k>/user/...``    the store handed to the function (``call_wrapper.store``)
=====================  ===========================================================

``compare_set`` against the empty value makes the first writer win, which
turns ``members`` and ``decision`` into agreements that all ranks read back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol, cast

from ft_core.utils.deadline import wait_until

from .exceptions import RestartAbort

if TYPE_CHECKING:
    import torch.distributed

__all__ = ["AttemptDecision", "RestartRecords"]


@dataclass(frozen=True)
class AttemptDecision:
    """How an attempt ends: all active ranks completed (``done``) or a restart."""

    done: bool
    rank: Optional[int] = None  # the rank blamed for the restart, if any
    reason: str = ""

    def encode(self) -> str:
        return "done" if self.done else f"restart|{'' if self.rank is None else self.rank}|{self.reason}"

    @classmethod
    def decode(cls, raw: bytes) -> AttemptDecision:
        text = raw.decode()
        if text == "done":
            return cls(True)
        _, rank, reason = text.split("|", 2)
        return cls(False, int(rank) if rank else None, reason)


def _ids(raw: bytes) -> set[int]:
    return {int(item) for item in raw.decode().split(",") if item}


def _fmt(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(ids))


class C10dStoreOps(Protocol):
    """The operations of a ``torch.distributed.Store`` this module uses.

    Torch's type stubs omit ``append`` (the runtime has it on every c10d store),
    so :class:`RestartRecords` types its store by what it calls.
    """

    def get(self, key: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...
    def add(self, key: str, value: int) -> int: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...
    def append(self, key: str, value: str) -> None: ...


class RestartRecords:
    """Typed access to the records above, and the barriers built on them."""

    def __init__(self, store: torch.distributed.Store, world_size: int, poll_interval: float) -> None:
        self.store = cast(C10dStoreOps, store)  # the stubs lack Store.append; the runtime has it
        self.world_size = world_size
        self.poll_interval = poll_interval

    # -- helpers ------------------------------------------------------------------------

    def _get(self, key: str) -> Optional[bytes]:
        # get() would block until the key exists; check() does not.
        return self.store.get(key) if self.store.check([key]) else None

    def _id_set(self, key: str) -> set[int]:
        raw = self._get(key)
        return _ids(raw) if raw else set()

    def _first_wins(self, key: str, value: str) -> bytes:
        return self.store.compare_set(key, "", value)

    # -- per-process records ---------------------------------------------------------------

    def init_heartbeats(self) -> None:
        for rank in range(self.world_size):
            self.store.add(f"hb/{rank}", 0)  # creates the key, so multi_get never blocks

    def heartbeat(self, rank: int) -> None:
        self.store.add(f"hb/{rank}", 1)

    def heartbeats(self, ranks: list[int]) -> list[int]:
        return [int(v) for v in self.store.multi_get([f"hb/{r}" for r in ranks])] if ranks else []

    def mark_terminated(self, rank: int) -> None:
        self.store.append("terminated", f"{rank},")

    def terminated(self) -> set[int]:
        return self._id_set("terminated")

    def mark_excluded(self, rank: int) -> None:
        self.store.append("excluded", f"{rank},")

    def excluded(self) -> set[int]:
        return self._id_set("excluded")

    def abort(self, reason: str) -> str:
        """Record that in-process restart gives up; returns the first recorded reason."""
        return self._first_wins("abort", reason or "aborted").decode()

    def abort_reason(self) -> Optional[str]:
        raw = self._get("abort")
        return raw.decode() if raw is not None else None

    # -- attempt barrier -------------------------------------------------------------------

    def join(self, attempt: int, rank: int, timeout: float) -> tuple[int, ...]:
        """Wait until every process that is not terminated joined ``attempt``; return the members.

        Raises ``RestartAbort`` when in-process restart was aborted or after ``timeout``.
        """
        key = f"it/{attempt}/"
        self.store.append(key + "arrived", f"{rank},")
        missing: set[int] = set()

        def members_recorded() -> bool:
            if self.store.check([key + "members"]):
                return True
            reason = self.abort_reason()
            if reason is not None:
                raise RestartAbort(reason)
            arrived, terminated = self._id_set(key + "arrived"), self.terminated()
            missing.clear()
            missing.update(set(range(self.world_size)) - arrived - terminated)
            if missing:
                return False
            self._first_wins(key + "members", _fmt(arrived - terminated))  # another rank may have won
            return True

        if not wait_until(members_recorded, timeout, self.poll_interval):
            raise RestartAbort(
                f"attempt {attempt}: ranks {sorted(missing)} did not join within barrier_timeout={timeout} s"
            )
        return tuple(sorted(self._id_set(key + "members")))

    def publish_active(self, attempt: int, active: tuple[int, ...]) -> None:
        self._first_wins(f"it/{attempt}/active", _fmt(active))

    def active(self, attempt: int) -> Optional[set[int]]:
        raw = self._get(f"it/{attempt}/active")
        return _ids(raw) if raw is not None else None

    # -- how an attempt ends ----------------------------------------------------------------

    def report_restart(self, attempt: int, rank: Optional[int], reason: str) -> AttemptDecision:
        """Ask for a restart of ``attempt``; returns the decision that stands (maybe an earlier one)."""
        raw = self._first_wins(f"it/{attempt}/decision", AttemptDecision(False, rank, reason).encode())
        return AttemptDecision.decode(raw)

    def decision(self, attempt: int) -> Optional[AttemptDecision]:
        raw = self._get(f"it/{attempt}/decision")
        return AttemptDecision.decode(raw) if raw is not None else None

    def complete(self, attempt: int, world_size: int) -> None:
        """Count this rank's function as returned; the last one decides ``done``."""
        if self.store.add(f"it/{attempt}/completed", 1) == world_size:
            self._first_wins(f"it/{attempt}/decision", AttemptDecision(True).encode())

    def decision_within(self, attempt: int, timeout: float) -> Optional[AttemptDecision]:
        """The decision of ``attempt``, waiting for it at most ``timeout`` seconds."""
        return wait_until(lambda: self.decision(attempt), timeout, self.poll_interval)

    def wait_decision(self, attempt: int) -> AttemptDecision:
        """The decision of ``attempt``, however long it takes: the ranks still running the
        function are watched by their soft and hard timeouts, and lost ranks by their monitors."""
        decision = self.decision_within(attempt, math.inf)
        assert decision is not None
        return decision

    def record_interrupted(self, attempt: int, rank: int) -> None:
        self.store.append(f"it/{attempt}/interrupted", f"{rank},")

    # -- final barrier ----------------------------------------------------------------------

    def leave(self, rank: int) -> None:
        self.store.append("left", f"{rank},")

    def wait_left(self, timeout: float) -> set[int]:
        """Wait (at most ``timeout``) until every live process left; returns those still missing."""

        def still_missing() -> set[int]:
            return set(range(self.world_size)) - self._id_set("left") - self.terminated()

        wait_until(lambda: not still_missing(), timeout, self.poll_interval)
        return still_missing()
