"""Slow storage, the policy: which deadlines are extended, how far, and on what evidence.

No clock (times are passed in); the evidence is read from the kernel about this test process,
which writes (or does not write) a real file between the monitor's look and the deadline.
"""

from __future__ import annotations

import os

import pytest
from monitor_rank import T0, watched

from ft_core.events import DeadlineExtended, HangReason
from ft_core.monitor.slow_storage import SlowStorage, moved_bytes
from ft_core.utils.storage_io import FileKey, FileOffset

KEY = FileKey(pid=10, fd=5, dev=1, ino=99)


# -- moved_bytes: the evidence compared ------------------------------------------------------------------
@pytest.mark.parametrize(("before", "after", "moved"), [
    ({}, {}, 0),  # nothing open
    ({KEY: FileOffset(100, 100, True)}, {KEY: FileOffset(100, 100, True)}, 0),  # open, still: hung
    ({KEY: FileOffset(100, 100, True)}, {KEY: FileOffset(300, 300, True)}, 200),  # written (offset and size)
    ({KEY: FileOffset(0, 100, True)}, {KEY: FileOffset(0, 400, True)}, 300),  # pwrite: the size grows alone
    ({KEY: FileOffset(50, 900, False)}, {KEY: FileOffset(450, 900, False)}, 400),  # read (a checkpoint load)
    ({KEY: FileOffset(50, 900, False)}, {KEY: FileOffset(50, 1900, False)}, 0),  # someone else grew it
    ({KEY: FileOffset(500, 500, True)}, {KEY: FileOffset(0, 500, True)}, 500),  # a seek back (zip headers)
    ({KEY: FileOffset(500, 500, True)}, {}, 0),  # closed since: nothing more
    ({}, {KEY: FileOffset(64, 64, True)}, 64),  # opened and written since
    ({}, {KEY: FileOffset(0, 4096, True)}, 0),  # opened since, nothing moved through it
    ({KEY: FileOffset(64, 64, True)}, {KEY._replace(ino=7): FileOffset(64, 64, True)}, 64),  # fd reused: new file
])
def test_moved_bytes(before, after, moved):
    assert moved_bytes(before, after) == moved


# -- SlowStorage: every deadline rule, the cap, the evidence -----------------------------------------------
@pytest.fixture
def storage():
    records = []
    return SlowStorage(watched().cfg, records.append), records


def _rank(**timeouts):
    rank = watched(**timeouts)
    rank.pid = os.getpid()  # the evidence is read about this process
    return rank


def _to_deadline(slow, rank, handle=None):
    """Look shortly before the rank's deadline, write 64 KiB to ``handle`` if any, then return the deadline."""
    expiry = rank.next_deadline()
    slow.look(rank, expiry, expiry.deadline - 0.01)
    if handle is not None:
        handle.write(b"x" * (64 << 10))
        handle.flush()
    return expiry


@pytest.mark.parametrize(("timeouts", "reason", "section"), [
    ({"subsequent": 4.0}, HangReason.HEARTBEAT, None),
    ({"initial": 4.0}, HangReason.INITIAL_HEARTBEAT, None),
    ({"sections": {"checkpointing": 4.0}}, HangReason.SECTION, "checkpointing"),
    ({"out_of_section": 4.0}, HangReason.OUT_OF_SECTION, None),
])
def test_every_deadline_is_extended_while_storage_progresses_up_to_the_cap(storage, tmp_path, timeouts, reason,
                                                                           section):
    slow, records = storage
    rank = _rank(**timeouts)
    if reason is HangReason.HEARTBEAT:
        rank.touch(T0)
    if section:
        rank.section_start(section, T0)
    with open(tmp_path / "ckpt", "wb") as handle:
        while True:
            expiry = _to_deadline(slow, rank, handle)
            assert (expiry.reason, expiry.section) == (reason, section)
            if not slow.extend(rank, expiry, expiry.deadline):
                break
            assert rank.next_deadline().deadline == pytest.approx(expiry.deadline + 1.0)  # one look interval on
    assert expiry.deadline == pytest.approx(T0 + 3 * 4.0)  # the default cap: 3 x the timeout from its start
    assert records == [DeadlineExtended(time=records[0].time, rank=1, pid=os.getpid(), reason=reason,
                                        section=section or "", timeout=4.0, bytes=64 << 10, cap=3.0)]


def test_no_progress_or_no_look_is_judged_at_the_deadline(storage, tmp_path):
    slow, records = storage
    rank = _rank(subsequent=4.0)
    rank.touch(T0)
    with open(tmp_path / "ckpt", "wb") as handle:  # open, written before the look, then still
        handle.write(b"x")
        handle.flush()
        expiry = _to_deadline(slow, rank)
        assert not slow.extend(rank, expiry, expiry.deadline)
    fresh = _rank(subsequent=4.0)
    fresh.touch(T0)  # the monitor did not look (it woke only at the deadline): no baseline, no extension
    assert not slow.extend(fresh, fresh.next_deadline(), T0 + 4.0)
    assert records == []


def test_a_heartbeat_starts_a_new_watch_and_io_progress_cap_none_turns_extensions_off(storage, tmp_path):
    slow, _records = storage
    rank = _rank(subsequent=4.0)
    rank.touch(T0)
    with open(tmp_path / "ckpt", "wb") as handle:
        expiry = _to_deadline(slow, rank, handle)
        assert slow.extend(rank, expiry, expiry.deadline)
        rank.touch(T0 + 4.5)  # the save ended: a heartbeat; the next deadline is the plain timeout again
        assert rank.next_deadline().deadline == T0 + 8.5
        assert rank.io_watch(rank.next_deadline()).look is None
        slow.cfg.io_progress_cap = None
        expiry = _to_deadline(slow, rank, handle)
        assert not slow.extend(rank, expiry, expiry.deadline)


def test_a_compile_inside_an_extended_section_keeps_the_extension(storage, tmp_path):
    slow, _records = storage
    rank = _rank(sections={"checkpointing": 4.0})
    rank.cfg.compile_timeout = 30.0
    rank.section_start("checkpointing", T0)
    with open(tmp_path / "ckpt", "wb") as handle:
        expiry = _to_deadline(slow, rank, handle)
        assert slow.extend(rank, expiry, expiry.deadline)  # to T0 + 5
    rank.section_start("compile", T0 + 4.5)
    rank.section_end("compile", T0 + 14.5)  # 10 s paused
    assert rank.next_deadline().deadline == T0 + 15.0
    rank.section_end("checkpointing", T0 + 15.0)
    rank.section_start("checkpointing", T0 + 20)  # the next save starts unextended
    assert rank.next_deadline().deadline == T0 + 24.0
