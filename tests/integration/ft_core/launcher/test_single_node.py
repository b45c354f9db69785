"""ft_launcher on one node: restarts after crashes and hangs, stop rules, signals, monitor loss, no orphans."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest
from helpers import wait_for
from launcher_helpers import FAST_FLAGS, exit_event

from ft_core.launcher.observability.report import build_report, load_records

pytestmark = pytest.mark.timeout(240)


def test_crashes_of_every_kind_are_restarted(launchers):
    # One job, one fault per cycle: exception, os._exit(3), SIGKILL, SIGSEGV; cycle 4 succeeds.
    node = launchers.start("--max-restarts=4", FT_TEST_FAULT="exception,exit3,sigkill,sigsegv")
    assert node.wait(180) == 0, node.output()[-3000:]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1, 2, 3, 4]
    exits = {(e["cycle"], e["rank"]): e for e in node.events("worker_exit")}
    # Cycle 0: rank 0 raised. Rank 1, blocked in an all_reduce with it, sees the connection close while
    # rank 0's interpreter is still exiting and may itself exit (code 1, a gloo error) first: the first
    # failure seen is either. Faults of the later cycles end rank 0 at once, so it is always seen first.
    assert 1 in {ev.get("exit_code") for (cycle, _), ev in exits.items() if cycle == 0}, exits
    assert exits[1, 0]["exit_code"] == 3
    assert exits[2, 0]["signal"] == "SIGKILL" and exits[3, 0]["signal"] == "SIGSEGV"
    restarts = node.events("restart")
    assert [r["kind"] for r in restarts] == ["crash"] * 4
    assert [r["restarts"] for r in restarts] == [1, 2, 3, 4]
    # Every cycle's workers saw the job-wide cycle number.
    assert {r["cycle"] for r in launchers.worker_records("first_heartbeat")} == {0, 1, 2, 3, 4}
    started = launchers.worker_records("started")
    # Forked. Nothing compiles or steps an optimizer here: the first cycle's ranks do not import dynamo; a
    # restarted rank finds it imported by its factory while the cycle before ran, and pays no time for it.
    assert all(r["prewarmed"] for r in started) and len(started) == 10
    assert sorted((r["cycle"], r["dynamo"]) for r in started) == [(c, c > 0) for c in range(5) for _ in (0, 1)]
    assert exit_event(node)["exit_code"] == 0
    assert "faults     : 4 crash" in node.output()


def test_hang_is_detected_and_restarted(launchers):
    # Cycle 0: rank 0 exits with 3; cycle 1: rank 0 hangs; cycle 2 finishes.
    node = launchers.start("--max-restarts=2", FT_TEST_FAULT="exit3,hang")
    assert node.wait(180) == 0, node.output()[-3000:]
    hangs = [e for e in node.events("hang_detected") if e["rank"] == 0]
    assert hangs and hangs[0]["reason"] == "heartbeat" and hangs[0]["elapsed"] >= 3
    # The stack is kept next to the event log, named by the cycle the hang happened in.
    assert os.path.basename(hangs[0]["stack_dump_file"]).startswith(f"cycle1_rank0_pid{hangs[0]['pid']}")
    assert os.path.dirname(hangs[0]["stack_dump_file"]) == os.path.join(node.dir, "ft_stacks")
    with open(hangs[0]["stack_dump_file"]) as handle:
        assert "inject" in handle.read()  # the hung rank's Python stack
    assert [r["kind"] for r in node.events("restart")] == ["crash", "hang"]
    assert "hung: heartbeat timeout" in node.events("restart")[1]["reason"]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1, 2]

    # Quiet by default: one line per hang, the launcher's diagnosis, naming the culprit and its stack file
    # (the monitor's line per expired rank is DEBUG under ft_launcher); no stack, no torch echo.
    output = node.output()
    (line,) = [line for line in output.splitlines() if "stack: " in line]
    assert "ft_core.launcher" in line and "cycle 1: rank 0 (node " in line and f"pid {hangs[0]['pid']}" in line
    assert line.endswith(f"; stack: {hangs[0]['stack_dump_file']}")
    assert "Current thread" not in output and "failed (exitcode" not in output

    # The goodput report of this real run.
    report = build_report(load_records([node.events_path]))
    crash, hang = report.faults
    assert (crash.kind, crash.cycle, crash.culprit_rank, crash.detection_s) == ("crash", 0, 0, 0.0)
    assert (hang.kind, hang.cycle) == ("hang", 1) and hang.ranks[0] == 0
    # Rank 1, blocked in the all-reduce with the hung rank 0, may miss its heartbeat deadline too:
    # then two ranks hung and the report leaves the culprit unknown (docs/events.md, "Goodput report").
    # The diagnosis names rank 0 even when rank 1, blocked in the all-reduce, expired first.
    assert (hang.culprit_rank, hang.waiting) == (0, [1]) and set(hang.ranks) <= {0, 1}
    assert hang.detection_s == pytest.approx(hangs[0]["elapsed"], abs=0.01)
    assert hang.restart_s > 0 and hang.recompute_s is None  # the worker reports no checkpoints
    assert report.cycles == 3 and 0 < report.goodput_pct < 100
    assert report.training_time_s + report.detection_s + report.restart_s <= report.wall_time_s
    assert "goodput    : " in output and "time lost  : " in output and "(detection 3." in output


def test_explicit_flag_equal_to_the_default_wins_over_the_workers_fallback(launchers):
    # --ft-rank-heartbeat-timeout=2700 is the default value, given on purpose (it overrides FAST_FLAGS' 3 s).
    # The workers' training config asks for 0.5 s and their steps take 1 s: healthy under the launch's
    # value, so nothing may be killed. safety_factor was not set at launch: the workers' value applies,
    # also with -v (which used to mark every key as set at launch).
    fallback = {"rank_heartbeat_timeout": 0.5, "safety_factor": 2.5}
    node = launchers.start("-v", "--ft-rank-heartbeat-timeout=2700", FT_TEST_FALLBACK=json.dumps(fallback),
                           FT_TEST_STEPS="2", FT_TEST_STEP_TIME="1.0")
    assert node.wait(180) == 0, node.output()[-3000:]
    configs = [record["config"] for record in launchers.worker_records("monitor_config")]
    assert len(configs) == 2  # what each rank's monitor applies, from the HelloAck it received
    assert {cfg["rank_heartbeat_timeout"] for cfg in configs} == {2700.0}
    assert {cfg["safety_factor"] for cfg in configs} == {2.5}
    assert node.events("hang_detected") == [] and node.events("restart") == []


@pytest.mark.parametrize(("flag", "reported", "finished"), [
    (True, None, True), (False, "all", True), (False, "1", False), (False, None, False),
], ids=["flag_written_0", "all_ranks_reported_finished_0", "rank_0_never_reported_1", "no_flag_1"])
def test_a_worker_aborting_at_exit_restarts_only_an_unfinished_job(launchers, tmp_path, flag, reported, finished):
    # Both ranks finish and shut their clients down, then rank 0 dies of SIGABRT at interpreter exit.
    # With the finished flag written, or with every rank's shutdown reporting training complete, the job
    # is done: exit 0, one cycle, the abort a warning. Without either (rank 0 never reported it) the same
    # abort is a fault: with no restart left, exit 1.
    node = launchers.start("--max-restarts=0", FT_TEST_FAULT="abort_at_exit",
                           FAULT_TOL_FINISHED_FLAG_FILE=str(tmp_path / "finished.flag"),
                           FT_TEST_MARK_FINISHED="1" if flag else "0", FT_TEST_REPORT_FINISHED=reported or "")
    assert node.wait(120) == (0 if finished else 1), node.output()[-3000:]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0]
    assert node.events("restart") == []
    (abort,) = [e for e in node.events("worker_exit") if e.get("signal") == "SIGABRT"]
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"
    disconnected = {e["rank"]: e.get("training_finished", False) for e in node.events("rank_disconnected")}
    assert disconnected == {0: reported == "all", 1: reported is not None}
    if finished:
        assert abort["cause"] == "exit after training finished"
        assert "training is finished" in exit_event(node)["reason"]
        assert ("exists" if flag else "every rank reported training complete") in exit_event(node)["reason"]
        assert "after training finished" in node.output() and "SIGABRT" in node.output()
    else:
        assert abort["cause"] == "crash"
        assert "restart budget spent" in exit_event(node)["reason"]


def test_exclude_this_node_on_a_node_the_job_cannot_lose_restarts_as_a_fault(launchers):
    # Rank 0 asks ExcludeThisNode on the only node (it hosts the c10d store): leaving would end the job
    # unfinished. One warning names why; every worker restarts as after a fault (a restart spent) and the
    # next cycle finishes: exit 0. (A node the job can lose leaves: test_excluded_node_is_replaced_by_the_hot_spare.)
    node = launchers.start("--max-restarts=1", FT_TEST_FAULT="exclude")
    assert node.wait(120) == 0, node.output()[-3000:]
    (restart,) = node.events("restart")
    assert restart["kind"] == "node-fault" and "ExcludeThisNode" in restart["reason"]
    assert "not excluded: the node hosts the c10d rendezvous store" in restart["reason"]
    assert [(e["cycle"], e["restarts"]) for e in node.events("cycle_start")] == [(0, 0), (1, 1)]
    assert node.output().count("requested ExcludeThisNode, but the job cannot go on without this node") == 1
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


def test_children_of_a_crashed_worker_do_not_outlive_its_cycle(launchers):
    # Each worker starts a child that ignores SIGTERM (a data loader worker blocked in I/O). Rank 0
    # exits 3 in cycle 0: its child, and its peer's, are gone before cycle 1's workers start, and
    # nothing of the job outlives the launcher (LauncherGroup checks every process it saw).
    node = launchers.start("--max-restarts=1", "--workers-stop-timeout=1", "--shutdown-timeout=1", FT_TEST_FAULT="exit3",
                           FT_TEST_CHILD="1")
    assert node.wait(120) == 0, node.output()[-3000:]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
    children = launchers.worker_records("child")
    assert {r["cycle"] for r in children} == {0, 1} and len(children) == 4
    checks = [r for r in launchers.worker_records("earlier_children_alive") if r["cycle"] == 1]
    assert len(checks) == 2 and all(r["pids"] == [] for r in checks), checks
    assert "still alive at the end of the stop timeout: SIGKILL" in node.output()
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


def test_budget_spent_exits_1(launchers):
    node = launchers.start("--max-restarts=1", "-v", FT_TEST_FAULT="exit3", FT_TEST_FAULT_CYCLES="all")
    assert node.wait(120) == 1, node.output()[-3000:]
    assert len(node.events("cycle_start")) == 2
    assert "restart budget spent" in exit_event(node)["reason"]
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"
    # -v: debug lines of the launcher and the monitor, and torch elastic's own report of the failure.
    assert "rank monitor serving on" in node.output() and "failed (exitcode: 3)" in node.output()


def test_no_progress_exits_93(launchers):
    # Every cycle resumes from iteration 10 and crashes: cycle 0 made progress, cycles 1 and 2 did not.
    node = launchers.start("--max-restarts=10", "--ft-max-no-progress-cycles=2", FT_TEST_FAULT="exit3",
                           FT_TEST_FAULT_CYCLES="all", FT_TEST_CHECKPOINT="10")
    assert node.wait(180) == 93, node.output()[-3000:]
    assert len(node.events("cycle_start")) == 3
    assert [e["iteration"] for e in node.events("progress")] == [10]
    assert "no progress" in exit_event(node)["reason"]
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


@pytest.mark.parametrize("finished", [False, True], ids=["unfinished_143", "flag_exists_0"])
def test_sigterm_exit_code_says_whether_to_requeue(launchers, tmp_path, finished):
    # SLURM's SIGTERM before preemption: the workers save and exit 0, but only a finished job exits 0.
    flag = tmp_path / "finished.flag"
    if finished:
        flag.touch()
    node = launchers.start(FT_TEST_FAULT="forever", FT_TEST_ON_SIGTERM="exit0",
                           FAULT_TOL_FINISHED_FLAG_FILE=str(flag))
    node.wait_event("rank_connected", 120, count=2)
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait(60) == (0 if finished else 128 + signal.SIGTERM), node.output()[-3000:]
    (sig,) = node.events("signal")
    assert sig["signal"] == "SIGTERM" and sig["running_workers"] == 2
    assert {e.get("exit_code") for e in node.events("worker_exit")} == {0}
    assert ("training is finished" if finished else "training not finished") in exit_event(node)["reason"]
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


def test_sigterm_after_every_worker_exited_0_exits_0(launchers):
    # The launcher is stopped (SIGSTOP) while its workers finish, so the signal is pending when it
    # resumes, before it saw them succeed (as SIGTERM during the exit barrier would): a worker's exit
    # wakes the agent at once, so no monitoring interval is long enough to keep it asleep.
    finish = os.path.join(launchers.tmp_path, "finish")
    node = launchers.start("--monitor-interval=30", FT_TEST_STEPS="1", FT_TEST_FINISH_AFTER=finish)
    wait_for(lambda: len(launchers.worker_records("finish_waiting")) == 2, 120, "both workers to end their steps")
    node.proc.send_signal(signal.SIGSTOP)
    try:
        with open(finish, "w"):
            pass  # the workers finish only now, with the launcher stopped
        workers = wait_for(lambda: len(launchers.worker_records("finished")) == 2 and
                           launchers.worker_records("finished"), 120, "both workers to finish")

        def exited() -> bool:
            return all(not psutil.pid_exists(w["pid"]) or psutil.Process(w["pid"]).status() == psutil.STATUS_ZOMBIE
                       for w in workers)

        wait_for(exited, 30, "both workers to exit")
        node.proc.send_signal(signal.SIGTERM)
    finally:
        node.proc.send_signal(signal.SIGCONT)
    assert node.wait(60) == 0, node.output()[-3000:]
    (sig,) = node.events("signal")
    assert sig["running_workers"] == 0
    assert "after every worker had finished" in exit_event(node)["reason"]


def test_shutdown_request_wins_over_the_requesting_rank_exiting(launchers):
    # The rank asks for ShutdownWorkload, then exits 1 at once: with a 1 s monitoring interval the
    # launcher sees both in the same pass, and the request (the reason) must win over the exit (its effect).
    node = launchers.start("--max-restarts=2", "--monitor-interval=1", FT_TEST_FAULT="shutdown_exit")
    assert node.wait(120) == 93, node.output()[-3000:]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0]
    assert node.events("restart") == []
    assert "ShutdownWorkload" in exit_event(node)["reason"]


def test_a_20_s_preemption_save_is_not_cut_short(launchers, tmp_path):
    # SLURM's SIGTERM before preemption: each rank saves for 20 s (the old default killed it at 15 s).
    # The defaults users get: no --term-timeout, and their
    # heartbeat timeout (the ranks do not heartbeat while saving). Without torch: a rank blocked in a
    # gloo all-reduce would run its Python handler only when the call returns.
    save = tmp_path / "ckpt"
    node = launchers.start(base_flags=tuple(f for f in FAST_FLAGS if not f.startswith("--ft-rank-heartbeat")),
                           FT_TEST_FAULT="forever", FT_TEST_TORCH="0", FT_TEST_ON_SIGTERM="save",
                           FT_TEST_SAVE_FILE=str(save), FT_TEST_SAVE_TIME="20")
    node.wait_event("rank_connected", 120, count=2)
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait(120) == 128 + signal.SIGTERM, node.output()[-3000:]
    for rank in (0, 1):
        lines = (tmp_path / f"ckpt.rank{rank}").read_text().splitlines()
        assert lines == [f"chunk {i}" for i in range(200)] + ["complete"]
    assert {e.get("exit_code") for e in node.events("worker_exit")} == {0}
    assert "training not finished" in exit_event(node)["reason"]


def test_workers_ignoring_sigterm_are_killed_after_term_timeout(launchers):
    # An explicit --term-timeout still bounds the wait for a rank that never stops.
    node = launchers.start("--term-timeout=1", FT_TEST_FAULT="forever", FT_TEST_ON_SIGTERM="ignore")
    node.wait_event("rank_connected", 120, count=2)
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait(60) == 128 + signal.SIGTERM, node.output()[-3000:]
    (sig,) = node.events("signal")
    exits = node.events("worker_exit")
    # SIGKILL only after the grace period (the second worker may die of its peer's death first).
    assert "SIGKILL" in {e.get("signal") for e in exits}
    assert all(e["time"] - sig["time"] >= 1.0 for e in exits)


def test_monitor_killed_mid_run_is_recovered(launchers):
    node = launchers.start("--max-restarts=1", FT_TEST_FAULT="forever,none")
    node.wait_event("rank_connected", 120, count=2)
    monitor_pid = node.events("launcher_started")[0]["monitor_pid"]
    os.kill(monitor_pid, signal.SIGKILL)
    assert node.wait(120) == 0, node.output()[-3000:]
    assert len(node.events("monitor_died")) == 1
    (restart,) = node.events("restart")
    assert restart["kind"] == "monitor"
    (second,) = [e for e in node.events("cycle_start") if e["cycle"] == 1]
    assert second["monitor_pid"] != monitor_pid
    assert len(node.events("rank_connected")) == 4  # the new monitor serves the new workers


def test_sigkilled_launcher_leaves_no_process_behind(launchers):
    node = launchers.start(FT_TEST_FAULT="forever")
    node.wait_event("rank_connected", 120, count=2)
    tree = [node.proc.pid, *(p.pid for p in psutil.Process(node.proc.pid).children(recursive=True))]
    assert len(tree) >= 4  # launcher, monitor, two workers
    node.proc.kill()  # SIGKILL: no cleanup code runs in the launcher
    node.proc.wait()

    def all_gone() -> bool:
        return not [pid for pid in tree if psutil.pid_exists(pid) and
                    psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

    wait_for(all_gone, 20, "the monitor and the workers to die with their launcher")
