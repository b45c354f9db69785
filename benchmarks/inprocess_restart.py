"""Time from a fault to the training function running again: in-process vs in-job restart.

The same workload (gloo all_reduce steps on CPU) runs twice under a launcher,
with one rank raising in each of the first ``--faults`` iterations:

* in process: ``ft_core.inprocess.Wrapper`` restarts the function inside the
  surviving processes (launched by torchrun, which never restarts anything);
* in job: the exception ends the process; the launcher stops all workers
  and starts new ones (``ft_launcher`` when ``python -m ft_core.launcher``
  exists, else ``torchrun --max-restarts``).

For every fault it measures, on the wall clock of this host, the time from
the faulting rank's raise to the moment *all* ranks are back in the function
(``fault_to_function``) and have finished their first all_reduce
(``fault_to_first_step``). Prints JSON.

    python benchmarks/inprocess_restart.py [--nproc 3] [--faults 6]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, summarize  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS_BEFORE_FAULT = 5
FAULTY_RANK = 1


# -- the workload (runs in the launched workers) ------------------------------------------------


def _record(out: str, **fields: Any) -> None:
    with open(os.path.join(out, f"rank{os.environ['RANK']}.jsonl"), "a") as file:
        file.write(json.dumps({"time": time.time(), **fields}) + "\n")


def _workload(out: str, iteration: int, faults: int, init_process_group) -> None:
    """``init_process_group`` joins the job; then train, and raise on FAULTY_RANK while ``iteration < faults``."""
    import torch
    import torch.distributed as dist

    _record(out, event="function", iteration=iteration)
    init_process_group()
    rank = dist.get_rank()
    tensor = torch.ones(1024)
    for step in range(STEPS_BEFORE_FAULT):
        dist.all_reduce(tensor)
        if step == 0:
            _record(out, event="first_step", iteration=iteration)
        if iteration < faults and step == STEPS_BEFORE_FAULT - 1 and int(os.environ["RANK"]) == FAULTY_RANK:
            _record(out, event="fault", iteration=iteration)
            raise RuntimeError(f"injected fault in iteration {iteration} on rank {rank}")
        time.sleep(0.02)
    dist.destroy_process_group()


def worker_inprocess(out: str, faults: int) -> None:
    import torch.distributed as dist

    from ft_core.inprocess import CallWrapper, Wrapper

    @Wrapper(soft_timeout=30.0, hard_timeout=60.0, heartbeat_timeout=30.0, barrier_timeout=120.0,
             monitor_thread_interval=0.02, monitor_process_interval=0.25, progress_watchdog_interval=0.5)
    def train(call_wrapper: CallWrapper = None) -> None:
        def init() -> None:
            dist.init_process_group("gloo", store=call_wrapper.store, rank=call_wrapper.rank,
                                    world_size=call_wrapper.world_size)

        _workload(out, call_wrapper.iteration, faults, init)

    train()


def worker_injob(out: str, faults: int) -> None:
    import torch.distributed as dist

    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    def init() -> None:
        # A fresh store per restart cycle: torchrun's shared env:// store makes
        # gloo restarts fail intermittently (stale peer addresses).
        store = dist.FileStore(os.path.join(out, f"store.{restart}"), int(os.environ["WORLD_SIZE"]))
        dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))

    _workload(out, restart, faults, init)


# -- the measurement -------------------------------------------------------------------------


def injob_launcher() -> tuple[str, list[str]]:
    if importlib.util.find_spec("ft_core.launcher.__main__") is not None:
        return "ft_launcher", [sys.executable, "-m", "ft_core.launcher"]
    return "torchrun", [sys.executable, "-m", "torch.distributed.run"]


def launch(command: list[str], env: dict[str, str], log_path: str, timeout: float) -> int:
    """Run a launcher; on timeout stop it like a scheduler would (SIGTERM, then SIGKILL)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher stops its workers
        try:
            proc.wait(30)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise


def run(mode: str, launcher: list[str], nproc: int, faults: int, timeout: float) -> dict[str, Any]:
    out = tempfile.mkdtemp(prefix=f"inprocess-bench-{mode}-")
    command = [
        *launcher, "--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={faults if mode == 'injob' else 0}",
        os.path.abspath(__file__),
    ]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1", LOGLEVEL="WARNING", BENCH_WORKER=mode, BENCH_OUT=out, BENCH_FAULTS=str(faults),
    )
    code = launch(command, env, os.path.join(out, "launcher.log"), timeout)
    events: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name in os.listdir(out):
        if name.endswith(".jsonl"):
            with open(os.path.join(out, name)) as file:
                for line in file:
                    event = json.loads(line)
                    events[event["event"]][event["iteration"]].append(event["time"])
    to_function, to_first_step = [], []
    for iteration in range(faults):
        fault = events["fault"].get(iteration)
        back = events["function"].get(iteration + 1, [])
        stepped = events["first_step"].get(iteration + 1, [])
        if fault and len(back) == nproc and len(stepped) == nproc:
            to_function.append(max(back) - fault[0])
            to_first_step.append(max(stepped) - fault[0])
    if code != 0 or len(to_function) != faults:
        raise RuntimeError(f"{mode} run failed (exit code {code}, {len(to_function)}/{faults} restarts); see {out}")
    return {"fault_to_function_s": summarize(to_function), "fault_to_first_step_s": summarize(to_first_step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--faults", type=int, default=6, help="faults per mode (at least 5)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per launcher run")
    args = parser.parse_args()
    if args.faults < 5:
        parser.error("--faults must be at least 5")

    inprocess = run("inprocess", [sys.executable, "-m", "torch.distributed.run"], args.nproc, args.faults, args.timeout)
    name, launcher = injob_launcher()
    result: dict[str, Any] = {"nproc": args.nproc, "faults": args.faults, "backend": "gloo", "inprocess": inprocess}
    try:
        injob = run("injob", launcher, args.nproc, args.faults, args.timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        if name == "torchrun":
            raise
        result["ft_launcher_error"] = str(exc)  # fall back to torchrun, and say so
        name, launcher = "torchrun", [sys.executable, "-m", "torch.distributed.run"]
        injob = run("injob", launcher, args.nproc, args.faults, args.timeout)
    result["injob"] = {"launcher": name, **injob}
    result["speedup_median"] = {
        key: round(injob[key]["median"] / inprocess[key]["median"], 1) for key in inprocess
    }
    emit(result)


if __name__ == "__main__":
    # Launched workers get their part through the environment: launcher options
    # must not see (or abbreviate-match) worker options.
    worker = {"inprocess": worker_inprocess, "injob": worker_injob}.get(os.environ.get("BENCH_WORKER", ""))
    if worker is not None:
        worker(os.environ["BENCH_OUT"], int(os.environ["BENCH_FAULTS"]))
    else:
        main()
