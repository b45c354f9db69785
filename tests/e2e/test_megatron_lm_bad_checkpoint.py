"""Unmodified Megatron-LM (its own ``ft_integration``, through the NVRx import alias) and a bad checkpoint.

``megatron_lm/pretrain.py`` driven by ``nvrx_client_integration`` (Megatron-LM's call pattern on
``nvidia_resiliency_ext.fault_tolerance``, which ``ft_integrations.nvrx_alias`` serves): no
``checkpoint_loaded`` record, no manifest, nothing of ours in the training code. The checkpoint of
iteration 40 holds NaN weights, rank 0 crashes once at iteration 45 (transient), and every resume
from 40 then fails at its first step with Megatron-LM's NaN check, the same ``RuntimeError`` on
every rank. The launcher infers the checkpoint each cycle resumed from (the tracker at the cycle's
start, confirmed by the first iteration its ranks reported), condemns ``iter_0000040`` after one
extra restart, and moves Megatron's tracker back to 30: training finishes from there (Megatron-LM#5281
watched 44 cycles). Beside it, the same loop with a good checkpoint 40: the transient crash is
restarted, training finishes from 40, nothing is condemned.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from helpers import REPO_ROOT, python_env
from integration.launcher_helpers import run_job

from ft_core.event_file import read_events
from ft_integrations.nvrx_alias import SHIM_PATH

PRETRAIN = os.path.join(REPO_ROOT, "tests", "e2e", "megatron_lm", "pretrain.py")
TRACKER = "latest_checkpointed_iteration.txt"


def _launch(tmp_path: Any, script_flags: list[str]) -> tuple[int, str, list]:
    save, log_dir = tmp_path / "ckpt", tmp_path / "logs"
    command = [
        "-m", "ft_core.launcher", "--nproc-per-node=2", "--max-restarts=3", f"--log-dir={log_dir}",
        "--monitor-interval=0.1", "--workers-stop-timeout=10",
        "--ft-rank-section-timeouts=setup:600,step:120,checkpointing:120", "--ft-num-warmup-iterations=0",
        PRETRAIN, "--enable-ft-package", "--ft-num-warmup-iters=1", f"--save={save}", f"--load={save}",
        "--train-iters=60", "--save-interval=10", "--log-interval=10", "--step-time=0.02",
        "--inject-crash-at-iter=45", *script_flags,
    ]
    # Megatron-LM's `from nvidia_resiliency_ext.fault_tolerance import ...` resolves through the alias.
    env = python_env(PRETRAIN_FT_INTEGRATION="nvrx-client")
    env["PYTHONPATH"] = f"{SHIM_PATH}{os.pathsep}{env['PYTHONPATH']}"
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET"):
        env.pop(key, None)
    result = run_job([sys.executable, *command], env, timeout=360, log_path=tmp_path / "launcher.out")
    assert not result.timed_out, result.output[-6000:]
    return result.returncode, result.output, read_events(str(log_dir / "ft_events.jsonl"))[0]


@pytest.mark.timeout(420)
def test_megatron_lm_through_the_alias_does_not_reload_a_nan_checkpoint_again_and_again(tmp_path):
    exit_code, output, events = _launch(tmp_path, ["--inject-nan-weights-at-iter=40"])
    assert "FT: initialized with ft_core.client.RankMonitorClient" in output, output[-4000:]
    restarts = [e for e in events if e["event"] == "restart"]
    # Cycle 0: the transient crash at 45. Cycle 1: the NaN at 40, a restart may fix it. Cycle 2: the
    # same fault from the same checkpoint: condemned. At most this one extra restart.
    assert len(restarts) <= 3, [r["cause"] for r in restarts]
    marked = [e for e in events if e["event"] == "checkpoint_marked_bad"]
    if exit_code == 93:
        # The stop names the condemned checkpoint (and is not requeued).
        assert any("iter_0000040" in line for line in output.splitlines()[-20:]), output[-4000:]
        return
    assert exit_code == 0, output[-6000:]
    assert [os.path.basename(e["checkpoint"]) for e in marked] == ["iter_0000040"], output[-6000:]
    # Every rank raised alike: the faults of cycles 1 and 2 are one fault, not "rank 0" then "rank 1".
    fingerprints = [e for e in events if e["event"] == "fault_fingerprint"]
    assert [(f["iteration"], os.path.basename(f.get("resumed_from") or "")) for f in fingerprints] == \
        [(45, ""), (40, "iter_0000040"), (40, "iter_0000040")], fingerprints
    # The next cycle loaded the previous good checkpoint and finished.
    assert output.count("resumed from iteration 40") == 2 and "resumed from iteration 30" in output, output[-6000:]
    save = tmp_path / "ckpt"
    assert (save / TRACKER).read_text().strip() == "60"
    assert (save / f"{TRACKER}.bad-40").read_text().strip() == "40"  # the tracker as it was, kept


@pytest.mark.timeout(420)
def test_megatron_lm_through_the_alias_restarts_a_transient_crash_after_a_good_checkpoint(tmp_path):
    exit_code, output, events = _launch(tmp_path, [])
    assert exit_code == 0, output[-6000:]
    assert [e["cycle"] for e in events if e["event"] == "restart"] == [0], output[-6000:]
    assert not [e for e in events if e["event"] == "checkpoint_marked_bad"], output[-6000:]
    assert "resumed from iteration 40" in output
    save = tmp_path / "ckpt"
    assert (save / TRACKER).read_text().strip() == "60"
    assert not list(save.glob(f"{TRACKER}.bad-*"))
