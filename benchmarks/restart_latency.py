"""Restart latency of ft_launcher on one node, with plain torchrun as the baseline. Prints JSON.

For a crash and for a hang, over ``--restarts`` restarts of one job (2 gloo
workers), the time from the fault to:

  (a) detection          crash: the launcher logs the worker's exit; hang: the monitor's hang_detected
  (b) old workers gone   the launcher logs ``workers_stopped``
  (c) new workers spawned  the launcher logs ``cycle_start`` (after every worker process exists)
  (d) first heartbeat    the earliest first heartbeat of the next cycle (written by the workers)

Fault times come from the workers (the moment before they crash, or their
last heartbeat before they hang). Workers import torch, so (d) includes one
``import torch``, measured separately in ``import_torch_s``; ``d_minus_import``
subtracts each worker's own import time. The baseline runs the same workers
under ``torchrun --max-restarts`` (crashes only: torchrun detects no hangs);
for it, (c) is approximated by the new workers' first line of Python. Each job
reports how many store/rendezvous errors its output shows: torchrun's workers
reuse one store across restarts, and a restart can fail or hang on stale keys.

With ``--prewarm on`` (ft_launcher's default) the restarted workers are forked
from a factory that has already imported torch; ``prewarm`` in the output is
true only if every restarted worker really was.

``c_minus_detection`` is (c) counted from the detection: for a hang, from the
moment the monitor declared the rank hung (and killed it after its stack dump).

The headline keys: ``crash_to_spawn_s`` (c) and ``crash_to_first_heartbeat_s``
(d) of the crash job, ``hang_to_spawn_s`` (``c_minus_detection`` of the hang
job), ``prewarm``, ``import_torch_s``.

Usage: python benchmarks/restart_latency.py [--restarts 10] [--nproc 2] [--prewarm on|off] [--no-baseline] [--no-hang]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "integration", "launcher_workers", "worker.py")
HANG_TIMEOUT = 1.0
#: What a restart that trips over a stale store or port looks like in the logs.
STORE_ERRORS = re.compile(r"Rendezvous\w*Error|DistStoreError|DistNetworkError|Connection refused|"
                          r"Address already in use|wait timeout|Socket Timeout")


def read_jsonl(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "median": round(statistics.median(ordered), 4), "min": round(ordered[0], 4),
            "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 4), "max": round(ordered[-1], 4)}


def import_torch_seconds(runs: int = 3) -> dict[str, Any]:
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    times = [float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(runs)]
    return stats(times)


def run_job(launcher: list[str], workdir: str, fault: str, restarts: int, nproc: int,
            timeout: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Run one job with ``restarts`` faults; returns (launcher events, worker records, run facts)."""
    record = os.path.join(workdir, "workers.jsonl")
    env = dict(os.environ, FT_TEST_RECORD=record, FT_TEST_FAULT=",".join([fault] * restarts),
               FT_TEST_FAULT_STEP="0", FT_TEST_STEPS="3", PYTHONUNBUFFERED="1")
    cmd = [*launcher, f"--nproc-per-node={nproc}", f"--max-restarts={restarts}", "--monitor-interval=0.05",
           f"--log-dir={workdir}", WORKER]
    started = time.monotonic()
    output = os.path.join(workdir, "launcher.out")
    with open(output, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: Any = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout:.0f} s"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    records = read_jsonl(record)
    for pid in {r["pid"] for r in records}:  # torchrun's workers outlive a killed torchrun
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with open(output, errors="replace") as handle:
        store_errors = len(STORE_ERRORS.findall(handle.read()))
    facts = {"exit_code": code, "wall_s": round(time.monotonic() - started, 1),
             "cycles_started": len({r["cycle"] for r in records}), "store_or_rendezvous_errors": store_errors}
    return read_jsonl(os.path.join(workdir, "ft_events.jsonl")), records, facts


def first(items: list[dict[str, Any]], **match: Any) -> Optional[dict[str, Any]]:
    return next((i for i in items if all(i.get(k) == v for k, v in match.items())), None)


def per_restart(events: list[dict[str, Any]], records: list[dict[str, Any]], restarts: int,
                hang: bool) -> dict[str, Any]:
    columns: dict[str, list[float]] = {k: [] for k in (
        "a_detection", "b_old_workers_gone", "c_new_workers_spawned", "c_minus_detection", "new_worker_python_started",
        "d_first_heartbeat", "d_minus_import", "detection_minus_timeout")}
    for cycle in range(restarts):
        faults = [r for r in records if r.get("event") == "fault" and r["cycle"] == cycle]
        if hang:
            hung_since = min(f["time"] for f in faults)
            hang = min((e for e in events if e["event"] == "hang_detected" and e["time"] >= hung_since),
                       key=lambda e: e["time"])
            fault_time = hang["deadline_time"] - hang["timeout"]  # the hung rank's last heartbeat
            detection = hang["time"]
            columns["detection_minus_timeout"].append(detection - hang["deadline_time"])
        else:
            fault_time = min(f["time"] for f in faults)
            detection = first(events, event="worker_exit", cycle=cycle)["time"]
        stopped = first(events, event="workers_stopped", cycle=cycle)
        spawned = first(events, event="cycle_start", cycle=cycle + 1)
        nxt = [r for r in records if r["cycle"] == cycle + 1]
        heartbeats = [r for r in nxt if r.get("event") == "first_heartbeat"]
        started = [r["time"] for r in nxt if r.get("event") == "started"]
        columns["a_detection"].append(detection - fault_time)
        columns["b_old_workers_gone"].append(stopped["time"] - fault_time)
        columns["c_new_workers_spawned"].append(spawned["time"] - fault_time)
        columns["c_minus_detection"].append(spawned["time"] - detection)
        columns["new_worker_python_started"].append(min(started) - fault_time)
        if heartbeats:
            hb = min(heartbeats, key=lambda r: r["time"])
            import_time = hb["imported"] - first(nxt, event="started", pid=hb["pid"])["time"]
            columns["d_first_heartbeat"].append(hb["time"] - fault_time)
            columns["d_minus_import"].append(hb["time"] - fault_time - import_time)
    return {name: stats(values) for name, values in columns.items() if values}


