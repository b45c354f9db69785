"""The launcher's job-wide policy (coordination.py) on every job store.

Every test runs three times: on ``C10dJobStore`` over a ``torch.distributed.HashStore``
(what the c10d rendezvous store offers, in process), on ``EtcdJobStore`` (v2 API)
and on ``EtcdV3JobStore`` (v3 API) against a real etcd server (the session's
``etcd_server`` fixture; skipped with the reason when etcd is not installed).
Several coordinators on one store play the launchers of several nodes; with
etcd each has its own client.
"""

from __future__ import annotations

import itertools
import threading

import pytest
import torch.distributed as dist
from etcd_cluster import EtcdCluster, assert_rides_out_an_outage

from ft_core.launcher.coordination import (
    CoordinationError,
    DecisionAction,
    JobCoordinator,
)
from ft_core.launcher.rendezvous.job_store import EtcdJobStore, JobStoreUnavailable

NODES = itertools.count()


def coordinator(new_job_store, max_restarts: int = 3, max_no_progress_cycles: int = 0) -> JobCoordinator:
    return JobCoordinator("test", f"node{next(NODES)}", max_restarts, max_no_progress_cycles, 93, job_store=new_job_store())


def test_compare_set_writes_only_over_the_expected_value(new_job_store):
    store = new_job_store()
    assert store.get("k") is None
    assert store.compare_set("k", None, "a") == "a"
    assert store.compare_set("k", None, "b") == "a"  # present: not written
    assert store.compare_set("k", "x", "b") == "a"  # wrong expectation: not written
    assert store.compare_set("k", "a", "b") == "b"
    assert new_job_store().get("k") == "b"
    assert store.compare_set("absent", "x", "y") is None and store.get("absent") is None
    assert store.add("n", 2) == 2 and new_job_store().add("n", 3) == 5 and store.get("n") == "5"


def test_a_fault_spends_one_restart_however_many_nodes_report_it(new_job_store):
    a, b = coordinator(new_job_store), coordinator(new_job_store)
    assert a.poll(0) is None
    first = a.end_cycle(0, "rank 3 crashed", fault=True, progress_active=False)
    second = b.end_cycle(0, "rank 5 crashed (peer)", fault=True, progress_active=False)
    assert first == second
    assert (first.action, first.reason, first.restarts, first.node) == (DecisionAction.RESTART, "rank 3 crashed",
                                                                          1, a.node)
    assert b.poll(0) == first  # a third node learns it by polling
    assert b.poll(1) is None  # the next cycle has not ended
    nxt = b.end_cycle(1, "rank 0 hung", fault=True, progress_active=False)
    assert (nxt.restarts, nxt.node) == (2, b.node)


