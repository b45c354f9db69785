"""Pre-warmed workers: forked from a factory, they must be indistinguishable from plain starts."""

from __future__ import annotations

import glob
import json
import os
import signal
import stat
import sys

import psutil
import pytest
from helpers import REPO_ROOT, wait_for
from launcher_helpers import LauncherGroup, exit_event, rendezvous_for

WORKERS = os.path.join(REPO_ROOT, "tests", "integration", "launcher_workers")
PROBE = os.path.join(WORKERS, "probe.py")
TRAIN = os.path.join(WORKERS, "train_torch.py")
OFF_WARNING = "pre-warmed workers off"
UNAVAILABLE_WARNING = "pre-warmed workers unavailable"
pytestmark = pytest.mark.timeout(600)


def _factories(launchers: LauncherGroup, launcher_pid: int) -> list[psutil.Process]:
    """The launcher's worker factories: its other descendants are the workers (which share the factories'
    command line) and the monitor."""
    workers = {r["pid"] for r in launchers.worker_records()}
    children = psutil.Process(launcher_pid).children(recursive=True)
    return [p for p in children if "ft_core.monitor" not in p.cmdline() and p.pid not in workers]


def _probe_run(launchers: LauncherGroup, tmp_path, mode: str) -> tuple[dict, dict[int, dict], str]:
    out = tmp_path / f"probe_{mode}"
    out.mkdir()
    node = launchers.start(f"--ft-prewarm={mode}", "--redirects=3", name=mode, script=(PROBE, "--flag", "value"),
                           FT_TEST_RECORD_DIR=str(out), FT_TEST_RAISE_RANK="1", FT_TEST_EXTRA="kept")
    assert node.wait(300) == 1, node.output()[-4000:]  # rank 1 raised; no restarts allowed
    records = {rank: json.loads((out / f"probe_r{rank}_c0.json").read_text()) for rank in (0, 1)}
    (stderr_1,) = glob.glob(os.path.join(node.dir, "*", "attempt_0", "1", "stderr.log"))
    with open(stderr_1) as handle:
        return {"launcher_pid": node.proc.pid, "output": node.output()}, records, handle.read()


def test_forked_worker_looks_like_a_plain_start(launchers, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # torchrun sets 1 for the workers of a 2-rank node
    on_run, on, on_stderr = _probe_run(launchers, tmp_path, "on")
    off_run, off, off_stderr = _probe_run(launchers, tmp_path, "off")
    assert all(r["prewarmed"] for r in on.values()) and not any(r["prewarmed"] for r in off.values())
    assert OFF_WARNING not in on_run["output"] and UNAVAILABLE_WARNING not in on_run["output"]
    for run in (on_run, off_run):  # torchrun's warning, once, though the factory's torch loaded with the setting
        assert run["output"].count("Setting OMP_NUM_THREADS environment variable for each process to be 1") == 1

    run_specific = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "FT_RANK_MONITOR_IPC_SOCKET",
                    "FT_LAUNCHER_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_TEST_RECORD_DIR"}
    for rank in (0, 1):
        forked, plain = on[rank], off[rank]
        # The launcher is the parent of both, each worker leads its own session and process
        # group, and dies with the launcher (SIGKILL).
        assert forked["ppid"] == on_run["launcher_pid"] and plain["ppid"] == off_run["launcher_pid"]
        for record in (forked, plain):
            assert record["pgid_is_pid"] and record["sid_is_pid"]
            assert record["pdeathsig"] == signal.SIGKILL
            # stdout and stderr are torch's per-rank log files (--redirects=3).
            assert record["fd1"].endswith(f"/attempt_0/{rank}/stdout.log")
            assert record["fd2"].endswith(f"/attempt_0/{rank}/stderr.log")
        same = ("name", "file", "argv", "orig_argv", "path0", "path", "cwd", "main_is_module", "spec", "loader",
                "cached", "builtins", "stdin", "stdout", "stderr", "umask", "python_threads",
                "sigint", "sigterm", "sigpipe", "blocked", "torch_threads", "root_handlers", "fds", "cmdline",
                "comm")
        assert {k: forked[k] for k in same} == {k: plain[k] for k in same}
        assert forked["torch_threads"] == 1 and forked["root_handlers"] == 0
        assert forked["cmdline"] == [sys.executable, "-u", PROBE, "--flag", "value"]
        assert forked["name"] == "__main__" and forked["argv"] == [PROBE, "--flag", "value"]
        assert set(forked["env"]) == set(plain["env"])
        assert {k: v for k, v in forked["env"].items() if k not in run_specific} == \
               {k: v for k, v in plain["env"].items() if k not in run_specific}
        assert forked["env"]["FT_TEST_EXTRA"] == "kept" and forked["env"]["RANK"] == str(rank)
    # Random state drawn from the OS at start-up differs between the ranks, as in new processes.
    assert on[0]["numpy_draw"] != on[1]["numpy_draw"] and on[0]["torch_seed"] != on[1]["torch_seed"]
    # The uncaught exception: the same traceback (no factory frames), and exit code 1 for both.
    assert on_stderr == off_stderr
    assert on_stderr.splitlines()[1:] and 'in <module>' in on_stderr and "zygote" not in on_stderr
    assert "ValueError: probe failure on rank 1" in on_stderr


