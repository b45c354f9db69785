"""The launcher's head start, with real processes: the factory it forks after its imports (or starts anew before
them) forks the first cycle, the monitor process it starts before them becomes the job's monitor.

Which command lines get a guess, and that the guess is the factory the parsed command line asks for:
tests/unit/ft_core/launcher/startup/test_head_start.py.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

import psutil
import pytest
from launcher_helpers import WORKER, LauncherGroup, exit_event

from ft_core.launcher.startup.head_start import HeadStart, adopt, guess_factory

ADOPTED = "forked from the launcher after its imports, adopted"
ADOPTED_NEW = "started before the launcher's imports, adopted"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def script_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('train')\n")
    return tmp_path


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid)


def test_adopt_keeps_the_early_factory_only_if_it_is_the_one_wanted(script_dir, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="ft_core.launcher")
    argv = ["--nproc-per-node=2", "--ft-prewarm-modules=json", "train.py"]
    monkeypatch.setenv("FT_TEST_SECRET", "hunter2")
    early = guess_factory(argv)
    assert early is not None
    early.start()
    try:
        assert adopt(early, guess_factory(argv)) is early and early.pid is not None
        assert "started as a new process, adopted" in caplog.text
        # The same job, but the environment its imports would see differs: a fresh factory instead.
        second = guess_factory(argv)
        assert second is not None
        second.start()
        pid = second.pid
        assert pid is not None
        monkeypatch.setenv("FT_TEST_SECRET", "changed")
        wanted = guess_factory(argv)
        assert wanted is not None
        assert adopt(second, wanted) is wanted and not wanted.started
        assert second.pid is None and _gone(pid)  # stopped and reaped
        assert "does not fit the job ($FT_TEST_SECRET): stopped" in caplog.text and "hunter2" not in caplog.text
        # Pre-warming does not apply after all (e.g. turned off where the guess could not see it).
        third = guess_factory(argv)
        assert third is not None
        third.start()
        pid = third.pid
        assert pid is not None
        assert adopt(third, None) is None and third.pid is None and _gone(pid)
        assert adopt(None, wanted) is wanted
    finally:
        early.close()


def test_head_start_pauses_the_collector_until_the_imports_are_done_and_stops_what_nobody_took(script_dir):
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with HeadStart(["--nproc-per-node=1", "--ft-prewarm-modules=json", "train.py"]) as head_start:
            assert not gc.isenabled()
            factory, monitor = head_start.factory, head_start.monitor
            assert factory is not None and factory.started and factory.pid is not None
            assert monitor is not None and monitor.proc is not None
            pid, monitor_proc = factory.pid, monitor.proc
            head_start.imports_done()
            assert gc.isenabled() and gc.get_freeze_count() > frozen
        # Nobody took them: both ended and reaped.
        assert factory.pid is None and _gone(pid)
        assert monitor.proc is None and monitor_proc.returncode is not None
        with pytest.raises(RuntimeError), HeadStart(["train.py"]):  # e.g. the launcher's imports fail
            raise RuntimeError("import failed")
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_first_cycle_is_forked_by_the_early_factory_and_a_restart_by_its_successor(tmp_path):
    finish = tmp_path / "finish"
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("-v", "--max-restarts=1", FT_TEST_FAULT="exit3", FT_TEST_FINISH_AFTER=str(finish))
        node.wait_event("cycle_start", 120, cycle=1)
        # The job's monitor is the standby monitor started before the launcher's imports.
        (started,) = node.events("launcher_started")
        assert psutil.Process(started["monitor_pid"]).cmdline()[-3:] == ["-m", "ft_core.monitor", "--standby"]
        # Forked from the launcher, the factory and the workers show the workers' command line and name, as
        # torchrun's workers do: `pkill -f ft_core.launcher` (or `pkill ft_launcher`) reaches the launcher only.
        workers = {r["pid"] for r in launchers.worker_records("started") if r["cycle"] == 1}
        forked = [p for p in psutil.Process(node.proc.pid).children(recursive=True)
                  if p.pid != started["monitor_pid"]]
        assert workers <= {p.pid for p in forked} and len(forked) >= len(workers) + 1  # and the next factory
        assert {(tuple(p.cmdline()), p.name()) for p in forked} == \
               {((sys.executable, "-u", WORKER), os.path.basename(sys.executable)[:15])}
        finish.touch()
        assert node.wait(180) == 0, node.output()[-3000:]
        output = node.output()
        assert output.count(ADOPTED) == 1 and "does not fit" not in output and "worker factory started" not in output
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
        (crash,) = [e for e in node.events("worker_exit") if (e["cycle"], e["rank"]) == (0, 0)]
        assert crash["exit_code"] == 3
        started = launchers.worker_records("started")
        assert sorted((r["cycle"], r["rank"]) for r in started) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(r["prewarmed"] for r in started)
        # Both cycles trained: every rank heartbeated in each, with the job-wide cycle number.
        assert {(r["cycle"], r["rank"]) for r in launchers.worker_records("first_heartbeat")} == \
               {(0, 0), (0, 1), (1, 0), (1, 1)}
        assert exit_event(node)["exit_code"] == 0


def test_a_launcher_run_with_interpreter_options_starts_its_factory_anew(tmp_path):
    """A worker forked from the launcher would inherit its interpreter's options (here -B); a new factory runs
    with the workers' own."""
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("-v", python_options=("-B",))
        assert node.wait(180) == 0, node.output()[-3000:]
        output = node.output()
        assert ADOPTED_NEW in output and ADOPTED not in output
        assert all(r["prewarmed"] for r in launchers.worker_records("started"))


def test_a_script_directory_module_named_like_a_launcher_module_is_the_one_the_worker_imports(tmp_path):
    """`secrets` is imported by the launcher, not by torch: a factory forked from it would hand the worker that one."""
    (tmp_path / "secrets.py").write_text("WHOSE = 'the script directory'\n")
    (tmp_path / "train.py").write_text("import secrets\nprint('secrets from', secrets.WHOSE)\n")
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("-v", nproc=1, script=(str(tmp_path / "train.py"),))
        assert node.wait(180) == 0, node.output()[-3000:]
        output = node.output()
    assert "secrets from the script directory" in output
    assert (f"started anew after the launcher's imports (secrets in {tmp_path} would shadow the launcher's "
            "modules), adopted") in output
