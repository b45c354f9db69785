"""No false kills: a healthy job is never declared hung, and a true hang still is.

Each test starts a real monitor and real torch-free ranks (``core_workers/swarm.py``
forks them from one interpreter, each with its own client and connection), makes
the situation happen for real -- a stopped monitor, a flat-out load on this
2-core machine, a monitor that reads slowly, a slow start-up, bad timeouts on
the wire -- and checks which ranks were signalled. A true hang in each situation
must be caught, never early (``elapsed >= timeout`` on the monitor's clock); how
late is printed, not asserted, since it depends on the machine's load.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import time

import pytest
from helpers import REPO_ROOT, kill_group, python_env, spawn_python, wait_for
from launcher_helpers import LauncherGroup, exit_event

from ft_core.protocol import Ack, FrameDecoder, Hello, HelloAck, UpdateTimeouts, recv_msg, send_msg

SWARM = os.path.join(REPO_ROOT, "tests", "integration", "core_workers", "swarm.py")
pytestmark = pytest.mark.timeout(240)
KILLED = -signal.SIGKILL


@pytest.fixture
def swarm():
    """``swarm(monitor, n, *train_options)``: n ranks training against ``monitor`` (see swarm.py)."""
    procs = []

    def start(monitor, ranks, *options):
        proc = spawn_python([SWARM, "--ranks", str(ranks), *map(str, options)],
                            env=python_env(FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path,
                                           FT_MONITOR_TOKEN=monitor.token),
                            stdout=-1, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        kill_group(proc)
        proc.stdout.close()


def _exits(proc, timeout: float = 180) -> dict[int, int]:
    """Each rank's exit code (``-9``: killed by the monitor)."""
    out, _ = proc.communicate(timeout=timeout)
    return {int(rank): code for rank, code in json.loads(out.splitlines()[-1])["exits"].items()}


def _events(monitor, name: str) -> list[dict]:
    return [e for e in monitor.events() if e["event"] == name]


def _the_hang(monitor, rank: int, reason: str) -> dict:
    """The one hang of the run: ``rank`` for ``reason``, not early; prints how late it was caught."""
    hangs = _events(monitor, "hang_detected")
    assert [(h["rank"], h["reason"]) for h in hangs] == [(rank, reason)], hangs
    hang = hangs[0]
    assert hang["elapsed"] >= hang["timeout"]  # never early
    print(f"rank {rank} {reason} hang detected {1e3 * (hang['detected_time'] - hang['deadline_time']):.1f} ms "
          f"after its deadline ({hang['elapsed']:.3f} s > {hang['timeout']} s)")
    return hang


def _report(directory, rank: int) -> dict:
    with open(directory / f"rank{rank}.json") as handle:
        return json.load(handle)


