"""Who hung and who only waited: naming the culprit(s) of a hang from the evidence of every rank.

When one rank hangs, its peers block in the next collective waiting for it and
miss their own deadlines too; the first rank to expire is often an innocent
waiter. :func:`diagnose` ranks the evidence each monitor has about its ranks
(:class:`~ft_core.events.RankEvidence`) with these rules, strongest first, each
applied only while it can tell ranks apart:

* **Absent.** Given the job's world size, a rank no monitor ever saw (it never
  connected) or one that never sent a sign of life is where the job stands still.
0. **Stopped.** A rank the kernel showed stopped (SIGSTOP, a debugger) cannot
   be making progress; running ranks wait for it.
1. **Stacks.** A rank whose stack dump shows it blocked inside a
   ``torch.distributed`` collective is waiting for a peer -- provided some rank
   is elsewhere or gave no stack (else all of them are in the collective, and
   the stacks tell nothing). A rank that gives no stack when its peers do
   could not even run the dump's signal handler (stopped, or stuck in native
   code), or never finished its dump: that is where the hang is, not in the
   collective its peers wait in.
1b. **Recently alive.** A rank that did not hang itself and whose last sign
   of life is younger than the timeout of its running deadline (by more than
   :data:`STOPPED_FIRST_MARGIN`) is no culprit while another suspect remains:
   it was active moments ago. After the stacks: a stack in a collective is
   the stronger evidence of waiting.
2. **Lowest iteration.** Ranks that reported a higher iteration than the lowest
   one got further: they wait. A rank that never reported an iteration cannot be
   compared and stays a suspect.
3. **Who stopped first.** Only when the stacks did not tell the suspects apart
   (no stack, or every one in a collective, or none): ranks whose last sign of
   life is more than :data:`STOPPED_FIRST_MARGIN` later than the earliest one
   were still alive after it stopped. (A waiter may well stop first when the
   culprit kept heartbeating before it hung, so stacks take precedence.)

Stacks show waiting only where a collective blocks the host. With NCCL a
collective returns at once and a waiter blocks at its next host sync
(``.item()``, a copy to the CPU), outside ``torch.distributed``; when stacks were
taken and none is in a collective, the headline says that they cannot show who
waits.

What is left are the culprits (all of them when nothing tells them apart: an
honest tie); the other ranks were waiting. The diagnosis only *names*: nothing
in the launcher or the monitor kills or restarts because of it.

Example::

    >>> from ft_core.events import RankEvidence
    >>> verdict = diagnose([
    ...     RankEvidence(rank=0, pid=10, node="a:1", iteration=25, section="step", hung=True, stalled_for=3.0,
    ...                  in_collective=True),
    ...     RankEvidence(rank=1, pid=11, node="a:1", iteration=25, section="step", stalled_for=2.9,
    ...                  in_collective=False)])
    >>> [e.rank for e in verdict.culprits], [e.rank for e in verdict.waiting]
    ([1], [0])
    >>> verdict.headline()
    'rank 1 (node a:1, pid 11) hung in section step at iteration 25 for 2.9 s; rank 0 was waiting for it'

This module must not import torch nor the monitor.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Optional

from ft_core.events import Diagnosis, HangDetected, RankEvidence

__all__ = ["STACKS_BLIND", "STOPPED_FIRST_MARGIN", "Verdict", "diagnose", "dumped_frames", "evidence_of_hang",
           "stack_in_collective"]

#: A rank whose last sign of life is this much later than the earliest suspect's was still running after
#: that one stopped. Generous: ranks of one job step in lock-step, so a real gap is the length of a hang.
STOPPED_FIRST_MARGIN = 1.0

#: Where a rank waits for its peers: a thread whose innermost frame is here is blocked in a collective.
#: torch.distributed's own calls and DDP's module; and the autograd engine, because with DDP the
#: gradient all-reduce runs inside backward (the reducer's C++ hooks), so a rank stuck there past its
#: step timeout is waiting for a peer's gradients (a rank hung in its own backward is then named only
#: if its peers are elsewhere, which they are not: they wait in backward too).
_COLLECTIVE_PATH = re.compile(r"[/\\]torch[/\\](distributed[/\\]|nn[/\\]parallel[/\\]distributed\.py"
                              r"|autograd[/\\]graph\.py)")
_THREAD_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+")
_FRAME = re.compile(r'^\s*File "([^"]*)", line (\d+)(?: in (.*))?')


def dumped_frames(stack: Optional[str]) -> list[tuple[str, int, str]]:
    """The frames of the judged thread of a faulthandler dump, outermost first: ``(file, line, function)``.

    The thread judged is the one faulthandler marks "Current thread" (the one
    that took the dump signal), else the last one listed (CPython lists the
    main thread last). Empty when the text holds no frame.
    """
    blocks: list[tuple[bool, list[tuple[str, int, str]]]] = []
    for line in (stack or "").splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            blocks.append((header.group(1) == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame:
            if not blocks:
                blocks.append((False, []))
            blocks[-1][1].append((frame.group(1), int(frame.group(2)), (frame.group(3) or "?").strip()))
    blocks = [b for b in blocks if b[1]]
    if not blocks:
        return []
    current = [frames for is_current, frames in blocks if is_current]
    return list(reversed(current[0] if current else blocks[-1][1]))  # faulthandler: most recent call first


def stack_in_collective(stack: Optional[str]) -> Optional[bool]:
    """Whether a faulthandler dump shows the rank blocked in a ``torch.distributed`` collective.

    The thread judged is the one :func:`dumped_frames` picks. None when the text holds no frame.
    """
    frames = dumped_frames(stack)
    if not frames:
        return None
    return bool(_COLLECTIVE_PATH.search(frames[-1][0]))  # the innermost frame


def evidence_of_hang(hang: HangDetected, node: Optional[str]) -> RankEvidence:
    """The evidence a ``hang_detected`` record (with its stack, as the monitor wrote it) gives."""
    return RankEvidence(
        rank=hang.rank, pid=hang.pid, node=node, iteration=hang.iteration,
        section=hang.section or (hang.open_sections[-1] if hang.open_sections else None),
        last_activity=hang.deadline_time - hang.timeout, stalled_for=hang.elapsed, hung=True,
        in_collective=stack_in_collective(hang.stack), stack_dump_file=hang.stack_dump_file, stopped=hang.stopped,
        timeout=hang.timeout)


#: Said in the headline when stacks were taken but none shows a rank waiting in a collective.
STACKS_BLIND = ("the stacks cannot show who waits (no rank is in a collective: with NCCL a collective returns "
                "at once and a waiter blocks at its next host sync)")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`diagnose`: culprits and waiters (ordered by rank) and why, in one line."""

    culprits: list[RankEvidence]
    waiting: list[RankEvidence]
    evidence: str
    #: A caveat for the headline (e.g. :data:`STACKS_BLIND`), or None.
    note: Optional[str] = None

    def headline(self) -> str:
        """The one line a human reads first: what each culprit did, and who waited for it."""
        parts = [_story(e) for e in self.culprits]
        them = "it" if len(self.culprits) == 1 else "them"
        if self.waiting:
            parts.append(f"{_ranks(self.waiting)} {_were(self.waiting)} waiting for {them}")
        else:
            parts.append("no rank was only waiting")
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)

    def to_event(self, cycle: int, decided_by: Optional[str]) -> Diagnosis:
        return Diagnosis(cycle=cycle, culprits=[e.rank for e in self.culprits],
                         waiting=[e.rank for e in self.waiting], evidence=self.evidence, headline=self.headline(),
                         culprit_nodes=sorted({e.node for e in self.culprits if e.node}), decided_by=decided_by)


