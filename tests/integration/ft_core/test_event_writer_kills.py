"""A writer SIGKILLed mid-record costs its own record only, never the next record of a writer beside it.

Ranks append large records (a checkpoint loaded, a resume chosen, checkpoints
rejected) to the monitor's event file while the monitor writes to it. The
kernel stops a regular-file ``write()`` between pages on a fatal signal, so a
SIGKILLed rank can leave part of a record of 15-30 KB behind; the monitor, which
has the file open all along, must not glue its next record onto that part.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from helpers import python_env

from ft_core import event_file as ef
from ft_core import events as ev

pytestmark = pytest.mark.timeout(120)

KILLS = 100

#: The live writer (as the monitor): one writer, one record every 2 ms, numbered, until the stop file exists.
_LIVE = """
import os, sys, time
from ft_core import events as ev
from ft_core.event_file import EventWriter
path, stop = sys.argv[1:]
with EventWriter(path, node="live") as out:
    count = 0
    while not os.path.exists(stop):
        out.write(ev.Progress(iteration=count, source="live", cycle=0))
        count += 1
        time.sleep(0.002)
print(count)
"""


def _killed_writer(path: str, seed: int) -> None:
    """In a forked child: append 15-30 KB records (a rank's checkpoint_rejected) until killed."""
    rng = random.Random(seed)
    with ef.EventWriter(path) as out:
        while True:
            out.write(ev.CheckpointRejected(rank=0, cycle=0, checkpoint="x" * rng.randint(15_000, 30_000),
                                             reason="torn"))


def test_a_writer_killed_mid_record_costs_only_its_own_records(tmp_path):
    path, stop = str(tmp_path / "ft_monitor_events.jsonl"), str(tmp_path / "stop")
    live = subprocess.Popen([sys.executable, "-c", _LIVE, path, stop], env=python_env(), stdout=subprocess.PIPE,
                            text=True)
    rng = random.Random(34)
    try:
        for kill in range(KILLS):
            pid = os.fork()
            if pid == 0:  # the child only writes: no pytest code runs in it
                try:
                    _killed_writer(path, kill)
                finally:
                    os._exit(1)
            time.sleep(rng.uniform(0.0, 0.02))
            os.kill(pid, signal.SIGKILL)
            assert os.waitpid(pid, 0)[1] == signal.SIGKILL
    finally:
        open(stop, "w").close()
        written = int(live.communicate(timeout=60)[0])
    records = ef.read_records(path)[0]
    assert [r.iteration for r in records if isinstance(r, ev.Progress)] == list(range(written))
    assert written > 0
    # The killed writers' whole records are readable too; only a torn last one of each may be lost.
    assert sum(isinstance(r, ev.CheckpointRejected) for r in records) > 0
