"""Start the ranks of an in-process restart test as plain processes and check what they did."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from helpers import free_port, kill_group, python_env, spawn_python

WORKER = str(Path(__file__).with_name("worker.py"))
TOKEN_ENV = "INPROCESS_TEST_TOKEN"


class Job:
    """``nprocs`` ranks running ``worker.py scenario``, each in its own process group."""

    def __init__(self, scenario: str, nprocs: int, tmp_path: Path) -> None:
        self.out = tmp_path / scenario
        self.out.mkdir()
        self.token = uuid.uuid4().hex
        env = python_env(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), FT_INPROCESS_STORE_PORT=str(free_port()),
            WORLD_SIZE=str(nprocs), INPROCESS_OUT=str(self.out), OMP_NUM_THREADS="1", **{TOKEN_ENV: self.token},
        )
        self.procs: list[subprocess.Popen] = []
        for rank in range(nprocs):
            env_rank = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
            with open(self.out / f"rank{rank}.log", "w") as log:
                self.procs.append(spawn_python([WORKER, scenario], env=env_rank, stdout=log, stderr=subprocess.STDOUT))

    def wait(self, timeout: float) -> list[int]:
        """Exit codes of all ranks; fails with the logs if they do not all exit in time."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"ranks still running after {timeout} s\n{self.logs(tail=4000)}") from None
        return [proc.returncode for proc in self.procs]

    def events(self) -> dict[int, list[dict[str, Any]]]:
        found: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for rank in range(len(self.procs)):
            path = self.out / f"rank{rank}.jsonl"
            if path.exists():
                found[rank] = [json.loads(line) for line in path.read_text().splitlines()]
        return found

    def logs(self, tail: int | None = None) -> str:
        """Every rank's log (each with its watchdog process's lines); ``tail``: only the last characters of each,
        for a failure message. Search the whole text: a watchdog that lost the store after the job ended can
        log for seconds more, past any tail."""
        return "\n".join(
            f"--- rank {rank} ---\n{(self.out / f'rank{rank}.log').read_text()[-(tail or 0):]}"
            for rank in range(len(self.procs))
        )

    def kill(self) -> None:
        for proc in self.procs:
            kill_group(proc)

    def leftovers(self, grace: float) -> list[psutil.Process]:
        """Processes of this job (ranks, monitor processes) still alive after ``grace`` seconds."""
        deadline = time.monotonic() + grace
        while True:
            alive = [p for p in psutil.process_iter() if _has_token(p, self.token)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)


@contextlib.contextmanager
def job_starter(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Yields ``start(scenario, nprocs=3) -> Job``; on exit kills what is left and fails on orphans.

    Orphans are found by an environment token, which also finds monitor
    processes that outlived their rank (they are no longer in the test's
    process tree once the rank is gone).
    """
    jobs: list[Job] = []

    def start(scenario: str, nprocs: int = 3) -> Job:
        jobs.append(Job(scenario, nprocs, tmp_path))
        return jobs[-1]

    try:
        yield start
    finally:
        for job in jobs:
            job.kill()
        orphans = [proc for job in jobs for proc in job.leftovers(grace=15.0)]
        described = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in orphans if p.is_running()]
        kill_leftovers(orphans)
    assert not orphans, f"processes outlived the test: {described}"


def _has_token(proc: psutil.Process, token: str) -> bool:
    try:
        return proc.environ().get(TOKEN_ENV) == token and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def starts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "start"]


def result(events: list[dict[str, Any]]) -> Any:
    values = [e["value"] for e in events if e["event"] == "result"]
    assert len(values) == 1, events
    return values[0]


def kill_leftovers(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def events_of(job, rank, event):
    return [e for e in job.events()[rank] if e["event"] == event]


def assert_left_blocked_collective(job, rank):
    """``rank`` entered the all_reduce of iteration 0 and left it unfinished; iteration 1's completed.

    The gloo timeout is 10 minutes, so within the test only the abort can have released it.
    """
    begun = [e["iteration"] for e in events_of(job, rank, "collective_begin")]
    done = [e["iteration"] for e in events_of(job, rank, "collective_done")]
    assert (begun, done) == ([0, 1], [1]), job.logs(tail=4000)


def assert_restarted_in_process(job, ranks, iterations=(0, 1)):
    events = job.events()
    for rank in ranks:
        runs = starts(events[rank])
        assert [e["iteration"] for e in runs] == list(iterations), job.logs(tail=4000)
        assert len({e["pid"] for e in runs}) == 1, f"rank {rank} ran in more than one process: {runs}"
