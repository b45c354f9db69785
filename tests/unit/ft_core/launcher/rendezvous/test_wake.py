"""ft_core.launcher.rendezvous.wake without processes: phases, the logged line, the switch and its validation."""

from __future__ import annotations

import logging

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

from ft_core.launcher.rendezvous.wake import (
    LOG_LINE,
    RendezvousCounts,
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
