"""ft_launcher on a GPU: a rank blocked in CUDA, and pre-warmed workers that use CUDA (``make test-gpu``).

Marked ``cuda``: skipped where no CUDA device is visible (this project's CI machine has none); written to
run unchanged on a machine with one GPU (one rank per node, every rank on device ``LOCAL_RANK % count``).
"""

from __future__ import annotations

import os

import psutil
import pytest
from helpers import REPO_ROOT
from launcher_helpers import LauncherGroup

from ft_core.event_file import read_events

WORKERS = os.path.join(REPO_ROOT, "tests", "integration", "launcher_workers")
CUDA_WORKER = os.path.join(WORKERS, "cuda_worker.py")
UNAVAILABLE_WARNING = "pre-warmed workers unavailable"
#: Device memory the hung rank holds: the next cycle's rank must find it free again.
HOLD_MB = 1024

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]


def _started(launchers: LauncherGroup) -> dict[int, dict]:
    """cycle -> the "started" record of rank 0 in that cycle."""
    return {r["cycle"]: r for r in launchers.worker_records("started") if r["rank"] == 0}


def test_rank_blocked_in_cuda_synchronize_is_caught_and_its_memory_free_before_the_next_cycle(launchers):
    node = launchers.start("--max-restarts=1", nproc=1, script=(CUDA_WORKER,),
                           FT_TEST_CUDA_HANG="1", FT_TEST_CUDA_HOLD_MB=str(HOLD_MB))
    assert node.wait(300) == 0, node.output()[-4000:]

    (hanging,) = launchers.worker_records("hanging")
    (hang,) = [e for e in node.events("hang_detected") if e["cycle"] == 0]
    assert (hang["rank"], hang["pid"], hang["reason"]) == (0, hanging["pid"], "heartbeat")
    # The stack was dumped while the rank was blocked in the driver: the Python frames that called it.
    with open(hang["stack_dump_file"]) as handle:
        stack = handle.read()
    assert "hang_in_cuda_synchronize" in stack and "synchronize" in stack, stack
    assert not psutil.pid_exists(hanging["pid"]) or psutil.Process(hanging["pid"]).status() == psutil.STATUS_ZOMBIE

    # The next cycle's rank found the device as free as the first cycle's did: the hung process (its
    # context and the memory it held) was gone before the new rank allocated anything.
    started = _started(launchers)
    assert set(started) == {0, 1}
    assert started[1]["free_bytes"] > started[0]["free_bytes"] - (HOLD_MB << 20) // 2, started
    assert [r["cycle"] for r in launchers.worker_records("finished")] == [1]


def test_prewarmed_workers_use_cuda(launchers):
    # The factory imports torch without touching CUDA: forked workers initialise CUDA themselves.
    node = launchers.start("--max-restarts=0", nproc=1, script=(CUDA_WORKER,))
    assert node.wait(300) == 0, node.output()[-4000:]
    assert _started(launchers)[0]["prewarmed"] is True
    assert len(launchers.worker_records("finished")) == 1


def test_prewarm_module_that_touches_cuda_at_import_falls_back_with_one_warning(launchers):
    # torch.cuda.is_available() at import initialises the real driver: the factory refuses to fork from it
    # (CUDA in a forked child would fail), warns once, and the job runs on plainly started workers.
    node = launchers.start("--max-restarts=0", "--ft-prewarm-modules=torch,cuda_at_import", nproc=1,
                           script=(CUDA_WORKER,))
    assert node.wait(300) == 0, node.output()[-4000:]
    output = node.output()
    assert output.count(UNAVAILABLE_WARNING) == 1 and "initialised the CUDA driver" in output, output[-3000:]
    assert _started(launchers)[0]["prewarmed"] is False
    assert len(launchers.worker_records("finished")) == 1
    assert not [e for e in read_events(node.events_path)[0] if e["event"] == "hang_detected"]
