"""Another node's decision wakes a launcher at once (ft_core.launcher.decision_notice), with real launchers.

Two launchers with a monitoring interval of 600 s, longer than the test: between two passes a
launcher wakes only at its own worker's exit or at another node's decision. B's rank crashes;
A's rank keeps stepping (torch-free workers: no collective fails), so only B's notice can tell
A to restart before the test times out (without it, A restarts at its next pass, 600 s on).
"""

from __future__ import annotations

import pytest
from helpers import wait_for
from launcher_helpers import rendezvous_for

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3"])
def test_a_peer_restarts_on_the_deciders_notice_not_at_its_next_pass(launchers, request, tmp_path, backend):
    rdzv = rendezvous_for(request, backend)
    trigger = tmp_path / "fire"
    flags = [*rdzv.flags("2:2"), "--monitor-interval=600"]
    env = {"FT_TEST_TORCH": "0", "FT_TEST_FAULT_AFTER": str(trigger)}
    a = launchers.start(*flags, name="A", nproc=1, **env)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT="exit3", FT_TEST_FAULT_RANK="1", **env)
    # The launchers read their monitors' events only at a pass: the workers' own records say they run.
    wait_for(lambda: {r["rank"] for r in launchers.worker_records("started")} == {0, 1}, 180, "both ranks started")
    trigger.touch()  # B's rank exits with code 3; A's keeps stepping until its launcher stops it

    for node in (a, b):
        assert node.wait(240) == 0, node.output()[-3000:]
    (decided,) = b.events("restart")
    (told,) = a.events("restart")
    assert "exited with code 3" in decided["cause"] and told["cause"] == decided["cause"]
    for node in (a, b):
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
