"""`ft_launcher report` run as a command on an event log (the analysis itself: tests/unit/ft_core/launcher/observability/report)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import REPO_ROOT, python_env

from ft_core.event_file import EventWriter
from ft_core.events import CycleStart, LauncherExit, LauncherStarted, Restart, RestartKind, WorkerExit


def test_ft_launcher_report_subcommand(tmp_path):
    # One node's log, written as the launcher writes it: a crash, a restart, then the job finishes.
    with EventWriter(str(tmp_path / "ft_events.jsonl"), node="hostA:300") as log:
        log.write(LauncherStarted(time=0.0, run_id="42", min_nodes=1, max_nodes=1, nproc_per_node=1, max_restarts=3,
                                  rdzv_backend="c10d", monitor_pid=None, config={}))
        for cycle in (0, 1):
            log.write(CycleStart(time=1.0 + 10 * cycle, cycle=cycle, restarts=cycle, group_rank=0,
                                 group_world_size=1, world_size=1, workers={"0": 3000 + cycle}, monitor_pid=None))
        log.write(WorkerExit(time=10.0, cycle=0, rank=0, local_rank=0, pid=3000, cause="crash", exit_code=1))
        log.write(Restart(time=10.2, cycle=0, kind=RestartKind.CRASH, reason="rank 0 (pid 3000) exited with code 1",
                          restarts=1, max_restarts=3))
        log.write(LauncherExit(time=51.0, exit_code=0, reason="all workers finished successfully"))
    result = subprocess.run([sys.executable, "-m", "ft_core.launcher", "report", str(tmp_path), "--json"],
                            env=python_env(), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["faults_by_kind"] == {"crash": 1}
