"""The JSON-lines event files (ft_core.event_file): a record per line beside other writers, readers that tail
from an offset and skip what they cannot read."""

from __future__ import annotations

import json
import os

import msgspec

from ft_core import event_file as ef
from ft_core import events as ev

#: A large record: a hang with its stack.
HANG = ev.HangDetected(time=2.5, rank=1, pid=12, reason=ev.HangReason.SECTION, section="step", elapsed=5.012,
                       timeout=5.0, iteration=7, open_sections=["outer", "step"], deadline_time=2.49,
                       detected_time=2.5, stack_dump_file="/job/stacks/rank1_pid12.txt",
                       stack="Current thread 0x1 (most recent call first):\n  File \"t.py\", line 3 in f\n" * 20)


def test_a_writer_without_node_writes_none_and_a_launcher_writer_stamps_it(tmp_path):
    monitor_file, launcher_file = str(tmp_path / "m.jsonl"), str(tmp_path / "l.jsonl")
    record = ev.RankConnected(time=1.0, rank=0, local_rank=0, pid=1, restart_count=0)
    with ef.EventWriter(monitor_file) as out:
        out.write(record)
    with ef.EventWriter(launcher_file, node="host:9") as out:
        assert out.write(record).node == "host:9"
    assert "node" not in ef.read_events(monitor_file)[0][0]
    assert ef.read_events(launcher_file)[0][0]["node"] == "host:9"


def test_a_partial_last_line_waits_for_the_next_read(tmp_path):
    path = tmp_path / "events.jsonl"
    first = ev.MonitorStarted(time=1.0, pid=1, socket="s")
    second = ev.RankTerminated(time=2.0, rank=0, pid=2, signal="SIGKILL")
    with ef.EventWriter(str(path)) as out:
        out.write(first)
    whole = path.read_bytes()
    line = json.dumps({"event": "rank_terminated", "time": 2.0, "rank": 0, "pid": 2, "signal": "SIGKILL"})
    with open(path, "ab") as handle:
        handle.write(line[:20].encode())  # a writer caught mid-line
    records, offset = ef.read_records(str(path))
    assert records == [first] and offset == len(whole)
    assert ef.read_events(str(path)) == ([json.loads(whole)], len(whole))
    with open(path, "ab") as handle:
        handle.write(line[20:].encode() + b"\n")
    records, offset = ef.read_records(str(path), offset)
    assert records == [second] and offset == path.stat().st_size
    assert ef.read_records(str(path), offset) == ([], offset)


def test_unknown_and_corrupt_lines_are_skipped_not_fatal(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    good = ev.Progress(time=1.0, iteration=1, source="file", cycle=0)
    path.write_bytes(b'{"event": "from_a_newer_version", "time": 1}\n'
                     b"not json at all\n"
                     b'{"event": "progress", "time": 1.0, "iteration": "NaN", "source": "x", "cycle": 0}\n'
                     b"[1, 2]\n"
                     b'{"event": "progress", "time": 1.0, "iteration": 1, "source": "file", "cycle": 0, "new": 1}\n')
    assert ef.read_records(str(path))[0] == [good]  # unknown extra fields are fine
    assert [e["event"] for e in ef.read_events(str(path))[0]] == ["from_a_newer_version", "progress", "progress"]
    assert "skipping" in caplog.text


def test_a_torn_line_costs_only_its_own_record_even_for_a_writer_that_had_the_file_open(tmp_path):
    # A writer SIGKILLed mid-write() leaves part of its record (no newline); the monitor, whose
    # writer opened the file before, appends its next record: that record must stay readable.
    path = tmp_path / "events.jsonl"
    first = ev.MonitorStarted(time=1.0, pid=1, socket="s")
    after = ev.RankTerminated(time=2.0, rank=0, pid=2, signal="SIGKILL")
    torn = json.dumps({"event": "checkpoint_loaded", "time": 1.5, "path": "x" * 100})[:40].encode()
    with ef.EventWriter(str(path)) as monitor:
        monitor.write(first)
        with open(path, "ab") as killed:
            killed.write(torn)
        monitor.write(after)
    assert ef.read_records(str(path)) == ([first, after], path.stat().st_size)
    assert [e["event"] for e in ef.read_events(str(path))[0]] == ["monitor_started", "rank_terminated"]


def test_the_reader_skips_a_torn_line_and_blank_lines_and_reads_the_good_one_after(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    good = ev.Progress(time=1.0, iteration=1, source="file", cycle=0)
    path.write_bytes(b'\n{"event": "checkpoint_loaded", "time": 1.5, "pa\n\n' + msgspec.json.encode(good) + b"\n\n")
    assert ef.read_records(str(path)) == ([good], path.stat().st_size)
    assert ef.read_events(str(path))[0] == [msgspec.to_builtins(good)]
    assert "skipping" in caplog.text


def test_reading_a_missing_file_returns_nothing(tmp_path):
    assert ef.read_records(str(tmp_path / "none.jsonl"), 5) == ([], 5)
    assert ef.read_events(str(tmp_path / "none.jsonl")) == ([], 0)


def test_each_record_is_one_write_of_a_whole_line(tmp_path, monkeypatch):
    path = str(tmp_path / "events.jsonl")
    writes: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    with ef.EventWriter(path) as out:
        monkeypatch.setattr(os, "write", spy)
        out.write(HANG)  # a large record: a hang with its stack
        monkeypatch.undo()
    # On a fresh line of its own: whatever a killed writer left unfinished before it cannot swallow it.
    assert len(writes) == 1 and writes[0].startswith(b"\n") and writes[0].endswith(b"\n")
    assert writes[0].count(b"\n") == 2
    assert open(path, "rb").read() == writes[0]


