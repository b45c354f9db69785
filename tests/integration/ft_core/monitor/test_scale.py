"""16 nodes of one job on one machine, on each rendezvous backend: a hang on one rank restarts all of them once.

16 launchers x 1 rank on loopback; the workers only use ``RankMonitorClient``
(no torch), so 16 nodes fit on 2 cores. Every node must restart exactly once,
name the same culprit (the hung rank) in its event log and exit summary, and
every rank must run the next cycle to the end. The time from the hang's
detection to every rank heartbeating again is reported (``recovery_s``).
"""

from __future__ import annotations

import statistics

import pytest
from launcher_helpers import LauncherGroup, Rendezvous
from scale_job import SAMPLE_INTERVAL, run_scale_job

NODES = 16

pytestmark = pytest.mark.timeout(400)


@pytest.mark.parametrize("backend", ["c10d", "etcd-v2", "etcd-v3"])
def test_a_hang_on_one_of_16_nodes_restarts_every_node_once(tmp_path, request, record_property, backend):
    if backend == "etcd-v3":
        pytest.importorskip("etcd3gw", reason="etcd-v3 needs etcd3gw (pip install -e '.[etcd]')")
    rdzv = Rendezvous("c10d") if backend == "c10d" else Rendezvous(backend, request.getfixturevalue("etcd_server"))
    with LauncherGroup(tmp_path, SAMPLE_INTERVAL) as launchers:
        run = run_scale_job(launchers, rdzv, NODES, hangs=1, timeout=300)
    culprit = f"rank {run.hung_rank} (pid "
    assert run.exit_codes == [0] * NODES, run.summaries
    assert run.cycles == [[0, 1]] * NODES
    for causes, summary in zip(run.causes, run.summaries):
        assert len(causes) == 1 and causes[0].startswith(culprit) and " hung: " in causes[0], causes
        # The restart row says what the job-wide diagnosis says (the same on every node).
        assert f"restart    : cycle 0: hang: rank(s) {run.hung_rank} hung" in summary, summary
    assert len({causes[0] for causes in run.causes}) == 1  # the very same decision everywhere
    assert run.finished == {(rank, 1) for rank in range(NODES)}
    assert len(run.recovery) == 1
    record_property("recovery_s", round(run.recovery[0], 3))
    print(f"\n{backend}, {NODES} nodes: hang detected -> all ranks heartbeating again in {run.recovery[0]:.2f} s "
          f"(decision on every node after {run.propagation[0]:.2f} s, rendezvous {run.rendezvous[0]:.2f} s, "
          f"worker start median {statistics.median(run.worker_start):.2f} s); job wall time {run.wall:.1f} s")
