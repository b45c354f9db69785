"""A newcomer lets the last round's members rejoin first (:mod:`ft_core.launcher.rendezvous.members_first`).

The rule is read on torch's own state objects (``_RendezvousState``, ``_NodeDesc``) as the join operation sees
them; the rule on real launchers is in ``tests/integration/ft_core/launcher/rendezvous/test_members_first.py``.
"""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _Action,
    _NodeDesc,
    _RendezvousState,
)

from ft_core.launcher.rendezvous.members_first import (
    ABSENT_GRACE,
    MEMBERS_FIRST_GRACE,
    LastRound,
    MembersFirst,
    absent_members,
    install_members_first,
    newcomer_waits,
)
from ft_core.utils.validation import ValidationError

A, B, C, X = (_NodeDesc("127.0.0.1", pid, 0) for pid in (1, 2, 3, 4))
NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.timezone.utc)
KEEP_ALIVE = datetime.timedelta(seconds=5)


def state(round_: int, complete: bool, participants=(), wait_list=(), heartbeats=None) -> _RendezvousState:
    result = _RendezvousState()
    result.round, result.complete = round_, complete
    result.participants = {node: rank for rank, node in enumerate(participants)}
    result.wait_list = set(wait_list)
    result.last_heartbeats = dict(heartbeats or {})
    return result


def ago(seconds: float) -> datetime.datetime:
    return NOW - datetime.timedelta(seconds=seconds)


def spare_saw(*states: _RendezvousState, node=C, at: float = 100.0) -> LastRound:
    last = LastRound()
    for seen in states:
        last.observe(seen, node, at)
    return last


def waits(open_state: _RendezvousState, last: LastRound, at: float, node=C, max_nodes: int = 2) -> bool:
    return newcomer_waits(open_state, node, last, max_nodes, NOW, KEEP_ALIVE, at)


def test_after_a_crash_the_spare_waits_for_both_members_and_gets_no_place():
    # Round 3: A and B train, C (the spare) watches. A rank crashes: both leave, keep alive from the wait list.
    full = state(3, True, (A, B), heartbeats={A: ago(2), B: ago(1), C: ago(1)})
    b_left = state(3, True, (B,), wait_list=(A,), heartbeats={A: ago(0.1), B: ago(1), C: ago(1)})
    last = spare_saw(full, b_left)
    opened = state(4, False, (), wait_list=(A, C), heartbeats={A: ago(0.1), C: ago(1)})  # B's leaving opened it
    last.observe(opened, C, 100.0)
    assert waits(opened, last, 100.0)  # B is absent just after it opened the round: it joins next
    b_joined = state(4, False, (B,), wait_list=(A, C), heartbeats={A: ago(0.1), B: ago(0), C: ago(1)})
    assert waits(b_joined, last, 100.0 + ABSENT_GRACE)  # A waits for the next round, keeping alive: waited for
    both = state(4, False, (A, B), wait_list=(C,), heartbeats={A: ago(0), B: ago(0), C: ago(1)})
    assert not waits(both, last, 101.0)  # (torch completes the round at max_nodes: no join is asked)


def test_a_lost_node_is_not_waited_for_the_spare_takes_the_free_place_at_once():
    # X stopped keeping alive: torch drops it after 3 intervals, which opens the round for A, B and C.
    full = state(3, True, (A, B, X), heartbeats={A: ago(1), B: ago(2), X: ago(14)})
    survivors_waiting = state(3, True, (X,), wait_list=(A, B), heartbeats={A: ago(0), B: ago(0), X: ago(14.5)})
    last = spare_saw(full, survivors_waiting)
    opened = state(4, False, (), wait_list=(A, B, C), heartbeats={A: ago(0), B: ago(0), C: ago(0)})
    last.observe(opened, C, 50.0)
    assert not waits(opened, last, 50.0, max_nodes=3)  # A, B and C fill it: nobody to displace


def test_a_node_that_left_the_job_is_waited_for_only_briefly():
    # B was excluded: it left round 3 and the job; A restarts and joins round 4.
    last = spare_saw(state(3, True, (A, B), heartbeats={A: ago(1), B: ago(1)}))
    opened = state(4, False, (A,), wait_list=(C,), heartbeats={A: ago(0), C: ago(0)})
    last.observe(opened, C, 10.0)
    assert waits(opened, last, 10.0)
    assert not waits(opened, last, 10.0 + ABSENT_GRACE)


def test_a_member_that_does_not_come_back_within_the_grace_is_replaced():
    last = spare_saw(state(3, True, (A, B), heartbeats={A: ago(1), B: ago(1)}))
    stuck = state(4, False, (A,), wait_list=(B, C), heartbeats={A: ago(0), B: ago(0), C: ago(0)})
    last.observe(stuck, C, 10.0)
    assert waits(stuck, last, 10.0 + MEMBERS_FIRST_GRACE - 0.01)
    assert not waits(stuck, last, 10.0 + MEMBERS_FIRST_GRACE)


def test_a_member_that_left_its_round_first_is_no_newcomer_and_never_waits():
    # Round 3: A, B, X (max 3); C waits as a spare. A's rank fails first: A leaves round 3 before the others and
    # sees it without itself. X is lost; B and the spare C join round 4 before A does. Seen as a newcomer, A
    # would wait for B and X, the spare would take its place and A would become the spare (goodput.py saw it).
    full = state(3, True, (A, B, X), heartbeats={A: ago(1), B: ago(1), X: ago(1)})
    a_left = state(3, True, (B, X), wait_list=(A,), heartbeats={A: ago(0), B: ago(1), X: ago(1)})
    opened = state(4, False, (B, C), wait_list=(A,), heartbeats={A: ago(0), B: ago(0), C: ago(0), X: ago(1)})
    member = spare_saw(full, a_left, opened, node=A)
    assert member.member_of == 3 and member.round == -1
    assert not waits(opened, member, 100.0, node=A, max_nodes=3)
    # Once round 4 completed without it, A is a spare: for round 5 it is a newcomer like any other.
    without_a = state(4, True, (B, C, X), wait_list=(A,), heartbeats={A: ago(0), B: ago(0), C: ago(0), X: ago(0)})
    member.observe(without_a, A, 101.0)
    assert member.round == 4 and member.member_of == 3


