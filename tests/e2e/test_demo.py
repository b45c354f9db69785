"""`make demo` runs examples/demo.py: the main job must show detection, restart, resume and completion."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, python_env


@pytest.mark.timeout(420)
def test_demo_shows_hang_restart_resume_and_completion():
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "examples", "demo.py")],
                            env=python_env(), capture_output=True, text=True, timeout=400)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "hung: section timeout in section 'step'" in out  # the monitor's detection
    assert "stack of hung rank" in out and "fault_injection.py" in out  # where it hung
    assert "restarting all workers" in out  # the launcher's restart
    assert "resuming from" in out and "last.ckpt" in out  # resume from the checkpoint
    assert "finished flag written" in out
    assert "ft_launcher summary" in out and "faults     : 1 hang" in out