def baseline(records: list[dict[str, Any]], restarts: int) -> dict[str, Any]:
    columns: dict[str, list[float]] = {"new_worker_python_started": [], "d_first_heartbeat": [],
                                       "d_minus_import": []}
    for cycle in range(restarts):
        faults = [r["time"] for r in records if r.get("event") == "fault" and r["cycle"] == cycle]
        nxt = [r for r in records if r["cycle"] == cycle + 1]
        if not faults or not nxt:
            continue
        fault_time = min(faults)
        columns["new_worker_python_started"].append(min(r["time"] for r in nxt if r["event"] == "started")
                                                    - fault_time)
        heartbeats = [r for r in nxt if r["event"] == "first_heartbeat"]
        if not heartbeats:
            continue  # the cycle never got its workers going (see store_or_rendezvous_errors)
        hb = min(heartbeats, key=lambda r: r["time"])
        import_time = hb["imported"] - first(nxt, event="started", pid=hb["pid"])["time"]
        columns["d_first_heartbeat"].append(hb["time"] - fault_time)
        columns["d_minus_import"].append(hb["time"] - fault_time - import_time)
    return {name: stats(values) for name, values in columns.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--job-timeout", type=float, default=300.0, help="give up on one job after this long")
    parser.add_argument("--prewarm", choices=("on", "off"), default="on", help="ft_launcher's --ft-prewarm")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip the plain torchrun job (e.g. when it ran with the other --prewarm)")
    parser.add_argument("--no-hang", dest="hang", action="store_false",
                        help="skip the hang job (hang detection does not depend on --prewarm)")
    args = parser.parse_args()
    if args.restarts < 5:
        parser.error("--restarts must be at least 5")
    ft = [sys.executable, "-m", "ft_core.launcher", "--ft-initial-rank-heartbeat-timeout=120",
          f"--ft-rank-heartbeat-timeout={HANG_TIMEOUT}", "--ft-stack-dump-timeout=0.2", f"--ft-prewarm={args.prewarm}"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    result: dict[str, Any] = {"benchmark": "restart_latency", "cpus": os.cpu_count(),
                              "load_avg_1m": os.getloadavg()[0], "restarts": args.restarts,
                              "nproc_per_node": args.nproc, "import_torch_s": import_torch_seconds()}
    jobs = [("ft_launcher_crash", ft, "exit3", False)]
    if args.hang:
        jobs.append(("ft_launcher_hang", ft, "hang", True))
    if args.baseline:
        jobs.append(("torchrun_crash", torchrun, "exit3", False))
    restarted: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="ft_bench_") as tmp:
        for name, launcher, fault, hang in jobs:
            workdir = os.path.join(tmp, name)
            os.makedirs(workdir)
            events, records, facts = run_job(launcher, workdir, fault, args.restarts, args.nproc, args.job_timeout)
            summary = baseline(records, args.restarts) if launcher is torchrun else \
                per_restart(events, records, args.restarts, hang)
            result[name] = {**facts, **({"hang_timeout_s": HANG_TIMEOUT} if hang else {}),
                            "seconds_from_fault": summary}
            if launcher is ft:
                restarted += [bool(r.get("prewarmed")) for r in records if r.get("event") == "started" and r["cycle"]]
    crash = result["ft_launcher_crash"]["seconds_from_fault"]
    if args.hang:
        hang = result["ft_launcher_hang"]["seconds_from_fault"]["c_minus_detection"]
        result["hang_to_spawn_s"] = {k: hang[k] for k in ("median", "p90", "min", "max")}
    result.update({
        "prewarm": bool(restarted) and all(restarted),
        "crash_to_spawn_s": {k: crash["c_new_workers_spawned"][k] for k in ("median", "p90", "min", "max")},
        "crash_to_first_heartbeat_s": {k: crash["d_first_heartbeat"][k] for k in ("median", "p90", "min", "max")},
        "targets": {"crash_to_spawn_s": 0.15, "hang_to_spawn_s": 0.15, "crash_to_first_heartbeat_s_prewarmed": 0.4,
                    "hang_detection_minus_timeout_s": 0.1},
    })
    emit(result)


if __name__ == "__main__":
    main()
