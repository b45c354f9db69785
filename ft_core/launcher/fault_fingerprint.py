"""This node's fingerprint of the fault that ends a cycle: a pure function of what the node saw.

:func:`fingerprint` reads a :class:`~.cycle_observations.CycleObservations` (and the
node's name, its local-to-global rank map) and returns the
:class:`~ft_core.fault_policy.Fingerprint` the restart policy compares faults by; the
agent waits for the failed workers' records first (:func:`failure_records_in` says when
they are in) and writes the result (:func:`fingerprint_record`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ft_core.diagnosis import diagnose, dumped_frames, evidence_of_hang
from ft_core.events import FaultFingerprint, RankException, RestartKind
from ft_core.fault_policy import NONFINITE_LOSS_ERROR, FaultClass, Fingerprint, innermost_user_frames
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.outcome import exit_status
from ft_core.launcher.resumed_checkpoint import resumed_from

__all__ = ["failure_records_in", "fingerprint", "fingerprint_record", "is_reaction", "silent_failures"]


def fingerprint(seen: CycleObservations, trigger: RestartKind, node: str,
                ranks: dict[int, int]) -> Optional[Fingerprint]:
    """This node's fingerprint of the fault of kind ``trigger`` that ends the cycle ``seen``; None: none to take.

    ``node``: this launcher's ``host:pid``; ``ranks``: local rank -> global rank of the cycle's workers.
    The culprit of a crash is the rank that failed first, unless several ranks reported
    the same exception and none another (a fault of the job, ``alike``). An exception a worker reported
    is the strongest evidence, unless another rank of the cycle had died without a report
    before the reporting rank did: then the exception is a reaction (its collective lost a
    peer) and the silent death is the fault (see :func:`is_reaction`). In a hang's cycle the
    hang is the fault: an exception reported then is a waiter's reaction to the hung rank's
    kill, which must not be blamed; and a node whose every suspect waits in a collective names
    no culprit and no node (the hung rank is elsewhere), only the iteration.
    """
    nodes = (node,)
    silent = silent_failures(seen)
    first = seen.exceptions[0] if seen.exceptions else None
    if first is not None and trigger is not RestartKind.HANG and not is_reaction(seen, first, silent):
        kind = FaultClass.NONFINITE_LOSS if first.exception_type == NONFINITE_LOSS_ERROR else FaultClass.EXCEPTION
        # Several ranks, one exception (type, frames, iteration) and no other: the job's fault, not a rank's.
        reporters = {e.rank for e in seen.exceptions}
        alike = len(reporters) > 1 and all((e.exception_type, e.frames, e.iteration)
                                           == (first.exception_type, first.frames, first.iteration)
                                           for e in seen.exceptions)
        result = Fingerprint(kind, culprits=tuple(sorted(reporters)) if alike else (first.rank,), nodes=nodes,
                             iteration=first.iteration, exception_type=first.exception_type,
                             frames=tuple(first.frames), alike=alike)
    elif trigger is RestartKind.HANG:
        # The suspects are the diagnosis's culprits on this node's evidence (its hang records and, once
        # taken, its live ranks with their stacks): the first rank to expire is often a waiter blocked in a
        # collective, and only the live rank's stack shows who it waits for.
        evidence = seen.evidence if seen.evidence is not None else [evidence_of_hang(h, node)
                                                                    for h in seen.hangs.values()]
        verdict = diagnose(evidence)
        suspects = [] if verdict is None else verdict.culprits
        iterations = [e.iteration for e in suspects if e.iteration is not None]
        if suspects and all(e.in_collective is True for e in suspects):
            # Every rank here waits in a collective: the rank they wait for is on another node. Blaming a
            # waiter would count the hang against this node (the bad-node rule excluded a healthy one).
            suspects = []
        # Where the first suspect was stuck (its stack dump): the same hang again is the same place.
        hangs = sorted((h for h in seen.hangs.values() if h.rank in {e.rank for e in suspects}),
                       key=lambda h: h.detected_time)
        frames = next((innermost_user_frames(f) for f in (dumped_frames(h.stack) for h in hangs) if f), [])
        result = Fingerprint(FaultClass.HANG, culprits=tuple(sorted({e.rank for e in suspects})),
                             nodes=nodes if suspects else (), iteration=min(iterations) if iterations else None,
                             frames=tuple(frames))
    elif trigger is RestartKind.CRASH and silent:  # (every failed worker reported: the branch above)
        _lost, local_rank, code = silent[0]
        _exit_code, sig = exit_status(code)
        rank = ranks.get(local_rank)
        result = Fingerprint(FaultClass.SIGNAL if sig else FaultClass.CRASH,
                             culprits=() if rank is None else (rank,), nodes=nodes, signal=sig)
    else:
        return None
    resumed = resumed_from(seen)  # for rule 1 of the fault policy
    if resumed is not None:
        result = dataclasses.replace(result, resumed_from=resumed[0], resumed_step=resumed[1])
    return result


def fingerprint_record(fp: Fingerprint, cycle: int) -> FaultFingerprint:
    """The ``fault_fingerprint`` record of ``fp``, the fingerprint of the fault that ended ``cycle``."""
    return FaultFingerprint(
        cycle=cycle, kind=fp.kind, culprits=list(fp.culprits), nodes=list(fp.nodes), iteration=fp.iteration,
        exception_type=fp.exception_type, frames=list(fp.frames), signal=fp.signal,
        resumed_from=fp.resumed_from, resumed_step=fp.resumed_step)


def failure_records_in(seen: CycleObservations) -> bool:
    """Whether the monitor's records of the workers that failed are all in: a crash's fingerprint waits for them.

    A worker that connected to the monitor and died has the end of its connection recorded
    (after its exception report, if it sent one: both come over its connection, in that
    order) within milliseconds.
    """
    return all(pid in seen.gone_at or pid not in seen.connected for pid, _code in seen.failed.values())


def silent_failures(seen: CycleObservations) -> list[tuple[float, int, int]]:
    """``(died by, local rank, exit code)`` of the workers that failed without an exception report, first first.

    "Died by": the monitor's record of the end of its connection, else (it never connected)
    the time this launcher saw it dead.
    """
    reported = {e.pid for e in seen.exceptions}
    return sorted((seen.gone_at.get(pid, seen.failed_at), local_rank, code)
                  for local_rank, (pid, code) in seen.failed.items() if pid not in reported)


def is_reaction(seen: CycleObservations, report: RankException, silent: list[tuple[float, int, int]]) -> bool:
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
    return silent[0][0] < seen.gone_at.get(report.pid, float("inf"))