def _stop(pid: int, seconds: float) -> None:
    """The stimulus itself: the monitor process does not run for ``seconds``."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_stopped_monitor_blames_no_rank_and_still_catches_a_hang(start_monitor, swarm, tmp_path):
    """Situation 1: the monitor is stopped for twice the timeout while 4 ranks heartbeat and step."""
    timeout = 1.0
    monitor = start_monitor(initial_rank_heartbeat_timeout=30, rank_heartbeat_timeout=2 * timeout,
                            rank_section_timeouts={"step": timeout})
    proc = swarm(monitor, 5, "--interval", 0.02, "--duration", 4, "--report-dir", tmp_path,
                 "--hang-rank", 4, "--hang-after", 0.5, "--hang-in", "step")
    wait_for((tmp_path / "rank4.json").exists, 60, "the ranks to train and rank 4 to hang")
    _stop(monitor.pid, 2 * timeout)

    assert _exits(proc) == {0: 0, 1: 0, 2: 0, 3: 0, 4: KILLED}
    hang = _the_hang(monitor, 4, "section")
    assert hang["iteration"] == _report(tmp_path, 4)["iteration"]
    # The stop was measured and granted to every timed rank, and said so.
    late = max(_events(monitor, "monitor_late"), key=lambda e: e["late"])
    assert late["late"] >= timeout and late["grace"] == late["late"]
    assert set(late["ranks"]) >= {0, 1, 2, 3}


def test_64_ranks_flat_out_on_two_cores_no_false_kill(start_monitor, swarm):
    """Situation 1 under load: 64 ranks step and heartbeat flat out for 10 s; one hangs half way."""
    timeout = 2.0
    monitor = start_monitor(initial_rank_heartbeat_timeout=60, rank_heartbeat_timeout=2 * timeout,
                            rank_section_timeouts={"step": timeout})
    proc = swarm(monitor, 64, "--interval", 0, "--duration", 10, "--hang-rank", 0, "--hang-after", 5)
    assert _exits(proc) == {0: KILLED, **{rank: 0 for rank in range(1, 64)}}
    _the_hang(monitor, 0, "section")


def test_slow_reading_monitor_and_full_buffers_lose_no_state(start_monitor, swarm, tmp_path):
    """Situation 2: ranks write flat out into a monitor that is stopped most of the time.

    Buffers fill, heartbeats are coalesced, and the last ``end_section`` of each
    healthy rank is written while the monitor is stopped and the rank then makes
    no call for 2 s (untracked work): it must still reach the monitor (step
    timeout 1 s). The hung rank's last section end must have arrived too: it is
    caught for out-of-section time, at the iteration it last reported.
    """
    monitor = start_monitor(initial_rank_heartbeat_timeout=30, rank_heartbeat_timeout=4.0,
                            rank_section_timeouts={"step": 1.0}, rank_out_of_section_timeout=3.0)
    proc = swarm(monitor, 5, "--interval", 0, "--duration", 3, "--tail", 2, "--report-dir", tmp_path,
                 "--hang-rank", 4, "--hang-after", 1, "--hang-in", "out_of_section")
    wait_for((tmp_path / "rank4.json").exists, 60, "rank 4 to hang, 1 s into training")
    for _ in range(3):  # t = 1.0 .. 2.8 s of training: the monitor runs 1/3 of the time
        _stop(monitor.pid, 0.4)
        time.sleep(0.2)
    _stop(monitor.pid, 0.8)  # t = 2.8 .. 3.6 s: the ranks' last steps end while nothing is read

    assert _exits(proc) == {0: 0, 1: 0, 2: 0, 3: 0, 4: KILLED}
    hang = _the_hang(monitor, 4, "out_of_section")
    assert hang["iteration"] == _report(tmp_path, 4)["iteration"]
    assert all(_report(tmp_path, rank)["coalesced"] > 0 for rank in range(4))  # the buffers were full


def test_start_up_longer_than_out_of_section_timeout_is_not_killed(start_monitor, swarm):
    """Situation 4: out-of-section time is not enforced before the first section."""
    timeout = 1.0
    monitor = start_monitor(initial_rank_heartbeat_timeout=10, rank_heartbeat_timeout=None,
                            rank_section_timeouts={"step": 5.0}, rank_out_of_section_timeout=timeout)
    proc = swarm(monitor, 2, "--startup", 2 * timeout, "--interval", 0.02, "--duration", 1.5,
                 "--hang-rank", 1, "--hang-after", 0.5, "--hang-in", "out_of_section")
    assert _exits(proc) == {0: 0, 1: KILLED}
    _the_hang(monitor, 1, "out_of_section")


def _state(subsequent=10.0, step=10.0, out_of_section=10.0) -> dict:
    return {"current_timeouts": {
        "heartbeat": {"initial": 30.0, "subsequent": subsequent, "were_calculated": True},
        "section": {"section": {"step": step}, "out_of_section": out_of_section,
                    "calculated_sections": ["step"], "is_out_of_section_calculated": True}}}


BAD_VALUES = ["10", math.nan, math.inf, 0, -1, [1.0], True]


def _bad_states():
    for value in BAD_VALUES:
        yield "heartbeat.subsequent", _state(subsequent=value)
        yield "section.section.step", _state(step=value)
        yield "section.out_of_section", _state(out_of_section=value)
    yield "heartbeat", {"current_timeouts": {"heartbeat": 5, "section": {}}}


def _refused(sock, decoder, key: str) -> None:
    """The monitor answered Ack(ok=False) naming ``key``, then closed the connection."""
    reply = recv_msg(sock, decoder, 10)
    assert isinstance(reply, Ack) and not reply.ok and f"current_timeouts.{key}" in reply.error, reply
    assert sock.recv(1) == b""


def test_bad_timeouts_refuse_only_that_client(start_monitor, swarm):
    """Situation 5: invalid timeouts in Hello or UpdateTimeouts: a clear error for that client only."""
    monitor = start_monitor(initial_rank_heartbeat_timeout=30, rank_heartbeat_timeout=2.0,
                            rank_section_timeouts={"step": 1.0})
    proc = swarm(monitor, 2, "--interval", 0.02, "--duration", 4, "--hang-rank", 1, "--hang-after", 0.3)
    wait_for(lambda: len(_events(monitor, "rank_connected")) == 2, 60, "the watched ranks to connect")
    refused = 0
    for rank, (key, state) in enumerate(_bad_states(), start=100):
        for in_hello in (True, False):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(monitor.socket_path)
                decoder = FrameDecoder()
                if in_hello:
                    send_msg(sock, Hello(token=monitor.token, rank=rank, timeouts=state))
                else:
                    send_msg(sock, Hello(token=monitor.token, rank=rank))
                    assert isinstance(recv_msg(sock, decoder, 10), HelloAck)
                    send_msg(sock, UpdateTimeouts(state))
                _refused(sock, decoder, key)
                refused += 1
    assert monitor.is_alive()
    # The other ranks were watched all along: the healthy one finished, the hung one was caught.
    assert _exits(proc) == {0: 0, 1: KILLED}
    _the_hang(monitor, 1, "section")
    # Every refused client got its error (checked above); the records of a burst are rate-limited
    # (at most 20 per 10 s, the rest counted in the next record), so not every one is in the log.
    assert min(refused, 20) <= len(_events(monitor, "connection_rejected")) <= refused


def test_launcher_logs_and_summarises_a_late_monitor(tmp_path):
    """``ft_launcher`` copies ``monitor_late`` to its event log and counts it in its summary."""
    with LauncherGroup(tmp_path) as group:
        launcher = group.start(nproc=1, FT_TEST_STEPS="60", FT_TEST_STEP_TIME="0.05")
        monitor_pid = launcher.wait_event("launcher_started", 120)[0]["monitor_pid"]
        wait_for(lambda: group.worker_records("first_heartbeat"), 120, "the worker's first heartbeat")
        _stop(monitor_pid, 1.0)
        assert launcher.wait(120) == 0
        assert exit_event(launcher)["exit_code"] == 0
        (late,) = launcher.events("monitor_late")
        assert late["late"] >= 0.5 and late["ranks"] == [0]
        assert "monitor    : late 1 times" in launcher.output()