def test_restarted_ranks_are_forked_with_torch_dynamo_imported_and_the_first_start_does_not_wait_for_it(
        launchers, tmp_path):
    # torch.optim imports torch._dynamo at an optimizer's first step, seconds on a loaded node: the successor
    # factory imports it once the first cycle runs, so a restarted rank finds it imported.
    out = tmp_path / "restart"
    out.mkdir()
    node = launchers.start("--max-restarts=1", name="restart", script=(PROBE,), FT_TEST_RECORD_DIR=str(out),
                           FT_TEST_RAISE_RANK="1")
    assert node.wait(300) == 0, node.output()[-4000:]
    first, restarted = ([json.loads((out / f"probe_r{rank}_c{cycle}.json").read_text()) for rank in (0, 1)]
                        for cycle in (0, 1))
    assert all(r["prewarmed"] for r in first + restarted)
    assert [r["dynamo"] for r in first + restarted] == [False, False, True, True]
    assert UNAVAILABLE_WARNING not in node.output()


def _maps_cprofile(pid: int) -> bool:
    """Whether ``pid`` mapped cProfile's extension, which ``import torch._dynamo`` loads (torch._dynamo.utils)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
            return "/_lsprof." in maps.read()
    except OSError:
        return False


def test_a_factory_left_idle_imports_torch_dynamo_so_a_late_rounds_first_ranks_start_warm(launchers, request,
                                                                                         tmp_path):
    # A waits for B (a hot spare waits so for a place): its factory, asked for nothing IDLE_PREWARM_AFTER s after
    # Ready, imports torch._dynamo meanwhile. B's factory is asked at once: its first rank starts as before.
    out = tmp_path / "late"
    out.mkdir()
    rdzv = rendezvous_for(request, "c10d")
    env = {"FT_TEST_RECORD_DIR": str(out)}
    a = launchers.start(*rdzv.flags("2:2"), name="A", nproc=1, script=(PROBE,), **env)
    rdzv.wait_ready()
    wait_for(lambda: any(_maps_cprofile(p.pid) for p in _factories(launchers, a.proc.pid)), 180,
             "A's idle factory to import torch._dynamo", interval=0.2)
    b = launchers.start(*rdzv.flags("2:2"), name="B", nproc=1, script=(PROBE,), **env)
    for node in (a, b):
        assert node.wait(300) == 0, node.output()[-4000:]
    records = [json.loads(path.read_text()) for path in out.glob("probe_r*_c0.json")]
    dynamo = {record["ppid"]: record["dynamo"] for record in records}
    assert all(record["prewarmed"] for record in records) and len(records) == 2
    assert dynamo == {a.proc.pid: True, b.proc.pid: False}
    assert UNAVAILABLE_WARNING not in a.output() + b.output()


def _train(launchers: LauncherGroup, tmp_path, mode: str) -> dict:
    out = tmp_path / f"train_{mode}"
    out.mkdir()
    node = launchers.start(f"--ft-prewarm={mode}", "--max-restarts=2", name=f"train_{mode}",
                           script=(TRAIN, f"--out={out}"), FAULT_TOL_FINISHED_FLAG_FILE=str(out / "finished"))
    assert node.wait(300) == 0, node.output()[-4000:]
    restarts = "; ".join(f"cycle {r['cycle']}: {r['reason']}" for r in node.events("restart"))
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1], f"restarts: {restarts}\n{node.output()[-6000:]}"
    assert UNAVAILABLE_WARNING not in node.output()
    return {path.name: json.loads(path.read_text()) for path in out.glob("train_r*_c1.json")}


def test_restarted_torch_job_gives_the_same_results_with_and_without_prewarm(launchers, tmp_path):
    forked = _train(launchers, tmp_path, "on")
    plain = _train(launchers, tmp_path, "off")
    assert sorted(forked) == ["train_r0_c1.json", "train_r1_c1.json"]
    assert forked == plain  # same resume step, losses, final step and parameters, bit for bit
    assert forked["train_r0_c1.json"]["start_step"] == 6 and forked["train_r0_c1.json"]["end_step"] == 10


def test_non_python_entrypoint_falls_back_with_one_warning(launchers, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho \"shell rank $RANK\" >> \"$FT_TEST_OUT\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "shell.out"
    node = launchers.start("--no-python", name="shell", script=(str(script),), FT_TEST_OUT=str(out))
    assert node.wait(300) == 0, node.output()[-4000:]
    assert sorted(out.read_text().splitlines()) == ["shell rank 0", "shell rank 1"]
    assert node.output().count(OFF_WARNING) == 1
    assert exit_event(node)["exit_code"] == 0


def test_factory_lost_mid_job_falls_back_to_plain_starts_with_one_warning(launchers):
    node = launchers.start("--max-restarts=2", FT_TEST_FAULT="forever,exit3,none")
    node.wait_event("rank_connected", 120, count=2)
    # The standby factories (the next cycle's and its prepared successor) die: the next cycles must
    # still start.
    for standby in wait_for(lambda: _factories(launchers, node.proc.pid), 60, "the standby factory"):
        standby.kill()
    first = {r["pid"] for r in launchers.worker_records("started") if r["cycle"] == 0}
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    assert node.wait(300) == 0, node.output()[-4000:]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1, 2]
    assert node.output().count(UNAVAILABLE_WARNING) == 1
    later = [r for r in launchers.worker_records("started") if r["cycle"] > 0]
    assert len(later) == 4 and not any(r["prewarmed"] for r in later)


def test_sigkilled_launcher_leaves_no_worker_or_factory_behind(launchers):
    node = launchers.start(FT_TEST_FAULT="forever")
    node.wait_event("rank_connected", 120, count=2)
    standby = wait_for(lambda: _factories(launchers, node.proc.pid), 60, "the standby factory")
    workers = [r["pid"] for r in launchers.worker_records("started")]
    assert all(psutil.Process(pid).ppid() == node.proc.pid for pid in workers)  # adopted by the launcher
    tree = [node.proc.pid, *(p.pid for p in psutil.Process(node.proc.pid).children(recursive=True))]
    assert {p.pid for p in standby} <= set(tree) and set(workers) <= set(tree)
    node.proc.kill()
    node.proc.wait()

    def all_gone() -> bool:
        return not [pid for pid in tree if psutil.pid_exists(pid) and
                    psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

    wait_for(all_gone, 20, "the workers and the factory to die with their launcher")


def test_prewarm_module_that_fails_to_import_falls_back_with_one_warning(launchers):
    node = launchers.start("--ft-prewarm-modules=torch,no_such_module_for_ft_tests", FT_TEST_STEPS="2")
    assert node.wait(300) == 0, node.output()[-4000:]
    output = node.output()
    assert output.count(UNAVAILABLE_WARNING) == 1 and "no_such_module_for_ft_tests" in output
    assert not any(r["prewarmed"] for r in launchers.worker_records("started"))


def test_prewarm_module_that_initialises_the_cuda_driver_falls_back_with_one_warning(launchers, tmp_path):
    # torch.cuda.is_available() at import initialises the driver without torch.cuda.is_initialized()
    # saying so. The driver call is mocked (no GPU here; see cuda_probe_at_import.py): it loads a
    # stand-in libcuda.so.1, as the real call does. The factory must refuse; the job runs unforked.
    node = launchers.start("--ft-prewarm-modules=torch,cuda_probe_at_import", FT_TEST_STEPS="2",
                           FT_TEST_FAKE_CUDA_DIR=str(tmp_path / "fake_cuda"))
    assert node.wait(300) == 0, node.output()[-4000:]
    output = node.output()
    assert output.count(UNAVAILABLE_WARNING) == 1 and "initialised the CUDA driver" in output, output[-3000:]
    started = launchers.worker_records("started")
    assert len(started) == 2 and not any(r["prewarmed"] for r in started)
