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

from ft_core.diagnosis import evidence_of_hang
from ft_core.events import Diagnosis, FaultFingerprint, RankEvidence, RanksSnapshot, RestartKind
from ft_core.fault_policy import NONFINITE_LOSS_ERROR, FaultKind, Fingerprint
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
#: How long a worker that exited with code 1 may take to have its exception report reach us (it sends it
#: before it exits; the monitor records it within milliseconds): only such a crash waits, at most this.
EXCEPTION_REPORT_WAIT = 0.5


class HangDiagnosis(AgentState):
    """The agent's diagnosis of a faulty cycle (see the module docstring)."""

    def _fingerprint(self, trigger: Trigger) -> Optional[Fingerprint]:
        """This node's fingerprint of the fault that ends the cycle (:mod:`ft_core.fault_policy`), recorded.

        An exception a worker reported is the strongest evidence; the first one reported is
        the culprit's (its peers fail after it, with their own errors). A worker that exited
        with code 1 may have sent its report an instant before: wait for it, briefly. In a
        hang's cycle the hang is the fault: an exception reported then is a waiter's reaction
        to the hung rank's kill (its collective lost a peer), which must not be blamed.
        """
        if trigger.kind is RestartKind.CRASH and not self._exceptions and any(
                code == 1 for _pid, code in self._failed.values()):
            def reported() -> bool:
                self._read_monitor_events()
                return bool(self._exceptions)

            wait_until(reported, EXCEPTION_REPORT_WAIT, interval=0.02)
        if self._exceptions and trigger.kind is not RestartKind.HANG:
            first = self._exceptions[0]
            kind = FaultKind.NONFINITE_LOSS if first.exception_type == NONFINITE_LOSS_ERROR else FaultKind.EXCEPTION
            fingerprint = Fingerprint(kind, culprits=(first.rank,), iteration=first.iteration,
                                      exception_type=first.exception_type, frames=tuple(first.frames))
        elif trigger.kind is RestartKind.HANG:
            hangs = sorted(self._hangs.values(), key=lambda h: h.detected_time)
            iterations = [h.iteration for h in hangs if h.iteration is not None]
            fingerprint = Fingerprint(FaultKind.HANG, culprits=tuple(sorted({h.rank for h in hangs})),
                                      iteration=min(iterations) if iterations else None)
        elif trigger.kind is RestartKind.CRASH and self._failed:
            local_rank, (_pid, code) = min(self._failed.items())
            _exit_code, sig = exit_status(code)
            rank = self._global_ranks().get(local_rank)
            fingerprint = Fingerprint(FaultKind.SIGNAL if sig else FaultKind.CRASH,
                                      culprits=() if rank is None else (rank,), signal=sig)
        else:
            return None
        if self._loaded is not None:  # the checkpoint this cycle resumed from: rule 1 of the fault policy
            fingerprint = dataclasses.replace(fingerprint, resumed_from=self._loaded.checkpoint,
                                              resumed_step=self._loaded.step)
        self._svc.events.write(FaultFingerprint(
            cycle=self._cycle_number(), kind=fingerprint.kind.value, culprits=list(fingerprint.culprits),
            iteration=fingerprint.iteration, exception_type=fingerprint.exception_type,
            frames=list(fingerprint.frames), signal=fingerprint.signal, resumed_from=fingerprint.resumed_from,
            resumed_step=fingerprint.resumed_step))
        return fingerprint

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
