"""The fuzzer of benchmarks/fuzz_monitor.py against a live monitor with real heartbeating ranks."""

from __future__ import annotations

import pytest
from security_helpers import import_benchmark

pytestmark = pytest.mark.timeout(120)

#: Resident memory the monitor may gain over a fuzzing run. Each connection may hold at most
#: MAX_HELLO_FRAME_BYTES before its handshake; a leak per connection (thousands of them) would
#: exceed this many times over.
RSS_GROWTH_BOUND_MB = 8.0


def test_fuzzing_kills_no_rank_and_does_not_grow_the_monitor():
    fuzz = import_benchmark("fuzz_monitor")
    result = fuzz.run(duration=4.0, n_ranks=2, seed=1)
    assert result["monitor_alive"] and result["new_rank_served_after"]
    assert result["ranks_signalled"] == 0
    # Every case ran, and the monitor closed the connections that sent garbage.
    assert set(result["cases"]) == {
        "random_bytes", "random_length", "huge_length", "zero_length", "deep_nesting", "truncated",
        "wrong_token", "other_ranks_frames", "wrong_types", "flipped_bits", "idle"}
    assert result["frames_sent"] > 500
    assert result["connections_dropped"] > result["connections_opened"] // 2
    assert result["garbage_connections_left_open"] == 0
    assert result["rejections_recorded"] > 0
    assert result["monitor_rss_mb"]["growth"] <= RSS_GROWTH_BOUND_MB, result
