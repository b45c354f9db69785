"""Soak: 50 consecutive injected failures in one job, without a single rendezvous or store error."""

from __future__ import annotations

import re

import pytest
from launcher_helpers import LauncherGroup, exit_event

FAILURES = 50
#: Errors a restart must never produce (a stale store, a reused port, a broken rendezvous).
STORE_ERRORS = re.compile(r"Rendezvous\w*Error|DistStoreError|DistNetworkError|Connection refused|"
                          r"Address already in use|EADDRINUSE|wait timeout|Socket Timeout")


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_fifty_consecutive_failures_then_success(tmp_path):
    # Every 5th cycle the workers import torch, join the gloo group through the cycle's store and
    # crash after one all-reduce; the other cycles fail right at start, before importing torch,
    # to keep the soak affordable. Cycle 50 runs to completion.
    kinds = ",".join("exit3" if cycle % 5 == 0 else "early_exit" for cycle in range(FAILURES))
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start(f"--max-restarts={FAILURES}", "--ft-max-no-progress-cycles=0", FT_TEST_FAULT=kinds)
        assert node.wait(800) == 0, node.output()[-3000:]
        assert [e["cycle"] for e in node.events("cycle_start")] == list(range(FAILURES + 1))
        assert [e["restarts"] for e in node.events("restart")] == list(range(1, FAILURES + 1))
        assert exit_event(node)["exit_code"] == 0
        assert not STORE_ERRORS.findall(node.output())
        finished = launchers.worker_records("finished")
        assert {(r["rank"], r["cycle"]) for r in finished} == {(0, FAILURES), (1, FAILURES)}
