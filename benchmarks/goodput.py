"""Goodput under faults: ft_launcher (its defaults) and torchrun --max-restarts, one fault schedule. Prints JSON.

A job of 4 launchers x 1 rank (c10d rendezvous on loopback, ``--nnodes=3:4``, a fifth launcher
waiting as a hot spare) trains for ``--duration`` seconds (``_goodput_worker.py``: gloo, paced
steps of ``--step-time``, a disk checkpoint every ``--checkpoint-every`` steps; under ft_launcher
also heartbeats with learned timeouts and in-memory snapshots at the automatic interval, as its
documentation asks of a plain loop). Meanwhile faults arrive from one seeded schedule, one in
each ``--fault-interval`` window at a random point of its middle half, the kinds in shuffled
rounds:

  crash      a rank raises
  hang       a rank stops before the all-reduce; its peers block inside the collective
  node_loss  a node's launcher and everything under it SIGKILLed; the spare takes its place,
             and a new spare is started (as a cluster would give one back)

The same schedule runs under ft_launcher and then under torchrun, in the same invocation.
torchrun never sees a hang: its job waits for the collective's own timeout
(``--collective-timeout``, default 600 s: NCCL's default, what most GPU jobs run with; gloo's
is 30 min), the same process-group timeout the script has under ft_launcher. A fault is
applied only to a job that is stepping, one at a time: one that falls due while the job is
recovering waits for it (``delay_s``), and a job that never steps again leaves the rest
unapplied. Node 0 hosts the c10d store (with c10d its loss ends any job): no fault targets it.

The training window runs from the job's first step (``t0``) to the step at which it stopped
(``--duration`` after ``t0``; the script saves a last checkpoint there). A job that does not
stop within ``--stop-grace`` is killed, and keeps what its newest checkpoint held at the stop.
``useful_steps`` are the steps in the final state; ``step_s`` the run's median step (the
floor: a fault-free step in the same run); ``goodput = useful_steps x step_s / wall_s``. Per
fault: the step it hit, ``to_first_step_s`` (fault -> first step of the restarted job), the
steps computed again, where the restart resumed from, and ``cost_s``: the time from the last
step before the fault until the job had passed that step again, less one step.

Usage: python benchmarks/goodput.py [--duration 600] [--seed 1] [--fault-interval 60] [--launchers both]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Optional

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_goodput_worker.py")
NODES, KINDS = 4, ("crash", "hang", "node_loss")
LAUNCHERS = {"ft_launcher": [sys.executable, "-m", "ft_core.launcher"],
             "torchrun": [sys.executable, "-m", "torch.distributed.run"]}


def schedule(seed: int, duration: float, interval: float) -> list[dict[str, Any]]:
    """One fault per ``interval`` window (in its middle half); kinds in shuffled rounds; ``node``: 1..3."""
    rng = random.Random(seed)
    kinds: list[str] = []
    faults = []
    for index in range(int(duration // interval)):
        if not kinds:
            kinds = rng.sample(KINDS, len(KINDS))
        faults.append({"id": index, "at_s": round(interval * (index + rng.uniform(0.25, 0.75)), 1),
                       "kind": kinds.pop(), "node": rng.randrange(1, NODES)})
    return faults


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything under it (a node lost: its launcher, monitor, workers)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


class Job:
    """The launchers of one run, the records its ranks write, and the faults applied to it."""

    def __init__(self, launcher: str, workdir: str, args: argparse.Namespace) -> None:
        self.launcher, self.dir, self.args = launcher, workdir, args
        self.port, self.run_id = free_port(), f"goodput-{uuid.uuid4().hex[:8]}"
        self.env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        PYTHONUNBUFFERED="1", GOODPUT_DIR=workdir, GOODPUT_STEP_S=str(args.step_time),
                        GOODPUT_CKPT_EVERY=str(args.checkpoint_every),
                        GOODPUT_COLLECTIVE_TIMEOUT=str(args.collective_timeout))
        self.nodes: list[subprocess.Popen] = []
        self.killed: set[int] = set()
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self.worker_node: dict[int, int] = {}  # worker pid -> index of its node in self.nodes
        self.spares_started = 0

    def start_node(self) -> None:
        index = len(self.nodes)
        log_dir = os.path.join(self.dir, f"node{index}")
        os.makedirs(log_dir)
        cmd = [*LAUNCHERS[self.launcher], f"--nnodes={NODES - 1}:{NODES}", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id={self.run_id}",
               "--local-addr=127.0.0.1", f"--max-restarts={self.args.max_restarts}"]
        if self.launcher == "ft_launcher":
            cmd += [f"--log-dir={log_dir}", *shlex.split(self.args.ft_args)]
        with open(os.path.join(log_dir, "launcher.out"), "wb") as out:
            self.nodes.append(subprocess.Popen([*cmd, WORKER], env=self.env, cwd=self.dir, stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def read(self) -> list[dict[str, Any]]:
        """Records appended since the last call (whole lines only); maps each new worker to its node."""
        path = os.path.join(self.dir, "records.jsonl")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as handle:
            handle.seek(self._offset)
            data = handle.read()
        complete = data[:data.rfind("\n") + 1]
        self._offset += len(complete.encode())
        new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        pids = {node.pid: index for index, node in enumerate(self.nodes)}
        for rec in new:
            if rec["event"] == "started":
                with contextlib.suppress(psutil.NoSuchProcess):
                    parents = [p.pid for p in psutil.Process(rec["pid"]).parents()]
                    self.worker_node[rec["pid"]] = next((pids[p] for p in parents if p in pids), -1)
        self.records += new
        return new

    def running(self) -> list[tuple[int, int]]:
        """(node index, rank) of each node whose newest worker is alive, node order."""
        newest: dict[int, dict[str, Any]] = {}
        for rec in self.records:
            if rec["event"] == "started" and self.worker_node.get(rec["pid"], -1) >= 0:
                newest[self.worker_node[rec["pid"]]] = rec
        return sorted((node, rec["rank"]) for node, rec in newest.items()
                      if node not in self.killed and psutil.pid_exists(rec["pid"]))

    def last_step(self) -> Optional[dict[str, Any]]:
        return next((r for r in reversed(self.records) if r["event"] == "step"), None)

    def stop_everything(self) -> None:
        for node in self.nodes:
            if node.poll() is None:
                kill_tree(node.pid)
        for pid in {r["pid"] for r in self.records}:  # workers can outlive a killed torchrun
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(30)


def run(launcher: str, faults: list[dict[str, Any]], args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    job = Job(launcher, workdir, args)
    launched = time.time()
    load = [os.getloadavg()[0]]
    try:
        job.start_node()
        deadline = time.monotonic() + 120
        while not _listening(job.port):
            if time.monotonic() > deadline or job.nodes[0].poll() is not None:
                raise RuntimeError(f"{launcher}: the rendezvous store never served")
            time.sleep(0.1)
        for _ in range(NODES - 1):
            job.start_node()
        deadline = time.monotonic() + args.start_timeout
        while job.last_step() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{launcher}: no step within {args.start_timeout:.0f} s")
            job.read()
            time.sleep(0.2)
        t0 = job.last_step()["t"]  # type: ignore[index]
        for _ in range(args.spares):  # the hot spare, once the job's round is closed
            job.start_node()
        applied, pending = _drive(job, faults, t0, args, load)
        with contextlib.suppress(subprocess.TimeoutExpired):  # a job that stopped: its launchers exit now
            job.nodes[0].wait(30 if any(r["event"] == "stopped" for r in job.records) else 0)
        exit_code = job.nodes[0].poll()  # node 0's launcher: None when it was still running at the end
    finally:
        job.stop_everything()
    job.read()
    return {**summarize(job, applied, pending, t0, launched, load, args), "exit_code": exit_code}


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _drive(job: Job, faults: list[dict[str, Any]], t0: float, args: argparse.Namespace,
           load: list[float]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Apply the faults on schedule, keep a spare waiting, stop the job; returns (applied, never applied)."""
    queue, applied = list(faults), []
    waiting: Optional[dict[str, Any]] = None  # a crash or hang written, not yet taken by its rank
    stop_at, stopped_at = t0 + args.duration, None
    next_load = time.time() + 10
    while True:
        now = time.time()
        new = job.read()
        if now > next_load:
            load.append(os.getloadavg()[0])
            next_load = now + 10
        if job.nodes[0].poll() is not None:  # the job ended (its store host exited): nothing to train on
            break
        for index, node in enumerate(job.nodes):  # a launcher that left (e.g. a node excluded): a new spare
            if node.poll() is not None and index not in job.killed and stopped_at is None and args.spares:
                job.killed.add(index)
                job.start_node()
                job.spares_started += 1
        taken = next((r for r in new if r["event"] == "fault"), None)
        if waiting is not None and taken is not None:
            waiting.update(time=taken["t"], step=taken["step"])
            applied.append(waiting)
            waiting = None
        if any(r["event"] == "stopped" for r in new):
            break
        if stopped_at is None and now >= stop_at:
            with open(os.path.join(job.dir, "stop"), "w"):
                pass
            stopped_at = now
        if stopped_at is not None and now > stopped_at + args.stop_grace:
            break
        last = job.last_step()
        stepping = last is not None and now - last["t"] < 3 * args.step_time + 0.5 and \
            (not applied or last["t"] > applied[-1]["time"])
        if queue and waiting is None and stopped_at is None and now >= t0 + queue[0]["at_s"] and stepping:
            fault = {**queue.pop(0)}
            running = [entry for entry in job.running() if entry[0] != 0]
            if not running:
                queue.insert(0, fault)
            else:
                node, rank = running[(fault["node"] - 1) % len(running)]
                fault.update(delay_s=round(now - t0 - fault["at_s"], 2), rank=rank)
                if fault["kind"] == "node_loss":
                    kill_tree(job.nodes[node].pid)
                    job.killed.add(node)
                    fault.update(time=time.time(), step=last["step"])  # type: ignore[index]
                    applied.append(fault)
                    if args.spares:
                        job.start_node()  # the cluster's new spare
                        job.spares_started += 1
                else:
                    tmp = os.path.join(job.dir, "fault.tmp")
                    with open(tmp, "w", encoding="utf-8") as handle:
                        json.dump({"id": fault["id"], "kind": fault["kind"], "rank": rank}, handle)
                    os.replace(tmp, os.path.join(job.dir, "fault.json"))
                    waiting = fault
        time.sleep(0.05)
    pending = ([waiting] if waiting is not None else []) + queue
    return applied, pending


