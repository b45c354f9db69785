"""A lost node leaves torch's rendezvous in seconds (:mod:`ft_core.launcher.rendezvous.liveness`), without processes.

The rule runs on torch's own state objects (``_RendezvousState``, ``_NodeDesc``, ``RendezvousSettings``) and a
clock the test advances; the beats are an in-memory table. The rule on real launchers (a node SIGKILLed is removed
and the spare takes its place; a node slow to leave but beating is waited for) is in
``tests/integration/ft_core/launcher/rendezvous/test_liveness.py``.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Optional

import pytest
from helpers import wait_for
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _NodeDesc,
    _RendezvousState,
)

from ft_core.launcher.rendezvous.conf import LOST_AFTER
from ft_core.launcher.rendezvous.liveness import (
    LOST_MARK,
    BeatEvidence,
    BeatWriter,
    LostMembers,
    install_lost_members,
)
from ft_core.launcher.rendezvous.turns import inbox_name

A, B, C = (_NodeDesc("127.0.0.1", pid, 0) for pid in (1, 2, 3))


class TableBeats:
    """Beats in a dict: ``table[name]`` is a node's counter; reads are counted."""

    def __init__(self) -> None:
        self.table: dict[str, bytes] = {}
        self.reads = 0
        self.written: list[int] = []

    def write(self, count: int) -> None:
        self.written.append(count)

    def read(self, names: Iterable[str]) -> dict[str, Optional[bytes]]:
        self.reads += 1
        return {name: self.table.get(name) for name in names}

    def mark_lost(self, name: str) -> None:
        self.table[name] = LOST_MARK

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def complete_round(*participants: _NodeDesc, round_: int = 4) -> _RendezvousState:
    state = _RendezvousState()
    state.round, state.complete = round_, True
    state.participants = {node: rank for rank, node in enumerate(participants)}
    state.last_heartbeats = {node: datetime.datetime.now(datetime.timezone.utc) for node in participants}
    return state


@pytest.fixture
def rule():
    """(rule, holder, beats, clock): the rule on node A's state holder; torch's own clean-up is a no-op here."""
    settings = RendezvousSettings("run", 1, 3, RendezvousTimeout(), datetime.timedelta(seconds=5), 3)
    holder = SimpleNamespace(_state=complete_round(A, B), _settings=settings, _sanitize=lambda: None)
    beats, clock = TableBeats(), Clock()
    lost = LostMembers(holder, A, beats, LOST_AFTER, clock=clock, interval=0.5)
    yield lost, holder, beats, clock
    lost.close()


def left(holder: SimpleNamespace, *nodes: _NodeDesc) -> None:
    """``nodes`` left the complete round (torch's exit operation, the round still complete: others remain)."""
    for node in nodes:
        del holder._state.participants[node]


def test_the_rule_is_installed_only_on_a_dynamic_rendezvous_and_not_when_off():
    handler = SimpleNamespace()  # not a DynamicRendezvousHandler: never given the rule
    assert install_lost_members(handler, {"lost_after": "0"}) is None
    assert install_lost_members(handler, {}) is None


def test_the_writer_beats_from_install_and_the_holder_runs_the_rule(rule):
    lost, holder, beats, _ = rule
    assert beats.written[0] == 1  # the first beat at once, the next ones every interval
    assert holder._sanitize == lost.sanitize


def test_a_member_whose_beat_stopped_is_removed_from_the_deserted_round_after_lost_after(rule, caplog):
    lost, holder, beats, clock = rule
    holder._sanitize()  # A is a member: it sees the whole round (A, B)
    assert beats.reads == 0  # nothing read while the round is whole
    left(holder, A)  # A's ranks failed: it left to form the next round; B (dead) remains
    beats.table[inbox_name(B)] = b"41"
    holder._sanitize()
    clock.now += LOST_AFTER - 0.5
    holder._sanitize()
    assert B in holder._state.participants and holder._state.complete  # not yet: 2.5 s unchanged
    clock.now += 0.5
    with caplog.at_level(logging.INFO, logger="ft_core.launcher"):
        holder._sanitize()
    state = holder._state
    assert B not in state.participants and B not in state.last_heartbeats
    assert not state.complete and state.round == 5  # torch's epilogue: no participant left, the next round opens
    assert lost.removed == [(4, inbox_name(B), pytest.approx(LOST_AFTER))]
    assert f"node {inbox_name(B)} lost: its liveness beat did not change for 3.0 s" in caplog.text
    assert "would wait until 15 s after its last heartbeat" in caplog.text
    assert beats.table[inbox_name(B)] == LOST_MARK  # marked: a spare need not wait for it (members_first)
    assert lost.marked_lost([A, B]) == frozenset({B})


def test_a_member_another_node_marked_lost_is_removed_at_the_next_fresh_read(rule):
    # Another node removed B, but its write lost the compare-and-set to this one's: B is still in the state here.
    lost, holder, beats, clock = rule
    holder._sanitize()
    left(holder, A)
    beats.table[inbox_name(B)] = b"41"
    holder._sanitize()
    clock.now += 1.0
    beats.table[inbox_name(B)] = LOST_MARK
    holder._sanitize()
    assert B not in holder._state.participants and lost.removed == [(4, inbox_name(B), 0.0)]


