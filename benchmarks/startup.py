"""Start-up cost: a trivial 2-rank job under ft_launcher and under plain torchrun, wall clock. Prints JSON.

The job (``_trivial_job.py``) imports torch, joins a gloo process group, does
one all_reduce and exits: the time from starting the launcher to its exit is
almost all start-up and shutdown. Runs alternate between the launchers
(``--runs`` of each, interleaved); ``ratio`` is ft / torchrun per pair of
consecutive runs (median and min-max over the pairs). ``first_rank_running_s``
is the time from starting the launcher to the first rank's first line of Python
(each rank writes the moment it starts, before its imports), per launcher, with
``first_rank_ratio`` (ft / torchrun) over the same pairs.

    python benchmarks/startup.py [--runs 5] [--nproc 2] [--prewarm on|off]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_trivial_job.py")


def run(command: list[str], nproc: int, log_path: str) -> tuple[float, float]:
    """(launch -> launcher exit, launch -> first rank running), in seconds."""
    started_file = log_path + ".started"
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="WARNING", FT_BENCH_STARTED_FILE=started_file)
    launched = time.time()
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        code = subprocess.call([*command, "--standalone", f"--nproc-per-node={nproc}", JOB], env=env, stdout=log,
                               stderr=subprocess.STDOUT, timeout=600)
    elapsed = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"{command[2]} exited with {code}; see {log_path}")
    with open(started_file) as handle:
        first_rank = min(float(line) for line in handle if line.strip()) - launched
    return elapsed, first_rank


def bytecode_cached() -> bool:
    """Whether the launcher's modules run from fresh bytecode, as in a ``pip install`` (``make bytecode``):
    compiling them from source adds about 0.2 s to each launch."""
    import importlib.util

    import ft_core.launcher

    sources = list(Path(ft_core.launcher.__file__).parent.glob("*.py"))
    return all(os.path.exists(cached := importlib.util.cache_from_source(str(path)))
               and os.stat(cached).st_mtime >= os.stat(path).st_mtime for path in sources)


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each launcher, interleaved (at least 5)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--prewarm", choices=("on", "off"), default="on", help="ft_launcher's --ft-prewarm")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    ft = [sys.executable, "-m", "ft_core.launcher", f"--ft-prewarm={args.prewarm}"]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    times: dict[str, list[float]] = {"ft": [], "torchrun": []}
    first_rank: dict[str, list[float]] = {"ft": [], "torchrun": []}
    with tempfile.TemporaryDirectory(prefix="ft_startup_") as tmp:
        for i in range(args.runs):
            # Alternate which launcher goes first, so neither always runs on a warmer page cache.
            order = (("ft", ft), ("torchrun", torchrun)) if i % 2 == 0 else (("torchrun", torchrun), ("ft", ft))
            for name, command in order:
                elapsed, first = run(command, args.nproc, os.path.join(tmp, f"{name}{i}.log"))
                times[name].append(elapsed)
                first_rank[name].append(first)
    emit({
        "benchmark": "startup", "nproc": args.nproc, "prewarm": args.prewarm == "on", "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0], "bytecode_cached": bytecode_cached(),
        "ft_launcher_s": spread(times["ft"]), "torchrun_s": spread(times["torchrun"]),
        "ratio": spread([a / b for a, b in zip(times["ft"], times["torchrun"])]),
        "first_rank_running_s": {name: spread(values) for name, values in first_rank.items()},
        "first_rank_ratio": spread([a / b for a, b in zip(first_rank["ft"], first_rank["torchrun"])]),
        "targets": {"ratio": 1.03, "first_rank_ratio": 1.0},
    })


if __name__ == "__main__":
    main()
