"""Slow storage is not a hang, in every mode; storage progress is the evidence, not any I/O.

Real rank processes (``core_workers/rank.py save``) write real files in ``tmp_path`` at a slow
filesystem's pace (64 KiB every 0.1 s), themselves or from a forked async writer, while the
monitor's deadline passes; beside each, the same situation hung, caught at its timeout.
"""

from __future__ import annotations

import pytest
from helpers import killed

pytestmark = pytest.mark.timeout(120)

#: Heartbeats mode (the client's and Lightning's default: ``FaultToleranceCallback()``); sections
#: mode (heartbeats off, as Megatron-LM's recipe); out-of-section time (sections, heartbeats off).
HEARTBEATS = {"rank_heartbeat_timeout": 1.0}
SECTIONS = {"initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None,
            "rank_section_timeouts": "checkpointing:1.0"}
OUT_OF_SECTION = {"initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None,
                  "rank_section_timeouts": "step:none", "rank_out_of_section_timeout": 1.0}
MODES = {"heartbeats": (HEARTBEATS, "heartbeat", "checkpointing"), "sections": (SECTIONS, "section", "checkpointing"),
         "out_of_section": (OUT_OF_SECTION, "out_of_section", "")}


def _save(ranks, monitor, rank, tmp_path, seconds, *options):
    return ranks(monitor, "save", rank=rank, extra=["--beats", "2", "--write-to", str(tmp_path / f"ckpt{rank}"),
                                                    "--write-seconds", str(seconds), *options])


def _hangs(monitor):
    return {e["rank"]: e for e in monitor.events() if e["event"] == "hang_detected"}


def _extended(monitor):
    return sorted(e["rank"] for e in monitor.events() if e["event"] == "deadline_extended")


def test_a_steady_8s_save_in_heartbeats_mode_is_not_killed_and_a_stalled_one_is(start_monitor, ranks, tmp_path):
    # Lightning's default mode; the 3 s heartbeat timeout stands for one learned from 0.5 s saves (issue 34:
    # such a save on a slow filesystem, writing steadily for 8 s, was killed at 3 s). Cap: 3 x 3 s.
    monitor = start_monitor(rank_heartbeat_timeout=3.0)
    steady = _save(ranks, monitor, 0, tmp_path, 8.0, "--section", "")
    stalled = _save(ranks, monitor, 1, tmp_path, 1.0, "--section", "", "--then", "hang")
    assert steady.wait(timeout=60) == 0, steady.stderr.read()
    assert killed(stalled)
    hangs = _hangs(monitor)
    assert sorted(hangs) == [1]
    assert (hangs[1]["reason"], hangs[1]["timeout"]) == ("heartbeat", 3.0)
    assert hangs[1]["elapsed"] < 3.0 + 0.75  # at its timeout: its writing stopped before the monitor's look
    extended = [e for e in monitor.events() if e["event"] == "deadline_extended"]
    assert [(e["rank"], e["reason"], e["section"], e["cap"]) for e in extended] == [(0, "heartbeat", "", 3.0)]


@pytest.mark.parametrize("mode", ["heartbeats", "sections", "out_of_section"])
def test_a_save_past_the_deadline_is_extended_and_a_hung_one_is_caught(start_monitor, ranks, tmp_path, mode):
    cfg, reason, section = MODES[mode]
    monitor = start_monitor(**cfg)
    slow = _save(ranks, monitor, 0, tmp_path, 2.0, "--section", section)
    hung = _save(ranks, monitor, 1, tmp_path, 0, "--section", section)  # hung with no I/O
    assert slow.wait(timeout=60) == 0, slow.stderr.read()
    assert killed(hung)
    hangs = _hangs(monitor)
    assert sorted(hangs) == [1]
    assert hangs[1]["reason"] == reason and hangs[1]["elapsed"] < 2.0
    assert _extended(monitor) == [0]


@pytest.mark.parametrize("mode", ["heartbeats", "sections"])
def test_a_hung_rank_whose_logging_thread_writes_is_caught_at_its_timeout(start_monitor, ranks, tmp_path, mode):
    # rchar/wchar count pipes, ttys and log files alike: a hung rank that logs was extended to the cap.
    # Its stdout (a pipe), its stdout redirected to a file (torchrun --redirects, tee), a log file in append mode.
    cfg, reason, _section = MODES[mode]
    monitor = start_monitor(**cfg)
    procs = [_save(ranks, monitor, rank, tmp_path, 0, "--chatter", chatter, "--chatter-file", str(tmp_path / f"log{rank}"))
             for rank, chatter in enumerate(("stdout", "stdout-file", "log"))]
    assert all(killed(proc) for proc in procs)
    hangs = _hangs(monitor)
    assert sorted(hangs) == [0, 1, 2]
    assert all(h["reason"] == reason and h["elapsed"] < 2.0 for h in hangs.values())  # timeout 1 s, cap 3 s
    assert _extended(monitor) == []
    assert (tmp_path / "log1").stat().st_size > 0 and (tmp_path / "log2").stat().st_size > 0  # they did write


@pytest.mark.parametrize("mode", ["heartbeats", "sections"])
def test_an_async_writer_child_that_keeps_writing_keeps_its_rank_alive(start_monitor, ranks, tmp_path, mode):
    # Megatron's async save, torch DCP's process-based async save: the bytes are written by a child process
    # (uncounted by the rank's /proc/<pid>/io). The rank waits for it; a hung child is a hung save.
    cfg, reason, section = MODES[mode]
    monitor = start_monitor(**cfg)
    writing = _save(ranks, monitor, 0, tmp_path, 2.0, "--section", section, "--writer", "child")
    hung = _save(ranks, monitor, 1, tmp_path, 0, "--section", section, "--writer", "child")
    assert writing.wait(timeout=60) == 0, writing.stderr.read()
    assert killed(hung)
    hangs = _hangs(monitor)
    assert sorted(hangs) == [1]
    assert hangs[1]["reason"] == reason and hangs[1]["elapsed"] < 2.0
    assert _extended(monitor) == [0]


def test_slow_storage_extends_a_save_up_to_the_cap_and_hangs_are_still_caught(start_monitor, ranks, tmp_path):
    # checkpointing 1 s, the default cap (3x). Three saves at once: a slow writer that ends after 2 s
    # (past its timeout, under the cap), a save hung with no I/O, and a writer that never ends.
    monitor = start_monitor(**SECTIONS)
    slow, hung, endless = (_save(ranks, monitor, rank, tmp_path, seconds) for rank, seconds in ((0, 2.0), (1, 0), (2, -1)))
    assert slow.wait(timeout=60) == 0, slow.stderr.read()
    assert killed(hung) and killed(endless)
    events = monitor.events()
    hangs = _hangs(monitor)
    assert sorted(hangs) == [1, 2]
    assert hangs[1]["elapsed"] < 2.0  # no I/O: at its timeout, as before
    assert 3.0 <= hangs[2]["elapsed"] < 4.5  # moving bytes: at the cap, 3 x 1 s
    assert all((h["reason"], h["section"], h["timeout"]) == ("section", "checkpointing", 1.0) for h in hangs.values())
    extended = [e for e in events if e["event"] == "deadline_extended"]
    assert sorted(e["rank"] for e in extended) == [0, 2]  # one event per save, none for the hung one
    assert all(e["section"] == "checkpointing" and e["bytes"] > 0 and e["cap"] == 3.0 for e in extended)
