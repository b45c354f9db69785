"""Restarts that cannot help stop: the same exception at the same place and iteration, twice (real launcher).

Two ranks under ft_launcher (``launcher_workers/worker.py``, gloo). Rank 1 raises in step 3 of
every cycle: the client reports the exception (type, innermost user frames, iteration) to its
monitor before the rank dies, the launcher records a ``fault_fingerprint`` for each cycle, and
the second identical one stops the job with the do-not-requeue code (93) instead of spending
the other 8 restarts of the budget. Beside it, the same rank failing at a *different* step
each cycle is not the same fault: it restarts as always.
"""

from __future__ import annotations

import pytest
from launcher_helpers import LauncherGroup, exit_event

pytestmark = pytest.mark.timeout(240)

COMMON = dict(FT_TEST_FAULT="exception", FT_TEST_FAULT_CYCLES="all", FT_TEST_FAULT_RANK="1", FT_TEST_SECTIONS="1")


def test_the_same_exception_twice_stops_the_job_with_93_and_a_headline(tmp_path):
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("--max-restarts=9", FT_TEST_FAULT_STEP="3", **COMMON)
        assert node.wait(180) == 93, node.output()[-4000:]
        assert len(node.events("cycle_start")) == 2  # not 10
        prints = node.events("fault_fingerprint")
        assert [(p["kind"], p["culprits"], p["iteration"], p["exception_type"]) for p in prints] == \
            [("exception", [1], 3, "RuntimeError")] * 2
        assert prints[0]["frames"][0].startswith("worker.py:") and prints[0]["frames"][0].endswith(" inject")
        reason = exit_event(node)["reason"]
        assert reason.startswith("RuntimeError at worker.py:") and "on rank 1 at iteration 3, 2 times in a row" in reason
        assert "restarting cannot help" in node.output()
        assert launchers.alive_now() == []


def test_the_same_rank_failing_at_another_step_each_cycle_restarts_as_always(tmp_path):
    with LauncherGroup(tmp_path) as launchers:
        # Step 1 in cycle 0, step 2 in cycle 1 (FT_TEST_FAULT_STEP is per job: vary it through the cycle list).
        node = launchers.start("--max-restarts=2", "--ft-max-identical-faults=2", FT_TEST_FAULT="exception,exception",
                               FT_TEST_FAULT_RANK="1", FT_TEST_SECTIONS="1", FT_TEST_FAULT_STEP_BY_CYCLE="1,2")
        assert node.wait(180) == 0, node.output()[-4000:]
        assert [p["iteration"] for p in node.events("fault_fingerprint")] == [1, 2]
        assert len(node.events("cycle_start")) == 3
