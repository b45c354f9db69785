"""Who hung, who waited: this node's evidence, the job-wide diagnosis, and the fault's fingerprint (``FtElasticAgent``'s part).

At the end of a faulty cycle :class:`HangDiagnosis` takes the node's evidence
(its hang records and the monitor's snapshot of the live ranks, stacks
included) before the survivors are stopped, agrees on one diagnosis with the
other nodes through the job store (:mod:`.culprit`), and fingerprints the
fault for the restart policy (:mod:`ft_core.fault_policy`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import msgspec

from ft_core.diagnosis import dumped_frames, evidence_of_hang, stack_in_collective
from ft_core.events import (
    Diagnosis,
    FaultFingerprint,
    RankEvidence,
    RankException,
    RanksSnapshot,
    RestartKind,
)
from ft_core.fault_policy import NONFINITE_LOSS_ERROR, FaultKind, Fingerprint, innermost_user_frames
from ft_core.launcher.agent_state import AgentState, Trigger
from ft_core.launcher.coordination import Decision
from ft_core.launcher.culprit import CulpritExchange
from ft_core.launcher.outcome import exit_status
from ft_core.utils.deadline import wait_until

__all__ = ["EXCEPTION_REPORT_WAIT", "SNAPSHOT_MARGIN", "SNAPSHOT_POLL", "HangDiagnosis"]

log = logging.getLogger("ft_core.launcher")

#: How long the launcher waits for the monitor's snapshot beyond the monitor's own stack-dump wait.
SNAPSHOT_MARGIN = 2.0
#: How often the launcher reads the monitor's records while it waits for the snapshot: the monitor writes it
#: as soon as the dumps settled (two of its 5 ms polls), and the survivors are stopped only after it.
SNAPSHOT_POLL = 0.005
#: How long the records of a worker that died (its exception report, the end of its connection) may take to
#: reach us (the monitor records them within milliseconds): a crash's fingerprint waits for them, at most this.
EXCEPTION_REPORT_WAIT = 0.5


class HangDiagnosis(AgentState):
    """The agent's diagnosis of a faulty cycle (see the module docstring)."""

    def _fingerprint(self, trigger: Trigger) -> Optional[Fingerprint]:
        """This node's fingerprint of the fault that ends the cycle (:mod:`ft_core.fault_policy`), recorded.

        The culprit of a crash is the rank that failed first. An exception a worker reported
        is the strongest evidence, unless another rank of the cycle had died without a report
        before the reporting rank did: then the exception is a reaction (its collective lost a
        peer) and the silent death is the fault (see :meth:`_reaction`). In a hang's cycle the
        hang is the fault: an exception reported then is a waiter's reaction to the hung rank's
        kill, which must not be blamed.
        """
        node = (self._svc.events.node,)
        if trigger.kind is RestartKind.CRASH and self._failed:
            self._await_failure_records()
        silent = self._silent_failures()
        first = self._exceptions[0] if self._exceptions else None
        if first is not None and trigger.kind is not RestartKind.HANG and not self._reaction(first, silent):
            kind = FaultKind.NONFINITE_LOSS if first.exception_type == NONFINITE_LOSS_ERROR else FaultKind.EXCEPTION
            fingerprint = Fingerprint(kind, culprits=(first.rank,), nodes=node, iteration=first.iteration,
                                      exception_type=first.exception_type, frames=tuple(first.frames))
        elif trigger.kind is RestartKind.HANG:
            # A rank whose stack shows it waiting in a collective is a waiter (as the diagnosis judges, which
            # comes after this decision): the suspects are the others, if any.
            hung = sorted(self._hangs.values(), key=lambda h: h.detected_time)
            hangs = [h for h in hung if stack_in_collective(h.stack) is not True] or hung
            iterations = [h.iteration for h in hangs if h.iteration is not None]
            # Where the first suspect was stuck (its stack dump): the same hang again is the same place.
            frames = next((innermost_user_frames(f) for f in (dumped_frames(h.stack) for h in hangs) if f), [])
            fingerprint = Fingerprint(FaultKind.HANG, culprits=tuple(sorted({h.rank for h in hangs})),
                                      nodes=node if hangs else (), iteration=min(iterations) if iterations else None,
                                      frames=tuple(frames))
        elif trigger.kind is RestartKind.CRASH and silent:  # (every failed worker reported: the branch above)
            _lost, local_rank, code = silent[0]
            _exit_code, sig = exit_status(code)
            rank = self._global_ranks().get(local_rank)
            fingerprint = Fingerprint(FaultKind.SIGNAL if sig else FaultKind.CRASH,
                                      culprits=() if rank is None else (rank,), nodes=node, signal=sig)
        else:
            return None
        # What this cycle resumed from, for rule 1 of the fault policy: the in-memory snapshot when one
        # replaced the disk checkpoint (whose content was then not what the cycle ran on), else that checkpoint.
        if self._resumed_snapshot is not None:
            fingerprint = dataclasses.replace(fingerprint, resumed_from=self._resumed_snapshot.snapshot,
                                              resumed_step=self._resumed_snapshot.step)
        elif self._loaded is not None:
            fingerprint = dataclasses.replace(fingerprint, resumed_from=self._loaded.checkpoint,
                                              resumed_step=self._loaded.step)
        self._svc.events.write(FaultFingerprint(
            cycle=self._cycle_number(), kind=fingerprint.kind.value, culprits=list(fingerprint.culprits),
            nodes=list(fingerprint.nodes), iteration=fingerprint.iteration,
            exception_type=fingerprint.exception_type, frames=list(fingerprint.frames), signal=fingerprint.signal,
            resumed_from=fingerprint.resumed_from, resumed_step=fingerprint.resumed_step))
        return fingerprint

    def _await_failure_records(self) -> None:
        """Wait (at most :data:`EXCEPTION_REPORT_WAIT`) for the monitor's records of the workers that failed.

        A worker that connected to the monitor and died has the end of its connection recorded
        (after its exception report, if it sent one: both come over its connection, in that
        order) within milliseconds.
        """
        def recorded() -> bool:
            self._read_monitor_events()
            return all(pid in self._gone_at or pid not in self._connected for pid, _code in self._failed.values())

        wait_until(recorded, EXCEPTION_REPORT_WAIT, interval=0.02)

    def _silent_failures(self) -> list[tuple[float, int, int]]:
        """``(died by, local rank, exit code)`` of the workers that failed without an exception report, first first.

        "Died by": the monitor's record of the end of its connection, else (it never connected)
        the time this launcher saw it dead.
        """
        reported = {e.pid for e in self._exceptions}
        return sorted((self._gone_at.get(pid, self._failed_at), local_rank, code)
                      for local_rank, (pid, code) in self._failed.items() if pid not in reported)

    def _reaction(self, report: RankException, silent: list[tuple[float, int, int]]) -> bool:
        """Whether ``report``'s rank raised because a rank of ``silent`` had died first (its collective broke).

        The ends of both ranks' connections to the monitor are compared, as the monitor recorded
        them, not the silent death with the report: a reaction is reported within milliseconds of
        the death that caused it, often before the monitor has read that death (a busy monitor
        reads the reporter's pending heartbeat and its report first), while the reporting rank's
        connection ends only after its exception hook and Python's teardown began. The records
        are read in the monitor's order: when the silent rank's end has been read and the
        reporter's has not, the reporter's came later (or not yet: it is still connected).
        Seeing the processes exit does not tell the order: a rank that raised first may take
        longer to exit than the peer it broke (the peer dies when the rank's process group goes,
        during its teardown, while its process lives on).
        """
        if not silent:
            return False
        return silent[0][0] < self._gone_at.get(report.pid, float("inf"))

    # -- who hung, who waited (diagnosis) -------------------------------------
    def _take_evidence(self) -> list[RankEvidence]:
        """This node's evidence: its hang records and a snapshot of its live ranks (stacks included)."""
        if self._evidence is not None:
            return self._evidence
        self._snapshot = None
        if self._svc.monitor.request_snapshot():
            def snapshot_in() -> Optional[RanksSnapshot]:
                self._read_monitor_events()
                return self._snapshot

            # The monitor waits at most stack_dump_timeout for the dumps; then it writes the record.
            if wait_until(snapshot_in, self._svc.monitor.cfg.stack_dump_timeout + SNAPSHOT_MARGIN,
                          interval=SNAPSHOT_POLL) is None:
                log.warning("the rank monitor sent no snapshot of its ranks; diagnosing without it")
        node = self._svc.events.node
        evidence = [evidence_of_hang(h, node) for h in self._hangs.values()]
        if self._snapshot is not None:
            evidence += [msgspec.structs.replace(e, node=node) for e in self._snapshot.ranks]
        self._evidence = evidence
        return evidence

    def _diagnose(self, trigger: Trigger, decision: Optional[Decision]) -> Optional[Diagnosis]:
        """The job-wide diagnosis of this cycle's hang (see :mod:`.culprit`), written and told; None otherwise."""
        store = self._coord.job_store
        if store is None:
            return None
        cycle = self._cycle_number()
        exchange = CulpritExchange(store, self._svc.events.node, self._svc.monitor.cfg.stack_dump_timeout)
        group_rank = self._worker_group.group_rank or 0
        if decision is None or decision.node == self._svc.events.node:  # this node decided
            if trigger.kind is not RestartKind.HANG:
                exchange.publish(cycle, None)  # the others need not snapshot their ranks
                return None
            exchange.request(cycle)
            evidence = self._take_evidence()
            exchange.share(cycle, group_rank, evidence)
            workers = self._worker_group.workers
            diagnosis = exchange.decide(cycle, self._worker_group.group_world_size or 1, evidence,
                                        workers[0].world_size if workers else None)
        else:
            if trigger.kind not in (RestartKind.HANG, RestartKind.PEER):
                return None
            wanted = exchange.requested(cycle)
            if not wanted and trigger.kind is not RestartKind.HANG:
                return None  # another node's crash or stop: nothing to diagnose, no stack dumps
            evidence = self._take_evidence()
            if wanted:
                exchange.share(cycle, group_rank, evidence)
            diagnosis = exchange.wait(cycle, evidence)
        if diagnosis is not None:
            self._svc.events.write(diagnosis)
            # The one line per hang: the culprit, who waited, why, and where the culprit's stack is.
            stacks = [h.stack_dump_file for h in self._hangs.values()
                      if h.rank in diagnosis.culprits and h.stack_dump_file]
            log.error("cycle %d: %s (evidence: %s)%s", cycle, diagnosis.headline, diagnosis.evidence,
                      f"; stack: {', '.join(stacks)}" if stacks else "")
        return diagnosis
