"""Lightning on one GPU under ft_launcher, the callback's defaults, the loss on the progress bar.

Marked ``cuda``: skipped without a CUDA device (``make test-gpu`` runs it on a GPU machine).
"""

from __future__ import annotations

import json
import sys

import pytest
from helpers import free_port
from launcher_helpers import run_job
from lightning_scripts.harness import SCRIPTS, base_env, of

from ft_core.event_file import read_events

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]


def test_one_gpu_with_prog_bar_learns_catches_a_hang_and_finishes(tmp_path):
    events_file = tmp_path / "ft_events.jsonl"
    cmd = [sys.executable, "-m", "ft_core.launcher", "--nproc-per-node=1", "--max-restarts=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--ft-events-file={events_file}",
           str(SCRIPTS / "gpu_prog_bar.py"), f"--ckpt-dir={tmp_path / 'ckpt'}", f"--out-dir={tmp_path}"]
    result = run_job(cmd, base_env(tmp_path), timeout=500, log_path=tmp_path / "launcher.log")
    assert not result.timed_out and result.returncode == 0, result.output[-6000:]
    events = read_events(str(events_file))[0]

    first = json.loads((tmp_path / "report_c0.json").read_text())
    second = json.loads((tmp_path / "report_c1.json").read_text())
    assert first["device"].startswith("cuda") and first["start_step"] == 0 and "end_step" not in first
    # The only hang is the injected one (step 130, after the timeouts were learned at step 100), caught at
    # the learned heartbeat timeout; the next cycle resumed from the checkpoint of step 120 and finished.
    (hang,) = of(events, "hang_detected")
    assert hang["cycle"] == 0 and hang["rank"] == 0 and hang["reason"] == "heartbeat"
    assert second["start_step"] == 120 and second["end_step"] == 160
    learned = second["start_timeouts"]["current_timeouts"]["heartbeat"]  # restored from the checkpoint
    assert learned["were_calculated"] is True and hang["timeout"] == pytest.approx(learned["subsequent"])