def summarize(job: Job, applied: list[dict[str, Any]], pending: list[dict[str, Any]],
              t0: float, launched: float, load: list[float], args: argparse.Namespace) -> dict[str, Any]:
    steps = [r for r in job.records if r["event"] == "step"]
    gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:]) if a["pid"] == b["pid"] and b["step"] == a["step"] + 1]
    step_s = statistics.median(gaps)
    stopped = next((r for r in job.records if r["event"] == "stopped"), None)
    first_step = steps[0]["step"]
    if stopped is not None:
        end, final = stopped["t"], stopped["step"]
    else:  # killed: what the newest checkpoint held at the stop
        end = t0 + args.duration
        final = max((r["step"] for r in job.records if r["event"] == "checkpoint" and r["t"] <= end), default=0)
    wall = end - t0
    useful = max(0, final - first_step)
    costs = [_fault_cost(job.records, fault, applied[i + 1]["time"] if i + 1 < len(applied) else end, step_s)
             for i, fault in enumerate(applied)]
    pids = [r["pid"] for r in steps]
    restarts = sum(1 for a, b in zip(pids, pids[1:]) if a != b)
    return {
        "wall_s": round(wall, 2), "useful_steps": useful, "step_s": round(step_s, 4),
        "goodput": round(useful * step_s / wall, 4),
        "stopped_cleanly": stopped is not None, "final_step": final, "restarts": restarts,
        "startup_s": round(t0 - launched, 2), "spares_started": job.spares_started,
        "faults": [{**{k: f[k] for k in ("id", "kind", "at_s", "delay_s", "rank", "step")},
                    "time_s": round(f["time"] - t0, 2), **cost} for f, cost in zip(applied, costs)],
        "faults_not_applied": [{k: f[k] for k in ("id", "kind", "at_s")} for f in pending],
        "fault_cost_s": round(sum(c["cost_s"] for c in costs), 2),
        "load_avg_1m": {"min": min(load), "max": max(load), "mean": round(statistics.mean(load), 2)},
    }


