"""Job-wide state shared by the launchers of all nodes through the rendezvous store.

Torch's elastic agent keeps its restart budget per node and hands workers a
store that outlives a restart. This module adds what fault tolerance needs on
top, using only the rendezvous store that every node already shares:

* **Cycles.** After each rendezvous the node with group rank 0 takes the next
  job-wide cycle number (``TORCHELASTIC_RESTART_COUNT`` for the workers) and
  starts a brand-new ``TCPStore`` server for the workers of that cycle, on a
  port the OS picks while the previous cycle's server is still bound. Workers
  therefore never see a previous cycle's keys, nor a port that another process
  may have taken. The address travels in the rendezvous round's own key space.
* **Decisions.** A cycle ends at most once: the first node to report a fault
  writes the decision (restart, or stop with an exit code) with an atomic
  ``compare_set``; the others read it. The restart budget and the no-progress
  count are therefore counted once per cycle for the whole job.
* **Stop.** A job-wide ``stop`` key (budget spent, no progress, shutdown
  requested) makes every launcher stop its workers and exit with the same code.
* **Progress.** The highest checkpointed iteration any node has seen
  (an atomic max built on ``compare_set``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Optional

import torch.distributed as dist

from ft_core.launcher.progress import made_progress

__all__ = ["CycleInfo", "Decision", "JobCoordinator", "leave_rendezvous", "spares_waiting"]

log = logging.getLogger("ft_core.launcher")


@dataclasses.dataclass(frozen=True)
class CycleInfo:
    """What every node of the job agrees on for one restart cycle."""

    cycle: int
    restarts: int
    store_addr: str
    store_port: int


@dataclasses.dataclass(frozen=True)
class Decision:
    """How a cycle ends (``restart``) or the job ends (``stop``), decided once for the whole job."""

    action: str
    reason: str
    exit_code: int = 0
    restarts: int = 0
    node: str = ""

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, raw: bytes) -> Decision:
        return cls(**json.loads(raw))


class JobCoordinator:
    """The launcher's view of the job-wide state; see the module docstring."""

    def __init__(self, run_id: str, node: str, max_restarts: int, max_no_progress_cycles: int,
                 no_restart_exit_code: int, min_progress_iterations: int = 1) -> None:
        self.run_id = run_id
        self.node = node
        self.max_restarts = max_restarts
        self.max_no_progress_cycles = max_no_progress_cycles
        self.min_progress_iterations = min_progress_iterations
        self.no_restart_exit_code = no_restart_exit_code
        self._job: Optional[dist.Store] = None
        self._rendezvous_count = 0
        # Held so the server lives exactly as long as the cycle it serves.
        self._worker_store_server: Optional[dist.TCPStore] = None

    # -- store plumbing ---------------------------------------------------
    def attach(self, base_store: dist.Store) -> None:
        """Use ``base_store`` (the rendezvous backend's store, shared by every node) for job-wide keys."""
        if self._job is None:
            self._job = dist.PrefixStore(f"ft_launcher/{self.run_id}", base_store)

    def _get_int(self, key: str, default: int) -> int:
        assert self._job is not None
        return int(self._job.get(key)) if self._job.check([key]) else default

    # -- cycles -----------------------------------------------------------
    def begin_cycle(self, rdzv_store: dist.Store, group_rank: int, master_addr: str, static: bool) -> CycleInfo:
        """Agree on the cycle number and the workers' fresh store (call right after each rendezvous).

        ``rdzv_store`` is the store the rendezvous returned: for c10d/etcd it is
        already private to the rendezvous round; the static backend reuses one
        key space, so a per-rendezvous prefix is added (static nodes always
        rendezvous together, so their counts agree).
        """
        if isinstance(rdzv_store, dist.PrefixStore):
            self.attach(rdzv_store.underlying_store)
        else:
            self.attach(rdzv_store)
        assert self._job is not None
        namespace = f"ft_launcher/rdzv{self._rendezvous_count}" if static else "ft_launcher"
        self._rendezvous_count += 1
        cycle_store = dist.PrefixStore(namespace, rdzv_store)
        if group_rank == 0:
            # Bind the new server before releasing the old one: the OS cannot give the same port back.
            server = dist.TCPStore(master_addr, 0, is_master=True, wait_for_workers=False)
            self._worker_store_server = server
            info = CycleInfo(cycle=self._job.add("cycles", 1) - 1, restarts=self._get_int("restarts", 0),
                             store_addr=master_addr, store_port=server.port)
            cycle_store.set("cycle", json.dumps(dataclasses.asdict(info)))
        else:
            self._worker_store_server = None
            info = CycleInfo(**json.loads(cycle_store.get("cycle")))
        return info

    # -- decisions --------------------------------------------------------
    def poll(self, cycle: int) -> Optional[Decision]:
        """The job-wide stop, else the decision that ended ``cycle``, else None (cheap: one or two checks)."""
        if self._job is None:
            return None
        for key in ("stop", f"cycle/{cycle}/end"):
            if self._job.check([key]):
                return Decision.decode(self._job.get(key))
        return None

    def stop_decision(self) -> Optional[Decision]:
        if self._job is None or not self._job.check(["stop"]):
            return None
        return Decision.decode(self._job.get("stop"))

    def request_stop(self, reason: str, exit_code: int) -> Decision:
        """Stop the whole job; if another node stopped it first, its decision wins."""
        assert self._job is not None
        wanted = Decision("stop", reason, exit_code=exit_code, node=self.node)
        return Decision.decode(self._job.compare_set("stop", "", wanted.encode()))

    def end_cycle(self, cycle: int, reason: str, fault: bool, progress_active: bool) -> Decision:
        """Decide how ``cycle`` ends after a fault (``fault=True``) or a membership change.

        A fault spends one restart of the job's budget and, when progress is
        tracked, counts as a cycle without progress unless the checkpointed
        iteration grew by ``min_progress_iterations`` since the previous
        decision (:func:`made_progress`). Returns the decision in force, which
        is another node's if it decided first.
        """
        assert self._job is not None
        existing = self.poll(cycle)
        if existing is not None:
            return existing
        restarts = self._get_int("restarts", 0) + int(fault)
        best = self._get_int("progress", -1)
        mark = self._get_int("progress_mark", -1)
        progressed = made_progress(best, mark, self.min_progress_iterations)
        no_progress = 0 if progressed else self._get_int("no_progress", 0) + int(fault)
        progress_active = progress_active or best >= 0
        if fault and progress_active and 0 < self.max_no_progress_cycles <= no_progress:
            latest = "none yet" if best < 0 else str(best)
            decision = Decision("stop", f"no progress: {no_progress} consecutive faulty cycles without a newer "
                                        f"checkpoint (latest checkpointed iteration: {latest}, progress means "
                                        f"+{self.min_progress_iterations})",
                                exit_code=self.no_restart_exit_code, restarts=restarts - 1, node=self.node)
        elif restarts > self.max_restarts:
            decision = Decision("stop", f"restart budget spent: {self.max_restarts} restart(s) used",
                                exit_code=1, restarts=restarts - 1, node=self.node)
        else:
            decision = Decision("restart", reason, restarts=restarts, node=self.node)
        encoded = decision.encode()
        current = self._job.compare_set(f"cycle/{cycle}/end", "", encoded)
        if current.decode() != encoded:
            return Decision.decode(current)
        # We decided; the next cycle's decider reads these (it cannot start before we rejoin).
        self._job.set("restarts", str(decision.restarts))
        # As in NVRx, each cycle is judged on its own: the next one must add min_progress_iterations again.
        self._job.set("progress_mark", str(best))
        self._job.set("no_progress", str(no_progress))
        if decision.action == "stop":
            return self.request_stop(decision.reason, decision.exit_code)
        return decision

    # -- hot spares at the end of the job ---------------------------------
    def spare_released(self) -> None:
        """Called by a spare that saw the rendezvous close: the nodes that closed it may exit now."""
        if self._job is not None:
            self._job.add("spares_released", 1)

    def wait_spares_released(self, count: int, timeout: float) -> bool:
        """Keep the store up until ``count`` spares have read how the job ended (the first
        launcher hosts the rendezvous store: when it exits, a spare cannot learn anything)."""
        if self._job is None:
            return False
        deadline = time.monotonic() + timeout
        while self._job.add("spares_released", 0) < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    # -- progress ---------------------------------------------------------
    def publish_progress(self, iteration: int) -> None:
        """Raise the job-wide latest checkpointed iteration to ``iteration`` (atomic max)."""
        if self._job is None:
            return
        while True:
            current: Any = self._job.get("progress") if self._job.check(["progress"]) else None
            if current is not None and int(current) >= iteration:
                return
            expected = "" if current is None else current.decode()
            if self._job.compare_set("progress", expected, str(iteration)).decode() == str(iteration):
                return


def spares_waiting(handler: Any) -> int:
    """Hot spares in the redundancy list of a dynamic rendezvous (0 for other backends).

    Torch exposes only ``num_nodes_waiting()`` (the wait list); spares are in the
    handler's private state, which this reads after a fresh sync (bypassing the
    state holder's one-second cache, which may predate a spare's arrival).
    """
    holder = getattr(handler, "_state_holder", None)
    if holder is None:
        return 0
    holder._last_sync_time = -1
    holder.sync()
    return len(holder.state.redundancy_list)


def leave_rendezvous(handler: Any) -> None:
    """Take this node out of a dynamic rendezvous without closing it for the other nodes.

    Torch offers ``shutdown()``, which closes the rendezvous for everyone; a
    node that is excluded must only remove itself so that the remaining nodes
    and a hot spare can form the next round at once (instead of waiting for
    this node's keep-alive to expire). There is no public API for that, so this
    runs the handler's own exit operation.
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        _RendezvousExitOp,
    )

    if not isinstance(handler, DynamicRendezvousHandler):
        return
    handler._stop_heartbeats()
    deadline = time.monotonic() + handler.settings.timeout.close.total_seconds()
    handler._op_executor.run(_RendezvousExitOp(), deadline)