def test_members_never_wait_nor_does_a_newcomer_that_saw_no_complete_round():
    full = state(3, True, (A, B), heartbeats={A: ago(1), B: ago(1)})
    opened = state(4, False, (), wait_list=(A, B), heartbeats={A: ago(0), B: ago(0)})
    member = spare_saw(full, opened, node=A)
    assert not waits(opened, member, 100.0, node=A)
    newcomer = spare_saw(opened)  # arrived while the round was open
    assert not waits(opened, newcomer, 100.0)
    # Below the maximum (a scale-up node): the members and the newcomer all fit.
    assert not waits(opened, spare_saw(full, opened), 100.0, max_nodes=3)


def test_the_wrapped_join_turns_a_premature_join_into_a_wait_and_counts_it():
    executor = SimpleNamespace(run=lambda handler, deadline, update_deadline=None: None)
    rule = MembersFirst(executor)
    assert executor.run == rule.run
    settings = RendezvousSettings("run", 1, 2, RendezvousTimeout(), KEEP_ALIVE, 3)
    now = datetime.datetime.now(datetime.timezone.utc)
    full = state(3, True, (A, B), heartbeats={A: now, B: now, C: now})
    opened = state(4, False, (), wait_list=(A, B, C), heartbeats={A: now, B: now, C: now})
    rule.join(lambda ctx, deadline: _Action.SYNC, SimpleNamespace(node=C, state=full, settings=settings), 0.0)
    action = rule.join(lambda ctx, deadline: _Action.ADD_TO_PARTICIPANTS,
                       SimpleNamespace(node=C, state=opened, settings=settings), 0.0)
    assert action == _Action.SYNC and rule.deferrals == 1
    # A member's join goes through.
    assert rule.join(lambda ctx, deadline: _Action.ADD_TO_PARTICIPANTS,
                     SimpleNamespace(node=A, state=opened, settings=settings), 0.0) == _Action.ADD_TO_PARTICIPANTS


def test_a_member_marked_lost_by_the_node_that_removed_it_is_not_waited_for():
    # X's liveness beat stopped: a survivor removed it from round 3 (which opened round 4) and marked it lost. Its
    # keep-alive is still recent, so without the mark the spare would wait ABSENT_GRACE for it.
    full = state(3, True, (A, B, X), heartbeats={A: ago(1), B: ago(1), X: ago(4)})
    last = spare_saw(full)
    opened = state(4, False, (A,), wait_list=(B, C), heartbeats={A: ago(0), B: ago(0), C: ago(0)})
    last.observe(opened, C, 10.0)
    assert absent_members(opened, last, NOW, KEEP_ALIVE) == frozenset({X})
    assert newcomer_waits(opened, C, last, 3, NOW, KEEP_ALIVE, 10.0)  # X might be the member that opened the round
    assert not newcomer_waits(opened, C, last, 3, NOW, KEEP_ALIVE, 10.0, lost=frozenset({X}))
    # A live member is still waited for whatever the mark of another.
    assert newcomer_waits(opened, C, last, 2, NOW, KEEP_ALIVE, 10.0, lost=frozenset({X}))


def test_the_wrapped_join_reads_the_marks_only_when_an_absent_member_would_keep_it_waiting():
    executor = SimpleNamespace(run=lambda handler, deadline, update_deadline=None: None)
    rule = MembersFirst(executor)
    asked: list[frozenset] = []
    rule.lost_of = lambda members: asked.append(members) or frozenset({X})
    settings = RendezvousSettings("run", 1, 3, RendezvousTimeout(), KEEP_ALIVE, 3)
    now = datetime.datetime.now(datetime.timezone.utc)
    full = state(3, True, (A, B, X), heartbeats={A: now, B: now, X: now, C: now})
    rule.join(lambda ctx, deadline: _Action.SYNC, SimpleNamespace(node=C, state=full, settings=settings), 0.0)
    whole = state(4, False, (A,), wait_list=(B, C, X), heartbeats={A: now, B: now, C: now, X: now})
    add = lambda ctx, deadline: _Action.ADD_TO_PARTICIPANTS  # noqa: E731
    assert rule.join(add, SimpleNamespace(node=C, state=whole, settings=settings), 0.0) == _Action.SYNC
    assert asked == []  # every member present: nothing to read
    opened = state(4, False, (A,), wait_list=(B, C), heartbeats={A: now, B: now, C: now})
    assert rule.join(add, SimpleNamespace(node=C, state=opened, settings=settings), 0.0) == _Action.ADD_TO_PARTICIPANTS
    assert asked == [frozenset({X})]


def test_the_conf_key_turns_the_rule_off_and_a_bad_value_is_one_error_naming_it():
    def run(handler, deadline, update_deadline=None) -> None:
        return None

    executor = SimpleNamespace(run=run)
    handler = SimpleNamespace(_op_executor=executor)  # not a DynamicRendezvousHandler: never wrapped
    assert install_members_first(handler, {"members_first": "0"}) is None
    assert install_members_first(handler, {}) is None and executor.run is run
    with pytest.raises(ValidationError, match=r"--rdzv-conf members_first: invalid value 'maybe'; allowed: true or"):
        install_members_first(handler, {"members_first": "maybe"})
