"""ft_core.launcher.rendezvous.wake without processes: phases, the logged line, the switch and its validation,
and the restart's turns on an in-memory backend (a turn that does not come is waited for once, not forever)."""

from __future__ import annotations

import datetime
import logging
import pickle
from typing import Optional

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    RendezvousSettings,
    RendezvousTimeout,
    _NodeDesc,
    _RendezvousState,
)

from ft_core.launcher.rendezvous.turns import inbox_name
from ft_core.launcher.rendezvous.wake import (
    LOG_LINE,
    TURN_WAIT,
    RendezvousCounts,
    WakingStateHolder,
    install_wake_on_change,
    logged_rounds,
    phase,
)
from ft_core.utils.validation import ValidationError


def state(round_: int, complete: bool) -> _RendezvousState:
    result = _RendezvousState()
    result.round, result.complete = round_, complete
    return result


def test_the_phase_grows_by_one_when_a_round_completes_and_when_the_next_one_opens():
    # A restart: round 3 complete -> the last node leaves (round 4 opens) -> the last node joins (complete).
    assert [phase(state(3, True)), phase(state(4, False)), phase(state(4, True))] == [7, 8, 9]
    assert phase(_RendezvousState()) == 0  # no state yet


def test_the_logged_line_is_read_back_as_it_was_written(caplog):
    counts = RendezvousCounts(reads=5, writes=4, refused_writes=1, wake_ops=9, waits=2, woken=1, missed=1, bytes=7342)
    with caplog.at_level(logging.INFO, logger="ft_core.launcher"):
        logging.getLogger("ft_core.launcher").info(
            LOG_LINE, 2, "etcd-v3", counts.woken, counts.waits, counts.waits - counts.woken, counts.missed, counts.reads,
            counts.writes, counts.refused_writes, counts.wake_ops, counts.bytes)
    assert logged_rounds("noise\n" + caplog.text + "more noise\n") == [(2, counts)]
    assert counts.since(RendezvousCounts(reads=1, bytes=42)) == RendezvousCounts(
        reads=4, writes=4, refused_writes=1, wake_ops=9, waits=2, woken=1, missed=1, bytes=7300)


def test_wake_on_change_0_keeps_torchs_poll_and_a_bad_value_names_the_key():
    handler = object()  # never looked at: the switch is read first
    assert install_wake_on_change(handler, {"wake_on_change": "0"}) is False
    assert install_wake_on_change(handler, {"wake_on_change": "false"}) is False
    with pytest.raises(ValidationError, match="wake_on_change.*maybe"):
        install_wake_on_change(handler, {"wake_on_change": "maybe"})


def test_a_handler_that_is_not_torchs_dynamic_one_is_left_alone():
    assert install_wake_on_change(object(), {}) is False


NODES = [_NodeDesc("host", 100 + index, 0) for index in range(4)]


class MemoryBackend(RendezvousBackend):
    """Torch's state in memory, written by compare-and-set on a counter (the fencing token)."""

    def __init__(self, state: _RendezvousState) -> None:
        self.value, self.token = pickle.dumps(state), 1

    @property
    def name(self) -> str:
        return "memory"

    def get_state(self) -> Optional[tuple[bytes, int]]:
        return self.value, self.token

    def set_state(self, state: bytes, token: Optional[object] = None) -> tuple[bytes, int, bool]:
        if token != self.token:
            return self.value, self.token, False
        self.value, self.token = state, self.token + 1
        return state, self.token, True

    def replace(self, change) -> None:  # noqa: ANN001 - another node's write
        state = pickle.loads(self.value)
        change(state)
        self.value, self.token = pickle.dumps(state), self.token + 1


class Keys:
    """Phase keys whose turn waits are all woken or all time out; records what was waited for and told."""

    def __init__(self, woken: bool) -> None:
        self.woken, self.waits, self.told, self.timeouts = woken, [], [], []
        self.meanwhile: list = []  # what other nodes write during the next waits, one per wait


    def notify(self, phase: int, inbox: Optional[str] = None) -> tuple[int, int]:
        self.told.append((phase, inbox))
        return 1, 0

    def wait(self, phase: int, timeout: float, inbox: Optional[str] = None) -> tuple[bool, int]:
        self.waits.append((phase, inbox))
        self.timeouts.append(timeout)
        if self.meanwhile:
            self.meanwhile.pop(0)()
        return self.woken, 1

    def cancel(self) -> int:
        return 0


def restarting(node: _NodeDesc, woken: bool) -> tuple[WakingStateHolder, MemoryBackend, Keys]:
    """``node``'s holder in a restart of the completed round 3 of NODES (it has read that round)."""
    round_3 = state(3, True)
    round_3.participants = {each: rank for rank, each in enumerate(NODES)}
    backend, keys = MemoryBackend(round_3), Keys(woken)
    settings = RendezvousSettings("job", 4, 4, RendezvousTimeout(), datetime.timedelta(seconds=5), 3)
    holder = WakingStateHolder(backend, settings, keys, node)
    holder.sync()
    holder.begin()
    return holder, backend, keys


def leave(holder: WakingStateHolder, node: _NodeDesc) -> Optional[bool]:
    """Torch's leave (REMOVE_FROM_PARTICIPANTS) computed on the state held, then the sync that writes it."""
    del holder.state.participants[node]
    holder.mark_dirty()
    return holder.sync()


def test_a_restarts_write_waits_for_its_turn_then_writes_on_the_state_read_after_it():
    holder, backend, keys = restarting(NODES[2], woken=True)
    assert leave(holder, NODES[2]) is False  # waited for its turn: the state is read again, nothing written
    assert keys.waits == [(7, inbox_name(NODES[2]))] and backend.token == 1
    assert leave(holder, NODES[2]) is True  # its turn: written, not refused
    assert NODES[2] not in pickle.loads(backend.value).participants and holder.counts.refused_writes == 0
    holder.wait_for_change(0.0)  # done writing in this phase: the turn goes to the next rank still in the round
    assert (7, inbox_name(NODES[3])) in keys.told


def test_a_turn_that_does_not_come_is_waited_for_again_only_while_the_nodes_ahead_progress():
    holder, backend, keys = restarting(NODES[2], woken=False)
    keys.meanwhile.append(lambda: backend.replace(lambda state: state.participants.pop(NODES[0])))
    assert leave(holder, NODES[2]) is False  # the turn did not come, but rank 0 left meanwhile: progress
    assert leave(holder, NODES[2]) is False  # so it waits once more (for rank 1)
    assert leave(holder, NODES[2]) is True  # no progress in a whole wait (rank 1 lost, say): it writes
    assert len(keys.waits) == 2 and holder.counts.refused_writes == 0
    # The further back in line, the longer it waits: behind a node that never comes, the next one goes first.
    assert keys.timeouts[0] > keys.timeouts[1] > TURN_WAIT
    assert NODES[2] not in pickle.loads(backend.value).participants


def test_writes_outside_a_rendezvous_and_of_the_first_in_line_never_wait():
    holder, backend, keys = restarting(NODES[0], woken=True)
    assert leave(holder, NODES[0]) is True and keys.waits == []  # rank 0: first in line
    holder, backend, keys = restarting(NODES[3], woken=True)
    holder.end_waits()  # the rendezvous is over: torch's keep-alive thread writes as it did
    holder.state.last_heartbeats[NODES[3]] = datetime.datetime.now(datetime.timezone.utc)
    holder.mark_dirty()
    assert holder.sync() is True and keys.waits == []
