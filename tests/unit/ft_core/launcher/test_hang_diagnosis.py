"""Who hung, who waited (:mod:`ft_core.launcher.hang_diagnosis`): which node asks for evidence and decides, which
only shares, and when nobody takes stacks at all. The exchange is recorded here (what was asked of it); the real
one, through a job store with real launchers, is tested in ``tests/integration/ft_core/launcher/test_culprit.py``."""

from __future__ import annotations

from typing import Any, Optional

from ft_core.events import Diagnosis, HangDetected, HangReason, RankEvidence, RestartKind
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.hang_diagnosis import diagnose, hang_stacks

MINE = [RankEvidence(rank=1, pid=11, node="hostA:7", hung=True)]
DIAGNOSIS = Diagnosis(cycle=4, culprits=[1], waiting=[0], evidence="rank 1 hung", headline="rank 1 hung",
                      culprit_nodes=["hostA:7"])


class Exchange:
    """Records what the diagnosis asked of the culprit exchange; ``requested``: another node asked for evidence."""

    def __init__(self, requested: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._requested = requested

    def publish(self, cycle: int, diagnosis: Optional[Diagnosis]) -> None:
        self.calls.append(("publish", cycle, diagnosis))

    def request(self, cycle: int) -> None:
        self.calls.append(("request", cycle))

    def share(self, cycle: int, group_rank: int, evidence: list[RankEvidence]) -> None:
        self.calls.append(("share", cycle, group_rank, evidence))

    def decide(self, cycle: int, nodes: int, evidence: list[RankEvidence], world_size: Optional[int]) -> Diagnosis:
        self.calls.append(("decide", cycle, nodes, world_size))
        return DIAGNOSIS

    def requested(self, cycle: int) -> bool:
        self.calls.append(("requested", cycle))
        return self._requested

    def wait(self, cycle: int, evidence: list[RankEvidence]) -> Diagnosis:
        self.calls.append(("wait", cycle))
        return DIAGNOSIS


def _run(exchange: Exchange, trigger: RestartKind, decided_here: bool) -> tuple[Optional[Diagnosis], int]:
    taken: list[int] = []

    def evidence() -> list[RankEvidence]:
        taken.append(1)
        return MINE

    result = diagnose(exchange, 4, trigger, decided_here, group_rank=2, nodes=3, world_size=6,  # type: ignore[arg-type]
                      evidence=evidence, announce=lambda: exchange.calls.append(("announce",)))
    return result, len(taken)


def test_the_deciding_node_of_a_hang_asks_every_node_shares_its_own_evidence_and_decides():
    exchange = Exchange()
    assert _run(exchange, RestartKind.HANG, decided_here=True) == (DIAGNOSIS, 1)
    # The others are woken for the decision only once they can see that their evidence is wanted.
    assert exchange.calls == [("request", 4), ("announce",), ("share", 4, 2, MINE), ("decide", 4, 3, 6)]


def test_the_deciding_node_of_a_crash_tells_the_others_no_stacks_are_needed():
    exchange = Exchange()
    assert _run(exchange, RestartKind.CRASH, decided_here=True) == (None, 0)
    assert exchange.calls == [("publish", 4, None), ("announce",)]


def test_another_node_shares_when_asked_and_takes_no_stacks_for_a_crash_nobody_asks_about():
    asked = Exchange(requested=True)
    assert _run(asked, RestartKind.PEER, decided_here=False) == (DIAGNOSIS, 1)
    assert asked.calls == [("requested", 4), ("share", 4, 2, MINE), ("wait", 4)]
    quiet = Exchange(requested=False)
    assert _run(quiet, RestartKind.PEER, decided_here=False) == (None, 0)
    assert _run(Exchange(), RestartKind.CRASH, decided_here=False) == (None, 0)  # not even asked
    # A hang on this node that another node decides: its own evidence, waited for the job-wide diagnosis.
    own_hang = Exchange(requested=False)
    assert _run(own_hang, RestartKind.HANG, decided_here=False) == (DIAGNOSIS, 1)
    assert own_hang.calls == [("requested", 4), ("wait", 4)]


def test_the_log_line_names_the_stack_files_of_this_nodes_culprits_only():
    seen = CycleObservations(cycle=4)
    for rank, pid, path in ((1, 11, "/stacks/cycle4_rank1.txt"), (0, 10, "/stacks/cycle4_rank0.txt"), (5, 15, None)):
        seen.hangs[pid] = HangDetected(rank=rank, pid=pid, reason=HangReason.HEARTBEAT, section=None, elapsed=5.0,
                                       timeout=4.0, iteration=3, open_sections=[], deadline_time=1.0,
                                       detected_time=1.0, stack_dump_file=path)
    assert hang_stacks(seen, DIAGNOSIS) == ["/stacks/cycle4_rank1.txt"]
