"""Many nodes of one job on one machine: a fault on one node -> every node stepping again. Prints JSON.

For ``--nodes`` launchers x 1 rank on loopback (default 4, 8, 16; up to 64), on
c10d, etcd-v3 and etcd-v2 (a real single-member etcd server started for the run;
``BACKEND+poll``: the same with torch's one-second rendezvous poll,
``--rdzv-conf wake_on_change=0``, the baseline), one job per (fault, backend,
node count) (``tests/integration/scale_job.py``; workers use only
``RankMonitorClient`` and never import torch). Faults (``--faults``):

  hang        ``--hangs`` hangs, one per cycle, on a rank that is not node 0's; from its deadline
              (the monitor's detection)
  crash       the same rank exits with code 3 instead; from the crash
  node_loss   one launcher SIGKILLed with its worker while a hot spare waits, then a peer's rank
              exits (as its collective fails); from the SIGKILL. The survivors remove the lost node
              once its liveness beat was read unchanged for ``lost_after`` (3 s, the default:
              ``ft_core.launcher.rendezvous.liveness``); ``BACKEND+poll`` is torch's rendezvous
              (its poll, and its keep-alive expiry: ``lost_after=0``); torch's keep-alive defaults
              (5 s x 3) in both

Per fault:

  recovery_s      the fault -> every rank of the next cycle has heartbeated
  propagation_s   the fault -> the last node's restart (the decision has reached every node)
  rendezvous_s    the last node's restart -> the last node's new workers started
  rendezvous_ops  summed over the nodes' rendezvous lines (``ft_core.launcher.rendezvous.wake``):
                  torch's state reads, writes (refused ones), wake-up operations, waits (woken,
                  missed a change) and bytes
  worker_start_s  floor, same run: a node's workers started -> its rank's first heartbeat
  cpu_busy_s, cpu_utilization  the machine's busy CPU-seconds in the window and the share of its
                  cores: near 100 %, the figure is the cores' (every process counts: run it idle)

On etcd, the server's own request counters (its ``/metrics``, sampled every
0.1 s) give the store operations:

  etcd_ops_per_restart  per fault, in the recovery window above: reads (v3 Range, v2 get), writes
                        (v3 Txn and Put, v2 set/compare-and-swap/create/delete) and lease keep-alives
  etcd_ops_per_s        the steady rate while cycle 0 trains (every node polling its job store,
                        torch's rendezvous keep-alives)

``state_cost``: torch's rendezvous state of 4 to 4,096 nodes, its size and the time to pickle and
unpickle it (the cost model of docs/scale.md). Values are summaries (median, p99, min, max, n) over
the faults of one job (worker_start_s: over every node and cycle). ``ok`` is true when every
launcher exited 0, restarted once per fault and named the faulty rank as the cause (node_loss: every
survivor restarted once, the spare ran the new cycle); ``problems`` says what differed otherwise.
Needs the ``etcd`` binary, etcd3gw for etcd-v3 and python-etcd for etcd-v2 (else that backend reports
``skipped``). About 30 s per job on 2 idle cores at 4-8 nodes; 64 nodes need about 17 GB of memory.

Usage: python benchmarks/scale.py [--nodes 4,8,16] [--hangs 2] [--faults hang,crash,node_loss]
       [--backends c10d,etcd-v3,c10d+poll]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import pickle
import re
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests"), os.path.join(REPO, "tests", "integration")]

from _common import emit, summarize  # noqa: E402
from etcd_cluster import EtcdCluster, etcd_missing  # noqa: E402
from launcher_helpers import LauncherGroup, Rendezvous  # noqa: E402
from scale_job import SAMPLE_INTERVAL, ScaleRun, run_node_loss_job, run_scale_job  # noqa: E402

from ft_core.launcher.rendezvous.conf import LOST_AFTER  # noqa: E402

BACKENDS = ("c10d", "etcd-v3", "etcd-v2")
FAULTS = ("hang", "crash", "node_loss")
#: The baseline's rendezvous conf: torch's poll and, for a lost node, torch's keep-alive expiry alone.
TORCH_CONF = ("wake_on_change=0", "lost_after=0")
HEARTBEAT_TIMEOUT = 1.5

#: etcd's request counters, by kind: v3 messages received per gRPC method, v2 store actions.
_COUNTER = re.compile(r'^(grpc_server_msg_received_total\{[^}]*grpc_method="(?P<method>\w+)"[^}]*\}'
                      r'|etcd_debugging_store_(?P<v2>reads|writes)_total\{[^}]*\}) (?P<value>[0-9.e+]+)$', re.M)
_KINDS = {"Range": "reads", "Txn": "writes", "Put": "writes", "DeleteRange": "writes",
          "LeaseKeepAlive": "keepalives", "reads": "reads", "writes": "writes"}


class Sampled:
    """Cumulative counters (``read()``: name -> value) sampled every ``interval`` seconds from a thread."""

    def __init__(self, read: Callable[[], dict[str, float]], interval: float = 0.1) -> None:
        self._read = read
        self._interval = interval
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._samples.append((time.time(), self._read()))
            self._stop.wait(self._interval)

    def __enter__(self) -> Sampled:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _around(self, start: float, end: float) -> tuple[tuple[float, dict[str, float]], tuple[float, dict[str, float]]]:
        before = [sample for sample in self._samples if sample[0] <= start] or self._samples[:1]
        after = [sample for sample in self._samples if sample[0] >= end] or self._samples[-1:]
        return before[-1], after[0]

    def between(self, start: float, end: float) -> dict[str, float]:
        """Counted from the last sample before ``start`` to the first one after ``end``."""
        (_, before), (_, after) = self._around(start, end)
        return {kind: after[kind] - before[kind] for kind in before}

    def span(self, start: float, end: float) -> float:
        """Seconds between the two samples :meth:`between` subtracts."""
        (first, _), (last, _) = self._around(start, end)
        return max(last - first, 1e-9)


def etcd_counters(url: str) -> Callable[[], dict[str, float]]:
    """etcd's request counters by kind, read from its ``/metrics``."""
    def read() -> dict[str, float]:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        counts = dict.fromkeys(("reads", "writes", "keepalives"), 0.0)
        for match in _COUNTER.finditer(text):
            kind = _KINDS.get(match["method"] or match["v2"])
            if kind is not None:
                counts[kind] += float(match["value"])
        return counts
    return read


