"""ft_core.launcher.rendezvous.turns: whose turn it is to write torch's state in a restart, on torch's own state."""

from __future__ import annotations

import pickle

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from ft_core.launcher.rendezvous.turns import RestartOrder, Stage, inbox_name

NODES = [_NodeDesc("host", 100 + index, 0) for index in range(4)]


def completed(round_: int, nodes: list[_NodeDesc]) -> _RendezvousState:
    """A completed round of ``nodes``, ranked in their order (as torch sorts them); a copy, as a read gives."""
    state = _RendezvousState()
    state.round, state.complete = round_, True
    state.participants = {node: rank for rank, node in enumerate(nodes)}
    return pickle.loads(pickle.dumps(state))


def opened(round_: int, waiting: list[_NodeDesc], joined: list[_NodeDesc] = ()) -> _RendezvousState:
    state = _RendezvousState()
    state.round, state.complete = round_, False
    state.wait_list = set(waiting)
    state.participants = dict.fromkeys(joined, 0)
    return state


def order_of(node: _NodeDesc, *seen: _RendezvousState) -> RestartOrder:
    order = RestartOrder(node)
    for state in seen:
        order.observe(state)
    return order


def test_leaving_a_round_each_node_waits_for_the_lower_ranks_still_in_it_and_passes_to_the_next():
    order = order_of(NODES[2], completed(3, NODES))
    state = completed(3, NODES)
    assert order.stage(state) is Stage.LEAVING
    assert order.ahead(state) == {NODES[0], NODES[1]}
    assert order.successor(state) == NODES[3]
    del state.participants[NODES[0]]  # rank 0 left: rank 1 still ahead
    assert order.ahead(state) == {NODES[1]}
    assert order_of(NODES[0], completed(3, NODES)).ahead(completed(3, NODES)) == frozenset()  # first in line


def test_the_ranks_of_nodes_that_left_are_kept_when_the_round_is_read_again():
    # Rank 2 reads its round again after ranks 0 and 1 left it: their ranks (and their place ahead) stay known.
    after_two_left = completed(3, NODES)
    del after_two_left.participants[NODES[0]], after_two_left.participants[NODES[1]]
    order = order_of(NODES[2], completed(3, NODES), after_two_left)
    joining = opened(4, NODES[:3])
    assert order.stage(joining) is Stage.JOINING
    assert order.ahead(joining) == {NODES[0], NODES[1]}


def test_joining_the_next_round_each_node_waits_for_the_lower_ranks_still_waiting():
    order = order_of(NODES[1], completed(3, NODES))
    # Node 3 left last and opened round 4 (it never waited); nodes 0-2 wait to join.
    state = opened(4, NODES[:3], joined=[NODES[3]])
    assert order.ahead(state) == {NODES[0]}
    assert order.successor(state) == NODES[2]
    assert order_of(NODES[3], completed(3, NODES)).ahead(state) == frozenset()  # the opener: not waiting, goes
    state.wait_list.discard(NODES[0])  # a lost node dropped from the wait list is waited for by nobody
    assert order.ahead(state) == frozenset()


def test_nothing_is_ordered_outside_a_restart_of_the_last_completed_round():
    spare = _NodeDesc("spare", 1, 0)
    assert order_of(spare, completed(3, NODES)).stage(completed(3, NODES)) is None  # not in the round: torch's
    order = order_of(NODES[1], completed(3, NODES))
    assert order.stage(opened(5, NODES)) is None  # a later round than the next one
    assert order.stage(completed(4, NODES)) is None  # the next round completed without it
    # Its own keep-alive while in the wait list is not one of the restart's writes: nothing ahead of it.
    waiting = completed(3, NODES[2:])
    waiting.wait_list = {NODES[0], NODES[1]}
    assert order.ahead(waiting) == frozenset()
    assert order_of(NODES[0]).stage(completed(3, NODES)) is None  # no round seen yet: the first rendezvous


def test_an_inbox_name_is_one_key_segment_per_node():
    assert inbox_name(_NodeDesc("a/b", 7, 1)) == "a_b_7_1"
    assert len({inbox_name(node) for node in NODES}) == len(NODES)
