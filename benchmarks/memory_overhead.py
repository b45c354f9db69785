"""Memory of a node: ft_launcher's whole process tree next to plain torchrun's, same sleeping workers.

Both launchers run the same worker script (``_sleeping_worker.py``: ``import
torch``, under ft_launcher also connect a ``RankMonitorClient``, then sleep)
on one node. Once every worker is up, the PSS of every process of the
launcher's tree is summed from ``/proc/<pid>/smaps_rollup``. PSS divides each
shared page among the processes that map it, so the sum counts every page
once: the pages a pre-warmed worker still shares with its factory and its
sibling workers are counted once for the group, not once per worker.

With ``--train-steps N`` the workers first train a small model for N steps:
a forked worker stops sharing the pages training touches, while the standby
factory keeps its copy, so this shows what pre-warming costs once the workers
have diverged from the factory.

Runs alternate between the launchers (``--runs`` of each, interleaved); the
overhead is ft minus torchrun per pair of consecutive runs (median and
min-max). ``breakdown`` shows where ft's bytes go (launcher, monitor, worker
factory, workers; PSS and its anonymous part).

    python benchmarks/memory_overhead.py [--ranks 2 --ranks 8] [--runs 5] [--prewarm on|off|both] [--train-steps N]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

from ft_core.utils.deadline import wait_until  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_sleeping_worker.py")
MIB = 1024.0
#: After every worker is up: time for the standby factory and the pages to settle.
SETTLE_S = 0.5


def smaps_rollup(pid: int) -> dict[str, float]:
    """PSS and its anonymous part of one process, in MiB (zeros if it is gone)."""
    values = {"pss": 0.0, "pss_anon": 0.0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key == "Pss":
                    values["pss"] = int(rest.split()[0]) / MIB
                elif key == "Pss_Anon":
                    values["pss_anon"] = int(rest.split()[0]) / MIB
    except (FileNotFoundError, ProcessLookupError):
        pass
    return values


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def measure(command: list[str], nranks: int, workdir: str, train_steps: int = 0) -> dict[str, Any]:
    """Start a launcher, wait for its workers, sum PSS over its tree by role, stop it."""
    os.makedirs(workdir)
    env = dict(os.environ, FT_BENCH_READY_DIR=workdir, OMP_NUM_THREADS="1", LOGLEVEL="WARNING",
               FT_BENCH_TRAIN_STEPS=str(train_steps))
    with open(os.path.join(workdir, "launcher.out"), "wb") as out:
        proc = subprocess.Popen([*command, "--standalone", f"--nproc-per-node={nranks}", "--monitor-interval=0.5",
                                 WORKER], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def ready() -> list[int]:
            pids = [int(open(os.path.join(workdir, name)).read()) for name in os.listdir(workdir)
                    if name.startswith("ready_")]
            return pids if len(pids) == nranks else []

        workers = wait_until(ready, timeout=600, interval=0.2)
        if not workers or proc.poll() is not None:
            raise RuntimeError(f"{command[2]}: workers did not come up; see {workdir}/launcher.out")
        time.sleep(SETTLE_S)
        roles: dict[str, dict[str, float]] = {}
        for pid in process_tree(proc.pid):
            line = cmdline(pid)
            # The rest of ft_launcher's tree is its worker factories (the current one and its prepared
            # successor), which show the workers' command line when forked from the launcher.
            role = ("worker" if pid in workers else "launcher" if pid == proc.pid else
                    "monitor" if "ft_core.monitor" in line else "factory")
            usage = smaps_rollup(pid)
            total = roles.setdefault(role, {"processes": 0, "pss_mib": 0.0, "pss_anon_mib": 0.0})
            total["processes"] += 1
            total["pss_mib"] += usage["pss"]
            total["pss_anon_mib"] += usage["pss_anon"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"pss_mib": sum(r["pss_mib"] for r in roles.values()),
            "roles": {role: {k: round(v, 1) for k, v in r.items()} for role, r in roles.items()}}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "runs": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, action="append", help="workers per node (repeatable; default 2 and 8)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each launcher, interleaved (at least 5)")
    parser.add_argument("--prewarm", choices=("on", "off", "both"), default="on", help="ft_launcher's --ft-prewarm")
    parser.add_argument("--train-steps", type=int, default=0, help="steps the workers train before sleeping")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    modes = ("on", "off") if args.prewarm == "both" else (args.prewarm,)
    launchers = {"torchrun": [sys.executable, "-m", "torch.distributed.run"]}
    for mode in modes:
        launchers[f"ft_prewarm_{mode}"] = [sys.executable, "-m", "ft_core.launcher", f"--ft-prewarm={mode}"]
    result: dict[str, Any] = {"benchmark": "memory_overhead", "cpus": os.cpu_count(), "unit": "MiB (PSS)",
                              "train_steps": args.train_steps, "ranks": {}}
    with tempfile.TemporaryDirectory(prefix="ft_mem_") as tmp:
        for nranks in args.ranks or [2, 8]:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in launchers}
            for run in range(args.runs):
                for name, command in launchers.items():  # interleaved: machine drift hits all alike
                    runs[name].append(measure(command, nranks, os.path.join(tmp, f"{nranks}_{name}_{run}"),
                                              args.train_steps))
            torchrun = [r["pss_mib"] for r in runs["torchrun"]]
            entry: dict[str, Any] = {"torchrun_pss_mib": spread(torchrun)["median"],
                                     "torchrun": spread(torchrun), "breakdown": {}}
            for name in launchers:
                if name == "torchrun":
                    continue
                ft = [r["pss_mib"] for r in runs[name]]
                entry[name] = {"pss": spread(ft), "overhead": spread([a - b for a, b in zip(ft, torchrun)])}
                entry["breakdown"][name] = runs[name][len(runs[name]) // 2]["roles"]
            entry["breakdown"]["torchrun"] = runs["torchrun"][len(torchrun) // 2]["roles"]
            headline = f"ft_prewarm_{modes[0]}"
            entry.update(ft_pss_mib=entry[headline]["pss"]["median"],
                         overhead_mib=entry[headline]["overhead"]["median"], prewarm=modes[0] == "on")
            result["ranks"][str(nranks)] = entry
    result["targets"] = {"overhead_mib": 15}
    emit(result)


if __name__ == "__main__":
    main()
