"""A node waiting at a real c10d rendezvous says so, with how many nodes joined, until the wait ends."""

from __future__ import annotations

import logging
import re
import threading

import pytest
from helpers import free_port
from torch.distributed.elastic.rendezvous import RendezvousParameters, RendezvousTimeoutError
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from ft_core.launcher.rendezvous.waiting import reporting_rendezvous_wait


@pytest.mark.timeout(60)
def test_a_node_waiting_for_its_peer_reports_the_count_until_the_rendezvous_ends(caplog):
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id="wait-test",
                                  min_nodes=2, max_nodes=2, is_host=True, join_timeout=3)
    handler = get_rendezvous_handler(params)
    caplog.set_level(logging.INFO, logger="ft_core.launcher")
    try:
        with pytest.raises(RendezvousTimeoutError):  # the peer never comes: the join timeout ends the wait
            with reporting_rendezvous_wait(handler, interval=0.5):
                handler.next_rendezvous()
    finally:
        handler.shutdown()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for nodes")]
    assert len(lines) >= 3, lines
    # A line may come before this node's join is in the state it reads, or after the join timeout took it out
    # again (0 of 2, on a loaded machine); while it waits joined, it says so: 1 of 2, the peer never came.
    assert all(re.fullmatch(r"waiting for nodes: [01] of 2 joined, \d+ s \(c10d rendezvous, run wait-test\)", line)
               for line in lines), lines
    assert any(line.startswith("waiting for nodes: 1 of 2 joined, ") for line in lines), lines
    # The reporter thread ended with the wait: no line more after it (it would come within 0.5 s).
    assert not [t for t in threading.enumerate() if t.name == "ft-rendezvous-wait"]
