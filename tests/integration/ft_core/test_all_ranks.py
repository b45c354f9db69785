"""Two real gloo ranks agree through :mod:`ft_core.all_ranks`; without a process group each keeps its own values."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, free_port, kill_group, python_env, spawn_python

SCRIPT = os.path.join(REPO_ROOT, "tests", "integration", "core_workers", "all_ranks.py")


@pytest.mark.timeout(120)
def test_two_gloo_ranks_agree_and_each_alone_keeps_its_values(tmp_path):
    port = free_port()
    procs = []
    try:
        for rank in range(2):
            env = python_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(port))
            procs.append(spawn_python([SCRIPT, str(tmp_path)], env=env))
        for proc in procs:
            assert proc.wait(timeout=100) == 0
    finally:
        for proc in procs:
            kill_group(proc)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, result in enumerate(results):
        during = result["during"]
        assert during["distributed"] is True
        assert during["ok_when_all"] is True
        assert during["ok_when_one_fails"] is False  # rank 1 said no: no rank goes on
        assert during["max_ints"] == [1, 2**60 + 1, 7]  # exact: reduced as 64-bit integers
        assert during["max_floats"] == [0.5, -1.0, 1e-9]
        assert during["every_rank"] == [{"rank": 0, "held": [[0, "a"]]}, {"rank": 1, "held": [[10, "a"]]}]
        for alone in (result["before"], result["after"]):  # no process group: the rank's own values
            assert alone["distributed"] is False
            assert alone["ok_when_one_fails"] is (rank != 1)
            assert alone["max_ints"] == [rank, -1 if rank == 0 else 2**60 + 1, 7 - rank]
            assert alone["every_rank"] == [{"rank": rank, "held": [[rank * 10, "a"]]}]


def test_importing_and_asking_without_torch_does_not_import_torch():
    code = ("import sys; from ft_core.all_ranks import all_ranks_ok; assert all_ranks_ok(False) is False; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], env=python_env(), check=True, timeout=60)
