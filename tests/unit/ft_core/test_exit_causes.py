"""A worker's exit cause is a member of one closed set, ``launcher <SIGNAL>`` included, and its JSON is its value."""

from __future__ import annotations

import signal

import msgspec
import pytest

from ft_core.events import WorkerExit
from ft_core.exit_causes import ExitCause


def test_every_signal_a_launcher_forwards_has_one_member_that_round_trips_by_value():
    hup = ExitCause.stopped_by(signal.SIGHUP)  # --signals-to-handle may name any signal
    assert hup is ExitCause("launcher SIGHUP") and hup.launcher_stop and hup.value == "launcher SIGHUP"
    assert ExitCause.stopped_by(signal.SIGTERM) is ExitCause.SIGTERM
    assert not ExitCause.CRASH.launcher_stop and not ExitCause.FINISHED.launcher_stop
    record = WorkerExit(cycle=0, local_rank=0, pid=5, cause=hup, signal="SIGHUP", time=1.0)
    assert b'"cause":"launcher SIGHUP"' in msgspec.json.encode(record)
    assert msgspec.json.decode(msgspec.json.encode(record), type=WorkerExit).cause is hup


def test_a_cause_outside_the_set_is_refused():
    with pytest.raises(ValueError, match="launcher SIGNOPE"):
        ExitCause("launcher SIGNOPE")
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"cycle":0,"local_rank":0,"pid":5,"cause":"oops","time":1.0}', type=WorkerExit)