def diagnose(evidence: Sequence[RankEvidence], world_size: Optional[int] = None) -> Optional[Verdict]:
    """Name the culprit(s) of a hang from the ``evidence`` of every rank (see the module docstring).

    A rank given twice (e.g. a hang record and a snapshot) counts once: the
    hang record wins. With ``world_size`` (only when the evidence of every node
    is in), ranks of the job without any evidence are added as never connected.
    None when there is no evidence at all.
    """
    by_rank: dict[int, RankEvidence] = {}
    for e in sorted(evidence, key=lambda e: not e.hung):  # hang records first: they win
        by_rank.setdefault(e.rank, e)
    if not by_rank:
        return None
    for rank in range(world_size or 0):
        by_rank.setdefault(rank, RankEvidence(rank=rank, pid=-1, connected=False))
    everyone = [by_rank[rank] for rank in sorted(by_rank)]
    suspects = everyone
    why: list[str] = []

    absent = [e for e in suspects if not e.connected or _never_alive(e)]
    if absent and len(absent) < len(suspects):
        never = [e for e in absent if not e.connected]
        silent = [e for e in absent if e.connected]
        parts = ([f"{_ranks(never)} never connected"] if never else []) + (
            [f"{_ranks(silent)} never sent a sign of life"] if silent else [])
        why.append(", ".join(parts))
        suspects = absent

    frozen = [e for e in suspects if e.stopped]
    if frozen and len(frozen) < len(suspects):
        why.append(f"{_ranks(frozen)} stopped by a signal (SIGSTOP or a debugger)")
        suspects = frozen

    outside = [e for e in suspects if not e.in_collective]
    inside = [e for e in suspects if e.in_collective]
    stacks_told = bool(outside and inside)
    if stacks_told:
        suspects = outside
        stackless = [e for e in outside if e.in_collective is None]
        elsewhere = f"{_ranks(outside)} elsewhere" if not stackless else (
            f"{_ranks(outside)} elsewhere or without a stack ({_ranks(stackless)})")
        why.append(f"{_ranks(inside)} blocked in a collective, {elsewhere}")

    recent = [e for e in suspects if _recently_alive(e)]
    if recent and len(recent) < len(suspects):
        suspects = [e for e in suspects if e not in recent]
        why.append(f"{_ranks(recent)} alive within their timeouts")

    iterations = [e.iteration for e in suspects if e.iteration is not None]
    if iterations and min(iterations) != max(iterations):
        lowest = min(iterations)
        ahead = [e for e in suspects if e.iteration is not None and e.iteration > lowest]
        suspects = [e for e in suspects if e.iteration is None or e.iteration == lowest]
        why.append(f"lowest iteration {lowest} ({_ranks(suspects)}; {_ranks(ahead)} further)")

    stopped = [e.last_activity for e in suspects if e.last_activity is not None]
    if stopped and not stacks_told:
        first = min(stopped)
        later = [e for e in suspects if e.last_activity is not None and e.last_activity > first + STOPPED_FIRST_MARGIN]
        if later:
            suspects = [e for e in suspects if e not in later]
            why.append(f"{_ranks(suspects)} stopped first ({_ranks(later)} {_were(later)} alive "
                       f"> {STOPPED_FIRST_MARGIN:g} s later)")

    if not why:
        why.append("nothing tells the ranks apart (same iteration, no stack shows a rank waiting in a collective)")
    waiting = [e for e in everyone if e not in suspects]
    stacks = [e.in_collective for e in everyone if e.in_collective is not None]
    note = STACKS_BLIND if stacks and not any(stacks) else None
    return Verdict(culprits=suspects, waiting=waiting, evidence="; ".join(why), note=note)


