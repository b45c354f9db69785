"""`make demo` runs examples/demo.py: the main job must show detection, restart, resume and completion."""

from __future__ import annotations

import os
import re
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
    # One line per hang: the launcher's diagnosis, the culprit and the file with its stack (named by cycle).
    (headline,) = [line for line in out.splitlines() if "; stack: " in line]
    assert "ft_core.launcher" in headline and "cycle 0: rank 1 (node" in headline, out[-4000:]
    stack = headline.rsplit("; stack: ", 1)[1]
    assert "/ft_stacks/cycle0_rank1_pid" in stack
    assert "fault_injection.py" in open(stack).read()  # where it hung
    assert "Current thread" not in out  # stacks go to files, not to the console
    assert out.count("timeouts: setup") == len(set(re.findall(r"timeouts: (setup.*)", out)))  # once per change
    assert "restarting all workers" in out  # the launcher's restart
    assert "resuming from" in out and "last.ckpt" in out  # resume from the checkpoint
    assert "finished flag written" in out
    assert "ft_launcher summary" in out and "faults     : 1 hang" in out
    # Rank 1 hung; rank 0 only waited for it in DDP's gradient all-reduce (inside backward).
    assert re.search(r"culprit    : cycle 0: rank 1 \(node [^)]*\) hung .*; rank 0 was waiting for it", out), out[-4000:]
    # It ends with the goodput report of its own run and the timeline picture.
    assert "goodput report: 1 event log(s), 1 attempt(s)" in out and "faults         : 1 (1 hang)" in out
    picture = out.rsplit("timeline       : ", 1)[1].strip()
    with open(picture, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
