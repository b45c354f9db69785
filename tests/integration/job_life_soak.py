"""The job-life soak's driver (issue 20), shared by the Lightning and the Megatron-LM-shaped soaks.

A job runs under ``ft_launcher`` (one rank, no in-job restarts) the way a SLURM requeue loop
runs it: 10 runs preempted by SIGTERM at random points (4 during start-up, 6 mid-training, where
a save is under way about half the time), then a run with a hang injected in a warm-up step, one
with a hang in a steady step, and the requeue that finishes training. What differs between the
frameworks (the training script, its flags, how a run shows it has started, where it resumes) is
the :class:`SoakJob` a test passes in.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from helpers import free_port, kill_group

from ft_core.event_file import read_events

PREEMPTION_POINTS = ["start-up"] * 4 + ["training"] * 6


@dataclass
class SoakJob:
    tmp_path: Path
    #: the launcher's ``--ft-*`` flags (the same in every run, as in a job script)
    ft_flags: list[str]
    #: the training command for run ``n`` (script and its arguments; may draw from the random generator)
    script: Callable[[int, random.Random], list[str]]
    #: whether run ``n`` reached training (its preemption is then "mid-training")
    started: Callable[[int], bool]
    #: the step the next run resumes from (the newest complete checkpoint's)
    resume_step: Callable[[], int]
    #: the script arguments that inject a hang in step ``s`` of the next run
    hang_at: Callable[[int], list[str]]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class SoakResult:
    codes: list[int]
    hang_steps: list[int]
    events: list[dict]
    logs: str


def run_soak(job: SoakJob, seed: int) -> SoakResult:
    rng = random.Random(seed)
    tmp = job.tmp_path
    runs: list[int] = []

    def launch(*extra: str) -> subprocess.Popen:
        run = len(runs)
        runs.append(run)
        (tmp / str(run)).mkdir()
        cmd = [sys.executable, "-m", "ft_core.launcher", "--nproc-per-node=1", "--max-restarts=0",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
               f"--ft-events-file={tmp / f'events{run}.jsonl'}", *job.ft_flags, *job.script(run, rng), *extra]
        log = open(tmp / f"launcher{run}.log", "w")  # noqa: SIM115 - closed with the process below
        return subprocess.Popen(cmd, env=job.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def finish(proc: subprocess.Popen, timeout: float) -> int:
        try:
            return proc.wait(timeout=timeout)
        finally:
            kill_group(proc)

    codes = []
    for point in PREEMPTION_POINTS:
        proc = launch()
        if point == "start-up":  # importing, connecting, loading the checkpoint
            time.sleep(rng.uniform(1.0, 8.0))
        else:  # mid-step or mid-save
            deadline = time.monotonic() + 180
            while not job.started(runs[-1]) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 2.0))
        proc.send_signal(signal.SIGTERM)
        codes.append(finish(proc, 120))
    # A hang in a warm-up step of the next run, then in a steady step of the one after: both caught.
    hang_steps = []
    for offset in (2, 8):
        hang_steps.append(job.resume_step() + offset)
        codes.append(finish(launch(*job.hang_at(hang_steps[-1])), 400))
    codes.append(finish(launch(), 400))  # the requeue that finishes training
    logs = "\n".join((tmp / f"launcher{n}.log").read_text()[-1500:] for n in runs)
    events = [e for n in runs if (tmp / f"events{n}.jsonl").exists()
              for e in read_events(str(tmp / f"events{n}.jsonl"))[0]]
    return SoakResult(codes, hang_steps, events, logs)