def _fault_cost(records: list[dict[str, Any]], fault: dict[str, Any], until: float, step_s: float) -> dict[str, Any]:
    """What one fault cost, from rank 0's step records (see the module docstring); ``until``: the next fault or the end."""
    steps = [r for r in records if r["event"] == "step"]
    old_pid = [r for r in steps if r["t"] <= fault["time"]][-1]["pid"]
    last = max((r for r in steps if r["pid"] == old_pid), key=lambda r: r["step"])  # the furthest it got
    after = [r for r in steps if r["t"] > fault["time"] and r["pid"] != old_pid]
    regained = next((r for r in after if r["step"] > last["step"]), None)
    if regained is None or regained["t"] > until:  # no net progress until the next fault or the end
        cost = until - last["t"]
    else:
        cost = regained["t"] - last["t"] - step_s
    facts: dict[str, Any] = {"recovered": bool(after), "to_first_step_s": None, "recomputed_steps": None,
                             "resumed_from": None}
    if after:
        first = after[0]
        resumed = next((r for r in records if r["event"] == "resumed" and r["pid"] == first["pid"]), None)
        facts.update(to_first_step_s=round(first["t"] - fault["time"], 2),
                     recomputed_steps=last["step"] - (first["step"] - 1),
                     resumed_from=resumed["source"] if resumed is not None else None)
    return {**facts, "cost_s": round(max(0.0, cost), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="training seconds per launcher (from its first step)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule")
    parser.add_argument("--fault-interval", type=float, default=60.0, help="one fault per this many seconds")
    parser.add_argument("--step-time", type=float, default=0.15, help="paced seconds per training step")
    parser.add_argument("--checkpoint-every", type=int, default=60,
                        help="steps between disk checkpoints (default: 9 s of 0.15 s steps, about a sixth of the "
                             "time between faults, as a job checkpointing every 30 min at a 3-hour MTBF)")
    parser.add_argument("--collective-timeout", type=float, default=600.0,
                        help="init_process_group(timeout=...) seconds: NCCL's default (gloo's is 1800)")
    parser.add_argument("--spares", type=int, choices=(0, 1), default=1,
                        help="hot spares waiting (0: a lost node is not replaced, the job goes on with 3 nodes)")
    parser.add_argument("--max-restarts", type=int, default=100)
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--stop-grace", type=float, default=60.0,
                        help="seconds a job may take to stop after --duration before it is killed")
    parser.add_argument("--ft-args", default="", help="more ft_launcher flags (default none: its defaults), e.g. "
                        "'--ft-prewarm-modules=torch,torch._dynamo'")
    parser.add_argument("--workdir", help="keep every job's logs, records and checkpoints here (default: a temporary "
                        "directory, removed)")
    parser.add_argument("--launchers", choices=("both", "ft_launcher", "torchrun"), default="both")
    args = parser.parse_args()
    if not 0 < args.fault_interval <= args.duration:
        parser.error(f"--duration {args.duration:g} and --fault-interval {args.fault_interval:g}: the duration must "
                     "hold at least one fault window (0 < interval <= duration)")
    # SIGTERM (a timeout, a CI cancel) unwinds like Ctrl-C: every job's launchers and workers are killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faults = schedule(args.seed, args.duration, args.fault_interval)
    names = list(LAUNCHERS) if args.launchers == "both" else [args.launchers]
    result: dict[str, Any] = {"benchmark": "goodput", "nodes": NODES, "nproc_per_node": 1, "spares": args.spares,
                              "duration_s": args.duration, "seed": args.seed, "fault_interval_s": args.fault_interval,
                              "step_time_s": args.step_time, "checkpoint_every": args.checkpoint_every,
                              "collective_timeout_s": args.collective_timeout, "ft_args": args.ft_args,
                              "schedule": faults}
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="ft_goodput_"))
        for name in names:
            workdir = os.path.join(tmp, name)
            os.makedirs(workdir)
            result[name] = run(name, faults, args, workdir)
    if len(names) == 2:
        result["goodput_ft_over_torchrun"] = round(result["ft_launcher"]["goodput"] / result["torchrun"]["goodput"], 3) \
            if result["torchrun"]["goodput"] else None
    result["targets"] = {"ft_launcher_goodput": 0.95, "ft_launcher_above_torchrun": True}
    emit(result)


if __name__ == "__main__":
    main()
