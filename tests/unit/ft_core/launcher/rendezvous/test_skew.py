"""Torch's random first-join skew: skipped for the rendezvous the launcher wraps, torch's other waits kept."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as torch_rdzv

from ft_core.launcher.rendezvous.skew import join_skew_skipped


@pytest.fixture
def delays(monkeypatch):
    """Every ``_delay`` call torch's rendezvous makes, recorded instead of slept."""
    calls: list[object] = []
    monkeypatch.setattr(torch_rdzv, "_delay", lambda seconds: calls.append(seconds))
    return calls


@pytest.mark.timeout(60)
def test_a_real_first_join_sleeps_its_skew_unless_skipped(delays, one_rendezvous):
    spy = torch_rdzv._delay
    with join_skew_skipped(False):
        one_rendezvous()
    assert (0, 0.3) in delays  # torch's own behaviour, kept for the first join of a multi-node job
    delays.clear()
    with join_skew_skipped():
        one_rendezvous()
        torch_rdzv._delay(1)  # a fixed wait (torch's poll while it waits for other nodes) still sleeps
    assert delays == [1]
    assert torch_rdzv._delay is spy  # restored after the block
