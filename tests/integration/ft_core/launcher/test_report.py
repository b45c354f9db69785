"""`ft_launcher report` run as a command on an event log (the analysis itself: tests/unit/ft_core/launcher)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import REPO_ROOT, python_env


def test_ft_launcher_report_subcommand(tmp_path):
    node = "hostA:300"
    records = [{"event": "launcher_started", "time": 0.0, "node": node, "run_id": "42"},
               {"event": "cycle_start", "time": 1.0, "node": node, "cycle": 0, "workers": {"0": 3000}},
               {"event": "worker_exit", "time": 10.0, "node": node, "cycle": 0, "rank": 0, "local_rank": 0,
                "pid": 3000, "cause": "crash", "exit_code": 1},
               {"event": "restart", "time": 10.2, "node": node, "cycle": 0, "kind": "crash",
                "reason": "rank 0 (pid 3000) exited with code 1"},
               {"event": "exit", "time": 51.0, "node": node, "exit_code": 0,
                "reason": "all workers finished successfully"}]
    (tmp_path / "ft_events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = subprocess.run([sys.executable, "-m", "ft_core.launcher", "report", str(tmp_path), "--json"],
                            env=python_env(), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["faults_by_kind"] == {"crash": 1}
