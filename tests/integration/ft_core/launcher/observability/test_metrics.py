"""The launcher's Prometheus endpoint, scraped over real HTTP during a job whose rank 1 hangs.

Workers run without torch (``FT_TEST_TORCH=0``): nothing holds rank 0 back
while rank 1 hangs, so the two ranks' heartbeat ages must diverge.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path
from typing import Optional

import pytest
from helpers import wait_for
from launcher_helpers import LauncherGroup

from ft_core.utils.deadline import wait_until

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.timeout(300)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> Optional[float]:
    """The sample ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


def test_restart_counter_and_heartbeat_age_move_during_a_hang(tmp_path):
    trigger = tmp_path / "hang-now"
    with LauncherGroup(tmp_path) as group:
        launcher = group.start("--ft-metrics-port=0", "--max-restarts=1", nproc=2, FT_TEST_TORCH="0", FT_TEST_FAULT="hang",
                               FT_TEST_FAULT_RANK="1", FT_TEST_FAULT_AFTER=str(trigger), FT_TEST_STEPS="40",
                               FT_TEST_STEP_TIME="0.05")
        # Port 0: the launcher picked a free port and logged it.
        logged = wait_until(lambda: re.search(r"metrics endpoint: http://[\d.]+:(\d+)/metrics", launcher.output()),
                            60)
        assert logged, launcher.output()[-3000:]
        port = int(logged.group(1))

        def both_ranks_alive() -> Optional[Samples]:
            samples = scrape(port)
            ages = [value(samples, "ft_rank_heartbeat_age_seconds", rank=r) for r in ("0", "1")]
            return samples if all(a is not None and a < 1.5 for a in ages) else None

        before = wait_for(both_ranks_alive, 120, "both ranks connected and heartbeating")
        started = launcher.events("launcher_started")[0]
        host = started["node"].rsplit(":", 1)[0]  # the label has no pid: a requeue continues the series
        assert value(before, "ft_cycle", run_id=started["run_id"], node=host) == 0
        assert value(before, "ft_restarts_total", kind="hang") is None
        assert value(before, "ft_fault_free_time_ratio") == pytest.approx(1.0)
        # Prometheus finds the randomly picked port through the file_sd target file beside the event log.
        targets_dir = Path(launcher.events_path).parent / "ft_metrics_targets"
        targets = list(targets_dir.glob("*.json"))
        assert len(targets) == 1 and oct(targets[0].stat().st_mode & 0o777) == "0o644"
        assert json.loads(targets[0].read_text()) == [{"targets": [f"{socket.gethostname()}:{port}"], "labels": {}}]
        assert (value(before, "ft_cycle_uptime_seconds") or 0) > 0

        trigger.touch()

        def hang_visible() -> Optional[Samples]:
            samples = scrape(port)
            hung, healthy = (value(samples, "ft_rank_heartbeat_age_seconds", rank=r) for r in ("1", "0"))
            return samples if hung is not None and hung >= 2.0 and healthy is not None and healthy < 1.5 else None

        # FAST_FLAGS: a 3 s heartbeat timeout, so rank 1's age passes 2 s before the monitor ends it.
        wait_for(hang_visible, 30, "rank 1's heartbeat age to grow while rank 0's stays small", interval=0.2)

        def restarted() -> Optional[Samples]:
            samples = scrape(port)
            return samples if value(samples, "ft_cycle") == 1 else None

        after = wait_for(restarted, 120, "cycle 1", interval=0.2)
        assert value(after, "ft_restarts_total", kind="hang") == 1
        assert value(after, "ft_faults_total", kind="hang", rank="1") == 1
        # The next cycle's ranks heartbeat again (the hung rank's age is gone with its connection).
        assert wait_until(both_ranks_alive, 60)
        assert launcher.wait(120) == 0, launcher.output()[-3000:]
        assert not list(targets_dir.glob("*.json"))  # removed at exit: Prometheus stops scraping it
