"""Restarts that cannot help stop: the same exception at the same place and iteration, twice (real launcher).

Two ranks under ft_launcher (``launcher_workers/worker.py``, gloo). Rank 1 raises in step 3 of
every cycle: the client reports the exception (type, innermost user frames, iteration) to its
monitor before the rank dies, the launcher records a ``fault_fingerprint`` for each cycle, and
the second identical one stops the job with the do-not-requeue code (93) instead of spending
the other 8 restarts of the budget. Beside it, the same rank failing at a *different* step
each cycle is not the same fault: it restarts as always.
"""

from __future__ import annotations

import json
import os

import pytest
from launcher_helpers import WORKER, LauncherGroup, exit_event

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


BAD_CHECKPOINT = os.path.join(os.path.dirname(WORKER), "bad_checkpoint.py")


def test_a_nan_loss_right_after_a_resume_marks_the_checkpoint_bad_and_the_job_finishes_from_an_older_one(tmp_path):
    # Cycle 0 saves step 4 and a poisoned step 8 (NaN momentum, finite weights), then rank 1 crashes.
    # Cycle 1 resumes from step 8, the loss turns NaN: NonFiniteLossError, fingerprinted nonfinite_loss,
    # step 8 marked bad. Cycle 2 skips it (checkpoint_rejected) and finishes from step 4: one extra restart.
    out = tmp_path / "ckpt"
    out.mkdir()
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("--max-restarts=5", script=(BAD_CHECKPOINT, f"--out={out}"))
        assert node.wait(180) == 0, node.output()[-4000:]
        poisoned = str(out / "ckpt_step8.pt")
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1, 2]
        first, second = node.events("fault_fingerprint")
        assert first.get("resumed_from") is None  # cycle 0 started fresh
        assert (second["kind"], second["resumed_from"], second["resumed_step"]) == ("nonfinite_loss", poisoned, 8)
        (marked,) = node.events("checkpoint_marked_bad")
        assert marked["checkpoint"] == poisoned and "non-finite loss" in marked["reason"]
        rejected = node.events("checkpoint_rejected")
        assert {(r["rank"], r["cycle"], r["checkpoint"]) for r in rejected} == {(0, 2, poisoned), (1, 2, poisoned)}
        assert all(r["reason"].startswith("marked bad: ") for r in rejected)
        loaded = {(e["cycle"], e["rank"]): (e["checkpoint"], e["step"]) for e in node.events("checkpoint_loaded")}
        assert loaded == {(1, 0): (poisoned, 8), (1, 1): (poisoned, 8),
                          (2, 0): (str(out / "ckpt_step4.pt"), 4), (2, 1): (str(out / "ckpt_step4.pt"), 4)}
        for rank in (0, 1):
            assert json.loads((out / f"r{rank}_c2.json").read_text()) == {"start_step": 4, "end_step": 12}
        assert launchers.alive_now() == []