def _never_alive(e: RankEvidence) -> bool:
    """A connected rank that never sent a sign of life (no heartbeat, no section, nothing)."""
    return not e.hung and e.last_activity is None and e.stalled_for is None


def _recently_alive(e: RankEvidence) -> bool:
    """A rank that did not hang and whose last sign of life is younger than its running timeout (by more
    than :data:`STOPPED_FIRST_MARGIN`: ranks in lock-step expire within it, and the first to expire may be
    a waiter)."""
    return (not e.hung and e.connected and e.stalled_for is not None and e.timeout is not None
            and e.stalled_for + STOPPED_FIRST_MARGIN < e.timeout)


def _story(e: RankEvidence) -> str:
    if not e.connected:
        return f"rank {e.rank} never connected to its node's monitor"
    where = f"in section {e.section}" if e.section else "outside any section"
    at = f"at iteration {e.iteration}" if e.iteration is not None else "(no iteration reported)"
    node = f"node {e.node}, " if e.node else ""
    if _never_alive(e):
        return f"rank {e.rank} ({node}pid {e.pid}) never sent a sign of life"
    length = f" for {e.stalled_for:.1f} s" if e.stalled_for is not None else ""
    # Only a rank whose own deadline passed "hung"; another was silent (its timeout not yet spent).
    return f"rank {e.rank} ({node}pid {e.pid}) {'hung' if e.hung else 'silent'} {where} {at}{length}"


def _ranks(evidence: Sequence[RankEvidence]) -> str:
    """``rank 3`` or ``ranks 0, 1``: the headline and the evidence are read by people."""
    numbers = ", ".join(str(e.rank) for e in evidence)
    return f"rank {numbers}" if len(evidence) == 1 else f"ranks {numbers}"


def _were(evidence: Sequence[RankEvidence]) -> str:
    return "was" if len(evidence) == 1 else "were"
