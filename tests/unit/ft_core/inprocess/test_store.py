"""The coordination records and barriers, against a real TCPStore served by this process."""

from __future__ import annotations

import pytest
from helpers import free_port

from ft_core.inprocess import RestartAbort, TCPStoreFactory
from ft_core.inprocess.store import AttemptDecision, CoordinationStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stores():
    factory = TCPStoreFactory(host_name="127.0.0.1", port=free_port(), prefix="test")
    server = factory(host=True, timeout=10)  # keeps the server alive during the test
    yield [CoordinationStore(factory(host=False, timeout=10), 3, 0.01) for _ in range(3)]
    del server


def test_barrier_closes_without_terminated_ranks_and_all_agree(stores):
    stores[1].store.append("it/0/arrived", "1,")  # rank 1 arrived ...
    stores[2].mark_terminated(2)  # ... and rank 2 is gone
    assert stores[0].join(0, 0, timeout=10) == (0, 1)
    assert stores[1].join(0, 1, timeout=10) == (0, 1)  # reads the recorded members


def test_barrier_gives_up_on_missing_ranks_or_abort(stores):
    with pytest.raises(RestartAbort, match=r"ranks \[1, 2\] did not join within barrier_timeout=0.2 s"):
        stores[0].join(0, 0, timeout=0.2)
    assert stores[1].abort("too few ranks") == "too few ranks"
    assert stores[2].abort("second reason") == "too few ranks"  # the first reason stands
    with pytest.raises(RestartAbort, match="too few ranks"):
        stores[0].join(1, 0, timeout=10)


def test_first_decision_wins(stores):
    assert stores[0].decision(0) is None
    assert stores[1].report_restart(0, 1, "ValueError: boom") == AttemptDecision(False, 1, "ValueError: boom")
    assert stores[2].report_restart(0, 2, "RuntimeError: x|y") == AttemptDecision(False, 1, "ValueError: boom")
    for store in stores:
        store.complete(0, 3)  # completions after a restart decision do not turn it into "done"
    assert stores[0].wait_decision(0).done is False
    for store in stores:
        store.complete(1, 3)
    assert stores[0].wait_decision(1) == AttemptDecision(True)
    assert stores[0].decision_within(2, 0.05) is None


def test_records_of_processes(stores):
    stores[0].init_heartbeats()
    stores[1].heartbeat(1)
    assert stores[2].heartbeats([0, 1]) == [0, 1]
    stores[0].mark_excluded(2)
    stores[0].publish_active(0, (0, 1))
    stores[1].publish_active(0, (1,))  # first writer wins
    assert stores[2].excluded() == {2} and stores[2].active(0) == {0, 1} and stores[2].active(1) is None
    for rank in (1, 2):
        stores[rank].leave(rank)
    assert stores[0].wait_left(0.1) == {0}