def test_a_member_marked_lost_but_alive_beats_over_the_mark_and_is_not_removed(rule):
    lost, holder, beats, clock = rule
    holder._sanitize()
    left(holder, A)
    beats.table[inbox_name(B)] = LOST_MARK  # a stalled launcher another node judged; then it beats again
    beats.table[inbox_name(B)] = b"42"
    for _ in range(5):  # 2.5 s of reads, its counter now steady only since the mark was overwritten
        holder._sanitize()
        clock.now += 0.5
    assert B in holder._state.participants and not lost.removed and lost.marked_lost([B]) == frozenset()


def test_a_member_slow_to_leave_but_beating_is_never_removed(rule):
    lost, holder, beats, clock = rule
    holder._sanitize()
    left(holder, A)
    for count in range(60):  # 30 s of reads, its counter moving on between them
        beats.table[inbox_name(B)] = str(count).encode()
        holder._sanitize()
        clock.now += 0.5
    assert B in holder._state.participants and holder._state.complete and not lost.removed


def test_the_counters_are_read_at_most_once_per_beat_and_a_verdict_only_on_a_fresh_read(rule):
    lost, holder, beats, clock = rule
    holder._sanitize()
    left(holder, A)
    beats.table[inbox_name(B)] = b"3"
    for _ in range(10):  # ten state reads within one beat interval (a restart's syncs): one read
        holder._sanitize()
        clock.now += 0.04
    assert beats.reads == 1
    clock.now = 100.0 + LOST_AFTER + 0.2  # past the span, but the last read was 0.1 s ago: no read, no verdict
    lost._read_at = clock.now - 0.1
    holder._sanitize()
    assert beats.reads == 1 and B in holder._state.participants
    clock.now += 0.4
    holder._sanitize()  # a fresh read finds the counter unchanged for 3.6 s: lost
    assert beats.reads == 2 and B not in holder._state.participants


def test_a_member_that_never_beat_is_left_to_torchs_keep_alive(rule):
    lost, holder, beats, clock = rule
    holder._sanitize()
    left(holder, A)
    for _ in range(10):  # an older launcher: no counter, whatever the time
        holder._sanitize()
        clock.now += 10
    assert B in holder._state.participants and not lost.removed and beats.reads == 10


def test_nothing_is_read_while_the_round_is_whole_or_open_or_this_node_is_a_member(rule):
    lost, holder, beats, clock = rule
    for _ in range(5):
        holder._sanitize()  # a member, the round whole: a running job's keep-alives and checks
        clock.now += 10
    holder._state.complete = False  # an open round: torch's join rules decide
    left(holder, A)
    holder._sanitize()
    assert beats.reads == 0 and not lost.removed


def test_a_newcomer_that_saw_only_part_of_the_round_does_not_judge(rule):
    lost, holder, beats, clock = rule
    left(holder, A)  # this node's first look at round 4: one member; it cannot tell the round is deserted
    beats.table[inbox_name(B)] = b"7"
    for _ in range(3):
        holder._sanitize()
        clock.now += 10
    assert beats.reads == 0 and B in holder._state.participants


def test_a_new_round_starts_a_new_membership(rule):
    lost, holder, beats, clock = rule
    holder._sanitize()  # round 4: A and B
    holder._state = complete_round(C, round_=6)  # a later round of one member, C, that A saw whole
    holder._sanitize()
    assert beats.reads == 0  # round 6 is whole: its membership is {C}, not round 4's {A, B}


def test_the_evidence_is_the_first_read_of_a_value():
    evidence = BeatEvidence()
    evidence.observe({"b": b"1", "c": None}, 10.0)
    evidence.observe({"b": b"1", "c": None}, 12.0)
    assert evidence.unchanged_for("b", 12.5) == 2.5 and evidence.unchanged_for("c", 12.5) is None
    evidence.observe({"b": b"2"}, 13.0)  # it beat: the span starts again
    assert evidence.lost(["b", "c"], 15.9, 3.0) == {} and evidence.lost(["b"], 16.0, 3.0) == {"b": 3.0}
    evidence.observe({"b": None}, 16.0)  # its key is gone: nothing to judge
    assert evidence.lost(["b"], 100.0, 3.0) == {}
    evidence.observe({"c": LOST_MARK}, 20.0)  # another node's verdict: lost on the read that finds it
    assert evidence.lost(["c"], 20.0, 3.0) == {"c": 0.0}
    evidence.observe({"c": b"9"}, 20.5)  # alive after all: it beat over the mark
    assert evidence.lost(["c"], 21.0, 3.0) == {}


def test_the_writer_keeps_beating_through_failures():
    class Flaky(TableBeats):
        def write(self, count: int) -> None:
            super().write(count)
            if count < 3:
                raise RuntimeError("store away")

    beats = Flaky()
    writer = BeatWriter(beats, 0.01)
    try:
        wait_for(lambda: len(beats.written) >= 5, 10, "five beats")
    finally:
        writer.close()
    assert beats.written[:5] == [1, 2, 3, 4, 5] and not writer._failing  # two failures in 0.02 s: not warned
