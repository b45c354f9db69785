"""The numbers a rank shares with its watchdog process through a memory-mapped file."""

from __future__ import annotations

import os

from ft_core.inprocess.shared_state import RestartPhase, SharedState


def test_shared_state_is_visible_through_another_mapping():
    shared = SharedState.create()
    other = SharedState(os.dup(shared.fd))
    try:
        shared.enter(3, RestartPhase.MEMBER)
        shared.armed = True
        shared.progress = 12.5
        other.monitor_ready = True
        assert (other.attempt, other.phase, other.armed, other.progress) == (3, RestartPhase.MEMBER, True, 12.5)
        assert shared.monitor_ready
    finally:
        other.close()
        shared.close()