def test_concurrent_reports_of_one_cycle_agree_on_one_decision(new_job_store):
    nodes = [coordinator(new_job_store) for _ in range(8)]
    decisions = [None] * len(nodes)
    start = threading.Barrier(len(nodes))

    def report(index: int) -> None:
        start.wait()
        decisions[index] = nodes[index].end_cycle(0, f"fault seen by {index}", fault=True, progress_active=False)

    threads = [threading.Thread(target=report, args=(i,)) for i in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len({d for d in decisions}) == 1 and decisions[0].restarts == 1
    assert nodes[0].end_cycle(1, "next", fault=True, progress_active=False).restarts == 2


def test_the_budget_stops_the_job_when_spent_and_a_membership_change_is_free(new_job_store):
    a, b = coordinator(new_job_store, max_restarts=1), coordinator(new_job_store, max_restarts=1)
    assert a.end_cycle(0, "node joined", fault=False, progress_active=False).restarts == 0
    assert a.end_cycle(1, "crash", fault=True, progress_active=False).action is DecisionAction.RESTART
    stop = b.end_cycle(2, "crash again", fault=True, progress_active=False)
    assert (stop.action, stop.exit_code, stop.restarts) == (DecisionAction.STOP, 1, 1)
    assert "restart budget spent: 1 restart(s) used" in stop.reason
    assert a.poll(2) == stop and a.stop_decision() == stop
    assert a.poll(3) == stop  # a stop is job-wide: it answers for every cycle
    assert a.end_cycle(3, "late report", fault=True, progress_active=False) == stop


def test_no_progress_stops_with_the_no_restart_code_and_a_new_checkpoint_resets_the_count(new_job_store):
    a, b = coordinator(new_job_store, max_restarts=10, max_no_progress_cycles=2), coordinator(new_job_store)
    a.publish_progress(100)
    assert a.end_cycle(0, "crash", fault=True, progress_active=True).action is DecisionAction.RESTART  # 100 is new
    assert b.end_cycle(1, "crash", fault=True, progress_active=False).action is DecisionAction.RESTART  # 1 w/o
    b.publish_progress(200)
    assert a.end_cycle(2, "crash", fault=True, progress_active=True).action is DecisionAction.RESTART  # reset
    assert a.end_cycle(3, "crash", fault=True, progress_active=True).action is DecisionAction.RESTART  # 1 w/o
    stop = a.end_cycle(4, "crash", fault=True, progress_active=True)  # 2 without progress
    assert (stop.action, stop.exit_code, stop.restarts) == (DecisionAction.STOP, 93, 4)
    assert "no progress: 2 consecutive faulty cycles" in stop.reason and "iteration: 200" in stop.reason
    assert b.stop_decision() == stop


def test_no_progress_rule_waits_for_a_progress_signal(new_job_store):
    a = coordinator(new_job_store, max_restarts=10, max_no_progress_cycles=1)
    for cycle in range(3):  # no checkpoint was ever reported and no node tracks progress: budget only
        assert a.end_cycle(cycle, "crash", fault=True, progress_active=False).action is DecisionAction.RESTART
    stop = a.end_cycle(3, "crash", fault=True, progress_active=True)  # a node has a progress file
    assert (stop.action, stop.exit_code) == (DecisionAction.STOP, 93) and "none yet" in stop.reason


def test_the_first_stop_request_wins(new_job_store):
    a, b = coordinator(new_job_store), coordinator(new_job_store)
    a.end_cycle(0, "crash", fault=True, progress_active=False)
    first = a.request_stop("rank 1 requested ShutdownWorkload", 93)
    assert b.request_stop("budget", 1) == first
    assert (first.action, first.exit_code, first.restarts, first.node) == (DecisionAction.STOP, 93, 1, a.node)
    assert b.end_cycle(1, "crash", fault=True, progress_active=False) == first


def test_progress_is_the_highest_iteration_any_node_published(new_job_store):
    nodes = [coordinator(new_job_store) for _ in range(4)]
    threads = [threading.Thread(target=node.publish_progress, args=(it,))
               for node, it in zip(nodes * 3, [5, 90, 30, 70, 10, 80, 20, 60, 40, 50, 1, 2])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    nodes[0].publish_progress(3)  # lower: no effect
    assert new_job_store().get("progress") == "90"


def test_finished_nodes_are_counted_per_cycle(new_job_store):
    # Each node counts itself in once all its ranks reported training complete; a later cycle starts at 0.
    nodes = [coordinator(new_job_store) for _ in range(3)]
    for node in nodes[:2]:
        node.node_finished(4)
    assert [node.nodes_finished(4) for node in nodes] == [2, 2, 2]  # not 3: the job is not finished
    nodes[2].node_finished(4)
    assert nodes[0].nodes_finished(4) == 3 and nodes[0].nodes_finished(5) == 0
    assert JobCoordinator("test", "static", 0, 0, 93).nodes_finished(4) == 0  # no job store yet: nothing known


def test_cycle_numbers_and_the_workers_store_are_agreed_after_each_rendezvous(new_job_store):
    store = new_job_store()
    a = JobCoordinator("test", "a", 3, 0, 93, job_store=store)
    b = JobCoordinator("test", "b", 3, 0, 93, job_store=new_job_store())
    for rnd in range(2):
        rdzv_store = dist.PrefixStore(f"round{rnd}", dist.HashStore())  # torch's store of one round
        first = a.begin_cycle(rdzv_store, 0, "127.0.0.1", static=False)
        assert b.begin_cycle(rdzv_store, 1, "127.0.0.1", static=False) == first
        assert (first.cycle, first.restarts, first.worker_store_addr) == (rnd, rnd, "127.0.0.1")
        worker_store = dist.TCPStore("127.0.0.1", first.worker_store_port, is_master=False)  # the cycle's own store
        assert not worker_store.check(["anything"])
        b.end_cycle(first.cycle, "crash", fault=True, progress_active=False)


def test_a_foreign_value_in_the_job_store_is_rejected_by_name(new_job_store):
    store = new_job_store()
    store.set("state", '{"restarts": "many"}')
    with pytest.raises(CoordinationError, match=r"job store key 'state': invalid value .*restarts"):
        JobCoordinator("test", "a", 3, 0, 93, job_store=store).poll(0)


def test_spares_released_wait_is_needed_only_when_the_store_lives_in_a_launcher(new_job_store):
    store = new_job_store()
    a = JobCoordinator("test", "a", 3, 0, 93, job_store=store)
    if store.survives_node_loss:
        assert a.wait_spares_released(1, timeout=0)  # etcd stays up: nothing to wait for
        return
    assert not a.wait_spares_released(1, timeout=0.2)
    JobCoordinator("test", "spare", 3, 0, 93, job_store=new_job_store()).spare_released()
    assert a.wait_spares_released(1, timeout=5)


def test_etcd_job_store_gives_up_after_its_retry_window(etcd_server):
    import etcd

    dead = etcd.Client("127.0.0.1", 1, allow_reconnect=False, read_timeout=1)  # nothing listens on port 1
    store = EtcdJobStore(dead, "/ft_launcher/nowhere", unavailable_timeout=0.5)
    with pytest.raises(JobStoreUnavailable, match=r"etcd did not answer for 0.5 s"):
        store.get("state")


def test_etcd_job_store_rides_out_a_short_outage(tmp_path, caplog, etcd_server):
    """No false failure: an operation issued while etcd is down waits for it within the retry window."""
    cluster = EtcdCluster(str(tmp_path), size=1).start()
    try:
        store = EtcdJobStore(cluster.client(), "/ft_launcher/outage", unavailable_timeout=60)
        assert_rides_out_an_outage(cluster, store, caplog.records, "etcd job store")
    finally:
        cluster.stop()


def test_the_culprit_exchange_on_both_job_stores(new_job_store):
    # Every node's evidence meets in the job store and every node reads one verdict. A crash decided
    # elsewhere must not cost a peer a stack-dump snapshot: "no diagnosis" is published at once.
    from ft_core.events import RankEvidence
    from ft_core.launcher.culprit import CulpritExchange

    decider, peer = CulpritExchange(new_job_store(), "a:1", 0.0), CulpritExchange(new_job_store(), "b:2", 0.0)
    decider.publish(0, None)
    assert peer.requested(0) is False
    assert peer.wait(0, []) is None

    decider.request(1)
    assert peer.requested(1) is True
    peer.share(1, 1, [RankEvidence(rank=1, pid=11, node="b:2", iteration=25, hung=True, in_collective=False)])
    verdict = decider.decide(1, 2, [RankEvidence(rank=0, pid=10, node="a:1", iteration=25, hung=True,
                                                 in_collective=True)])
    assert verdict is not None and (verdict.culprits, verdict.waiting, verdict.culprit_nodes) == ([1], [0], ["b:2"])
    assert peer.wait(1, []) == verdict
