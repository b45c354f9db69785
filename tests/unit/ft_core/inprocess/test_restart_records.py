"""The in-process restart records and barriers, against a real TCPStore served by this process."""

from __future__ import annotations

import pytest
from helpers import free_port

from ft_core.inprocess import RestartAbort, TCPStoreFactory
from ft_core.inprocess.restart_records import AttemptDecision, RestartRecords

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ranks():
    factory = TCPStoreFactory(host_name="127.0.0.1", port=free_port(), prefix="test")
    server = factory(host=True, timeout=10)  # keeps the server alive during the test
    yield [RestartRecords(factory(host=False, timeout=10), 3, 0.01) for _ in range(3)]
    del server


def test_barrier_closes_without_terminated_ranks_and_all_agree(ranks):
    ranks[1].store.append("it/0/arrived", "1,")  # rank 1 arrived ...
    ranks[2].mark_terminated(2)  # ... and rank 2 is gone
    assert ranks[0].join(0, 0, timeout=10) == (0, 1)
    assert ranks[1].join(0, 1, timeout=10) == (0, 1)  # reads the recorded members


def test_barrier_gives_up_on_missing_ranks_or_abort(ranks):
    with pytest.raises(RestartAbort, match=r"ranks \[1, 2\] did not join within barrier_timeout=0.2 s"):
        ranks[0].join(0, 0, timeout=0.2)
    assert ranks[1].abort("too few ranks") == "too few ranks"
    assert ranks[2].abort("second reason") == "too few ranks"  # the first reason stands
    with pytest.raises(RestartAbort, match="too few ranks"):
        ranks[0].join(1, 0, timeout=10)


def test_first_decision_wins(ranks):
    assert ranks[0].decision(0) is None
    assert ranks[1].report_restart(0, 1, "ValueError: boom") == AttemptDecision(False, 1, "ValueError: boom")
    assert ranks[2].report_restart(0, 2, "RuntimeError: x|y") == AttemptDecision(False, 1, "ValueError: boom")
    for records in ranks:
        records.complete(0, 3)  # completions after a restart decision do not turn it into "done"
    assert ranks[0].wait_decision(0).done is False
    for records in ranks:
        records.complete(1, 3)
    assert ranks[0].wait_decision(1) == AttemptDecision(True)
    assert ranks[0].decision_within(2, 0.05) is None


def test_records_of_processes(ranks):
    ranks[0].init_heartbeats()
    ranks[1].heartbeat(1)
    assert ranks[2].heartbeats([0, 1]) == [0, 1]
    ranks[0].mark_excluded(2)
    ranks[0].publish_active(0, (0, 1))
    ranks[1].publish_active(0, (1,))  # first writer wins
    assert ranks[2].excluded() == {2} and ranks[2].active(0) == {0, 1} and ranks[2].active(1) is None
    for rank in (1, 2):
        ranks[rank].leave(rank)
    assert ranks[0].wait_left(0.1) == {0}
