"""Every rank resumes from the same checkpoint, even when only one rank cannot load the newest.

Two real processes under torchrun (gloo on CPU) run ``load_verified``
(``checkpoint_workers/agree.py``). About 8 s.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from helpers import REPO_ROOT, free_port
from launcher_helpers import run_job
from lightning_scripts.harness import base_env

AGREE = os.path.join(REPO_ROOT, "tests", "integration", "checkpoint_workers", "agree.py")


@pytest.mark.timeout(240)
def test_a_checkpoint_one_rank_cannot_load_is_skipped_by_every_rank(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=0",
           f"--master-port={free_port()}", AGREE, str(tmp_path)]
    result = run_job(cmd, base_env(tmp_path), timeout=180, log_path=tmp_path / "torchrun.log")
    assert not result.timed_out and result.returncode == 0, result.output[-6000:]
    r0, r1 = (json.loads((tmp_path / f"agree_r{rank}.json").read_text()) for rank in (0, 1))
    assert r0["path"] == r1["path"] == str(tmp_path / "step=20.ckpt") and r0["step"] == r1["step"] == 20
    assert r0["rejected"] == ["rejected by another rank"]
    assert r1["rejected"] == ["does not load: OSError: Input/output error"]
