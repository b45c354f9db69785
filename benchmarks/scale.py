"""Many nodes of one job on one machine: a hang on one rank -> every node restarted. Prints JSON.

For 4, 8 and 16 launchers x 1 rank on loopback, on the c10d backend and on
etcd-v3 and etcd-v2 (a real single-member etcd server started for the run), one job per
(backend, node count) with ``--hangs`` hangs, one per cycle, on a rank that is
not node 0's (``tests/integration/scale_job.py``; workers use only
``RankMonitorClient`` and never import torch). Per hang:

  recovery_s      the monitor's hang detection -> every rank of the next cycle has heartbeated
  propagation_s   detection -> the last node's restart (the decision has reached every node)
  rendezvous_s    the last node's restart -> the last node's new workers started
  worker_start_s  floor, same run: a node's workers started -> its rank's first heartbeat
                  (Python start-up and the client import, no coordination at all)

On etcd, the server's own request counters (its ``/metrics``, sampled every
0.1 s) give the store operations:

  etcd_ops_per_restart  per hang, in the recovery window above: reads (v3 Range, v2 get), writes
                        (v3 Txn and Put, v2 set/compare-and-swap/create/delete) and lease keep-alives
  etcd_ops_per_s        the steady rate while cycle 0 trains (every node polling its job store,
                        torch's rendezvous keep-alives)

Values are summaries (median, p99, min, max, n) over the hangs of one job
(worker_start_s: over every node and cycle). ``ok`` is true when every
launcher exited 0, restarted once per hang and named the hung rank as the
cause; ``problems`` says what differed otherwise. Needs the ``etcd`` binary, etcd3gw for etcd-v3 and python-etcd
for etcd-v2 (else that backend reports ``skipped``). Finishes within 6 minutes on 2 cores.

Usage: python benchmarks/scale.py [--nodes 4,8,16] [--hangs 2]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests"), os.path.join(REPO, "tests", "integration")]

from _common import emit, summarize  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_missing  # noqa: E402
from launcher_helpers import LauncherGroup, Rendezvous  # noqa: E402
from scale_job import SAMPLE_INTERVAL, ScaleRun, run_scale_job  # noqa: E402

BACKENDS = ("c10d", "etcd-v3", "etcd-v2")
HEARTBEAT_TIMEOUT = 1.5

#: etcd's request counters, by kind: v3 messages received per gRPC method, v2 store actions.
_COUNTER = re.compile(r'^(grpc_server_msg_received_total\{[^}]*grpc_method="(?P<method>\w+)"[^}]*\}'
                      r'|etcd_debugging_store_(?P<v2>reads|writes)_total\{[^}]*\}) (?P<value>[0-9.e+]+)$', re.M)
_KINDS = {"Range": "reads", "Txn": "writes", "Put": "writes", "DeleteRange": "writes",
          "LeaseKeepAlive": "keepalives", "reads": "reads", "writes": "writes"}


class EtcdOps:
    """etcd's request counters sampled every ``interval`` seconds from a thread, with wall-clock times."""

    def __init__(self, url: str, interval: float = 0.1) -> None:
        self._url = url + "/metrics"
        self._interval = interval
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> dict[str, float]:
        with urllib.request.urlopen(self._url, timeout=5) as response:
            text = response.read().decode()
        counts = dict.fromkeys(("reads", "writes", "keepalives"), 0.0)
        for match in _COUNTER.finditer(text):
            kind = _KINDS.get(match["method"] or match["v2"])
            if kind is not None:
                counts[kind] += float(match["value"])
        return counts

    def _run(self) -> None:
        while not self._stop.is_set():
            self._samples.append((time.time(), self._read()))
            self._stop.wait(self._interval)

    def __enter__(self) -> EtcdOps:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> dict[str, float]:
        """Requests counted from the last sample before ``start`` to the first one after ``end``."""
        before = [counts for when, counts in self._samples if when <= start] or [self._samples[0][1]]
        after = [counts for when, counts in self._samples if when >= end] or [self._samples[-1][1]]
        return {kind: after[0][kind] - before[-1][kind] for kind in before[-1]}


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


def etcd_figures(run: ScaleRun, ops: EtcdOps, started: float) -> dict[str, Any]:
    """Store operations per restart (in each recovery window) and per second while cycle 0 trains."""
    per_restart = [ops.between(start, end) for start, end in run.windows]
    steady_from, steady_to = started + run.startup, run.windows[0][0] if run.windows else started + run.wall
    steady = ops.between(steady_from, steady_to)
    seconds = max(steady_to - steady_from, 1e-9)
    return {
        "etcd_ops_per_restart": {kind: summarize([counts[kind] for counts in per_restart], digits=0)
                                 for kind in ("reads", "writes", "keepalives")} if per_restart else {},
        "etcd_ops_per_s": {kind: round(count / seconds, 1) for kind, count in steady.items()},
    }


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
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"(default: {','.join(BACKENDS)})")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {backend: {} for backend in args.backends.split(",")}
    with tempfile.TemporaryDirectory(prefix="ft-scale-") as tmp:
        missing = etcd_missing()
        cluster: Optional[EtcdCluster] = None
        if missing is None:
            os.makedirs(os.path.join(tmp, "etcd"))
            cluster = EtcdCluster(os.path.join(tmp, "etcd")).start()
        try:
            for backend in args.backends.split(","):
                for nodes in counts:
                    etcd = backend.startswith("etcd")
                    skipped = missing if cluster is None else etcd_missing(backend[-2:])
                    if etcd and skipped:
                        results[backend][str(nodes)] = {"skipped": skipped}
                        continue
                    rdzv = Rendezvous(backend, cluster if etcd else None)
                    directory = os.path.join(tmp, f"{backend}-{nodes}")
                    os.makedirs(directory)
                    started_at = time.time()
                    with LauncherGroup(directory, SAMPLE_INTERVAL) as launchers:
                        if cluster is not None and etcd:
                            with EtcdOps(cluster.members[0].client_url) as ops:
                                run = run_scale_job(launchers, rdzv, nodes, args.hangs,
                                                    heartbeat_timeout=HEARTBEAT_TIMEOUT)
                        else:
                            run = run_scale_job(launchers, rdzv, nodes, args.hangs, heartbeat_timeout=HEARTBEAT_TIMEOUT)
                    results[backend][str(nodes)] = measure(run, args.hangs)
                    if cluster is not None and etcd:
                        results[backend][str(nodes)].update(etcd_figures(run, ops, started_at))
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