def cpu_seconds() -> dict[str, float]:
    """CPU-seconds the whole machine spent busy (every process, also other jobs'), from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return {"busy": (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")}


def problems(run: ScaleRun, hangs: int) -> list[str]:
    """What went wrong: every node must exit 0, restart once per hang and blame the hung rank each time."""
    found = []
    if run.exit_codes != [0] * run.nodes:
        found.append(f"exit codes {run.exit_codes}")
    if len(run.recovery) != hangs:
        found.append(f"{len(run.recovery)} complete recoveries for {hangs} hangs")
    if run.hung_rank < 0:  # a lost node: every survivor restarted once, the spare (last) ran only the new cycle
        found += [f"survivor {i} restart causes {causes}" for i, causes in enumerate(run.causes[:-1])
                  if len(causes) != 1]
        found += [f"the spare ran cycles {run.cycles[-1]}"] if run.cycles[-1] != [1] else []
        return found
    culprit = f"rank {run.hung_rank} (pid "
    found += [f"node{i} restart causes {causes}" for i, causes in enumerate(run.causes)
              if len(causes) != hangs or not all(cause.startswith(culprit) for cause in causes)]
    return found


def etcd_figures(run: ScaleRun, ops: Sampled, started: float) -> dict[str, Any]:
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


def measure(run: ScaleRun, hangs: int, cpu: Sampled) -> dict[str, Any]:
    found = problems(run, hangs)
    busy = [cpu.between(start, end)["busy"] for start, end in run.windows]
    counts = run.rendezvous_counts
    return {
        "ok": not found,
        "problems": found,
        "recovery_s": summarize(run.recovery),
        "propagation_s": summarize(run.propagation),
        "rendezvous_s": summarize(run.rendezvous),
        "worker_start_s": summarize(run.worker_start),
        # Every node's restart rendezvous together (their logged lines): torch's state reads and writes,
        # the wake-ups' store operations (c10d: keys and lists; etcd-v3: keys and watches) and the waits; bytes of state and keys sent and received.
        "rendezvous_ops": {field: summarize([getattr(c, field) for c in counts], digits=0)
                           for field in ("reads", "writes", "refused_writes", "wake_ops", "waits", "woken",
                                         "missed", "bytes")} if counts else {},
        # CPU-seconds the machine spent busy in each recovery window (between the 0.1 s samples around it),
        # and the share of the cores it kept busy: near 1, the figure is the cores' (every node's restart
        # work queued on them). Other processes of the machine count too: run it on an idle machine.
        "cpu_busy_s": summarize(busy) if busy else {},
        "cpu_utilization": summarize([b / (cpu.span(start, end) * (os.cpu_count() or 1))
                                      for b, (start, end) in zip(busy, run.windows)]) if busy else {},
        "startup_s": round(run.startup, 3),
        "wall_s": round(run.wall, 1),
    }


def state_cost(nodes: int, repeats: int = 5) -> dict[str, float]:
    """Torch's rendezvous state of a complete round of ``nodes`` (host names of 30 characters): its pickled size,
    and the seconds one node spends pickling and unpickling it (every read and write of it does one)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    now = datetime.datetime.now(datetime.timezone.utc)
    for index in range(nodes):
        node = _NodeDesc(f"node{index:05d}.cluster.example.com", 100000 + index, 0)
        state.participants[node] = index
        state.last_heartbeats[node] = now
    state.complete = True
    dumps, loads = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        bits = pickle.dumps(state)
        dumps.append(time.perf_counter() - started)
        started = time.perf_counter()
        pickle.loads(bits)
        loads.append(time.perf_counter() - started)
    return {"bytes": len(bits), "pickle_s": round(min(dumps), 5), "unpickle_s": round(min(loads), 5)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="4,8,16", help="node counts (default: 4,8,16; up to 64 fit in 24 GB)")
    parser.add_argument("--hangs", type=int, default=2, help="faults per job, one per cycle (default: 2)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"(default: {','.join(FAULTS)})")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"(default: {','.join(BACKENDS)}); BACKEND+poll: the same with torch's one-second poll "
                             "(--rdzv-conf wake_on_change=0), the baseline")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    faults, backends = args.faults.split(","), args.backends.split(",")
    started = time.monotonic()
    results: dict[str, dict[str, dict[str, Any]]] = {fault: {backend: {} for backend in backends} for fault in faults}
    with tempfile.TemporaryDirectory(prefix="ft-scale-") as tmp:
        missing = etcd_missing()
        cluster: Optional[EtcdCluster] = None
        if missing is None and any(backend.startswith("etcd") for backend in backends):  # one server for all
            os.makedirs(os.path.join(tmp, "etcd"))
            cluster = EtcdCluster(os.path.join(tmp, "etcd")).start()
        try:
            for fault, backend, nodes in ((f, b, n) for f in faults for b in backends for n in counts):
                name, _, poll = backend.partition("+")
                etcd = name.startswith("etcd")
                skipped = missing if cluster is None else etcd_missing(name[-2:])
                if etcd and skipped:
                    results[fault][backend][str(nodes)] = {"skipped": skipped}
                    continue
                loss = fault == "node_loss"
                rdzv = Rendezvous(name, cluster if etcd else None, conf=TORCH_CONF if poll else ())
                directory = os.path.join(tmp, f"{fault}-{backend}-{nodes}")
                os.makedirs(directory)
                started_at = time.time()
                with contextlib.ExitStack() as stack:
                    cpu = stack.enter_context(Sampled(cpu_seconds))
                    ops = stack.enter_context(Sampled(etcd_counters(cluster.members[0].client_url))) \
                        if cluster is not None and etcd else None
                    launchers = stack.enter_context(LauncherGroup(directory, SAMPLE_INTERVAL))
                    if loss:
                        run = run_node_loss_job(launchers, rdzv, nodes, os.path.join(directory, "lose"))
                    else:
                        run = run_scale_job(launchers, rdzv, nodes, args.hangs, heartbeat_timeout=HEARTBEAT_TIMEOUT,
                                            fault=fault)
                result = results[fault][backend][str(nodes)] = measure(run, 1 if loss else args.hangs, cpu)
                if ops is not None:
                    result.update(etcd_figures(run, ops, started_at))
                print(f"{fault} {backend} {nodes}: recovery {result['recovery_s'].get('median')} s, "
                      f"ok={result['ok']}", file=sys.stderr, flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
    emit({
        "benchmark": "scale",
        "faults_per_job": args.hangs,
        "node_loss_lost_after_s": LOST_AFTER,
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT,
        "ranks_per_node": 1,
        "results": results,
        # For the cost model (docs/scale.md): torch's whole state is read and written by every node.
        "state_cost": {str(n): state_cost(n) for n in (4, 16, 64, 1024, 4096)},
        "total_s": round(time.monotonic() - started, 1),
    })


if __name__ == "__main__":
    main()
