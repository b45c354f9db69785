"""A Megatron-LM job's whole life with ``--async-save``: 10 preemptions, requeues, then hangs (issue 20).

The Megatron-LM-shaped loop (``tests/e2e/megatron_lm/pretrain.py``: Megatron-LM's call sites of
``ft_integration``, its async checkpointing reduced to a background write finalized later) runs with
learned timeouts (``--calc-ft-timeouts``) through the soak of ``job_life_soak``: no healthy rank is
killed over 13 runs, training finishes exactly once, and a hang in a warm-up step and in a steady step
of the last runs are each caught.
"""

from __future__ import annotations

import re

import pytest
from helpers import REPO_ROOT, python_env
from job_life_soak import SoakJob, run_soak

PRETRAIN = f"{REPO_ROOT}/tests/e2e/megatron_lm/pretrain.py"
TRAIN_ITERS = 150


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_soak_ten_preemptions_then_hangs_in_the_last_runs_megatron_async_save(tmp_path):
    save = tmp_path / "ckpt"
    tracker = save / "latest_checkpointed_iteration.txt"

    def script(run: int, rng) -> list[str]:
        # Variable step times, async writes 3-5x a step (finalized while training goes on), start-up
        # varying 2x between runs.
        step = rng.choice((0.05, 0.08, 0.1))
        return [PRETRAIN, "--enable-ft-package", "--calc-ft-timeouts", f"--save={save}", f"--load={save}",
                f"--train-iters={TRAIN_ITERS}", "--save-interval=6", "--log-interval=1", f"--step-time={step}",
                "--async-save", f"--async-write-time={step * rng.uniform(3, 5):.3f}",
                f"--setup-time={0.3 * (1 + run % 2)}"]

    def started(run: int) -> bool:
        log = tmp_path / f"launcher{run}.log"
        return log.exists() and re.search(r"iteration +\d+/", log.read_text()) is not None

    def resume_step() -> int:
        return int(tracker.read_text()) if tracker.exists() else 0

    env = python_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET"):
        env.pop(key, None)
    job = SoakJob(tmp_path, ["--ft-rank-section-timeouts=setup:20,step:20,checkpointing:20",
                             "--ft-rank-out-of-section-timeout=20"],
                  script, started, resume_step, hang_at=lambda step: [f"--inject-hang-in-step-at-iter={step}"],
                  env=env)
    result = run_soak(job, seed=27)
    assert result.codes[-1] == 0 and 0 not in result.codes[:-1], (result.codes, result.logs)
    hangs = [e for e in result.events if e["event"] == "hang_detected"]
    # 0 healthy ranks killed: the only hangs are the two injected ones, each caught once: the one in a
    # warm-up step inside "setup" (Megatron-LM's warm-up steps stay in it), the steady one in "step".
    warmup, steady = result.hang_steps
    assert [(h["iteration"], h["section"]) for h in hangs] == [(warmup, "setup"), (steady, "step")], hangs
    logs = [(tmp_path / f"launcher{n}.log").read_text() for n in range(len(result.codes))]
    finished = [n for n, log in enumerate(logs) if f"saved checkpoint at iteration {TRAIN_ITERS}\n" in log]
    assert finished == [len(logs) - 1]  # training finished exactly once, in the last requeue
    assert resume_step() == TRAIN_ITERS
