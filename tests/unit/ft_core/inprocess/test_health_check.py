"""The built-in ``health_check`` hook: ``FaultCounter`` retires a rank after its faults."""

from __future__ import annotations

import pytest

from ft_core.inprocess import ActiveWorldSize, Compose, FaultCounter, HealthCheckError


def test_fault_counter_and_compose(state):
    check = Compose(FaultCounter(max_rank_faults=2), lambda s: None)
    check(state(fault_count=1))
    with pytest.raises(HealthCheckError, match="rank 0 had 2 faults"):
        check(state(fault_count=2))
    with pytest.raises(ValueError, match="FaultCounter.max_rank_faults: invalid value 0"):
        FaultCounter(0)
    with pytest.raises(TypeError, match="hook #1"):
        Compose(ActiveWorldSize(1), "nope")  # type: ignore[arg-type]
