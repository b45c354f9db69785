"""Many nodes of one job on one machine: a hang on one rank -> every node restarted. Prints JSON.

For 4, 8 and 16 launchers x 1 rank on loopback, on the c10d backend and on
etcd-v2 (a real single-member etcd server started for the run), one job per
(backend, node count) with ``--hangs`` hangs, one per cycle, on a rank that is
not node 0's (``tests/integration/scale_job.py``; workers use only
``RankMonitorClient`` and never import torch). Per hang:

  recovery_s      the monitor's hang detection -> every rank of the next cycle has heartbeated
  propagation_s   detection -> the last node's restart (the decision has reached every node)
  rendezvous_s    the last node's restart -> the last node's new workers started
  worker_start_s  floor, same run: a node's workers started -> its rank's first heartbeat
                  (Python start-up and the client import, no coordination at all)

Values are summaries (median, p99, min, max, n) over the hangs of one job
(worker_start_s: over every node and cycle). ``ok`` is true when every
launcher exited 0, restarted once per hang and named the hung rank as the
cause; ``problems`` says what differed otherwise. Needs the ``etcd`` binary and python-etcd for etcd-v2 (else that
backend reports ``skipped``). Finishes within 4 minutes on 2 cores.

Usage: python benchmarks/scale.py [--nodes 4,8,16] [--hangs 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests"), os.path.join(REPO, "tests", "integration")]

from _common import emit, summarize  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_missing  # noqa: E402
from launcher_helpers import LauncherGroup, Rendezvous  # noqa: E402
from scale_job import SAMPLE_INTERVAL, ScaleRun, run_scale_job  # noqa: E402

BACKENDS = ("c10d", "etcd-v2")
HEARTBEAT_TIMEOUT = 1.5


def problems(run: ScaleRun, hangs: int) -> list[str]:
    """What went wrong: every node must exit 0, restart once per hang and blame the hung rank each time."""
    found = []
    if run.exit_codes != [0] * run.nodes:
        found.append(f"exit codes {run.exit_codes}")
    if len(run.recovery) != hangs:
        found.append(f"{len(run.recovery)} complete recoveries for {hangs} hangs")
    culprit = f"rank {run.hung_rank} (pid "
    found += [f"node{i} restart causes {causes}" for i, causes in enumerate(run.causes)
              if len(causes) != hangs or not all(cause.startswith(culprit) for cause in causes)]
    return found


def measure(run: ScaleRun, hangs: int) -> dict[str, Any]:
    found = problems(run, hangs)
    return {
        "ok": not found,
        "problems": found,
        "recovery_s": summarize(run.recovery),
        "propagation_s": summarize(run.propagation),
        "rendezvous_s": summarize(run.rendezvous),
        "worker_start_s": summarize(run.worker_start),
        "startup_s": round(run.startup, 3),
        "wall_s": round(run.wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="4,8,16", help="node counts (default: 4,8,16)")
    parser.add_argument("--hangs", type=int, default=2, help="hangs per job, one per cycle (default: 2)")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {backend: {} for backend in BACKENDS}
    with tempfile.TemporaryDirectory(prefix="ft-scale-") as tmp:
        missing = etcd_missing()
        cluster: Optional[EtcdCluster] = None
        if missing is None:
            os.makedirs(os.path.join(tmp, "etcd"))
            cluster = EtcdCluster(os.path.join(tmp, "etcd")).start()
        try:
            for backend in BACKENDS:
                for nodes in counts:
                    if backend == "etcd-v2" and cluster is None:
                        results[backend][str(nodes)] = {"skipped": missing}
                        continue
                    rdzv = Rendezvous(backend, cluster if backend == "etcd-v2" else None)
                    directory = os.path.join(tmp, f"{backend}-{nodes}")
                    os.makedirs(directory)
                    with LauncherGroup(directory, SAMPLE_INTERVAL) as launchers:
                        run = run_scale_job(launchers, rdzv, nodes, args.hangs, heartbeat_timeout=HEARTBEAT_TIMEOUT)
                    results[backend][str(nodes)] = measure(run, args.hangs)
        finally:
            if cluster is not None:
                cluster.stop()
    emit({
        "benchmark": "scale",
        "hangs_per_job": args.hangs,
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT,
        "ranks_per_node": 1,
        "results": results,
        "total_s": round(time.monotonic() - started, 1),
    })


if __name__ == "__main__":
    main()
