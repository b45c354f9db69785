"""One diagnosis per faulty cycle for the whole job: every node's evidence meets in the job store.

The launcher that decides the end of a cycle for a hang first marks
``diagnosis/<cycle>/wanted``; for any other end it publishes ``null`` at once,
so a node told of another node's decision snapshots its ranks (stack dumps
take up to ``stack_dump_timeout``) only when a diagnosis is wanted -- a crash
restarts as fast as before. Each launcher whose cycle ended for a hang (its
own, or another node's) shares the evidence of its ranks under
``diagnosis/<cycle>/evidence/<group rank>``. The launcher that decided the cycle's end gathers the evidence of every
node (waiting at most :data:`EVIDENCE_TIMEOUT` for late ones), runs
:func:`ft_core.diagnosis.diagnose` and publishes the result under
``diagnosis/<cycle>/result`` -- or ``null`` when its fault was no hang -- so the
summary of every node names the same culprit. A node that never sees the
result (the decider died) diagnoses with what it has. Nothing here changes
how or when workers are stopped: it only names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Optional

import msgspec

from ft_core.diagnosis import diagnose
from ft_core.events import Diagnosis, RankEvidence
from ft_core.launcher.rendezvous.job_store import JobStore
from ft_core.utils.deadline import wait_until

__all__ = ["EVIDENCE_TIMEOUT", "CulpritExchange"]

log = logging.getLogger("ft_core.launcher")

#: How long the deciding launcher waits for the evidence of the other nodes (on top of their stack dumps):
#: they learn of the decision at their next monitoring pass, then snapshot their ranks.
EVIDENCE_TIMEOUT = 5.0
_NONE = "null"
_EVIDENCE = msgspec.json.Decoder(list[RankEvidence])
_DIAGNOSIS = msgspec.json.Decoder(Optional[Diagnosis])


class CulpritExchange:
    """The job store keys of the diagnosis of one job; see the module docstring."""

    def __init__(self, job_store: JobStore, node: str, stack_dump_timeout: float) -> None:
        self._job_store = job_store
        self.node = node
        #: The others snapshot their ranks (stack dumps included) before they share.
        self.evidence_timeout = EVIDENCE_TIMEOUT + stack_dump_timeout

    @staticmethod
    def _result_key(cycle: int) -> str:
        # A leaf beside the others, never their parent: etcd v2 keys are a tree of directories.
        return f"diagnosis/{cycle}/result"

    def request(self, cycle: int) -> None:
        """As the deciding node of a hang: ask every node for its evidence."""
        self._job_store.set(f"diagnosis/{cycle}/wanted", "1")

    def requested(self, cycle: int) -> bool:
        """As another node: whether the decider wants evidence (False: its fault was no hang, or it is gone)."""
        wanted, result = f"diagnosis/{cycle}/wanted", self._result_key(cycle)

        def answer() -> Optional[str]:
            if self._job_store.get(wanted) is not None:
                return "wanted"
            return "published" if self._job_store.get(result) is not None else None

        # The decider marks or publishes right after deciding, before any node can learn of the decision.
        return wait_until(answer, self.evidence_timeout) == "wanted"

    def share(self, cycle: int, group_rank: int, evidence: Sequence[RankEvidence]) -> None:
        self._job_store.set(f"diagnosis/{cycle}/evidence/{group_rank}", msgspec.json.encode(list(evidence)).decode())

    def decide(self, cycle: int, nodes: int, evidence: Sequence[RankEvidence],
               world_size: Optional[int] = None) -> Optional[Diagnosis]:
        """As the deciding node: gather the evidence of ``nodes`` nodes, diagnose, publish the result.

        With every node's evidence in, ranks of the job's ``world_size`` that none of them saw never
        connected (see :func:`~ft_core.diagnosis.diagnose`); without it, nothing is inferred.
        """
        keys = [f"diagnosis/{cycle}/evidence/{rank}" for rank in range(nodes)]
        wait_until(lambda: all(self._job_store.get(key) is not None for key in keys), self.evidence_timeout)
        everything = list(evidence)
        missing = []
        for rank, key in enumerate(keys):
            raw = self._job_store.get(key)
            if raw is None:
                missing.append(rank)
                continue
            try:
                everything.extend(_EVIDENCE.decode(raw))
            except msgspec.DecodeError as exc:
                log.warning("ignoring the evidence of node %d (job store key %r): %s", rank, key, exc)
        if missing:
            log.warning("diagnosis of cycle %d without the evidence of node(s) %s (none within %.0f s)", cycle,
                        missing, self.evidence_timeout)
        verdict = diagnose(everything, None if missing else world_size)
        result = verdict.to_event(cycle, self.node) if verdict is not None else None
        self.publish(cycle, result)
        return result

    def publish(self, cycle: int, result: Optional[Diagnosis]) -> None:
        """The job-wide diagnosis of ``cycle`` (None: its fault was no hang)."""
        self._job_store.set(self._result_key(cycle), _NONE if result is None else msgspec.json.encode(result).decode())

    def wait(self, cycle: int, evidence: Sequence[RankEvidence]) -> Optional[Diagnosis]:
        """As another node: the deciding node's diagnosis; this node's own if none comes in time."""
        key = self._result_key(cycle)
        raw = wait_until(lambda: self._job_store.get(key), 2 * self.evidence_timeout)
        if raw is not None:
            try:
                published = _DIAGNOSIS.decode(raw)
            except msgspec.DecodeError as exc:
                log.warning("ignoring the diagnosis in job store key %r: %s", key, exc)
            else:
                if published is not None or not any(e.hung for e in evidence):
                    return published
        verdict = diagnose(evidence)  # the decider is gone, or saw no hang while this node did
        return verdict.to_event(cycle, self.node) if verdict is not None else None
