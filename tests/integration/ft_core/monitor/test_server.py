"""The node monitor with real processes and real Unix sockets (the rank client alone: tests/*/ft_core/test_client.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct

import pytest
from helpers import kill_group, killed, python_env, spawn_python, wait_for, wait_for_event

from ft_core.config import FaultToleranceConfig
from ft_core.event_file import read_events
from ft_core.protocol import FrameDecoder, Heartbeat, Hello, encode, recv_msg, send_msg

pytestmark = pytest.mark.timeout(120)


def test_socket_dir_and_token_file_are_private(start_monitor):
    monitor = start_monitor()
    job_dir = os.path.dirname(monitor.socket_path)
    assert stat.S_IMODE(os.stat(job_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(monitor.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(monitor.socket_path + ".token").st_mode) == 0o600
    assert [e["event"] for e in monitor.events()] == ["monitor_started"]


def test_missing_first_heartbeat_kills(start_monitor, ranks):
    monitor = start_monitor(initial_rank_heartbeat_timeout=1.0, rank_heartbeat_timeout=None)
    proc = ranks(monitor, "no_first_heartbeat")
    assert killed(proc)
    event = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert event["reason"] == "initial_heartbeat"
    assert event["pid"] == proc.pid
    assert event["elapsed"] >= 1.0


def test_heartbeat_gap_kills_after_stack_dump_naming_the_function(start_monitor, ranks):
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    proc = ranks(monitor, "heartbeat_gap")
    assert killed(proc)
    events = read_events(monitor.events_path)[0]
    names = [e["event"] for e in events]
    hang = next(e for e in events if e["event"] == "hang_detected")
    assert hang["reason"] == "heartbeat"
    assert hang["iteration"] == 4  # the last iteration the rank reported
    # The dump was taken before the kill and shows where the rank was stuck.
    assert names.index("hang_detected") < names.index("rank_terminated")
    assert "hang_without_heartbeat" in hang["stack"]
    with open(hang["stack_dump_file"]) as handle:
        assert "hang_without_heartbeat" in handle.read()


def test_nvrx_termination_signal_sigusr2_still_dumps_the_stack_before_it_ends_the_rank(start_monitor, ranks):
    # NVRx's --ft-rank-termination-signal SIGUSR2: the dump moves to SIGUSR1 (the default was SIGUSR2).
    monitor = start_monitor(rank_heartbeat_timeout=1.0, rank_termination_signal="SIGUSR2")
    proc = ranks(monitor, "heartbeat_gap")
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGUSR2
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert "hang_without_heartbeat" in hang["stack"]


def test_step_section_timeout_kills_while_another_section_is_open(start_monitor, ranks):
    # The rank hangs in its fourth step, a warm-up step: nothing but the configured step timeout is set.
    monitor = start_monitor(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
                            rank_section_timeouts="outer:none,step:1.0")
    proc = ranks(monitor, "step_in_other_section")
    assert killed(proc)
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert (hang["reason"], hang["section"]) == ("section", "step")
    assert hang["open_sections"] == ["outer", "step"]
    assert "hang_in_step" in hang["stack"]


def test_warmup_steps_are_not_timed(start_monitor, ranks):
    # Three 0.3 s steps against a 0.2 s step timeout: only warm-up saves them.
    monitor = start_monitor(rank_heartbeat_timeout=None, rank_section_timeouts="outer:none,step:0.2",
                            num_warmup_iterations=3)
    proc = ranks(monitor, "step_in_other_section", extra=["--interval", "0.3"])
    assert killed(proc)
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    # Killed in the fourth step (hang_in_step), not in one of the three slow warm-up steps.
    assert "hang_in_step" in hang["stack"]


# -- the default warm-up (5 steps, as NVRx): later detection in those steps, never an extra kill ----------


#: The config default (NVRx's), which the start_monitor fixture leaves alone.
DEFAULT_WARMUP = FaultToleranceConfig().num_warmup_iterations


def test_default_warmup_does_not_kill_slow_first_steps(start_monitor, ranks):
    # Five steps longer than the step timeout (compilation, data-loader start), then fast ones: healthy.
    monitor = start_monitor(rank_heartbeat_timeout=None, rank_section_timeouts="step:0.5")
    proc = ranks(monitor, "steps", extra=["--step-times", "0.8,0.8,0.8,0.8,0.8,0.05,0.05,0.05"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["cfg"]["num_warmup_iterations"] == 5
    assert not [e for e in monitor.events() if e["event"] == "hang_detected"]


def test_default_warmup_still_catches_a_hang_in_the_first_timed_step(start_monitor, ranks):
    monitor = start_monitor(rank_heartbeat_timeout=None, rank_section_timeouts="step:0.5")
    proc = ranks(monitor, "steps", extra=["--step-times", "0.05,0.05,0.05,0.05,0.05", "--then", "hang"])
    assert killed(proc)
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert (hang["reason"], hang["section"], hang["timeout"]) == ("section", "step", 0.5)


def test_a_hang_in_a_warmup_step_is_caught_by_the_heartbeat_timeout(start_monitor, ranks):
    # The step timeout does not apply in warm-up (its fallback, the 3600 s start-up budget, does); the
    # heartbeat timeout still does: later, not never.
    monitor = start_monitor(rank_heartbeat_timeout=2.0, rank_section_timeouts="step:0.5")
    proc = ranks(monitor, "steps", extra=["--then", "hang"])
    assert killed(proc)
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert (hang["reason"], hang["open_sections"]) == ("heartbeat", ["step"])
    assert hang["elapsed"] >= 2.0


# -- every warm-up step is timed: sections mode, heartbeats off (the demo's recipe, the Megatron path) --------


def test_a_hang_in_any_warmup_step_of_a_fresh_or_restarted_cycle_is_caught(start_monitor, ranks):
    # Default warm-up (5 steps). Before the fix a step that hangs in warm-up was never timed.
    monitor = start_monitor(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
                            rank_section_timeouts="step:0.5", rank_out_of_section_timeout=1.5)
    for cycle in range(2):  # a fresh cycle, then a restarted one (the monitor's warm-up starts over)
        procs = [ranks(monitor, "steps", rank=k, restart_count=cycle,
                       extra=["--beats", "0", "--step-times", ",".join(["0.05"] * k), "--then", "hang"])
                 for k in range(DEFAULT_WARMUP)]  # rank k hangs in warm-up step k
        for proc in procs:
            assert killed(proc)
    hangs = [e for e in monitor.events() if e["event"] == "hang_detected"]
    assert sorted((h["rank"], h["iteration"]) for h in hangs) == sorted(
        (k, k) for k in range(DEFAULT_WARMUP) for _cycle in range(2))
    # Timed by the out-of-section timeout (the larger budget), not by the 0.5 s step timeout.
    assert {(h["reason"], h["section"], h["timeout"]) for h in hangs} == {("section", "step", 1.5)}


def test_a_slow_healthy_warmup_step_is_not_killed_in_sections_mode(start_monitor, ranks):
    # The twin: a first step three times the step timeout (a compile), then fast steps: healthy.
    monitor = start_monitor(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
                            rank_section_timeouts="step:0.5", rank_out_of_section_timeout=3.0)
    proc = ranks(monitor, "steps", extra=["--beats", "0", "--step-times", "1.5,0.05,0.05,0.05,0.05,0.05,0.05"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not [e for e in monitor.events() if e["event"] == "hang_detected"]


def test_out_of_section_timeout_kills(start_monitor, ranks):
    monitor = start_monitor(rank_heartbeat_timeout=None, rank_section_timeouts="step:none",
                            rank_out_of_section_timeout=1.0)
    proc = ranks(monitor, "out_of_section")
    assert killed(proc)
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert hang["reason"] == "out_of_section"


def test_explicit_shutdown_is_neverkilled(start_monitor, ranks):
    monitor = start_monitor(initial_rank_heartbeat_timeout=0.5, rank_heartbeat_timeout=0.5)
    proc = ranks(monitor, "shutdown_then_idle", IDLE_AFTER_SHUTDOWN="2")
    proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()
    events = read_events(monitor.events_path)[0]
    assert not [e for e in events if e["event"] == "hang_detected"]
    assert [e["graceful"] for e in events if e["event"] == "rank_disconnected"] == [True]


def test_ranks_reconnect_over_three_cycles(start_monitor, ranks):
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    for cycle in range(3):
        healthy = ranks(monitor, "finish", rank=0, restart_count=cycle)
        hung = ranks(monitor, "heartbeat_gap", rank=1, restart_count=cycle)
        assert healthy.wait(timeout=60) == 0
        assert killed(hung)
    events = read_events(monitor.events_path)[0]
    connected = [(e["rank"], e["restart_count"]) for e in events if e["event"] == "rank_connected"]
    assert sorted(connected) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    hangs = [e for e in events if e["event"] == "hang_detected"]
    assert [e["rank"] for e in hangs] == [1, 1, 1]


def _raw_connection(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.settimeout(10)
    return sock


def _closed_by_peer(sock) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bad_peers_are_dropped_and_healthy_rank_still_watched(start_monitor, ranks, tmp_path):
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    ready = tmp_path / "ready"
    healthy = ranks(monitor, "heartbeat_gap", extra=["--ready-file", str(ready), "--beats", "40"])
    wait_for(ready.exists, 60, "the healthy rank to connect")

    wrong_token = _raw_connection(monitor.socket_path)
    send_msg(wrong_token, Hello(token="wrong", rank=7))
    garbage = _raw_connection(monitor.socket_path)
    garbage.sendall(os.urandom(64) + b"\x00" * 8)
    oversized = _raw_connection(monitor.socket_path)
    oversized.sendall(struct.pack(">I", 1 << 30))
    no_hello = _raw_connection(monitor.socket_path)
    send_msg(no_hello, Heartbeat())
    half_frame = _raw_connection(monitor.socket_path)
    half_frame.sendall(encode(Hello(token=monitor.token, rank=8))[:5])
    half_frame.close()  # abrupt disconnect mid-frame

    for sock in (wrong_token, garbage, oversized, no_hello):
        assert _closed_by_peer(sock)
        sock.close()
    reasons = [e["reason"] for e in read_events(monitor.events_path)[0] if e["event"] == "connection_rejected"]
    assert any("token" in r for r in reasons)
    assert any("exceeds the limit" in r for r in reasons)

    # The monitor survived all of that and still catches the healthy rank's hang.
    assert killed(healthy)
    assert wait_for_event(monitor.events_path, 10, event="hang_detected")["rank"] == 0
    assert monitor.is_alive()


def test_valid_handshake_gets_the_config(start_monitor):
    monitor = start_monitor(rank_heartbeat_timeout=7.0)
    sock = _raw_connection(monitor.socket_path)
    decoder = FrameDecoder()
    send_msg(sock, Hello(token=monitor.token, rank=3))
    reply = recv_msg(sock, decoder, 10)
    assert reply.config["rank_heartbeat_timeout"] == 7.0
    sock.close()


def test_monitor_dies_with_its_parent(tmp_path):
    code = (
        "import os, sys\n"
        "from ft_core.config import FaultToleranceConfig\n"
        "from ft_core.monitor import RankMonitorServer\n"
        f"m = RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), {str(tmp_path / 'm.sock')!r})\n"
        "print(m.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    parent = spawn_python(["-c", code], env=python_env(), stdout=-1, text=True)
    try:
        monitor_pid = int(parent.stdout.readline())
        parent.wait(timeout=30)
        wait_for(lambda: not _pid_alive(monitor_pid), 30, "the orphaned monitor to exit")
    finally:
        kill_group(parent)
        parent.stdout.close()


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_tight_fallback_does_not_kill_a_slow_rank_when_the_launch_set_the_default(start_monitor, ranks):
    # The launch set rank_heartbeat_timeout to its default on purpose; a rank's training config
    # asks for 0.3 s. Heartbeats 0.8 s apart are healthy under the launch's value: no kill.
    monitor = start_monitor(rank_heartbeat_timeout=2700.0)
    proc = ranks(monitor, "finish", extra=["--beats", "3", "--interval", "0.8",
                                           "--fallback", json.dumps({"rank_heartbeat_timeout": 0.3})])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["cfg"]["rank_heartbeat_timeout"] == 2700.0
    assert "hang_detected" not in [e["event"] for e in monitor.events()]


def test_fallback_timeout_kills_a_hung_rank_when_the_launch_did_not_set_it(start_monitor, ranks):
    monitor = start_monitor()  # rank_heartbeat_timeout not set: the rank's value applies
    proc = ranks(monitor, "heartbeat_gap", extra=["--fallback", json.dumps({"rank_heartbeat_timeout": 1.0})])
    assert killed(proc)
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert (hang["reason"], hang["timeout"], hang["pid"]) == ("heartbeat", 1.0, proc.pid)


def test_megatron_iteration_is_reported_with_heartbeats(start_monitor, ranks):
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    # Megatron-LM (not installed here) keeps curr_iteration in its global args; the rank script
    # stands in a module of that name and shape, set up before init as Megatron-LM does.
    proc = ranks(monitor, "megatron_heartbeat_gap")
    assert killed(proc)
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert hang["reason"] == "heartbeat"
    assert hang["iteration"] == 104  # the value of args.curr_iteration at the last heartbeat


def test_monitor_runs_as_a_batch_task_so_its_wakeups_never_preempt_ranks(start_monitor):
    monitor = start_monitor()
    assert os.sched_getscheduler(monitor.pid) == os.SCHED_BATCH


def test_a_stalled_log_filesystem_delays_neither_the_kill_nor_the_record(tmp_path, ranks, monkeypatch):
    # The copy of a hung rank's stack to the log directory (often a shared filesystem) must come after
    # the kill. A stalled filesystem cannot be made here: the one thing mocked is keep_stack, which
    # blocks until the test lets it go. The monitor, the rank, its dump and its kill are real.
    import threading
    import types

    from ft_core import jobdir
    from ft_core.monitor import RankMonitorServer

    released = threading.Event()
    real_keep_stack = jobdir.keep_stack

    def stalled_keep_stack(*args, **kwargs):
        released.wait(120)
        return real_keep_stack(*args, **kwargs)

    for module in ("ft_core.monitor.server", "ft_core.monitor.stack_copy"):
        monkeypatch.setattr(f"{module}.keep_stack", stalled_keep_stack, raising=False)
    stacks_dir = tmp_path / "logs" / "ft_stacks"
    token = "t0ken-" + "y" * 8
    cfg = FaultToleranceConfig.from_kwargs(rank_heartbeat_timeout=1.0, num_warmup_iterations=0)
    server = RankMonitorServer(cfg, str(tmp_path / "job" / "monitor.sock"), token, stacks_dir=str(stacks_dir))
    ready = threading.Event()
    thread = threading.Thread(target=server.serve_forever, kwargs={"ready_callback": ready.set}, daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        proc = ranks(types.SimpleNamespace(socket_path=server.socket_path, token=token), "heartbeat_gap")
        assert killed(proc)  # while the copy is still stalled
        hang = wait_for_event(server.events_path, 10, event="hang_detected")
        assert "hang_without_heartbeat" in hang["stack"]
        assert hang["stack_dump_file"] == str(stacks_dir / f"cycle0_rank0_pid{proc.pid}.txt")
        assert wait_for_event(server.events_path, 10, event="rank_terminated")["pid"] == proc.pid
        assert not os.path.exists(hang["stack_dump_file"])
        released.set()
        wait_for(lambda: os.path.exists(hang["stack_dump_file"]), 30, "the stack copy once the filesystem answers")
        with open(hang["stack_dump_file"]) as handle:
            assert "hang_without_heartbeat" in handle.read()
    finally:
        released.set()
        server.stop()
        server.request_live_ranks()  # wakes the loop, which sees the stop
        thread.join(30)
